"""A writable buffer shared between processes, pinned as a C pointer: the base of the bucket table and the
usage rings, and ``AtomicWords``, 64-bit atomics on its words. I/O: none."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from gateway.native._ffi import RegionError, WritableBuffer, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib

__all__ = ["AtomicWords", "SharedBuffer"]


class SharedBuffer:
    """A writable buffer pinned as a C pointer until ``close()``; ``close()`` must come before the buffer's
    owner is detached or resized (``memoryview.release()``, ``seg.detach()``), which raise otherwise."""

    __slots__ = ("_base", "_size")

    def __init__(self, buf: WritableBuffer) -> None:
        require_native()
        self._base: Any = _ffi.from_buffer("char[]", buf, require_writable=True)
        self._size: int = len(self._base)
        if int(_ffi.cast("uintptr_t", self._base)) % 8:
            self.close()
            raise RegionError("buffer is not 8-byte aligned")

    def close(self) -> None:
        """Release the buffer; later operations raise ``RegionError``. Idempotent."""
        if self._base is not _ffi.NULL:
            _ffi.release(self._base)
            self._base, self._size = _ffi.NULL, 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AtomicWords(SharedBuffer):
    """Sequentially consistent 64-bit operations on the words of a shared buffer, by byte offset."""

    __slots__ = ()

    def _check(self, offset: int) -> None:
        if self._base is _ffi.NULL:
            raise RegionError("closed")
        if offset % 8:
            raise ValueError(f"offset {offset} is not a multiple of 8")
        if not 0 <= offset <= self._size - 8:
            raise IndexError(f"offset {offset} is outside the {self._size}-byte buffer")

    def load(self, offset: int) -> int:
        self._check(offset)
        value: int = _lib.gw_load_u64(self._base, offset)
        return value

    def store(self, offset: int, value: int) -> None:
        """Store an unsigned 64-bit value."""
        self._check(offset)
        _lib.gw_store_u64(self._base, offset, value)

    def fetch_add(self, offset: int, delta: int) -> int:
        """Add a signed 64-bit delta (wrapping); return the previous value read as signed 64-bit."""
        self._check(offset)
        previous: int = _lib.gw_fetch_add_i64(self._base, offset, delta)
        return previous

    def compare_exchange(self, offset: int, expected: int, desired: int) -> bool:
        """Store ``desired`` if the word equals ``expected``; say whether it did."""
        self._check(offset)
        return bool(_lib.gw_cas_u64(self._base, offset, expected, desired))
