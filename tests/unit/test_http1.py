"""The sans-I/O HTTP/1.1 parser and serializer: every framing, fed whole and in every split, and every
way a response can be malformed. No sockets. Every parser case runs with a read's whole chunks walked by
the pure-Python reference and by its C twin, as the gateway's client runs it; the two agree on any bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.native import whole_chunks_c
from gateway.protocol.http1 import (
    END,
    MAX_HEADER_BYTES,
    HTTP1Error,
    ResponseHead,
    ResponseParser,
    WholeChunks,
    serialize_head,
    serialize_request,
    whole_chunks,
)
from tests.fixtures.twins import Twins

WALKS: Twins[WholeChunks] = Twins(whole_chunks, whole_chunks_c)
walk = WALKS.fixture("walk")


def new_parser(**kwargs: Any) -> ResponseParser:
    """A parser walking whole chunks the running case's way."""
    return ResponseParser(chunks=WALKS.current, **kwargs)


@dataclass(frozen=True)
class Outcome:
    """What a parser made of a response, independent of how the bytes were split."""

    status: int
    headers: list[tuple[str, str]]
    content_length: int | None
    content_type: str
    body: bytes
    ended: bool
    keep_alive: bool


def run(pieces: list[bytes], *, head_request: bool = False, eof: bool = False) -> Outcome:
    parser = new_parser(head_request=head_request)
    events: list[object] = []
    for piece in pieces:
        events += parser.feed(piece)
    if eof:
        events += parser.feed_eof()
    heads = [e for e in events if isinstance(e, ResponseHead)]
    assert len(heads) == 1, events
    assert events[0] is heads[0]  # the head comes first
    ends = [i for i, e in enumerate(events) if e is END]
    assert ends in ([], [len(events) - 1])  # END, if any, comes last and once
    body_events = [e for e in events[1:] if isinstance(e, bytes)]
    assert all(body_events), "no empty body pieces"
    head = heads[0]
    return Outcome(
        head.status,
        head.headers,
        head.content_length,
        head.content_type,
        b"".join(body_events),
        bool(ends),
        parser.keep_alive,
    )


def splits(raw: bytes) -> list[list[bytes]]:
    """Whole, byte by byte, and cut in two at every index."""
    out = [[raw], [raw[i : i + 1] for i in range(len(raw))]]
    out += [[raw[:i], raw[i:]] for i in range(1, len(raw))]
    return out


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"7\r\ndata: a\r\n"
    b"A;name=value\r\n0123456789\r\n"
    b"1b  \r\n" + b"x" * 27 + b"\r\n"
    b"0\r\nX-Trailer: dropped\r\nOther: too\r\n\r\n"
)

