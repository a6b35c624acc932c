"""Sans-I/O HTTP/1.1 for the upstream side: the request serializer and the response parser.

``serialize_request`` turns one request into the bytes to write. ``ResponseParser`` takes the bytes a
connection delivered, in whatever pieces they came, and returns events: one ``ResponseHead`` (status,
the header pairs exactly as received, in order, and the framing read from them), the body as ``bytes``
pieces with any chunked framing removed, then ``END``. Interim ``1xx`` answers are skipped. After
``END``, ``keep_alive`` says whether the connection may carry another request.

Body framing, in RFC 9112 order: no body for ``HEAD`` requests, ``1xx``, ``204`` and ``304``; then
``Transfer-Encoding: chunked`` (only ``chunked`` is supported; trailers are read and dropped); then
``Content-Length``; otherwise the body runs until the server closes (``feed_eof``).

Everything malformed raises ``HTTP1Error``, whose ``status`` (502) is what a proxy answers instead.
The parser is strict where a lenient reading could split one response into two (header names, chunk
sizes, conflicting lengths) and bounds what it buffers: the head (and the trailers) at 64 KiB, the
header count at 256. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "END",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "EndOfMessage",
    "Event",
    "HTTP1Error",
    "ResponseHead",
    "ResponseParser",
    "WholeChunks",
    "serialize_head",
    "serialize_request",
    "whole_chunks",
]

MAX_HEADER_BYTES: Final = 64 * 1024
MAX_HEADERS: Final = 256
_MAX_CHUNK_LINE: Final = 4096  # the size, plus any chunk extensions, which are ignored

# One header line, anchored at a line start. Names are RFC 9110 tokens (so no whitespace before the
# colon); values exclude CR, LF and NUL. Every line of a valid block matches, so counting matches against
# line ends validates the whole block in one C-level pass. The fast pattern keeps trailing whitespace
# (a lazy value is twice as slow), so blocks that have any, and blocks with a bad line, take the slow path.
_TCHAR = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_HEADER_LINE = re.compile(rf"^([{_TCHAR}]+):[ \t]*([^\r\n\x00]*)\r\n", re.MULTILINE)
_HEADER_LINE_STRIPPED = re.compile(rf"([{_TCHAR}]+):[ \t]*([^\r\n\x00]*?)[ \t]*")
_STATUS_LINE = re.compile(r"HTTP/1\.([0-9]) ([0-9]{3})(?: ([^\r\n\x00]*))?")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n")
# The usual size line (digits alone), matched where it starts by the fast path for whole chunks.
_PLAIN_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})\r\n")

_NO_BODY_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})

# Parser states.
_HEAD, _LENGTH, _CHUNK_SIZE_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class HTTP1Error(Exception):
    """The peer broke HTTP/1.1 framing, or a message could not be written. Not recoverable on this
    connection."""

    status = 502


@dataclass(slots=True)
class ResponseHead:
    status: int
    reason: str
    http_minor: int  # 1 for HTTP/1.1, 0 for HTTP/1.0
    headers: list[tuple[str, str]]  # latin-1 decoded, in order, names as sent
    content_length: int | None  # the declared length; None when chunked or delimited by close
    content_type: str  # the lowercased media type without parameters, "" when absent
    chunked: bool
    keep_alive: bool  # what the head allows; the parser's ``keep_alive`` is the final word


class EndOfMessage:
    """The response is complete. Use the ``END`` singleton."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END: Final = EndOfMessage()
Event = ResponseHead | bytes | EndOfMessage


def serialize_head(
    method: str, target: str, host_header: str, headers: Sequence[tuple[str, str]], body_length: int
) -> bytes:
    """The request line and headers. ``Host`` and ``Content-Length`` are written here and must not be
    in ``headers`` (nor ``Transfer-Encoding``). ``Content-Length`` is left out only for an empty body
    of a method that has none (GET, HEAD, ...). Values are written as UTF-8, as aiohttp did."""
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers])
    ends = len(headers) + 3  # the request line, Host, the headers, the empty line
    if body_length or method not in _NO_BODY_METHODS:
        lines += f"Content-Length: {body_length}\r\n"
        ends += 1
    text = f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n{lines}\r\n"
    # A CR or LF inside any part would start a header (or a request) of its own: they may only appear
    # in the line ends written here.
    if text.count("\n") != ends or text.count("\r") != ends or " " in method or " " in target:
        raise HTTP1Error("CR, LF or a space where they are not allowed in the request line or headers")
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise HTTP1Error(f"request head cannot be encoded: {exc}") from None


