"""Reading a request body on the admin port no further than a limit.

A declared ``Content-Length`` past the limit is refused before a byte of the body is read; a body sent
without one (chunked) is counted as it arrives and refused at the first chunk that passes the limit. So
a client never makes the control worker hold more than the limit (plus one chunk) of its body, whatever
it sends. I/O: reads the client connection (granian's RSGI protocol object).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import BadRequest, PayloadTooLarge

__all__ = ["read_body"]


async def read_body(proto: Any, headers: Any, limit: int) -> bytes:
    """The body, or PayloadTooLarge (413) once it passes ``limit`` bytes; BadRequest for a bad length."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest("invalid Content-Length header") from None
        if length > limit:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds the {limit}-byte limit")
    parts: list[bytes] = []
    size = 0
    async for chunk in proto:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        parts.append(chunk)
    return b"".join(parts)