# name -> (raw response, head_request, needs eof, expected outcome fields)
VALID: dict[str, tuple[bytes, bool, bool, dict[str, object]]] = {
    "content-length": (
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": 123}\n',
        False,
        False,
        {"status": 200, "body": b'{"a": 123}\n', "content_length": 11, "content_type": "application/json"},
    ),
    "content-length-zero": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        False,
        False,
        {"body": b"", "content_length": 0, "keep_alive": True},
    ),
    "chunked": (
        CHUNKED,
        False,
        False,
        {
            "body": b"data: a" + b"0123456789" + b"x" * 27,
            "content_length": None,
            "content_type": "text/event-stream",
            "keep_alive": True,
        },
    ),
    "chunked-uppercase-hex": (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\nB\r\nhello world\r\n0\r\n\r\n",
        False,
        False,
        {"body": b"hello world"},
    ),
    "until-close": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of this, until the server closes",
        False,
        True,
        {"body": b"all of this, until the server closes", "content_length": None, "keep_alive": False},
    ),
    "until-close-empty": (b"HTTP/1.0 200 OK\r\n\r\n", False, True, {"body": b"", "keep_alive": False}),
    "head-request": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",
        True,
        False,
        {"body": b"", "content_length": 1234, "keep_alive": True},
    ),
    "head-request-chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        True,
        False,
        {"body": b"", "keep_alive": True},
    ),
    "204": (b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n", False, False, {"status": 204, "body": b""}),
    "304-ignores-length": (
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n",
        False,
        False,
        {"status": 304, "body": b"", "keep_alive": True},
    ),
    "100-continue": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        False,
        False,
        {"status": 201, "body": b"ok", "headers": [("Content-Length", "2")]},
    ),
    "103-early-hints-twice": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n!",
        False,
        False,
        {"status": 200, "body": b"!"},
    ),
    "http10-closes": (
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
        False,
        False,
        {"body": b"hi", "keep_alive": False},
    ),
    "http10-keep-alive": (
        b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nhi",
        False,
        False,
        {"body": b"hi", "keep_alive": True},
    ),
    "connection-close": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        False,
        False,
        {"keep_alive": False},
    ),
    "connection-tokens": (
        b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive\r\nconnection: x-foo, CLOSE\r\nContent-Length: 0\r\n\r\n",
        False,
        False,
        {"keep_alive": False},
    ),
    "repeated-equal-length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\ncontent-length: 3\r\n\r\nabc",
        False,
        False,
        {"body": b"abc", "content_length": 3},
    ),
    "chunked-wins-over-length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        False,
        False,
        {"body": b"ab", "content_length": None, "keep_alive": False},
    ),
    "headers-verbatim": (
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-Odd-Case:  spaced value \t\r\nset-cookie: b=2\r\n"
        b"X-Empty:\r\nX-Latin: caf\xe9\r\nContent-Length: 0\r\n\r\n",
        False,
        False,
        {
            "headers": [
                ("Set-Cookie", "a=1"),
                ("X-Odd-Case", "spaced value"),
                ("set-cookie", "b=2"),
                ("X-Empty", ""),
                ("X-Latin", "café"),
                ("Content-Length", "0"),
            ]
        },
    ),
    "obs-fold": (
        b"HTTP/1.1 200 OK\r\nX-Folded: first\r\n  second\r\n\tthird\r\nContent-Length: 0\r\n\r\n",
        False,
        False,
        {"headers": [("X-Folded", "first second third"), ("Content-Length", "0")]},
    ),
    "no-reason": (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", False, False, {"status": 200}),
    "empty-reason": (b"HTTP/1.1 503 \r\nContent-Length: 0\r\n\r\n", False, False, {"status": 503}),
    "no-headers": (b"HTTP/1.1 404 Not Found\r\n\r\n", False, True, {"status": 404, "body": b""}),
    "content-type-parameters": (
        b"HTTP/1.1 200 OK\r\ncontent-type:  Text/Event-Stream ;charset=utf-8\r\nContent-Length: 0\r\n\r\n",
        False,
        False,
        {"content_type": "text/event-stream"},
    ),
}


@pytest.mark.parametrize("name", VALID)
def test_valid_response_in_every_split(name: str) -> None:
    raw, head_request, eof, expected = VALID[name]
    first = run([raw], head_request=head_request, eof=eof)
    for field, value in expected.items():
        assert getattr(first, field) == value, field
    assert first.ended
    for pieces in splits(raw):
        assert run(pieces, head_request=head_request, eof=eof) == first, pieces


@pytest.mark.parametrize("name", [n for n, v in VALID.items() if not v[2]])
def test_length_framed_responses_end_without_eof(name: str) -> None:
    raw, head_request, _, _ = VALID[name]
    parser = new_parser(head_request=head_request)
    assert parser.feed(raw)[-1] is END
    assert parser.done
    assert parser.feed_eof() == []


def test_body_pieces_are_not_copied_when_whole() -> None:
    parser = new_parser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    piece = b"0123456789"
    (got, end) = parser.feed(piece)
    assert got is piece and end is END


def test_parser_is_reused_across_responses() -> None:
    parser = new_parser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")[-1] is END
    parser.reset(head_request=True)
    events = parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n")
    assert events[-1] is END and len(events) == 2
    parser.reset()
    events = parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nb\r\n0\r\n\r\n")
    assert events[1:] == [b"b", END]


def test_whole_chunks_of_one_feed_are_one_piece() -> None:
    # An engine's token-by-token chunks, arrived together: one body piece, so the relay sends once.
    tokens = [b'data: {"t":%d}\n\n' % i for i in range(300)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(t), t) for t in tokens)
    parser = new_parser()
    events = parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n")
    assert events[1:] == [b"".join(tokens), END]
    # Cut inside the last chunk: the whole ones as one piece, then what there is of the last.
    parser.reset()
    cut = len(framed) - 5
    events = parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed[:cut])
    assert events[1:] == [b"".join(tokens[:-1]), tokens[-1][:-3]]
    assert parser.feed(framed[cut:] + b"0\r\n\r\n") == [tokens[-1][-3:], END]


