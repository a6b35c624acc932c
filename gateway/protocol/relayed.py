"""An estimate of the completion tokens in an answer that ended short, from what was relayed of it.

A stream the client abandoned, or one the backend broke off, usually ends before the engine's usage
report. What the gateway knows then is how many bytes it relayed and the last few KiB of them (the tap's
tail buffer). The estimate reads the content of the complete stream events in that tail (OpenAI chat and
completions, Anthropic and Responses API deltas: text, reasoning, refusals, tool-call arguments and custom
tool input), takes the share of those bytes that is content,
applies it to every byte relayed, and counts four characters a token (the usual ratio for English text
with these tokenizers). A tail with no stream events (a plain body cut short) counts four bytes a token.
It runs once per such answer, never per chunk. Sans-I/O: bytes in, a number out.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["CHARS_PER_TOKEN", "estimate_relayed_tokens"]

CHARS_PER_TOKEN = 4
# Delta members whose strings are generated text: OpenAI chat (content, reasoning), completions (text),
# Anthropic (text, thinking, partial_json of tool input).
_TEXT_KEYS = ("content", "reasoning_content", "reasoning", "text", "thinking", "partial_json")


def estimate_relayed_tokens(tail: bytes, relayed: int) -> int:
    """Completion tokens in ``relayed`` bytes of an answer whose last bytes are ``tail``."""
    if relayed <= 0:
        return 0
    lines = tail.split(b"\n")
    span = len(tail)
    if len(tail) < relayed:  # the tail is a window: its first line may begin mid-event, so it is left out
        span -= len(lines[0]) + 1
        lines = lines[1:]
    events = 0
    chars = 0
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        try:
            doc = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue  # [DONE], or an event cut at the end
        events += 1
        chars += _content_chars(doc)
    if not events:
        return -(-relayed // CHARS_PER_TOKEN)
    share = chars / max(span, 1)
    return -(-round(share * relayed) // CHARS_PER_TOKEN)


def _content_chars(doc: Any) -> int:
    if not isinstance(doc, dict):
        return 0
    n = 0
    choices = doc.get("choices")
    if isinstance(choices, list):  # OpenAI chat and completions chunks
        for choice in choices:
            if isinstance(choice, dict):
                delta = choice.get("delta")
                n += _delta_chars(delta if isinstance(delta, dict) else choice)
        return n
    delta = doc.get("delta")
    if isinstance(delta, str):  # Responses API: response.output_text.delta, ...arguments.delta, ...
        kind = doc.get("type")
        return len(delta) if isinstance(kind, str) and kind.endswith(".delta") else 0
    return _delta_chars(delta) if isinstance(delta, dict) else 0  # Anthropic content_block_delta


def _delta_chars(delta: dict[str, Any]) -> int:
    n = 0
    for key in _TEXT_KEYS:
        value = delta.get(key)
        if isinstance(value, str):
            n += len(value)
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                n += len(args)
    return n