def serialize_request(
    method: str, target: str, host_header: str, headers: Sequence[tuple[str, str]], body: bytes
) -> bytes:
    """The whole request: ``serialize_head`` followed by ``body``."""
    head = serialize_head(method, target, host_header, headers, len(body))
    return head + body if body else head


class ResponseParser:
    """Parses the responses of one connection, one at a time: ``reset`` before each request."""

    __slots__ = (
        "_buf",
        "_head_request",
        "_max_header_bytes",
        "_max_headers",
        "_remaining",
        "_scan",
        "_state",
        "_trailer_left",
        "_whole_chunks",
        "head",
        "keep_alive",
    )

    def __init__(
        self,
        *,
        head_request: bool = False,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_headers: int = MAX_HEADERS,
        chunks: WholeChunks | None = None,
    ) -> None:
        """``chunks`` walks a read's whole chunks (``whole_chunks`` when None; the gateway's client passes
        its C twin, ``gateway.native.whole_chunks``)."""
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._whole_chunks = whole_chunks if chunks is None else chunks
        self._buf = bytearray()
        self.reset(head_request)

    def reset(self, head_request: bool = False) -> None:
        """Expect the response to a new request; ``head_request`` when it was a HEAD (no body follows)."""
        self._head_request = head_request
        self._state = _HEAD
        self._buf.clear()
        self._scan = 0
        self._remaining = 0
        self._trailer_left = 0
        self.head: ResponseHead | None = None
        self.keep_alive = False

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> list[Event]:
        """Consume ``data`` and return the events it completes. Bytes after ``END`` mean the peer is
        not speaking HTTP with us: the events before them are returned and ``keep_alive`` turns false;
        bytes arriving after a feed that ended the message raise."""
        out: list[Event] = []
        n = len(data)
        pos = 0
        while True:
            state = self._state
            if state in (_LENGTH, _CHUNK_DATA):
                avail = n - pos
                if avail == 0:
                    break
                rem = self._remaining
                if avail < rem:
                    out.append(data[pos:] if pos else data)
                    self._remaining = rem - avail
                    break
                out.append(data[pos : pos + rem])
                pos += rem
                self._remaining = 0
                if state == _LENGTH:
                    self._state = _DONE
                    out.append(END)
                else:
                    self._state = _CHUNK_END
                continue
            if state == _UNTIL_CLOSE:
                if pos < n:
                    out.append(data[pos:] if pos else data)
                break
            if state == _DONE:
                if pos < n:
                    if not out:
                        raise HTTP1Error("data after the end of the response")
                    self.keep_alive = False
                break
            if state == _HEAD:
                limit = self._max_header_bytes
                block, data, pos = self._take(data, pos, b"\r\n\r\n", limit)
                if block is None:
                    break
                n = len(data)
                self._start_body(block, out)
            elif state == _CHUNK_SIZE_LINE:
                if not self._buf:
                    pos = self._whole_chunks(data, pos, out)
                    if pos == n:
                        break
                block, data, pos = self._take(data, pos, b"\r\n", _MAX_CHUNK_LINE)
                if block is None:
                    break
                n = len(data)
                m = _CHUNK_SIZE.fullmatch(block)
                if m is None:
                    raise HTTP1Error(f"malformed chunk size line {bytes(block[:40])!r}")
                size = int(m.group(1), 16)
                if size:
                    self._remaining = size
                    self._state = _CHUNK_DATA
                else:
                    self._trailer_left = self._max_header_bytes
                    self._state = _TRAILER
            elif state == _CHUNK_END:
                block, data, pos = self._take(data, pos, b"\r\n", 2)
                if block is None:
                    break
                n = len(data)
                self._state = _CHUNK_SIZE_LINE
            else:  # _TRAILER: fields we drop, up to an empty line
                block, data, pos = self._take(data, pos, b"\r\n", self._trailer_left)
                if block is None:
                    break
                n = len(data)
                if len(block) == 2:
                    self._state = _DONE
                    out.append(END)
                else:
                    self._trailer_left -= len(block)
        return out

    def feed_eof(self) -> list[Event]:
        """The peer closed its side. Ends a body delimited by the close; anywhere else in a response it
        is an error (a close before any byte of the head is one too: the caller knows it as such)."""
        state = self._state
        if state == _DONE:
            return []
        if state == _UNTIL_CLOSE:
            self._state = _DONE
            self.keep_alive = False
            return [END]
        if state == _HEAD:
            if self._buf:
                raise HTTP1Error("connection closed in the middle of the response head")
            raise HTTP1Error("connection closed before any response")
        if state == _LENGTH:
            raise HTTP1Error(f"connection closed with {self._remaining} bytes of the body still expected")
        raise HTTP1Error("connection closed in the middle of a chunked body")

    # -- internals -----------------------------------------------------------------------------------
    def _take(self, data: bytes, pos: int, delim: bytes, limit: int) -> tuple[bytes | None, bytes, int]:
        """Everything up to and including the next ``delim``, across feeds: ``(block, data, pos)`` with
        parsing to go on in ``data`` at ``pos``; ``(None, ...)`` when more bytes are needed. Raises when
        the block would pass ``limit`` bytes."""
        buf = self._buf
        if buf:
            buf += memoryview(data)[pos:]
            i = buf.find(delim, self._scan)
            if i < 0:
                if len(buf) > limit:
                    raise HTTP1Error(_too_long(self._state, limit))
                self._scan = max(0, len(buf) - len(delim) + 1)
                return None, data, len(data)
            end = i + len(delim)
            if end > limit:
                raise HTTP1Error(_too_long(self._state, limit))
            block = bytes(buf[:end])
            rest = bytes(buf[end:])
            buf.clear()
            self._scan = 0
            return block, rest, 0
        i = data.find(delim, pos)
        if i < 0:
            if len(data) - pos > limit:
                raise HTTP1Error(_too_long(self._state, limit))
            buf += memoryview(data)[pos:]
            self._scan = max(0, len(buf) - len(delim) + 1)
            return None, data, len(data)
        end = i + len(delim)
        if end - pos > limit:
            raise HTTP1Error(_too_long(self._state, limit))
        return data[pos:end], data, end

    def _start_body(self, block: bytes, out: list[Event]) -> None:
        head = _parse_head(block, self._max_headers)
        status = head.status
        if status < 200:
            if status == 101:
                raise HTTP1Error("101 Switching Protocols to a request that asked for no upgrade")
            return  # interim answer (100 Continue, 103 Early Hints): the real one follows
        self.head = head
        self.keep_alive = head.keep_alive
        out.append(head)
        if self._head_request or status == 204 or status == 304:
            self._state = _DONE
            out.append(END)
        elif head.chunked:
            self._state = _CHUNK_SIZE_LINE
        elif head.content_length is not None:
            if head.content_length:
                self._remaining = head.content_length
                self._state = _LENGTH
            else:
                self._state = _DONE
                out.append(END)
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE


