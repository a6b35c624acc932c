"""Budgets and prices: what a principal may spend per period, and what a model's tokens cost.

Shared by the control plane (which sums spend per window from the store) and the data plane (which keeps
the live spend of the current window in shared memory), so both cut time into the same windows and name
them with the same 64-bit keys. Pure functions and frozen values; no I/O.

Periods, all in UTC:

- ``"day"``: calendar days;
- ``"month"``: calendar months;
- ``"<N>s"``, ``"<N>m"``, ``"<N>h"``, ``"<N>d"``: fixed windows of that length, counted from the Unix epoch
  (``"7d"`` windows start on Thursdays, the weekday of 1970-01-01).

Money is kept as integer *nano-units* of the operator's currency (1e-9), so sums are exact and a
$0.15-per-million-token price still charges a 10-token request something.
"""

from __future__ import annotations

import calendar
import math
import re
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

from gateway.shm.bucket_keys import bucket_key

__all__ = [
    "NANOS",
    "Budget",
    "Price",
    "check_period",
    "format_money",
    "period_window",
]

NANOS = 1_000_000_000  # nano-units per currency unit
_DURATION = re.compile(r"([1-9][0-9]{0,9})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def check_period(value: object) -> str | None:
    """The problem with a period, or None."""
    if value in ("day", "month"):
        return None
    if isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        if int(m.group(1)) * _UNIT_SECONDS[m.group(2)] >= 60:
            return None
        return "a fixed window must be at least 60 seconds long"
    return 'must be "day", "month", or a fixed window such as "6h" or "7d"'


def period_window(period: str, now: float) -> tuple[float, float]:
    """The window of ``period`` that contains ``now``, as [start, end) in unix seconds."""
    if period == "day":
        start = math.floor(now / 86400) * 86400
        return float(start), float(start + 86400)
    if period == "month":
        t = time.gmtime(now)
        start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        return float(start), float(calendar.timegm((year, month, 1, 0, 0, 0)))
    m = _DURATION.fullmatch(period)
    if m is None:
        raise ValueError(f"unknown budget period {period!r}")
    length = int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    start = math.floor(now / length) * length
    return float(start), float(start + length)


def format_money(nanos: int) -> str:
    """Nano-units as a decimal amount, to the micro-unit (``12.345678``)."""
    micros = (abs(nanos) + 500) // 1000
    sign = "-" if nanos < 0 and micros else ""
    return f"{sign}{micros // 1_000_000}.{micros % 1_000_000:06d}"


def _amount(value: object) -> TypeGuard[int | float]:
    """A finite, non-negative int or float (not a bool): what prices and budget costs are made of."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    )


@dataclass(frozen=True, slots=True)
class Price:
    """Nano-units per token (the configured price per million tokens, times 1,000)."""

    input: float
    output: float
    cached_input: float

    @classmethod
    def from_doc(cls, doc: Any) -> Price | None:
        """From the snapshot's ``[input, output, cached_input]`` per million tokens."""
        if not isinstance(doc, list) or len(doc) != 3:
            return None
        if not all(_amount(v) for v in doc):
            return None
        return cls(doc[0] * 1000.0, doc[1] * 1000.0, doc[2] * 1000.0)

    def cost(self, prompt: int, completion: int, cached: int) -> int:
        """Nano-units for one request; cached prompt tokens are part of ``prompt``."""
        cached = min(max(cached, 0), prompt)
        return round((prompt - cached) * self.input + cached * self.cached_input + completion * self.output)


@dataclass(slots=True)
class Budget:
    """One principal's budget. ``tokens`` and ``cost`` (nano-units) are limits per window, None meaning
    unlimited. The current window's key is cached: only the first call after a rollover computes it."""

    principal_id: str
    period: str
    tokens: int | None
    cost: int | None
    _start: float = 0.0
    _end: float = -1.0
    _key: int = 0
    _epoch: str = ""

    @classmethod
    def from_doc(cls, principal_id: str, doc: Any) -> Budget | None:
        if not isinstance(doc, dict) or check_period(doc.get("period")) is not None:
            return None
        raw_tokens, raw_cost = doc.get("tokens"), doc.get("cost")
        tokens: int | None = None
        if isinstance(raw_tokens, int) and not isinstance(raw_tokens, bool) and raw_tokens > 0:
            tokens = raw_tokens
        cost: int | None = round(raw_cost * NANOS) if _amount(raw_cost) and raw_cost > 0 else None
        if tokens is None and cost is None:
            return None
        return cls(principal_id, doc["period"], tokens, cost)

    def key_at(self, epoch: str, now: float) -> int:
        """The shared-memory key of the window containing ``now``, for the bucket table of ``epoch``."""
        if not self._start <= now < self._end or epoch != self._epoch:
            self._start, self._end = period_window(self.period, now)
            self._epoch = epoch
            self._key = window_key(epoch, self.principal_id, self.period, self._start)
        return self._key

    def window(self, now: float) -> tuple[float, float]:
        return period_window(self.period, now)

    def exceeded(self, tokens: int, cost: int) -> bool:
        return (self.tokens is not None and tokens >= self.tokens) or (
            self.cost is not None and cost >= self.cost
        )


def window_key(epoch: str, principal_id: str, period: str, start: float) -> int:
    """Names the live spend of one principal in one window, in one host's bucket table: ``epoch`` is that
    table's lifetime, so spend counted live by an earlier table (or another host) is never mistaken for
    this one's."""
    return bucket_key(f"budget:{epoch}:{principal_id}", f"{period}@{int(start)}")
