"""perf.sse_client's event reader (no sockets): an answer split anywhere, LF or CRLF framed, gives the
same content, TTFT and usage; a refusal's body is kept whole for the report."""

from __future__ import annotations

import json
import time

import pytest

from perf.sse_client import Answer, _Events

CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"content": "alpha"}}]},
    {"choices": [{"index": 0, "delta": {"content": " beta"}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    },
]


def _stream(newline: bytes) -> bytes:
    events = [b"data: " + json.dumps(c).encode() for c in CHUNKS] + [b"data: [DONE]"]
    return b"".join(e + newline + newline for e in events)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("piece", [1, 7, 10_000])
def test_split_anywhere(newline: bytes, piece: int) -> None:
    answer = Answer(status=200)
    events = _Events(answer, time.perf_counter())
    body = _stream(newline)
    for i in range(0, len(body), piece):
        events.feed(body[i : i + piece])
    assert "".join(answer.parts) == "alpha beta"
    assert answer.ttft is not None  # the first chunk with content, not the empty role chunk
    assert (answer.prompt_tokens, answer.cached_tokens) == (100, 64)


def test_no_content_no_ttft_and_a_refusal_kept() -> None:
    answer = Answer(status=200)
    _Events(answer, time.perf_counter()).feed(b'data: {"choices":[{"delta":{"content":""}}]}\n\n')
    assert answer.ttft is None and answer.parts == []
    refused = Answer(status=429)
    events = _Events(refused, time.perf_counter())
    events.feed(b'{"error": {"message": "slow down",')
    events.feed(b' "type": "rate_limit"}}')
    assert events.raw == b'{"error": {"message": "slow down", "type": "rate_limit"}}'