WholeChunks = Callable[[bytes, int, list[Event]], int]


def whole_chunks(data: bytes, pos: int, out: list[Event]) -> int:
    """The fast path of chunked bodies: every whole chunk from ``pos`` on with a plain size line (no
    extension, no padding) and its closing CRLF, handed out as one piece; returns where the first chunk
    that is not such starts (a partial one, the last one, or one the general path must judge). An engine
    writing token by token sends hundreds of small chunks that often arrive together: one piece for them
    all is one send to the client instead of one per chunk, and no state changes per chunk here. The
    reference of ``gateway.native.whole_chunks``, the same walk in C, which the gateway's client runs."""
    match = _PLAIN_CHUNK_SIZE.match
    n = len(data)
    first = pos
    parts: list[memoryview] = []
    view = memoryview(data)
    while (m := match(data, pos)) is not None:
        size = int(m[1], 16)
        start = m.end()
        end = start + size
        if not size or end + 2 > n or not data.startswith(b"\r\n", end):
            break
        parts.append(view[start:end])
        pos = end + 2
    if pos != first:
        out.append(b"".join(parts))
    return pos


def _too_long(state: int, limit: int) -> str:
    if state == _CHUNK_END:
        return "chunk data longer than its declared size"
    what = {_HEAD: "head", _CHUNK_SIZE_LINE: "chunk size line"}.get(state, "trailers")
    return f"response {what} larger than {limit} bytes"


