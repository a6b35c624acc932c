"""One usage record: what a proxy worker hands the control worker for every request it forwarded.

The contract between the planes in the other direction from the snapshot: a worker encodes a record into
a few hundred bytes (an orjson array, version first) and pushes it into its shared-memory ring; the
control worker decodes it and writes it to the store, idempotently by ``request_id``. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import orjson

__all__ = [
    "VERSION",
    "UsageRecord",
    "decode_record",
    "encode_fields",
    "encode_record",
    "to_signed64",
    "to_unsigned64",
]

VERSION = 1


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str
    ts: float  # unix seconds when the response ended
    principal_id: str
    key_id: str
    model: str  # the name the client called
    backend: str | None  # which backend answered; None when none did
    status: int  # what the client got; 499 when it went away before an answer
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int
    usage_source: str  # "reported" | "estimated" | "none"
    cost_nanos: int
    latency_ms: float
    ttfb_ms: float | None
    budget_key: int | None  # the live spend counter (unsigned 64-bit) this request was added to

    def row(self) -> tuple[Any, ...]:
        """The values in column order, ``budget_key`` as the signed 64-bit integer SQL stores."""
        values = astuple(self)
        return (*values[:-1], to_signed64(self.budget_key))


def encode_record(record: UsageRecord) -> bytes:
    return orjson.dumps([VERSION, *astuple(record)])


def encode_fields(*fields: Any) -> bytes:
    """``encode_record`` without building the dataclass: the request path passes the fields in order."""
    return orjson.dumps((VERSION, *fields))


_TYPES: tuple[tuple[str, tuple[type, ...], bool], ...] = (
    ("request_id", (str,), False),
    ("ts", (int, float), False),
    ("principal_id", (str,), False),
    ("key_id", (str,), False),
    ("model", (str,), False),
    ("backend", (str,), True),
    ("status", (int,), False),
    ("prompt_tokens", (int,), False),
    ("completion_tokens", (int,), False),
    ("cached_tokens", (int,), False),
    ("total_tokens", (int,), False),
    ("usage_source", (str,), False),
    ("cost_nanos", (int,), False),
    ("latency_ms", (int, float), False),
    ("ttfb_ms", (int, float), True),
    ("budget_key", (int,), True),
)


def decode_record(data: bytes) -> UsageRecord:
    """The record in ``data``; ValueError when it is not one (a torn or foreign slot)."""
    try:
        values = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a usage record: {exc}") from None
    if not isinstance(values, list) or not values or values[0] != VERSION:
        raise ValueError("not a usage record of version 1")
    fields = values[1:]
    if len(fields) != len(_TYPES):
        raise ValueError(f"a usage record has {len(_TYPES)} fields, not {len(fields)}")
    for value, (name, types, nullable) in zip(fields, _TYPES, strict=True):
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"usage record field {name} has the wrong type")
    if not fields[0] or len(fields[0]) > 64:
        raise ValueError("usage record without a valid request id")
    return UsageRecord(*fields)


def to_signed64(value: int | None) -> int | None:
    if value is None:
        return None
    return value - (1 << 64) if value >= 1 << 63 else value


def to_unsigned64(value: int | None) -> int | None:
    if value is None:
        return None
    return value + (1 << 64) if value < 0 else value
