"""Translation cost in-process: microseconds per request (the request's translation, plus the parse of the
client's body and the translation of a non-streamed answer) and per streamed event, for each translator.

    .venv/bin/python -m perf.micro_translate [--seconds 1.0]

Inputs are realistic small ones: a short conversation with a system prompt and one tool; answers of a few
sentences; a stream of 64 content events plus its usage chunk. Each figure is the best of 5 timed batches
(``timeit``'s advice: the minimum is the least disturbed by the rest of the machine). No I/O.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

import orjson

from gateway.protocol import anthropic_openai, openai_anthropic, openai_gemini
from gateway.protocol.anthropic import parse_messages_request

TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {}}}
MESSAGES = orjson.dumps(
    {
        "model": "claude",
        "max_tokens": 256,
        "system": "You are a helpful assistant. Answer briefly.",
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": "What is the weather in Paris today?"},
            {"role": "assistant", "content": "Let me check that for you."},
            {"role": "user", "content": "Thanks, and tomorrow?"},
        ],
    }
)
CHAT = orjson.dumps(
    {
        "model": "chat",
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "What is the weather in Paris today?"},
            {"role": "assistant", "content": "Let me check that for you."},
            {"role": "user", "content": "Thanks, and tomorrow?"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ],
    }
)
TEXT = "Tomorrow in Paris: light rain in the morning, clearing by the afternoon, 14 degrees."
OPENAI_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 60, "completion_tokens": 20, "total_tokens": 80},
    }
)
ANTHROPIC_ANSWER = orjson.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": TEXT}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 60, "output_tokens": 20},
    }
)
GEMINI_ANSWER = orjson.dumps(
    {
        "candidates": [{"content": {"role": "model", "parts": [{"text": TEXT}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 60, "candidatesTokenCount": 20, "totalTokenCount": 80},
    }
)
EVENTS = 64


def _openai_stream() -> list[bytes]:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [
        b"data: "
        + orjson.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        + b"\n\n"
    ]
    for i in range(EVENTS):
        delta = {"index": 0, "delta": {"content": f" word{i}"}, "finish_reason": None}
        out.append(b"data: " + orjson.dumps({**head, "choices": [delta]}) + b"\n\n")
    out.append(
        b"data: " + orjson.dumps({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    )
    out[-1] += b"\n\n"
    usage = {"prompt_tokens": 60, "completion_tokens": EVENTS, "total_tokens": 60 + EVENTS}
    out.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n")
    return out


def _anthropic_stream() -> list[bytes]:
    def ev(name: str, doc: dict[str, object]) -> bytes:
        return f"event: {name}\ndata: ".encode() + orjson.dumps(doc) + b"\n\n"

    message = {"id": "msg", "type": "message", "role": "assistant", "model": "m", "content": []}
    out = [
        ev("message_start", {"type": "message_start", "message": {**message, "usage": {"input_tokens": 60}}})
    ]
    out.append(ev("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {}}))
    for i in range(EVENTS):
        delta = {"type": "text_delta", "text": f" word{i}"}
        out.append(ev("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    out.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
    delta_doc = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": EVENTS},
    }
    out.append(ev("message_delta", delta_doc))
    out.append(ev("message_stop", {"type": "message_stop"}))
    return out


def _gemini_stream() -> list[bytes]:
    out = []
    for i in range(EVENTS):
        doc = {"candidates": [{"content": {"role": "model", "parts": [{"text": f" word{i}"}]}}]}
        out.append(b"data: " + orjson.dumps(doc) + b"\r\n\r\n")
    last = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "."}]}, "finishReason": "STOP"}],
        "usageMetadata": {
            "promptTokenCount": 60,
            "candidatesTokenCount": EVENTS,
            "totalTokenCount": 60 + EVENTS,
        },
    }
    out.append(b"data: " + orjson.dumps(last) + b"\r\n\r\n")
    return out


def best_us(fn: Callable[[], object], seconds: float) -> float:
    number = max(1, int(seconds / 5 / max(timeit.timeit(fn, number=3) / 3, 1e-9)))
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def cases() -> list[tuple[str, Callable[[], object], int]]:
    """(name, work, events it handles) — per-event cost is work / events."""
    openai_stream, anthropic_stream, gemini_stream = _openai_stream(), _anthropic_stream(), _gemini_stream()

    def anthropic_request() -> object:
        return anthropic_openai.request_to_openai(parse_messages_request(MESSAGES), "upstream")

    def stream_to_anthropic() -> object:
        t = anthropic_openai.StreamToAnthropic("claude")
        for chunk in openai_stream:
            t.feed(chunk)
        return t.finish()

    def stream_from_anthropic() -> object:
        t = openai_anthropic.AnthropicStreamToOpenAI("chat", include_usage=True)
        for chunk in anthropic_stream:
            t.feed(chunk)
        return t.finish()

    def stream_from_gemini() -> object:
        t = openai_gemini.GeminiStreamToOpenAI("chat", include_usage=True)
        for chunk in gemini_stream:
            t.feed(chunk)
        return t.finish()

    return [
        ("anthropic client -> openai backend: parse + request", anthropic_request, 0),
        (
            "anthropic client -> openai backend: answer",
            lambda: anthropic_openai.response_from_openai(OPENAI_ANSWER, "claude"),
            0,
        ),
        ("anthropic client -> openai backend: stream", stream_to_anthropic, len(openai_stream)),
        (
            "openai client -> anthropic backend: request",
            lambda: openai_anthropic.request_to_anthropic(CHAT, "m", 4096),
            0,
        ),
        (
            "openai client -> anthropic backend: answer",
            lambda: openai_anthropic.response_to_openai(ANTHROPIC_ANSWER, "chat"),
            0,
        ),
        ("openai client -> anthropic backend: stream", stream_from_anthropic, len(anthropic_stream)),
        ("openai client -> gemini backend: request", lambda: openai_gemini.request_to_gemini(CHAT), 0),
        (
            "openai client -> gemini backend: answer",
            lambda: openai_gemini.response_to_openai(GEMINI_ANSWER, "chat"),
            0,
        ),
        ("openai client -> gemini backend: stream", stream_from_gemini, len(gemini_stream)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per case")
    args = parser.parse_args()
    print("| translation | µs per call | events | µs per event |")
    print("|---|---:|---:|---:|")
    for name, fn, events in cases():
        us = best_us(fn, args.seconds)
        per_event = f"{us / events:.2f}" if events else "—"
        print(f"| {name} | {us:.1f} | {events or '—'} | {per_event} |")


if __name__ == "__main__":
    main()