# The framing headers under the spellings engines use.
_FRAMING: Final = {
    spelling: name
    for name in ("content-length", "transfer-encoding", "content-type", "connection")
    for spelling in (name, name.title())
}


def _parse_head(block: bytes, max_headers: int) -> ResponseHead:
    """``block``: the status line and header lines, each with its CRLF, and the final CRLF."""
    text = block[:-2].decode("latin-1")
    eol = text.find("\r\n")
    m = _STATUS_LINE.fullmatch(text, 0, eol)
    if m is None:
        raise HTTP1Error(f"malformed status line {text[: min(eol, 60)]!r}")
    minor_text, status_text, reason = m.groups()
    minor = int(minor_text)
    status = int(status_text)
    if not 100 <= status <= 599:  # RFC 9110 15: three digits, 1xx to 5xx; anything else is no answer
        raise HTTP1Error(f"status {status} is out of range (100-599)")
    headers: list[tuple[str, str]] = _HEADER_LINE.findall(text, eol + 2)
    if len(headers) != text.count("\n") - 1 or " \r\n" in text or "\t\r\n" in text:
        headers = _parse_headers_slowly(text[eol + 2 :])
    if len(headers) > max_headers:
        raise HTTP1Error(f"more than {max_headers} response headers")

    length: int | None = None
    chunked = False
    conflicting = False
    content_type = ""
    tokens = ""
    for name, value in headers:
        lname = _FRAMING.get(name)  # the usual spellings in one lookup; others lowered when they could match
        if lname is None:
            if not 10 <= len(name) <= 17:
                continue
            lname = name.lower()
        if lname == "content-length":
            if length is None and value.isdigit() and value.isascii():
                length = int(value)
            else:
                length = _content_length(value, length)
        elif lname == "transfer-encoding":
            if chunked or value.strip(" \t").lower() != "chunked":
                raise HTTP1Error(f"unsupported Transfer-Encoding {value!r} (only chunked is)")
            chunked = True
        elif lname == "content-type":
            content_type = value.partition(";")[0].strip(" \t").lower()
        elif lname == "connection":
            tokens += "," + value.lower()
    if chunked and length is not None:
        # Both framings at once is how responses get smuggled: believe chunked, then drop the connection.
        length = None
        conflicting = True
    if tokens == ",keep-alive":  # what almost every HTTP/1.1 engine sends
        keep_alive = True
    elif tokens:
        options = {t.strip(" \t") for t in tokens.split(",")}
        keep_alive = "close" not in options and (minor >= 1 or "keep-alive" in options)
    else:
        keep_alive = minor >= 1
    if conflicting or (chunked and minor == 0):
        keep_alive = False
    return ResponseHead(
        status, reason or "", min(minor, 1), headers, length, content_type, chunked, keep_alive
    )


def _content_length(value: str, seen: int | None) -> int:
    """A Content-Length that is a list (``5, 5``) or repeats one already seen: all must agree."""
    for part in value.split(","):
        part = part.strip(" \t")
        if not part.isdigit() or not part.isascii():
            raise HTTP1Error(f"invalid Content-Length {value!r}")
        if seen is not None and int(part) != seen:
            raise HTTP1Error("conflicting Content-Length values")
        seen = int(part)
    assert seen is not None
    return seen


def _parse_headers_slowly(text: str) -> list[tuple[str, str]]:
    """The header lines one by one, for blocks the fast path rejected: unfolds obsolete line folding
    (RFC 9112 5.2 lets a recipient replace it with a space) and names the first bad line."""
    headers: list[tuple[str, str]] = []
    lines = text.split("\r\n")
    for line in lines[:-1]:  # the text ends with CRLF, so the last item is empty
        if line[:1] in (" ", "\t") and headers and "\n" not in line and "\r" not in line:
            name, value = headers[-1]
            headers[-1] = (name, (value + " " + line.strip(" \t")).strip(" \t"))
            continue
        m = _HEADER_LINE_STRIPPED.fullmatch(line)
        if m is None:
            raise HTTP1Error(f"malformed header line {line[:60]!r}")
        headers.append((m.group(1), m.group(2)))
    return headers
