"""OpenAI client, Gemini backend: requests, answers and streams against transcripts in tests/data."""

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
from gateway.mockengine import gemini as mock
from gateway.mockengine.responses import Reply, StreamReply
from gateway.protocol.openai_gemini import (
    GeminiStreamToOpenAI,
    error_to_openai,
    request_to_gemini,
    response_to_openai,
)
from tests.fixtures.transcripts import cut_at, expected_chunks, halves, load, names, openai_chunks

REQUESTS = load("openai_gemini_requests")
ERRORS = load("openai_request_errors")
RESPONSES = load("openai_gemini_responses")
STREAMS = load("openai_gemini_streams")
CREATED = 1735689600


def upstream_bytes(case: dict[str, Any]) -> bytes:
    eol = "\r\n" if case.get("framing") == "crlf" else "\n"
    return "".join("data: " + json.dumps(item["data"]) + eol + eol for item in case["in"]).encode()


def translate(case: dict[str, Any], pieces: list[bytes]) -> tuple[bytes, GeminiStreamToOpenAI]:
    stream = GeminiStreamToOpenAI(case["model"], include_usage=case["include_usage"], created=CREATED)
    return b"".join(stream.feed(p) for p in pieces) + stream.finish(), stream


@pytest.mark.parametrize("case", REQUESTS, ids=names(REQUESTS))
def test_request(case: dict[str, Any]) -> None:
    suffix, body = request_to_gemini(orjson.dumps(case["in"]))
    assert suffix == case["suffix"]
    assert orjson.loads(body) == case["out"]


@pytest.mark.parametrize(
    "case", [c for c in ERRORS["cases"] if "gemini" in c["to"]], ids=lambda c: c["param"]
)
def test_bad_fields_are_named(case: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as info:
        request_to_gemini(orjson.dumps({**ERRORS["base"], **case["set"]}))
    assert info.value.param == case["param"]


@pytest.mark.parametrize("body", [b"", b"{", b"[]"])
def test_request_not_an_object(body: bytes) -> None:
    with pytest.raises(BadRequest):
        request_to_gemini(body)


def test_tool_results_find_their_call_by_id() -> None:
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "[1, 2]"},
    ]
    _, body = request_to_gemini(orjson.dumps({"model": "g", "messages": messages}))
    part = orjson.loads(body)["contents"][2]["parts"][0]
    assert part == {"functionResponse": {"name": "f", "response": {"output": "[1, 2]"}}}  # not an object


@pytest.mark.parametrize("case", RESPONSES, ids=names(RESPONSES))
def test_response(case: dict[str, Any]) -> None:
    out = response_to_openai(orjson.dumps(case["in"]), case["model"], created=CREATED)
    assert orjson.loads(out) == case["out"]
    openai.types.chat.ChatCompletion.model_validate_json(out)


def test_response_without_response_id_gets_unique_ids() -> None:
    body = orjson.dumps(
        {"candidates": [{"content": {"parts": [{"functionCall": {"name": "f"}}]}, "index": 0}]}
    )
    first, second = (orjson.loads(response_to_openai(body, "m")) for _ in range(2))
    assert first["id"] != second["id"]
    assert (
        first["choices"][0]["message"]["tool_calls"][0]["id"]
        != second["choices"][0]["message"]["tool_calls"][0]["id"]
    )


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b"<html>",
        # Neither candidates nor a blocked prompt: no answer Gemini gives (issue 29: it became an empty
        # "completed" Response and a chat completion with nothing in it).
        b"{}",
        b'{"candidates": [], "usageMetadata": {"promptTokenCount": 3}}',
        b'{"promptFeedback": {"safetyRatings": []}}',
    ],
)
def test_response_that_is_not_json(body: bytes) -> None:
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
        assert stream.usage() is not None


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
    final = state.current_completion_snapshot
    assert all(choice.finish_reason is not None for choice in final.choices)


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


def test_a_last_event_without_its_blank_line_still_counts() -> None:
    case = STREAMS[0]
    raw = upstream_bytes(case).removesuffix(b"\r\n")
    assert translate(case, [raw])[0] == translate(case, [upstream_bytes(case)])[0]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            b'{"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}',
            {
                "message": "API key not valid.",
                "type": "invalid_request_error",
                "param": None,
                "code": "INVALID_ARGUMENT",
            },
        ),
        (
            429,
            b'{"error": {"code": 429, "message": "Resource has been exhausted",'
            b' "status": "RESOURCE_EXHAUSTED"}}',
            {
                "message": "Resource has been exhausted",
                "type": "invalid_request_error",
                "param": None,
                "code": "RESOURCE_EXHAUSTED",
            },
        ),
        (
            500,
            b"oops",
            {
                "message": "the backend answered with status 500",
                "type": "server_error",
                "param": None,
                "code": 500,
            },
        ),
    ],
)
def test_error_to_openai(status: int, body: bytes, expected: dict[str, Any]) -> None:
    assert orjson.loads(error_to_openai(status, body)) == {"error": expected}


@pytest.mark.parametrize("tools", [False, True])
def test_through_the_mock_engine(tools: bool) -> None:
    """Translated, answered by the Gemini mock, translated back: whole and streamed answers agree."""
    body: dict[str, Any] = {
        "model": "gpt",
        "messages": [{"role": "user", "content": "a b c d"}],
        "max_tokens": 2,
    }
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "ping"}}]
    suffix, upstream = request_to_gemini(orjson.dumps(body))
    assert suffix == ":generateContent"
    whole = mock.generate(orjson.loads(upstream), "gemini", 3, "r1", 1, stream=False)
    assert isinstance(whole, Reply)
    completion = openai.types.chat.ChatCompletion.model_validate_json(response_to_openai(whole.body, "gpt"))
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 2)
    assert completion.usage.prompt_tokens_details.cached_tokens == 1
    assert completion.choices[0].finish_reason == ("tool_calls" if tools else "length")

    suffix, upstream = request_to_gemini(orjson.dumps({**body, "stream": True}))
    assert suffix == ":streamGenerateContent?alt=sse"
    streamed = mock.generate(orjson.loads(upstream), "gemini", 3, "r1", 1, stream=True)
    assert isinstance(streamed, StreamReply)
    stream = GeminiStreamToOpenAI("gpt", include_usage=True, created=completion.created)
    out = b"".join(stream.feed(c) for c in streamed.chunks) + stream.finish()
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in openai_chunks(out)[:-1]:
        list(state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(chunk)))
    final = state.current_completion_snapshot
    assert final.usage == completion.usage
    assert final.choices[0].finish_reason == completion.choices[0].finish_reason
    assert (final.choices[0].message.content or None) == completion.choices[0].message.content
    streamed_calls: list[Any] = final.choices[0].message.tool_calls or []
    whole_calls: list[Any] = completion.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in streamed_calls] == [
        (c.id, c.function.name, c.function.arguments) for c in whole_calls
    ]
