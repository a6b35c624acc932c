"""Withholding the usage the gateway asked for: a client that did not ask gets the engine's stream without
usage, byte for byte, however the engine's pieces are cut (transcripts in tests/data/streams). Every case
runs with the nulls taken out in C, as the gateway does, and by the pure-Python reference; the two agree
on any bytes."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.native import strip_usage_nulls_c
from gateway.protocol.stream_usage import (
    EVENT_LIMIT,
    HOLD_LIMIT,
    Strip,
    UsageWithholder,
    strip_usage_nulls,
)
from tests.fixtures.transcripts import cut_at, halves
from tests.fixtures.twins import Twins

STREAMS = Path(__file__).resolve().parents[1] / "data" / "streams"
PAIRS = sorted(p.name.removesuffix(".include_usage.sse") for p in STREAMS.glob("*.include_usage.sse"))
STRIPS: Twins[Strip] = Twins(strip_usage_nulls, strip_usage_nulls_c)
strip = STRIPS.fixture("strip")


def withholder() -> UsageWithholder:
    return UsageWithholder(STRIPS.current)


def withheld(pieces: list[bytes]) -> bytes:
    w = withholder()
    return b"".join(w.feed(p) for p in pieces)


def pair(name: str) -> tuple[bytes, bytes]:
    return (STREAMS / f"{name}.include_usage.sse").read_bytes(), (STREAMS / f"{name}.sse").read_bytes()


def test_there_are_transcripts() -> None:
    assert len(PAIRS) >= 5


@pytest.mark.parametrize("name", PAIRS)
def test_whole_and_event_by_event(name: str) -> None:
    engine, expected = pair(name)
    assert withheld([engine]) == expected
    sep = b"\r\n\r\n" if b"\r\n" in engine else b"\n\n"
    events = [e + sep for e in engine.split(sep)[:-1]]
    assert withheld(events) == expected


@pytest.mark.parametrize("name", PAIRS)
def test_every_cut_in_two(name: str) -> None:
    engine, expected = pair(name)
    step = 1 if len(engine) < 4096 else 7
    for i, pieces in halves(engine):
        if i % step == 0:
            assert withheld(pieces) == expected, i


@pytest.mark.parametrize("name", PAIRS)
def test_random_cuts_and_single_bytes(name: str) -> None:
    engine, expected = pair(name)
    rng = random.Random(name)
    for _ in range(50):
        cuts = sorted(rng.randrange(len(engine) + 1) for _ in range(rng.randrange(1, 12)))
        assert withheld(cut_at(engine, cuts)) == expected, cuts
    tail = len(engine) - 600  # the usage chunk and [DONE] a byte at a time
    assert withheld([engine[:tail], *(engine[i : i + 1] for i in range(tail, len(engine)))]) == expected


def test_the_usage_chunk_is_held_only_until_what_follows_is_known() -> None:
    w = withholder()
    content = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'
    assert w.feed(content) == content  # no delay for an ordinary event
    assert w.feed(usage) == b""
    assert w.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    # Choices [] without usage (Azure's first chunk) is no usage chunk: it goes on at once.
    w = withholder()
    first = b'data: {"choices":[],"prompt_filter_results":[],"usage":null}\n\n'
    assert w.feed(first) == first.replace(b',"usage":null}', b"}")
    # A usage chunk that turns out not to be the last event goes out where it was.
    assert w.feed(usage) == b""
    assert w.feed(content) == usage + content
    # A stream that ends without [DONE]: the usage chunk, its last event, is never sent.
    w = withholder()
    assert w.feed(content + usage) == content


def test_what_only_looks_like_usage_passes_untouched() -> None:
    """Model output mentioning usage is inside JSON strings, where every quote is escaped."""
    odd = (
        b'data: {"choices":[{"delta":{"content":"\\"usage\\":null} \\"choices\\":[]"}}]}\n\n'
        b": a comment\n\n"
        b'data:{"choices":[{"delta":{}}],"usage":{"total_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert withheld([odd]) == odd
    for _, pieces in halves(odd):
        assert withheld(pieces) == odd


def test_an_unfinished_event_is_held_but_bounded() -> None:
    w = withholder()
    assert w.feed(b'data: {"choices":[{"delta":') == b""  # of no use to a client before its blank line
    assert w.feed(b'{}}]}\n\ndata: {"ch') == b'data: {"choices":[{"delta":{}}]}\n\n'
    big = b"x" * (HOLD_LIMIT + 10)
    assert w.feed(big) == b'data: {"ch' + big  # too long to be a usage chunk: it goes on unfinished


def test_a_long_last_event_is_never_taken_for_the_usage_chunk() -> None:
    """Only an event's last ``EVENT_LIMIT`` bytes are searched for where it starts: a longer one passes."""
    content = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    padded = b'data: {"choices":[],"usage":{"prompt_tokens":1},"pad":"' + b"x" * EVENT_LIMIT + b'"}\n\n'
    done = b"data: [DONE]\n\n"
    assert withheld([content + padded + done]) == content + padded + done
    assert withheld([content, padded, done]) == content + padded + done
    # A long content event before an ordinary usage chunk does not hide it.
    long = b'data: {"choices":[{"delta":{"content":"' + b"y" * (2 * EVENT_LIMIT) + b'"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'
    assert withheld([long + usage + done]) == long + done


_FRAGMENTS = st.sampled_from(
    [
        *(b',"usage":null', b', "usage": null', b'"usage"', b'"usag', b"usage", b"g", b'e"', b":null}"),
        *(b"}", b"\n", b"\r", b",", b" ", b"x", b'"'),
    ]
)


@settings(max_examples=500, deadline=None, database=None, derandomize=True)
@given(st.lists(_FRAGMENTS, max_size=24).map(b"".join))
def test_the_c_pass_agrees_with_the_reference(data: bytes) -> None:
    if STRIPS.native is not None:
        assert STRIPS.native(data) == strip_usage_nulls(data)


def test_the_c_pass_returns_the_piece_itself_when_nothing_goes(strip: Strip) -> None:
    piece = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    assert strip(piece)[0] is piece
    assert strip(b'data: {"choices":[],"usage":null}\n\n') == (b'data: {"choices":[]}\n\n', False)
    assert strip(b'data: {"choices":[],"usage":{"total_tokens":2}}\n\n')[1] is True
    assert strip(b"") == (b"", False)
    assert strip(b'"usage"') == (b'"usage"', True)


def test_a_piece_larger_than_the_kept_buffer(strip: Strip) -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"g"}}],"usage":null}\n\n'
    piece = chunk * (2 * (1 << 20) // len(chunk))
    assert strip(piece) == (piece.replace(b',"usage":null}', b"}"), False)
    assert strip(chunk) == (b'data: {"choices":[{"delta":{"content":"g"}}]}\n\n', False)


def test_threads_strip_into_buffers_of_their_own(strip: Strip) -> None:
    def many(letter: bytes) -> bool:
        chunk = b'data: {"choices":[{"delta":{"content":"' + letter * 300 + b'"}}],"usage":null}\n\n'
        expected = (chunk.replace(b',"usage":null}', b"}") * 20, False)
        return all(strip(chunk * 20) == expected for _ in range(300))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(many, [b"a", b"b", b"c", b"d"]))
