"""A chunked body's whole chunks unframed in C (``native/http1_chunks.c``); ``GATEWAY_PURE_PYTHON=1``
selects its pure-Python reference, ``gateway.protocol.http1.whole_chunks``. I/O: none."""

from __future__ import annotations

from typing import Final

from gateway.native._ffi import PURE_PYTHON, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib
from gateway.native._scratch import scratch, scratch_word
from gateway.protocol.http1 import Event
from gateway.protocol.http1 import whole_chunks as _whole_chunks_py

__all__ = ["whole_chunks", "whole_chunks_c"]


def whole_chunks_c(data: bytes, pos: int, out: list[Event]) -> int:
    """``gateway.protocol.http1.whole_chunks`` in C: every whole plain chunk of ``data`` from ``pos`` on,
    their data appended to ``out`` as one piece; returns where the first other chunk starts."""
    n = len(data)
    if pos >= n:
        return pos
    buf, written = scratch(n - pos), scratch_word()
    end: int = (_lib or require_native()).gw_http1_whole_chunks(data, n, pos, buf, written)
    if end != pos:
        out.append(_ffi.unpack(buf, written[0]))
    return end


whole_chunks: Final = _whole_chunks_py if PURE_PYTHON else whole_chunks_c
