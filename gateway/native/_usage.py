"""Token usage from the last bytes of a response: ``parse_usage`` and ``TailBuffer``, in C
(``native/usage_tail.c``) or, with ``GATEWAY_PURE_PYTHON=1``, the pure-Python rules of
``gateway.protocol.usage``; and ``strip_usage_nulls``, a stream's ``"usage":null`` members taken out in C
(``native/sse_usage.c``; its reference is ``gateway.protocol.stream_usage``). I/O: none."""

from __future__ import annotations

from typing import Any, Final

from gateway.native._ffi import PURE_PYTHON, Bytes, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib
from gateway.native._scratch import scratch
from gateway.protocol import usage as _usage
from gateway.protocol.stream_usage import strip_usage_nulls as _strip_usage_nulls_py
from gateway.protocol.usage import DEFAULT_TAIL_CAPACITY, TailWindow, Usage

__all__ = ["TailBuffer", "parse_usage", "parse_usage_c", "strip_usage_nulls", "strip_usage_nulls_c"]


def parse_usage_c(tail: Bytes) -> Usage | None:
    """``gateway.protocol.usage.parse_usage`` in C. ``bytes`` are passed without a copy; so is a
    ``memoryview`` slice such as ``memoryview(body)[-4096:]``."""
    lib = require_native()
    out = _ffi.new("gw_usage *")
    if type(tail) is bytes:
        found = lib.gw_usage_parse(tail, len(tail), out)
    else:
        with _ffi.from_buffer(tail) as view:
            found = lib.gw_usage_parse(view, len(view), out)
    return _usage_of(out) if found else None


def _usage_of(out: Any) -> Usage:
    return Usage(out.prompt_tokens, out.completion_tokens, out.total_tokens, out.cached_tokens)


parse_usage: Final = _usage.parse_usage if PURE_PYTHON else parse_usage_c


def strip_usage_nulls_c(data: bytes) -> tuple[bytes, bool]:
    """``gateway.protocol.stream_usage.strip_usage_nulls`` in C: ``data`` without the ``"usage":null``
    members before a chunk's closing brace, and whether a ``"usage"`` is left in it. ``data`` itself when
    nothing was taken out."""
    n = len(data)
    if not n:
        return data, False
    buf = scratch(n)
    both: int = (_lib or require_native()).gw_sse_strip_usage_nulls(data, n, buf)
    written = both >> 1
    return (data if written == n else _ffi.unpack(buf, written)), bool(both & 1)


strip_usage_nulls: Final = _strip_usage_nulls_py if PURE_PYTHON else strip_usage_nulls_c


class TailBuffer:
    """The last ``capacity`` bytes of a response, parsed once at the end for usage.

    ``TailBuffer(capacity)`` returns the C-backed implementation, or the pure-Python one when
    ``GATEWAY_PURE_PYTHON=1`` or ``pure=True``; both are instances of this class.
    """

    __slots__ = ()

    def __new__(cls, capacity: int = DEFAULT_TAIL_CAPACITY, *, pure: bool | None = None) -> TailBuffer:
        if cls is TailBuffer:
            cls = _PyTailBuffer if (PURE_PYTHON if pure is None else pure) else _CTailBuffer
        return super().__new__(cls)

    @property
    def capacity(self) -> int:
        raise NotImplementedError

    def append(self, chunk: Bytes) -> None:
        """Keep ``chunk``'s bytes, dropping the oldest beyond capacity; copies at most capacity bytes."""
        raise NotImplementedError

    def usage(self) -> Usage | None:
        """Parse the kept bytes (see ``gateway.protocol.usage``)."""
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def getvalue(self) -> bytes:
        """A copy of the kept bytes, oldest first."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class _CTailBuffer(TailBuffer):
    # Sliding window in 2 * capacity bytes of C memory: appends are one memcpy, compaction (one memmove of
    # at most capacity bytes) happens at most once per capacity bytes appended.
    __slots__ = ("_capacity", "_mem", "_out", "_state")

    def __init__(self, capacity: int = DEFAULT_TAIL_CAPACITY, *, pure: bool | None = None) -> None:
        require_native()
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._mem = _ffi.new("char[]", 2 * capacity)
        self._state = _ffi.new("gw_tail *", {"buf": self._mem, "cap": capacity, "len": 0})
        self._out = _ffi.new("gw_usage *")

    @property
    def capacity(self) -> int:
        return self._capacity

    def append(self, chunk: Bytes) -> None:
        try:
            _lib.gw_tail_append(self._state, chunk, len(chunk))
        except TypeError:  # cffi passes only bytes to `const char *` directly
            with _ffi.from_buffer(chunk) as view:
                _lib.gw_tail_append(self._state, view, len(view))

    def usage(self) -> Usage | None:
        out = self._out
        return _usage_of(out) if _lib.gw_tail_usage(self._state, out) else None

    def clear(self) -> None:
        self._state.len = 0

    def getvalue(self) -> bytes:
        start = _lib.gw_tail_start(self._state)
        data: bytes = _ffi.unpack(self._mem + start, self._state.len - start)
        return data

    def __len__(self) -> int:
        return min(int(self._state.len), self._capacity)


class _PyTailBuffer(TailBuffer):
    __slots__ = ("_window",)

    def __init__(self, capacity: int = DEFAULT_TAIL_CAPACITY, *, pure: bool | None = None) -> None:
        self._window = TailWindow(capacity)

    @property
    def capacity(self) -> int:
        return self._window.capacity

    def append(self, chunk: Bytes) -> None:
        self._window.append(chunk)

    def usage(self) -> Usage | None:
        return self._window.usage()

    def clear(self) -> None:
        self._window.clear()

    def getvalue(self) -> bytes:
        return self._window.getvalue()

    def __len__(self) -> int:
        return len(self._window)
