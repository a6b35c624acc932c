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

What it costs, per piece: one or two ``bytes.rfind`` for the last event boundary, one ``bytes.find`` for
``"usage"``, and a ``bytes.replace`` only in pieces that hold ``"usage":null``; no JSON is parsed. What it
holds back: the bytes after the piece's last complete event (an event is of no use to a client before its
blank line anyway), at most ``HOLD_LIMIT`` of them, and the usage chunk until the next piece shows what
follows it. Bytes still held when a stream ends without a final blank line are an event cut in the middle.
"""

from __future__ import annotations

from typing import Final

__all__ = ["HOLD_LIMIT", "UsageWithholder"]

HOLD_LIMIT: Final = 16384
"""Longest incomplete event held back; a longer one goes on as it is (a usage chunk is far shorter)."""

_USAGE: Final = b'"usage"'
_NULL_LF: Final = b',"usage":null}\n'
_OTHER_NULLS: Final = ((b',"usage":null}\r', b"}\r"), (b', "usage": null}\n', b"}\n"))
_EMPTY_CHOICES: Final = (b'"choices":[]', b'"choices": []')
_DONE: Final = b"[DONE]"


def _end_of_events(data: bytes) -> int:
    """The offset just past the last blank line (LF or CRLF framing); 0 when there is none."""
    lf = data.rfind(b"\n\n")
    if lf >= 0 and lf + 2 == len(data):
        return lf + 2  # the usual piece: whole events, ending with one
    crlf = data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _start_of_event(data: bytes, end: int) -> int:
    """Where the event that ends at ``end`` (just past its blank line) starts."""
    head = end - 3
    lf = data.rfind(b"\n\n", 0, head)
    crlf = data.rfind(b"\n\r\n", 0, head)
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _is_usage_chunk(event: bytes) -> bool:
    empty = _EMPTY_CHOICES[0] in event or _EMPTY_CHOICES[1] in event
    return empty and event.lstrip().startswith(b"data:")


def _is_done(data: bytes) -> bool:
    return _DONE in data[:16] and data.lstrip().startswith(b"data:")


class UsageWithholder:
    __slots__ = ("_held", "_usage_chunk")

    def __init__(self) -> None:
        self._held = b""  # bytes after the last complete event
        self._usage_chunk = b""  # the last complete event, when it is the usage chunk

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
        if data.find(_USAGE) < 0:
            return data
        data = data.replace(_NULL_LF, b"}\n")  # ``data`` itself when there is none
        if data.find(_USAGE) < 0:  # the usual piece: chunks whose only usage was null
            return data
        for null, brace in _OTHER_NULLS:
            data = data.replace(null, brace)
        return self._cut_usage_chunk(data)

    def _cut_usage_chunk(self, data: bytes) -> bytes:
        """``data`` without the usage chunk if it ends with it (then held until what follows is known) or
        with it and ``[DONE]``."""
        end = len(data)
        if not data.endswith((b"\n\n", b"\n\r\n")):
            return data  # an event too long to hold went on unfinished: it is no usage chunk
        start = _start_of_event(data, end)
        last = data[start:end]
        if _is_done(last) and start > 0:
            before = _start_of_event(data, start)
            if _is_usage_chunk(data[before:start]):
                return data[:before] + last
            return data
        if _is_usage_chunk(last):
            self._usage_chunk = last
            return data[:start]
        return data
