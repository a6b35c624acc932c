"""The last bytes of a relayed stream, kept as references to the pieces that hold them instead of copies.

A stream's usage is read once, from its last ``capacity`` bytes, when it ends (and, if it is cut short,
those bytes estimate what was relayed). Until then nothing reads them, so copying every piece into a
window (one C call per piece and a buffer of twice the capacity per stream, as ``gateway.native.TailBuffer``
does) buys nothing: the pieces already exist, and the tail only has to keep the newest of them alive,
dropping the oldest once the rest still covers ``capacity``. Per piece that is a list append, an addition
and a length check; what a stream holds is about ``capacity`` bytes of pieces it would have held a moment
anyway. A piece of ``capacity`` bytes or more replaces everything (cut to its last ``capacity`` bytes
when longer, one copy), so the bytes held never reach twice the capacity.

Sans-I/O; the joined bytes go to ``gateway.native.parse_usage``, the parser the C tail buffer runs.
"""

from __future__ import annotations

from collections import deque

from gateway.native import Usage, parse_usage

__all__ = ["StreamTail"]


class StreamTail:
    __slots__ = ("_capacity", "_pieces", "_size")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._pieces: deque[bytes] = deque()
        self._size = 0  # bytes in _pieces

    def append(self, piece: bytes) -> None:
        capacity = self._capacity
        n = len(piece)
        if n >= capacity:
            self._pieces.clear()
            self._pieces.append(piece if n == capacity else piece[-capacity:])
            self._size = capacity
            return
        if not n:
            return
        pieces = self._pieces
        pieces.append(piece)
        size = self._size + n
        while size - len(pieces[0]) >= capacity:  # the rest still covers the window
            size -= len(pieces.popleft())
        self._size = size

    def getvalue(self) -> bytes:
        """The last ``capacity`` bytes appended (all of them when fewer), oldest first."""
        pieces = self._pieces
        if len(pieces) == 1 and self._size <= self._capacity:
            return pieces[0]
        data = b"".join(pieces)
        return data[-self._capacity :] if len(data) > self._capacity else data

    def usage(self) -> Usage | None:
        """Usage parsed from ``getvalue()`` (see ``gateway.protocol.usage``)."""
        return parse_usage(self.getvalue())

    def __len__(self) -> int:
        return min(self._size, self._capacity)
