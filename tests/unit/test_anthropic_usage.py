"""The usage meter of verbatim Anthropic answers: streams and bodies, in any pieces, in bounded memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.anthropic_usage import AnthropicUsageMeter
from gateway.protocol.usage import Usage, parse_usage
from tests.fixtures.transcripts import cut_at

ROOT = Path(__file__).resolve().parents[1] / "data"
CASES = json.loads((ROOT / "translate" / "anthropic_usage.json").read_text())
FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def body_of(case: dict[str, Any]) -> bytes:
    if "body" in case:
        return str(case["body"]).encode()
    out = []
    for item in case["in"]:
        head = f"event: {item['event']}\n" if "event" in item else ""
        out.append(head + "data: " + json.dumps(item["data"]) + "\n\n")
    return "".join(out).encode()


def meter(pieces: list[bytes], max_event_bytes: int = 64 * 1024) -> AnthropicUsageMeter:
    m = AnthropicUsageMeter(max_event_bytes)
    for p in pieces:
        m.feed(p)
    m.finish()
    return m


def reading(m: AnthropicUsageMeter) -> dict[str, int | None] | None:
    if m.usage() is None:
        return None
    return {f: getattr(m, f) for f in FIELDS}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_usage(case: dict[str, Any]) -> None:
    m = meter([body_of(case)])
    assert reading(m) == case["usage"]
    usage = m.usage()
    if usage is not None:
        prompt = sum(getattr(m, f) or 0 for f in FIELDS if f != "output_tokens")
        assert usage == Usage(
            prompt, m.output_tokens or 0, prompt + (m.output_tokens or 0), m.cache_read_input_tokens or 0
        )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_split_at_every_byte(case: dict[str, Any]) -> None:
    data = body_of(case)
    for i in range(len(data) + 1):
        assert reading(meter([data[:i], data[i:]])) == case["usage"], i


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_split_anywhere(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES))
    raw = body_of(case)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    pieces = cut_at(raw, cuts)
    assert reading(meter(pieces)) == case["usage"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("anthropic_stream.sse", Usage(1525, 15, 1540, 1500)),
        ("anthropic_stream_output_only.sse", Usage(1525, 15, 1540, 1500)),
        ("anthropic_message.json", Usage(2257, 393, 2650, 2048)),
    ],
)
def test_the_usage_transcripts(name: str, expected: Usage) -> None:
    """Where the tail parser reads the output-only stream as 0 prompt tokens, the meter does not."""
    data = (ROOT / "usage" / name).read_bytes()
    assert meter([data]).usage() == expected
    if name == "anthropic_stream_output_only.sse":
        tail = parse_usage(data[-4096:])
        assert tail is not None and tail.prompt_tokens == 0


def stream_with_a_huge_delta(size: int) -> bytes:
    start = {
        "type": "message_start",
        "message": {"id": "m", "usage": {"input_tokens": 9, "output_tokens": 1}},
    }
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * size}}
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 70000}}
    return b"".join(
        b"event: " + str(e["type"]).encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in (start, delta, end)
    )


def test_memory_stays_bounded() -> None:
    data = stream_with_a_huge_delta(1_000_000)
    m = AnthropicUsageMeter(max_event_bytes=65536)
    for i in range(0, len(data), 1000):
        m.feed(data[i : i + 1000])
        assert len(m._sse._buf) <= 65536
    m.finish()
    assert (m.input_tokens, m.output_tokens, m.dropped_events) == (9, 70000, 1)


def test_events_under_the_cap_are_read_and_over_it_dropped() -> None:
    data = stream_with_a_huge_delta(100)
    assert meter([data], max_event_bytes=1000).dropped_events == 0
    assert meter([data], max_event_bytes=150).dropped_events == 1
    assert meter([data], max_event_bytes=150).output_tokens == 70000


def test_a_long_json_body_keeps_only_its_tail() -> None:
    text = "y" * 100_000
    body = orjson.dumps(
        {
            "id": "msg",
            "type": "message",
            "content": [{"type": "text", "text": text}],
            "usage": {
                "input_tokens": 5,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 6,
            },
        }
    )
    m = AnthropicUsageMeter()
    for i in range(0, len(body), 4000):
        m.feed(body[i : i + 4000])
        assert m._tail is not None and len(m._tail) <= 4096
    m.finish()
    assert (m.input_tokens, m.output_tokens) == (5, 6)


@pytest.mark.parametrize(
    "data", [b"", b"   \n", b"garbage", b"{not json", b"data: {nope\n\n", b"data: [1]\n\n"]
)
def test_nothing_readable(data: bytes) -> None:
    assert meter([data]).usage() is None


def test_out_of_range_counts_are_ignored() -> None:
    data = b'data: {"type":"message_start","message":{"usage":{"input_tokens":-1,"output_tokens":true}}}\n\n'
    data += b'data: {"type":"message_delta","usage":{"output_tokens":3.5,"cache_read_input_tokens":2}}\n\n'
    m = meter([data])
    assert (m.input_tokens, m.output_tokens, m.cache_read_input_tokens) == (None, None, 2)
    assert m.usage() is None
