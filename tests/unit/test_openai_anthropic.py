"""OpenAI client, Anthropic backend: requests, answers and streams against transcripts in tests/data."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.mockengine import anthropic as mock
from gateway.mockengine.responses import Reply, StreamReply
from gateway.protocol.anthropic import parse_messages_request
from gateway.protocol.openai_anthropic import (
    AnthropicStreamToOpenAI,
    error_to_openai,
    request_to_anthropic,
    response_to_openai,
)
from tests.fixtures.transcripts import cut_at, expected_chunks, halves, load, names, openai_chunks

REQUESTS = load("openai_anthropic_requests")
ERRORS = load("openai_request_errors")
RESPONSES = load("openai_anthropic_responses")
STREAMS = load("openai_anthropic_streams")
CREATED = 1735689600


def upstream_bytes(case: dict[str, Any]) -> bytes:
    eol = "\r\n" if case.get("framing") == "crlf" else "\n"
    out = []
    for item in case["in"]:
        if "raw" in item:
            out.append(item["raw"] + eol + eol)
        else:
            head = f"event: {item['event']}{eol}" if "event" in item else ""
            out.append(head + "data: " + json.dumps(item["data"]) + eol + eol)
    return "".join(out).encode()


def translate(case: dict[str, Any], pieces: list[bytes]) -> tuple[bytes, AnthropicStreamToOpenAI]:
    stream = AnthropicStreamToOpenAI(case["model"], include_usage=case["include_usage"], created=CREATED)
    return b"".join(stream.feed(p) for p in pieces) + stream.finish(), stream


@pytest.mark.parametrize("case", REQUESTS, ids=names(REQUESTS))
def test_request(case: dict[str, Any]) -> None:
    out = request_to_anthropic(orjson.dumps(case["in"]), case["upstream_model"], case["default_max_tokens"])
    assert orjson.loads(out) == case["out"]
    parse_messages_request(out)  # and it is a valid Messages request by our own checks


@pytest.mark.parametrize(
    "case", [c for c in ERRORS["cases"] if "anthropic" in c["to"]], ids=lambda c: c["param"]
)
def test_bad_fields_are_named(case: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as info:
        request_to_anthropic(orjson.dumps({**ERRORS["base"], **case["set"]}), "claude", 100)
    assert info.value.param == case["param"]
    assert orjson.loads(info.value.openai_body())["error"]["param"] == case["param"]


@pytest.mark.parametrize("body", [b"", b"{", b"[]"])
def test_request_not_an_object(body: bytes) -> None:
    with pytest.raises(BadRequest):
        request_to_anthropic(body, "claude", 100)


@pytest.mark.parametrize("case", RESPONSES, ids=names(RESPONSES))
def test_response(case: dict[str, Any]) -> None:
    out = response_to_openai(orjson.dumps(case["in"]), case["model"], created=CREATED)
    assert orjson.loads(out) == case["out"]
    openai.types.chat.ChatCompletion.model_validate_json(out)


@pytest.mark.parametrize("body", [b"", b"[]", b'{"type": "message"}', b'{"content": "text"}'])
def test_response_that_is_not_a_message(body: bytes) -> None:
    with pytest.raises(BadUpstreamResponse):
        response_to_openai(body, "m")


@pytest.mark.parametrize("case", STREAMS, ids=names(STREAMS))
def test_stream(case: dict[str, Any]) -> None:
    out, stream = translate(case, [upstream_bytes(case)])
    assert openai_chunks(out) == expected_chunks(case)
    usage = case["usage"]
    if usage is None:
        assert stream.usage() is None and stream.prompt_tokens is None
    else:
        assert (stream.prompt_tokens, stream.completion_tokens, stream.cached_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["cached_tokens"],
        )
        total = stream.usage()
        assert total is not None and total.total_tokens == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("case", STREAMS, ids=names(STREAMS))
def test_stream_chunks_are_what_the_sdk_reads(case: dict[str, Any]) -> None:
    out, _ = translate(case, [upstream_bytes(case)])
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in openai_chunks(out):
        if chunk == "[DONE]":
            break
        if "error" in chunk:
            assert set(chunk["error"]) == {"message", "type", "param", "code"}
            return
        list(state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(chunk)))
    final = state.current_completion_snapshot  # get_final_completion raises on finish_reason length
    assert final.choices[0].finish_reason is not None
    for call in final.choices[0].message.tool_calls or []:
        assert isinstance(json.loads(call.function.arguments), dict)


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


def test_nothing_after_the_end() -> None:
    stream = AnthropicStreamToOpenAI("m", include_usage=False)
    assert stream.feed(upstream_bytes(STREAMS[0])).endswith(b"data: [DONE]\n\n")
    assert stream.feed(b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n') == b""
    assert stream.finish() == b""


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            529,
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}',
            {"message": "Overloaded", "type": "server_error", "param": None, "code": "overloaded_error"},
        ),
        (
            400,
            b'{"type":"error","error":{"type":"invalid_request_error",'
            b'"message":"max_tokens: Field required"}}',
            {
                "message": "max_tokens: Field required",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request_error",
            },
        ),
        (
            429,
            b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}',
            {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limit_error"},
        ),
        (
            502,
            b"<html>Bad Gateway</html>",
            {"message": "<html>Bad Gateway</html>", "type": "server_error", "param": None, "code": 502},
        ),
    ],
)
def test_error_to_openai(status: int, body: bytes, expected: dict[str, Any]) -> None:
    assert orjson.loads(error_to_openai(status, body)) == {"error": expected}


@pytest.mark.parametrize("tools", [False, True])
def test_through_the_mock_engine(tools: bool) -> None:
    """Translated, answered by the Anthropic mock (which checks the body), translated back: whole and
    streamed answers agree, and the usage of both is the mock's."""
    body: dict[str, Any] = {
        "model": "gpt",
        "messages": [{"role": "user", "content": "a b c d"}],
        "max_tokens": 5,
    }
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "ping"}}]
    upstream = request_to_anthropic(orjson.dumps(body), "claude", 100)
    whole = mock.messages(upstream, "claude", 3, "msg_1", cache_read=2)
    assert isinstance(whole, Reply)
    completion = openai.types.chat.ChatCompletion.model_validate_json(response_to_openai(whole.body, "gpt"))
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 3)
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 2

    upstream = request_to_anthropic(orjson.dumps({**body, "stream": True}), "claude", 100)
    streamed = mock.messages(upstream, "claude", 3, "msg_1", cache_read=2)
    assert isinstance(streamed, StreamReply)
    stream = AnthropicStreamToOpenAI("gpt", include_usage=True, created=completion.created)
    out = b"".join(stream.feed(c) for c in streamed.chunks) + stream.finish()
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in openai_chunks(out)[:-1]:
        list(state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(chunk)))
    final = state.get_final_completion()
    assert final.usage == completion.usage
    assert final.choices[0].finish_reason == completion.choices[0].finish_reason
    # The role chunk's "" (as vLLM and OpenAI send it) accumulates to "" where the whole answer has null.
    assert (final.choices[0].message.content or None) == completion.choices[0].message.content
    streamed_calls: list[Any] = final.choices[0].message.tool_calls or []
    whole_calls: list[Any] = completion.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in streamed_calls] == [
        (c.id, c.function.name, json.loads(c.function.arguments)) for c in whole_calls
    ]
