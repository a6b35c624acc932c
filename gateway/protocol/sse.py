"""Server-sent events framing: an incremental decoder and an encoder. Sans-I/O: bytes in, events out.

``SSEDecoder.feed`` takes the response body in whatever pieces the network delivers and returns the events
completed so far, following the WHATWG event-stream rules: lines end in LF, CRLF or a lone CR (a CRLF split
between two pieces still counts once); a line starting with ``:`` is a comment; ``field: value`` loses one
space after the colon; several ``data:`` lines join with ``\\n``; a blank line dispatches the event, and an
event without data is not dispatched. ``id:`` and ``retry:`` are parsed and ignored: no translator needs
them.

Two deliberate departures from the browser's rules:

- ``close()`` dispatches an event whose closing blank line never came (the browser drops it). Upstreams
  that end the body right after the last ``data:`` line then still have their last event read.
- ``max_event_bytes`` bounds memory: an event, or a single line, that grows past it is dropped whole (and
  counted in ``dropped``), the decoder skipping to the next blank line. Usage meters set it so that a huge
  content delta cannot make them buffer without limit.

``usage.py`` has no framing to share: its tail parser deliberately finds usage without parsing SSE.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["Event", "EventTranslator", "SSEDecoder", "encode_event"]

_EOL: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event: ``event`` is the ``event:`` field (``None`` when absent) and ``data`` the
    joined ``data:`` lines, decoded as UTF-8 (invalid bytes replaced, as browsers do)."""

    event: str | None
    data: str


class SSEDecoder:
    """Feed it bytes, get whole events back. One instance per response body."""

    __slots__ = (
        "_after_cr",
        "_buf",
        "_data",
        "_event",
        "_has_data",
        "_long_line",
        "_max",
        "_size",
        "_skipping",
        "_start",
        "dropped",
    )

    def __init__(self, max_event_bytes: int | None = None) -> None:
        if max_event_bytes is not None and max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self._max = max_event_bytes
        self._buf = b""  # the unterminated last line
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self._has_data = False
        self._size = 0  # bytes held for the pending event
        self._skipping = False  # dropping an oversize event until its blank line
        self._after_cr = False  # the last piece ended in CR: a leading LF in the next one is part of it
        self._start = True  # a BOM may open the stream
        self._long_line = False  # the start of the current line was thrown away (it was too long)
        self.dropped = 0
        """Events dropped for exceeding ``max_event_bytes``."""

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if self._start:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._buf = buf
                return []
            self._start = False
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        out: list[Event] = []
        pos = 0
        for m in _EOL.finditer(buf):
            if m.end() == len(buf) and m.group() == b"\r":
                self._after_cr = True
            if self._long_line:
                self._long_line = False  # the end of a line already dropped: not a blank line
            else:
                self._line(buf[pos : m.start()], out)
            pos = m.end()
        rest = buf[pos:]
        if self._max is not None and rest and (self._skipping or self._size + len(rest) > self._max):
            # A line longer than the cap, or one of an event being dropped: keep none of it.
            if not self._skipping:
                self._drop()
            self._long_line = True
            rest = b""
        self._buf = rest
        return out

    def close(self) -> list[Event]:
        """At the end of the body: the pending event, if it has data (see the module docstring)."""
        out: list[Event] = []
        if self._buf:
            self._line(self._buf, out)
            self._buf = b""
        self._line(b"", out)
        self._long_line = self._after_cr = False
        return out

    def _line(self, line: bytes, out: list[Event]) -> None:
        if not line:
            if self._has_data and not self._skipping:
                event = self._event.decode("utf-8", "replace") if self._event is not None else None
                out.append(Event(event, b"\n".join(self._data).decode("utf-8", "replace")))
            self._reset()
            return
        if self._skipping or line[0] == 0x3A:  # ':' starts a comment
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
            self._size += len(value) + 1
        elif name == b"event":
            self._event = value
            self._size += len(value)
        else:
            return
        if self._max is not None and self._size > self._max:
            self._drop()

    def _drop(self) -> None:
        self.dropped += 1
        self._reset()
        self._skipping = True

    def _reset(self) -> None:
        self._data = []
        self._event = None
        self._has_data = False
        self._size = 0
        self._skipping = False


def encode_event(event: str | None, data: bytes) -> bytes:
    """One event, framed with LF: ``event: NAME`` (when given), one ``data:`` line per line of ``data``
    (JSON from orjson never has a raw newline, so that is the one line), then the blank line."""
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    if b"\n" not in data and b"\r" not in data:
        # One copy of ``data``, however large (a Response's last events repeat its whole text); adding the
        # pieces up would copy it once per ``+``.
        return b"".join((head, b"data: ", data, b"\n\n"))
    lines = _EOL.split(data)
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


class EventTranslator:
    """The skeleton every stream translator shares: upstream bytes are decoded into events, each event is
    translated (``_event``) until the translation is done, and an upstream that ends first gets
    ``_ended`` (close the answer when it is complete, else report the cut). Subclasses set ``_sse`` and
    ``_done``."""

    _sse: SSEDecoder
    _done: bool

    def _event(self, data: str, out: list[bytes]) -> None:
        raise NotImplementedError

    def _ended(self, out: list[bytes]) -> None:
        raise NotImplementedError

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for event in self._sse.feed(chunk):
            if not self._done:
                self._event(event.data, out)
        return b"".join(out)

    def finish(self) -> bytes:
        """Call when the upstream body ends (or is cut): what is left to send."""
        out: list[bytes] = []
        for event in self._sse.close():
            if not self._done:
                self._event(event.data, out)
        if not self._done:
            self._ended(out)
        return b"".join(out)