# -- after the end --------------------------------------------------------------------------------
def test_garbage_after_the_end_in_the_same_feed_keeps_the_response_but_not_the_connection() -> None:
    parser = new_parser()
    events = parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
    assert events[1:] == [b"ok", END]
    assert parser.keep_alive is False
    with pytest.raises(HTTP1Error, match="after the end"):
        parser.feed(b"more")


@pytest.mark.parametrize("extra", [b"garbage", b"\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
def test_data_after_the_end_raises(extra: bytes) -> None:
    parser = new_parser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    with pytest.raises(HTTP1Error, match="after the end"):
        parser.feed(extra)


def test_trailing_bytes_after_a_chunked_end() -> None:
    parser = new_parser()
    events = parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX")
    assert events[-1] is END and not parser.keep_alive


# -- malformed input -------------------------------------------------------------------------------
OK_HEAD = b"HTTP/1.1 200 OK\r\n"
CHUNKED_HEAD = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"

MALFORMED: dict[str, tuple[bytes, str]] = {
    "http2-status-line": (b"HTTP/2 200 OK\r\n\r\n", "status line"),
    "no-version": (b"200 OK\r\n\r\n", "status line"),
    "lowercase-version": (b"http/1.1 200 OK\r\n\r\n", "status line"),
    "four-digit-status": (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
    "two-digit-status": (b"HTTP/1.1 20 OK\r\n\r\n", "status line"),
    "status-below-100": (b"HTTP/1.1 099 Low\r\n\r\n", "out of range"),
    "status-above-599": (b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", "out of range"),
    "status-600": (b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n", "out of range"),
    "status-tab": (b"HTTP/1.1\t200 OK\r\n\r\n", "status line"),
    "empty-status-line": (b"\r\n\r\n", "status line"),
    "not-http": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "status line"),
    "no-colon": (OK_HEAD + b"Content-Length 5\r\n\r\n", "header line"),
    "space-before-colon": (OK_HEAD + b"Content-Length : 5\r\n\r\n", "header line"),
    "empty-name": (OK_HEAD + b": 5\r\n\r\n", "header line"),
    "space-in-name": (OK_HEAD + b"X Y: 5\r\n\r\n", "header line"),
    "bare-cr-in-value": (OK_HEAD + b"X: a\rb\r\n\r\n", "header line"),
    "bare-lf-in-block": (OK_HEAD + b"X: a\nY: b\r\n\r\n", "header line"),
    "nul-in-value": (OK_HEAD + b"X: a\x00b\r\n\r\n", "header line"),
    "fold-first": (OK_HEAD + b" folded: first\r\n\r\n", "header line"),
    "non-digit-length": (OK_HEAD + b"Content-Length: abc\r\n\r\n", "Content-Length"),
    "negative-length": (OK_HEAD + b"Content-Length: -1\r\n\r\n", "Content-Length"),
    "plus-length": (OK_HEAD + b"Content-Length: +5\r\n\r\n", "Content-Length"),
    "empty-length": (OK_HEAD + b"Content-Length:\r\n\r\n", "Content-Length"),
    "unicode-digit-length": (OK_HEAD + "Content-Length: ²\r\n\r\n".encode("latin-1"), "Content-Length"),
    "conflicting-length-list": (OK_HEAD + b"Content-Length: 5, 6\r\n\r\n", "conflicting"),
    "conflicting-length-headers": (
        OK_HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "conflicting",
    ),
    "gzip-transfer-coding": (OK_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n", "Transfer-Encoding"),
    "identity-transfer-coding": (OK_HEAD + b"Transfer-Encoding: identity\r\n\r\n", "Transfer-Encoding"),
    "double-chunked": (
        OK_HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "Transfer-Encoding",
    ),
    "switching-protocols": (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "101"),
    "chunk-size-not-hex": (CHUNKED_HEAD + b"xyz\r\n", "chunk size"),
    "chunk-size-0x": (CHUNKED_HEAD + b"0x5\r\nhello\r\n", "chunk size"),
    "chunk-size-negative": (CHUNKED_HEAD + b"-1\r\n", "chunk size"),
    "chunk-size-underscore": (CHUNKED_HEAD + b"1_0\r\n", "chunk size"),
    "chunk-size-leading-space": (CHUNKED_HEAD + b" 5\r\nhello\r\n", "chunk size"),
    "chunk-size-empty": (CHUNKED_HEAD + b"\r\n", "chunk size"),
    "chunk-size-huge": (CHUNKED_HEAD + b"1" * 16 + b"\r\n", "chunk size"),
    "chunk-size-bare-lf": (CHUNKED_HEAD + b"5\nhello\r\n", "chunk size"),
    "chunk-longer-than-declared": (CHUNKED_HEAD + b"3\r\nabcd\r\n0\r\n\r\n", "longer than its declared"),
    "chunk-without-crlf": (CHUNKED_HEAD + b"3\r\nabc0\r\n\r\n", "longer than its declared"),
    "chunk-line-too-long": (CHUNKED_HEAD + b"5;" + b"e" * 5000 + b"\r\n", "chunk size line larger"),
    # After whole plain chunks (the fast path), the general path judges what follows.
    "0x-after-plain-chunks": (CHUNKED_HEAD + b"1\r\na\r\n2\r\nbc\r\n0x5\r\nhello\r\n", "chunk size"),
    "no-crlf-after-plain-chunks": (
        CHUNKED_HEAD + b"1\r\na\r\n3\r\nabcd\r\n0\r\n\r\n",
        "longer than its declared",
    ),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_response_raises_in_every_split(name: str) -> None:
    raw, message = MALFORMED[name]
    for pieces in splits(raw):
        parser = new_parser()
        with pytest.raises(HTTP1Error, match=message):
            for piece in pieces:
                parser.feed(piece)


def test_error_carries_the_status_a_proxy_answers_with() -> None:
    with pytest.raises(HTTP1Error) as info:
        new_parser().feed(b"nonsense\r\n\r\n")
    assert info.value.status == 502


def test_oversized_head_raises_before_the_end_arrives() -> None:
    parser = new_parser()
    parser.feed(OK_HEAD)
    filler = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    with pytest.raises(HTTP1Error, match="head larger than"):
        for _ in range(MAX_HEADER_BYTES // len(filler) + 2):
            parser.feed(filler)


def test_oversized_head_in_one_piece() -> None:
    raw = OK_HEAD + b"X-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n"
    with pytest.raises(HTTP1Error, match="head larger than"):
        new_parser().feed(raw)


def test_head_just_under_the_limit_is_fine() -> None:
    limit = 4096
    raw = OK_HEAD + b"X-Big: " + b"a" * (limit - len(OK_HEAD) - 11) + b"\r\n\r\n"
    assert len(raw) == limit
    assert new_parser(max_header_bytes=limit).feed(raw)[0].status == 200  # type: ignore[union-attr]
    with pytest.raises(HTTP1Error):
        new_parser(max_header_bytes=limit - 1).feed(raw)


def test_too_many_headers() -> None:
    raw = OK_HEAD + b"".join(b"X-%d: v\r\n" % i for i in range(11)) + b"\r\n"
    with pytest.raises(HTTP1Error, match="more than 10"):
        new_parser(max_headers=10).feed(raw)
    assert isinstance(new_parser(max_headers=11).feed(raw)[0], ResponseHead)


def test_oversized_trailers() -> None:
    parser = new_parser(max_header_bytes=1024)
    parser.feed(CHUNKED_HEAD + b"0\r\n")
    with pytest.raises(HTTP1Error, match="trailers larger"):
        for _ in range(100):
            parser.feed(b"X-T: " + b"t" * 20 + b"\r\n")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "before any response"),
        (b"HTTP/1.1 200 OK\r\nContent-", "middle of the response head"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "before any response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "7 bytes of the body"),
        (CHUNKED_HEAD + b"5\r\nab", "chunked body"),
        (CHUNKED_HEAD + b"5\r\nabcde\r\n", "chunked body"),
        (CHUNKED_HEAD + b"0\r\nTrailer: x\r\n", "chunked body"),
    ],
)
def test_early_close_is_an_error(raw: bytes, message: str) -> None:
    parser = new_parser()
    parser.feed(raw)
    with pytest.raises(HTTP1Error, match=message):
        parser.feed_eof()


# -- random splits ---------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(VALID)), cuts=st.lists(st.integers(min_value=0, max_value=400)))
def test_random_splits_give_the_same_events(name: str, cuts: list[int]) -> None:
    raw, head_request, eof, _ = VALID[name]
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert run(pieces, head_request=head_request, eof=eof) == run([raw], head_request=head_request, eof=eof)


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000)),
)
def test_chunked_roundtrip_of_random_payloads(payloads: list[bytes], cuts: list[int]) -> None:
    raw = CHUNKED_HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    outcome = run(pieces)
    assert outcome.body == b"".join(payloads) and outcome.ended and outcome.keep_alive


# -- the serializer ---------------------------------------------------------------------------------
def test_serialize_post() -> None:
    raw = serialize_request(
        "POST", "/v1/chat/completions?x=1", "engine:8000", [("content-type", "application/json")], b"{}"
    )
    assert raw == (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: engine:8000\r\ncontent-type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )


def test_serialize_empty_bodies() -> None:
    raw = serialize_request("GET", "/v1/models", "h", [], b"")
    assert raw == b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
    assert b"Content-Length: 0\r\n" in serialize_request("POST", "/", "h", [], b"")
    assert b"Content-Length: 3\r\n" in serialize_request("GET", "/", "h", [], b"abc")


def test_serialize_head_then_body_is_the_request() -> None:
    headers = [("a", "1"), ("b", "2")]
    assert serialize_head("PUT", "/x", "h", headers, 4) + b"body" == serialize_request(
        "PUT", "/x", "h", headers, b"body"
    )


def test_serialize_writes_utf8_values() -> None:
    assert "x-name: café\r\n".encode() in serialize_request("GET", "/", "h", [("x-name", "café")], b"")


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GET", "/", [("x", "a\r\nInjected: yes")]),
        ("GET", "/", [("x", "a\nb")]),
        ("GET", "/", [("x", "a\rb")]),
        ("GET", "/", [("x\r\ny", "a")]),
        ("GET", "/ HTTP/1.1\r\nX: y", []),
        ("GET", "/a b", []),
        ("GET /", "/", []),
    ],
)
def test_serialize_refuses_injection(method: str, target: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(HTTP1Error):
        serialize_request(method, target, "h", headers, b"")


def test_serialized_request_parses_back_as_one_message() -> None:
    raw = serialize_request("POST", "/p", "h:1", [("k", "v")], b"\r\n\r\nbody")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.count(b"\r\n") == 3 and body == b"\r\n\r\nbody"


_FRAMING = st.sampled_from(
    [
        *(
            b"\r\n",
            b"\r",
            b"\n",
            b"0",
            b"1",
            b"2",
            b"a",
            b"F",
            b"10",
            b"fffffffffffffff",
            b"1000000000000000",
        ),
        *(b";ext", b" ", b"x", b"ab", b"\r\n\r\n", b"0\r\n\r\n", b"3\r\nabc\r\n", b"5\r\nhello\r\n"),
    ]
)


@settings(max_examples=500, deadline=None, database=None, derandomize=True)
@given(st.lists(_FRAMING, max_size=24).map(b"".join), st.integers(min_value=0, max_value=8))
def test_the_c_walk_agrees_with_the_reference(data: bytes, start: int) -> None:
    if WALKS.native is None:
        return
    ref: list[object] = []
    c: list[object] = []
    assert WALKS.native(data, start, c) == whole_chunks(data, start, ref)
    assert c == ref


def test_the_walk_stops_where_the_general_path_must_judge(walk: WholeChunks) -> None:
    out: list[object] = []
    body = b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    assert walk(body, 0, out) == 8 and out == [b"abc"]  # an extension: not plain
    out.clear()
    assert walk(b"3\r\nabc\r\n0\r\n\r\n", 0, out) == 8 and out == [b"abc"]  # the last chunk
    out.clear()
    assert walk(b"5\r\nabc", 0, out) == 0 and out == []  # not all here yet
    assert walk(b"3\r\nabcX\n", 0, out) == 0 and out == []  # no CRLF after the data
    assert walk(b"1000000000000000\r\n", 0, out) == 0 and out == []  # 16 digits
    assert walk(b"fffffffffffffff\r\n" + b"x" * 10, 0, out) == 0 and out == []  # a huge size
    assert walk(b"", 0, out) == 0 and walk(b"ab", 2, out) == 2 and out == []
