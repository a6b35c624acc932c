"""Output buffers for the C passes that rewrite a piece of bytes (``native/sse_usage.c``,
``native/http1_chunks.c``): one per thread (a proxy worker's is its event loop's), kept between calls and
grown to the largest piece met, up to ``KEEP`` bytes; a larger piece gets a buffer of its own for that
call. A caller copies what it needs out of the buffer before it returns, so the passes share it. I/O:
none."""

from __future__ import annotations

import threading
from typing import Any, Final

from gateway.native._ffi import ffi as _ffi

__all__ = ["KEEP", "scratch", "scratch_word"]

KEEP: Final = 1 << 20


class _Local(threading.local):
    def __init__(self) -> None:
        self.size = 0
        self.buf: Any = None
        self.word: Any = None


_local = _Local()


def scratch(n: int) -> Any:
    """A ``char[]`` of at least ``n`` bytes (``n`` > 0) for one call's output."""
    local = _local
    if n <= local.size:
        return local.buf
    buf = _ffi.new("char[]", n)
    if n <= KEEP:
        local.buf, local.size = buf, n
    return buf


def scratch_word() -> Any:
    """An ``int64_t[1]`` for one call's second result."""
    word = _local.word
    if word is None:
        word = _local.word = _ffi.new("int64_t[1]")
    return word
