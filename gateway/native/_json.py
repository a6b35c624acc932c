"""The request body's JSON scanned in C (``native/json_member.c``): the span of the ``model`` value and
the count of top-level members; ``GATEWAY_PURE_PYTHON=1`` selects their pure-Python references in
``gateway.protocol``. I/O: none."""

from __future__ import annotations

from typing import Final

from gateway.native._ffi import PURE_PYTHON, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib
from gateway.protocol.bounds import MAX_DEPTH
from gateway.protocol.json_members import count_top_members
from gateway.protocol.openai_request import find_model_span

__all__ = ["model_span", "model_span_c", "top_members", "top_members_c"]


def model_span_c(body: bytes) -> tuple[int, int] | None:
    """``gateway.protocol.openai_request.find_model_span`` in C (``native/json_member.c``)."""
    out = _ffi.new("int64_t[2]")
    if not require_native().gw_json_member_span(body, len(body), b"model", 5, out):
        return None
    return out[0], out[1]


model_span: Final = find_model_span if PURE_PYTHON else model_span_c


def top_members_c(body: bytes) -> int:
    """``gateway.protocol.json_members.count_top_members`` in C (``native/json_member.c``)."""
    members: int = (_lib or require_native()).gw_json_top_members(body, len(body), MAX_DEPTH)
    return members


top_members: Final = count_top_members if PURE_PYTHON else top_members_c
