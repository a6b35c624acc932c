"""``StreamTail``: the window written round gives exactly what the C tail buffer gives (the last
``capacity`` bytes, and the usage parsed from them), however the stream is cut, and never grows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.dataplane.stream_tail import StreamTail
from gateway.native import TailBuffer, parse_usage

DATA = Path(__file__).resolve().parent.parent / "data"
TRANSCRIPTS = sorted((DATA / "streams").glob("*.sse")) + [
    DATA / "usage" / name for name in sorted(json.loads((DATA / "usage" / "expected.json").read_text()))
]
QUICK = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def cut(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in zip([0, *marks], [*marks, len(data)], strict=True)]


@QUICK
@given(
    data=st.binary(max_size=3000),
    points=st.lists(st.integers(min_value=0, max_value=3000), max_size=40),
    capacity=st.integers(min_value=1, max_value=700),
)
def test_the_tail_is_the_last_capacity_bytes(data: bytes, points: list[int], capacity: int) -> None:
    tail = StreamTail(capacity)
    seen = b""
    for piece in cut(data, points):
        tail.append(piece)
        seen += piece
        assert tail.getvalue() == seen[-capacity:]
        assert len(tail) == len(seen[-capacity:])


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.name)
@QUICK
@given(points=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=60))
def test_usage_is_the_copying_buffers_in_every_cut(path: Path, points: list[int]) -> None:
    data = path.read_bytes()
    tail, copied = StreamTail(4096), TailBuffer(4096)
    for piece in cut(data, points):
        tail.append(piece)
        copied.append(piece)
    assert tail.usage() == copied.usage() == parse_usage(data[-4096:])
    assert tail.getvalue() == copied.getvalue()


def test_the_window_stays_its_capacity_however_much_is_written() -> None:
    tail = StreamTail(100)
    for i in range(50):
        tail.append(bytes([i]) * 30)
        assert len(tail._buf) == 100  # written round in place, never grown
    tail.append(b"y" * 1000)
    assert len(tail._buf) == 100 and tail.getvalue() == b"y" * 100
    tail.append(b"")
    assert tail.getvalue() == b"y" * 100


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StreamTail(0)
