"""The SSE decoder and encoder: framing variants, pieces split anywhere, the size cap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.sse import Event, SSEDecoder, encode_event
from tests.fixtures.transcripts import cut_at

MIXED = (
    b"\xef\xbb\xbf: a comment first, after a BOM\n"
    b"event: message_start\n"
    b'data: {"type":"message_start"}\n'
    b"\n"
    b"data: first line\r\n"
    b"data: second line\r\n"
    b"id: 7\r\n"
    b"retry: 1000\r\n"
    b"\r\n"
    b"event: lone\r"
    b"data:no space\r"
    b"data:  two spaces\r"
    b"data\r"
    b"\r"
    b"event: no data, not dispatched\n"
    b"\n"
    b"data: caf\xc3\xa9 \xe2\x82\xac\n"
    b"\n"
    b"data: [DONE]\n\n"
)
MIXED_EVENTS = [
    Event("message_start", '{"type":"message_start"}'),
    Event(None, "first line\nsecond line"),
    Event("lone", "no space\n two spaces\n"),
    Event(None, "café €"),
    Event(None, "[DONE]"),
]


def decode(pieces: list[bytes], max_event_bytes: int | None = None) -> list[Event]:
    d = SSEDecoder(max_event_bytes)
    out = [e for p in pieces for e in d.feed(p)]
    return out + d.close()


def test_framing_variants() -> None:
    assert decode([MIXED]) == MIXED_EVENTS


def test_split_at_every_byte() -> None:
    for i in range(len(MIXED) + 1):
        assert decode([MIXED[:i], MIXED[i:]]) == MIXED_EVENTS, i


def test_one_byte_at_a_time() -> None:
    assert decode([MIXED[i : i + 1] for i in range(len(MIXED))]) == MIXED_EVENTS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(MIXED)), max_size=20))
def test_split_anywhere(cuts: list[int]) -> None:
    cuts.sort()
    pieces = cut_at(MIXED, cuts)
    assert decode(pieces) == MIXED_EVENTS


def test_events_come_out_as_soon_as_they_are_whole() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\n") == []
    assert d.feed(b"\n") == [Event(None, "a")]
    assert d.feed(b"data: b\r") == []
    assert d.feed(b"\r") == [Event(None, "b")]  # CR CR: two line ends, dispatched without waiting
    assert d.feed(b"\ndata: c\n\n") == [Event(None, "c")]  # and the LF after them is a blank line


def test_crlf_split_between_pieces_counts_once() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"\n\r") == [Event(None, "a")]
    assert d.feed(b"\ndata: b\r\n\r\n") == [Event(None, "b")]


def test_event_name_does_not_leak_into_the_next_event() -> None:
    assert decode([b"event: x\ndata: 1\n\ndata: 2\n\n"]) == [Event("x", "1"), Event(None, "2")]


def test_close_dispatches_an_unterminated_event() -> None:
    assert decode([b"data: 1\n\ndata: 2"]) == [Event(None, "1"), Event(None, "2")]
    assert decode([b"event: e\ndata: 3\n"]) == [Event("e", "3")]
    assert decode([b"event: e\n"]) == []
    assert decode([b""]) == []


def test_invalid_utf8_is_replaced() -> None:
    assert decode([b"data: \xff\n\n"]) == [Event(None, "\ufffd")]


def test_a_bom_split_in_two() -> None:
    assert decode([b"\xef", b"\xbb", b"\xbfdata: x\n\n"]) == [Event(None, "x")]
    assert decode([b"\xef\xbbdata: x\n\n"]) == []  # half a BOM is part of the field name


def test_only_a_leading_bom_is_stripped() -> None:
    assert decode([b"data: a\n\n\xef\xbb\xbfdata: b\n\n"]) == [Event(None, "a")]  # field name is not "data"


def test_oversize_events_are_dropped_and_the_stream_goes_on() -> None:
    big = b"event: content_block_delta\ndata: " + b"x" * 200 + b"\n\n"
    many_lines = b"".join(b"data: " + b"y" * 30 + b"\n" for _ in range(10)) + b"\n"
    stream = b"data: small\n\n" + big + many_lines + b'event: message_delta\ndata: {"n":1}\n\n'
    for cut in range(len(stream) + 1):
        d = SSEDecoder(max_event_bytes=100)
        out = d.feed(stream[:cut]) + d.feed(stream[cut:]) + d.close()
        assert out == [Event(None, "small"), Event("message_delta", '{"n":1}')], cut
        assert d.dropped == 2


def test_a_huge_line_is_never_held() -> None:
    d = SSEDecoder(max_event_bytes=64)
    d.feed(b"data: ")
    for _ in range(100):
        d.feed(b"z" * 1000)
        assert len(d._buf) <= 64
    assert d.feed(b"\n\ndata: after\n\n") == [Event(None, "after")]
    assert d.dropped == 1


def test_the_end_of_a_dropped_line_is_not_a_blank_line() -> None:
    d = SSEDecoder(max_event_bytes=16)
    assert d.feed(b"data: " + b"a" * 40) == []
    # The LF ends the dropped line; the event goes on being dropped until its own blank line.
    assert d.feed(b"\ndata: tail of the same event\n\ndata: ok\n\n") == [Event(None, "ok")]


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SSEDecoder(0)


@pytest.mark.parametrize(
    ("event", "data", "wire"),
    [
        ("ping", b'{"type":"ping"}', b'event: ping\ndata: {"type":"ping"}\n\n'),
        (None, b"[DONE]", b"data: [DONE]\n\n"),
        (None, b"a\nb", b"data: a\ndata: b\n\n"),
        ("x", b"a\r\nb\rc", b"event: x\ndata: a\ndata: b\ndata: c\n\n"),
        (None, b"", b"data: \n\n"),
    ],
)
def test_encode_event(event: str | None, data: bytes, wire: bytes) -> None:
    assert encode_event(event, data) == wire


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), min_size=1),
    ),
    st.text(st.characters(blacklist_characters="\r", blacklist_categories=["Cs"])),
)
def test_encode_then_decode(event: str | None, data: str) -> None:
    assert decode([encode_event(event, data.encode())]) == [Event(event, data)]
