"""The ranges the gateway holds every client-supplied figure to, in one place. Sans-I/O.

Every number the proxy reads from a request body (a completion allowance, a choice count) is checked here
before anything is reserved, priced or recorded from it, and refused with 400 in the path's envelope
when out of range: an allowance of 2^63 - 1 would otherwise reach the token buckets, the budgets' cost
arithmetic and a usage record's integer columns. Nesting has one limit for every path (checked while
the top-level members are counted, ``json_members``): translators walk and re-encode what they read, and
orjson refuses to encode past 255 levels, so one depth for all paths keeps a body that one path accepts
from failing deeper on another. docs/operations.md ("Hostile traffic and faults") lists each limit.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import BadRequest

__all__ = [
    "MAX_CHOICES",
    "MAX_DEPTH",
    "MAX_TOKENS",
    "boolean",
    "choices",
    "token_allowance",
]

# Objects and arrays nested in a request body, the top-level object counting as 1.
MAX_DEPTH = 128
# A completion allowance (max_tokens, max_completion_tokens, max_output_tokens): int32's range, far above
# any context window, so a reservation (prompt + allowance x choices) and its cost stay well inside int64.
MAX_TOKENS = 2**31 - 1
# Choices per request (``n``): OpenAI's own limit.
MAX_CHOICES = 128


def token_allowance(doc: dict[str, Any], name: str, minimum: int = 0) -> int | None:
    """The integer member ``name`` of ``doc`` as a completion allowance in ``[minimum, MAX_TOKENS]``;
    None when absent (or null)."""
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer", param=name)
    if not minimum <= value <= MAX_TOKENS:
        raise BadRequest(f"{name} must be between {minimum} and {MAX_TOKENS}", param=name)
    return value


def choices(doc: dict[str, Any]) -> int:
    """``n``: how many choices the request asks for, 1 when absent."""
    value = doc.get("n")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise BadRequest(f"n must be an integer between 1 and {MAX_CHOICES}", param="n")
    return value


def boolean(doc: dict[str, Any], name: str) -> bool:
    """The member ``name`` as a boolean flag: absent or null is False, anything but a boolean is refused
    (``"stream": "yes"`` must not be served as a whole answer the client did not ask for)."""
    value = doc.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean", param=name)
    return value
