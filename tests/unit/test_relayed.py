"""The estimate of what a cut stream relayed (``gateway.protocol.relayed``)."""

from __future__ import annotations

import orjson

from gateway.protocol.relayed import estimate_relayed_tokens
from gateway.protocol.sse import encode_event


def openai_chunk(text: str) -> bytes:
    doc = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def test_a_whole_short_stream_counts_its_content() -> None:
    stream = b"".join(openai_chunk(" tok") for _ in range(30))
    assert estimate_relayed_tokens(stream, len(stream)) == 30  # 120 characters, four a token


def test_a_long_stream_is_extrapolated_from_its_tail() -> None:
    stream = b"".join(openai_chunk(" tok") for _ in range(3000))
    tail = stream[-4096:]  # begins mid-event
    assert 2900 <= estimate_relayed_tokens(tail, len(stream)) <= 3100


def test_tool_call_arguments_reasoning_and_anthropic_deltas_count() -> None:
    call = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "x" * 40}}]}}]}
    reasoning = {"choices": [{"delta": {"reasoning_content": "y" * 40}}]}
    delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "z" * 40}}
    stream = (
        b"data: " + orjson.dumps(call) + b"\n\n"
        b"data: "
        + orjson.dumps(reasoning)
        + b"\n\n"
        + encode_event("content_block_delta", orjson.dumps(delta))
    )
    assert estimate_relayed_tokens(stream, len(stream)) == 30


def test_events_without_content_count_nothing_and_plain_bodies_count_bytes() -> None:
    stream = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\ndata: [DONE]\n\n'
    assert estimate_relayed_tokens(stream, len(stream)) == 0
    assert estimate_relayed_tokens(b'{"choices":[{"message":{"content":"abcdefgh', 43) == 11
    assert estimate_relayed_tokens(b"", 0) == 0


def test_responses_api_deltas_count() -> None:
    """Responses API events carry their delta as a string (text, function arguments, reasoning, custom tool
    input); a cut Responses stream is billed for them like a chat stream (issue 29: it was billed 0)."""
    events = [
        {"type": "response.created", "response": {"id": "r", "output": []}},
        {"type": "response.output_text.delta", "delta": "a" * 40, "item_id": "m", "output_index": 0},
        {"type": "response.function_call_arguments.delta", "delta": "b" * 40, "item_id": "f"},
        {"type": "response.reasoning_text.delta", "delta": "c" * 20, "item_id": "r"},
        {"type": "response.custom_tool_call_input.delta", "delta": "d" * 20, "item_id": "c"},
        {"type": "response.output_text.done", "text": "a" * 40, "item_id": "m"},
    ]
    stream = b"".join(encode_event(e["type"], orjson.dumps(e)) for e in events)
    assert estimate_relayed_tokens(stream, len(stream)) == 30
    long = stream * 200
    assert 5700 <= estimate_relayed_tokens(long[-4096:], len(long)) <= 6300
