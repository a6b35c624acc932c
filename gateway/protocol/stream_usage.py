"""Taking back out of an OpenAI stream what the gateway's ``stream_options.include_usage`` added, so a
client that did not ask for usage gets the bytes it would have got from the engine directly. Sans-I/O.

With ``include_usage`` an engine changes its stream in two ways (vLLM and OpenAI alike):

- one more event before ``data: [DONE]``: the usage chunk, ``{…,"choices":[],"usage":{…}}``;
- ``"usage":null`` as the last member of every other chunk (vLLM and OpenAI both add it; an engine that
  does not simply has nothing to take out).

``UsageWithholder.feed`` takes the engine's pieces, however they are cut, and returns what the client is
sent: the ``,"usage":null`` before a chunk's closing brace taken out, and the usage chunk cut out once
what follows it shows it was the last event (``data: [DONE]`` or the end of the stream). Every other byte
passes as it came, in order. The gateway's own tail buffer sees the stream before this, so usage is still
read from the chunk the client does not get.

What it costs, per piece: one ``bytes.rfind`` for the last event boundary and one pass that takes the
nulls out (``strip_usage_nulls``, which the gateway runs in C: ``gateway.native.strip_usage_nulls``);
only a piece still holding a ``"usage"`` after that is searched for the usage chunk, and only its last
``EVENT_LIMIT`` bytes. No JSON is parsed. What it holds back: the bytes after the piece's last complete
event (an event is of no use to a client before its blank line anyway), at most ``HOLD_LIMIT`` of them,
and the usage chunk until the next piece shows what follows it. Bytes still held when a stream ends
without a final blank line are an event cut in the middle.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

__all__ = ["EVENT_LIMIT", "HOLD_LIMIT", "UsageWithholder", "strip_usage_nulls"]

HOLD_LIMIT: Final = 16384
"""Longest incomplete event held back; a longer one goes on as it is (a usage chunk is far shorter)."""
EVENT_LIMIT: Final = 8192
"""Longest event looked at as a possible usage chunk (or the ``[DONE]`` after one); a longer one is
neither. An engine's usage chunk is a few hundred bytes."""

_USAGE: Final = b'"usage"'
# ,"usage":null or , "usage": null before a closing brace that ends its line; the brace and the line
# ending stay. One pass from the left, as ``native/sse_usage.c`` does it.
_NULL_MEMBER: Final = re.compile(rb',(?:"usage":null| "usage": null)(?=\}[\n\r])')
_EMPTY_CHOICES: Final = (b'"choices":[]', b'"choices": []')
_DONE: Final = b"[DONE]"


def strip_usage_nulls(data: bytes) -> tuple[bytes, bool]:
    """``data`` without the ``"usage":null`` members an engine adds to every chunk when asked for usage,
    and whether a ``"usage"`` is still in it (the usage chunk, or a null elsewhere). The reference of
    ``gateway.native.strip_usage_nulls``, which does the same in one C pass."""
    if data.find(_USAGE) < 0:
        return data, False
    data = _NULL_MEMBER.sub(b"", data)
    return data, data.find(_USAGE) >= 0


Strip = Callable[[bytes], tuple[bytes, bool]]


def _end_of_events(data: bytes) -> int:
    """The offset just past the last blank line (LF or CRLF framing); 0 when there is none."""
    lf = data.rfind(b"\n\n")
    if lf >= 0 and lf + 2 == len(data):
        return lf + 2  # the usual piece: whole events, ending with one
    crlf = data.rfind(b"\n\r\n", lf if lf > 0 else 0)  # only one after the LF boundary can be later
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _start_of_event(data: bytes, end: int) -> int:
    """Where the event that ends at ``end`` (just past its blank line) starts; -1 when it starts more than
    ``EVENT_LIMIT`` bytes before ``end`` (it is then no usage chunk, and only that much is searched)."""
    head = end - 3
    low = head - EVENT_LIMIT if head > EVENT_LIMIT else 0
    lf = data.rfind(b"\n\n", low, head)
    crlf = data.rfind(b"\n\r\n", lf if lf > low else low, head)  # only a later one can be the start
    if lf < 0 and crlf < 0:
        return -1 if low else 0
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _is_usage_chunk(event: bytes) -> bool:
    empty = _EMPTY_CHOICES[0] in event or _EMPTY_CHOICES[1] in event
    return empty and event.lstrip().startswith(b"data:")


def _is_done(data: bytes) -> bool:
    return _DONE in data[:16] and data.lstrip().startswith(b"data:")


class UsageWithholder:
    """``strip`` takes the nulls out of a piece: ``strip_usage_nulls`` here, its C twin in the gateway."""

    __slots__ = ("_held", "_strip", "_usage_chunk")

    def __init__(self, strip: Strip = strip_usage_nulls) -> None:
        self._held = b""  # bytes after the last complete event
        self._usage_chunk = b""  # the last complete event, when it is the usage chunk
        self._strip = strip

    def feed(self, piece: bytes) -> bytes:
        data = self._held + piece if self._held else piece
        end = _end_of_events(data)
        if end == len(data):
            self._held = b""
        elif len(data) - end > HOLD_LIMIT:
            self._held, end = b"", len(data)
        else:
            self._held = data[end:]
            data = data[:end]
        if not data:
            return b""
        if self._usage_chunk:
            chunk, self._usage_chunk = self._usage_chunk, b""
            if not _is_done(data):  # it was not the last event after all: it goes out where it was
                data = chunk + data
        data, usage_left = self._strip(data)
        if not usage_left:  # the usual piece: chunks whose only usage was null
            return data
        return self._cut_usage_chunk(data)

    def _cut_usage_chunk(self, data: bytes) -> bytes:
        """``data`` without the usage chunk if it ends with it (then held until what follows is known) or
        with it and ``[DONE]``."""
        end = len(data)
        if not data.endswith((b"\n\n", b"\n\r\n")):
            return data  # an event too long to hold went on unfinished: it is no usage chunk
        start = _start_of_event(data, end)
        if start < 0:
            return data
        last = data[start:end]
        if _is_done(last) and start > 0:
            before = _start_of_event(data, start)
            if before >= 0 and _is_usage_chunk(data[before:start]):
                return data[:before] + last
            return data
        if _is_usage_chunk(last):
            self._usage_chunk = last
            return data[:start]
        return data
