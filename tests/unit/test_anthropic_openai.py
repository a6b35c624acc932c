"""Anthropic client, OpenAI backend: requests, answers and streams against transcripts in tests/data."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import orjson
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.mockengine import responses as mock
from gateway.protocol.anthropic import parse_messages_request
from gateway.protocol.anthropic_openai import (
    StreamToAnthropic,
    error_to_anthropic,
    request_to_openai,
    response_from_openai,
)
from tests.fixtures.transcripts import cut_at, halves, load, names

REQUESTS = load("anthropic_openai_requests")
ERRORS = load("anthropic_request_errors")
RESPONSES = load("anthropic_openai_responses")
STREAMS = load("anthropic_openai_streams")
EVENT = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)


def upstream_bytes(case: dict[str, Any]) -> bytes:
    eol = "\r\n" if case.get("framing") == "crlf" else "\n"
    out = []
    for item in case["in"]:
        if "raw" in item:
            out.append(item["raw"] + eol + eol)
        else:
            head = f"event: {item['event']}{eol}" if "event" in item else ""
            out.append(head + "data: " + json.dumps(item["data"], separators=(",", ":")) + eol + eol)
    return "".join(out).encode()


def events(sse: bytes) -> list[dict[str, Any]]:
    """Our output: LF framing, one ``event:`` and one ``data:`` line per event, nothing else."""
    out = []
    assert sse.endswith(b"\n\n") or not sse
    for block in sse.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: ")
        out.append({"event": name[7:].decode(), "data": json.loads(data[6:])})
    return out


def translate(case: dict[str, Any], pieces: list[bytes]) -> tuple[bytes, StreamToAnthropic]:
    stream = StreamToAnthropic(case["model"], input_tokens_estimate=case.get("estimate", 0))
    return b"".join(stream.feed(p) for p in pieces) + stream.finish(), stream


@pytest.mark.parametrize("case", REQUESTS, ids=names(REQUESTS))
def test_request(case: dict[str, Any]) -> None:
    req = parse_messages_request(orjson.dumps(case["in"]))
    assert orjson.loads(request_to_openai(req, case["upstream_model"])) == case["out"]


@pytest.mark.parametrize(
    "case", [c for c in ERRORS["cases"] if c["stage"] == "translate"], ids=lambda c: c["param"]
)
def test_untranslatable_fields_are_named(case: dict[str, Any]) -> None:
    body = {**ERRORS["base"], **case["set"]}
    req = parse_messages_request(orjson.dumps(body))
    with pytest.raises(BadRequest) as info:
        request_to_openai(req, "llama")
    assert info.value.param == case["param"]
    assert info.value.message.startswith(case["param"])


@pytest.mark.parametrize("case", RESPONSES, ids=names(RESPONSES))
def test_response(case: dict[str, Any]) -> None:
    out = response_from_openai(orjson.dumps(case["in"]), case["model"])
    assert orjson.loads(out) == case["out"]
    anthropic.types.Message.model_validate_json(out)  # the official SDK reads it


@pytest.mark.parametrize("body", [b"", b"[]", b'{"choices": []}', b'{"choices": ["x"]}', b"<html>"])
def test_response_that_is_not_a_completion(body: bytes) -> None:
    with pytest.raises(BadUpstreamResponse):
        response_from_openai(body, "m")


@pytest.mark.parametrize("case", STREAMS, ids=names(STREAMS))
def test_stream(case: dict[str, Any]) -> None:
    out, stream = translate(case, [upstream_bytes(case)])
    assert events(out) == case["out"]
    expected = case["usage"]
    if expected is None:
        assert stream.usage() is None and stream.prompt_tokens is None
    else:
        assert (stream.prompt_tokens, stream.completion_tokens, stream.cached_tokens) == (
            expected["prompt_tokens"],
            expected["completion_tokens"],
            expected["cached_tokens"],
        )
        usage = stream.usage()
        assert usage is not None
        assert usage.total_tokens == expected["prompt_tokens"] + expected["completion_tokens"]


@pytest.mark.parametrize("case", STREAMS, ids=names(STREAMS))
def test_stream_events_are_what_the_sdk_reads(case: dict[str, Any]) -> None:
    out, _ = translate(case, [upstream_bytes(case)])
    snapshot = None
    bufs: dict[int, bytes] = {}
    for e in events(out):
        if e["event"] == "error":
            assert set(e["data"]["error"]) == {"type", "message"}
            return
        event = EVENT.validate_python(e["data"])
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None and snapshot.stop_reason is not None
    for block in snapshot.content:
        if block.type == "tool_use":
            assert isinstance(block.input, dict)


@pytest.mark.parametrize("case", STREAMS, ids=names(STREAMS))
def test_stream_split_at_every_byte(case: dict[str, Any]) -> None:
    data = upstream_bytes(case)
    whole, _ = translate(case, [data])
    for i, pieces in halves(data):
        assert translate(case, pieces)[0] == whole, i


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_stream_split_anywhere(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(STREAMS))
    raw = upstream_bytes(case)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    assert translate(case, cut_at(raw, cuts))[0] == translate(case, [raw])[0]


def test_one_byte_at_a_time_emits_as_soon_as_an_event_is_whole() -> None:
    case = STREAMS[0]
    raw = upstream_bytes(case)
    stream = StreamToAnthropic("m")
    first = raw.index(b"\n\n") + 2
    assert all(stream.feed(raw[i : i + 1]) == b"" for i in range(first - 1))
    assert stream.feed(raw[first - 1 : first]).startswith(b"event: message_start\n")


def test_ping() -> None:
    assert StreamToAnthropic("m").ping() == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_nothing_after_the_end() -> None:
    case = STREAMS[0]
    stream = StreamToAnthropic("m")
    stream.feed(upstream_bytes(case))
    assert stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"late"}}]}\n\n') == b""
    assert stream.finish() == b""


def test_empty_upstream_is_an_error() -> None:
    assert events(StreamToAnthropic("m").finish()) == [
        {
            "event": "error",
            "data": {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": "the backend's stream ended before the answer was complete",
                },
            },
        }
    ]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            b'{"object":"error","message":"max_tokens is too large",'
            b'"type":"BadRequestError","param":null,"code":400}',
            {"type": "invalid_request_error", "message": "max_tokens is too large"},
        ),
        (
            429,
            b'{"error":{"message":"Rate limit reached","type":"rate_limit_error",'
            b'"code":"rate_limit_exceeded"}}',
            {"type": "rate_limit_error", "message": "Rate limit reached"},
        ),
        (503, b"upstream connect error", {"type": "overloaded_error", "message": "upstream connect error"}),
        (500, b"", {"type": "api_error", "message": "upstream answered with status 500"}),
    ],
)
def test_error_to_anthropic(status: int, body: bytes, expected: dict[str, str]) -> None:
    assert orjson.loads(error_to_anthropic(status, body)) == {"type": "error", "error": expected}


@pytest.mark.parametrize("tools", [False, True])
def test_through_the_mock_engine(tools: bool) -> None:
    """Request translated, answered by the vLLM mock, answer translated back: whole and streamed."""
    body: dict[str, Any] = {
        "model": "claude",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "a b c"}],
    }
    if tools:
        body["tools"] = [{"name": "ping", "input_schema": {"type": "object"}}]
    req = parse_messages_request(orjson.dumps(body))
    whole = mock.chat_completion(orjson.loads(request_to_openai(req, "llama")), "llama", 9, "chatcmpl-1", 1)
    assert isinstance(whole, mock.Reply)
    message = anthropic.types.Message.model_validate_json(response_from_openai(whole.body, "claude"))
    assert message.usage.input_tokens == 3 and message.usage.output_tokens == 3
    assert message.stop_reason == ("tool_use" if tools else "max_tokens")

    req = parse_messages_request(orjson.dumps({**body, "stream": True}))
    streamed = mock.chat_completion(
        orjson.loads(request_to_openai(req, "llama")), "llama", 9, "chatcmpl-1", 1
    )
    assert isinstance(streamed, mock.StreamReply)
    stream = StreamToAnthropic("claude", input_tokens_estimate=3)
    out = b"".join(stream.feed(c) for c in streamed.chunks) + stream.finish()
    snapshot = None
    bufs: dict[int, bytes] = {}
    for e in events(out):
        snapshot = accumulate_event(
            event=EVENT.validate_python(e["data"]), current_snapshot=snapshot, json_bufs=bufs
        )
    assert snapshot is not None
    assert snapshot.model_dump(exclude={"id"}) == message.model_dump(exclude={"id"})
