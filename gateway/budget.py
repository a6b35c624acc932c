"""Budgets and prices: what a principal or a key may spend per period, and what a model's tokens cost.

Shared by the control plane (which sums spend per window from the store) and the data plane (which keeps
the live spend of the current window in shared memory), so both cut time into the same windows and name
them with the same 64-bit keys. A principal and a key may each have several budgets, one per period
(``MAX_BUDGETS`` at most); a request answers to all of its principal's and all of its key's
(``BudgetSet``). Pure functions and small values; no I/O.

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
from gateway.usage_record import MAX_FIGURE

__all__ = [
    "KEY_OWNER",
    "MAX_BUDGETS",
    "NANOS",
    "Budget",
    "BudgetSet",
    "Price",
    "budgets_from_doc",
    "check_period",
    "exceeded_message",
    "format_money",
    "period_window",
    "window_key",
]

NANOS = 1_000_000_000  # nano-units per currency unit
# Budgets one principal or one key may have. Each window's live counter is named in the usage record of
# every request it counts (``gateway.usage_record``), which must fit a ring slot.
MAX_BUDGETS = 4
KEY_OWNER = "key:"  # a key's budgets are owned by "key:<key id>"; a principal's by its id (no colon)
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
        """Nano-units for one request, at most ``MAX_FIGURE``: an upstream may report any count up to the
        usage parser's bound, and a cost past 2^64 could not even be encoded into the usage record, which
        was then lost. Cached prompt tokens are part of ``prompt``."""
        cached = min(max(cached, 0), prompt)
        cost = (prompt - cached) * self.input + cached * self.cached_input + completion * self.output
        return round(cost) if cost < MAX_FIGURE else MAX_FIGURE


@dataclass(slots=True)
class Budget:
    """One budget of a principal or of a key. ``owner`` names whose spend it caps: the principal's id, or
    ``KEY_OWNER`` and the key's id. ``tokens`` and ``cost`` (nano-units) are limits per window, None
    meaning unlimited; ``alerts`` the fractions of them to alert at, ascending. The current window's key
    is cached: only the first call after a rollover computes it."""

    owner: str
    period: str
    tokens: int | None
    cost: int | None
    alerts: tuple[float, ...] = ()
    _start: float = 0.0
    _end: float = -1.0
    _key: int = 0
    _epoch: str = ""

    @classmethod
    def from_doc(cls, owner: str, doc: Any) -> Budget | None:
        if not isinstance(doc, dict) or check_period(doc.get("period")) is not None:
            return None
        raw_tokens, raw_cost = doc.get("tokens"), doc.get("cost")
        tokens: int | None = None
        if isinstance(raw_tokens, int) and not isinstance(raw_tokens, bool) and raw_tokens > 0:
            tokens = raw_tokens
        cost: int | None = round(raw_cost * NANOS) if _amount(raw_cost) and raw_cost > 0 else None
        if tokens is None and cost is None:
            return None
        raw_alerts = doc.get("alerts")
        alerts = tuple(
            sorted({float(a) for a in raw_alerts if _amount(a) and 0 < a <= 1})
            if isinstance(raw_alerts, list)
            else ()
        )
        return cls(owner, doc["period"], tokens, cost, alerts)

    @property
    def key_id(self) -> str | None:
        """The key whose budget this is; None for a principal's."""
        return self.owner[len(KEY_OWNER) :] if self.owner.startswith(KEY_OWNER) else None

    def key_at(self, epoch: str, now: float) -> int:
        """The shared-memory key of the window containing ``now``, for the bucket table of ``epoch``."""
        if not self._start <= now < self._end or epoch != self._epoch:
            self._start, self._end = period_window(self.period, now)
            self._epoch = epoch
            self._key = window_key(epoch, self.owner, self.period, self._start)
        return self._key

    def window(self, now: float) -> tuple[float, float]:
        return period_window(self.period, now)

    def exceeded(self, tokens: int, cost: int) -> bool:
        return (self.tokens is not None and tokens >= self.tokens) or (
            self.cost is not None and cost >= self.cost
        )

    def used(self, tokens: int, cost: int) -> float:
        """The share of the budget spent: the larger of the tokens' and the cost's."""
        return max(
            tokens / self.tokens if self.tokens else 0.0,
            cost / self.cost if self.cost else 0.0,
        )


def budgets_from_doc(owner: str, doc: Any) -> tuple[Budget, ...]:
    """The budgets of a snapshot entry: its ``"budgets"`` list, or the single ``"budget"`` of a document
    written before there could be several (a last-known-good copy, an older control plane). Unreadable
    ones and a second budget of the same period are left out."""
    raw = doc.get("budgets")
    if raw is None and doc.get("budget") is not None:
        raw = [doc["budget"]]
    if not isinstance(raw, list):
        return ()
    out: dict[str, Budget] = {}
    for item in raw[:MAX_BUDGETS]:
        budget = Budget.from_doc(owner, item)
        if budget is not None and budget.period not in out:
            out[budget.period] = budget
    return tuple(out.values())


class BudgetSet:
    """The budgets a request through one key answers to: its principal's, then the key's own. The window
    keys of all of them are cached together, with the tuples the record carries: the request path builds
    nothing per request until one of the windows rolls over."""

    __slots__ = ("_end", "_epoch", "_start", "_windows", "key", "live", "native", "principal")

    def __init__(self, principal: tuple[Budget, ...], key: tuple[Budget, ...]) -> None:
        self.principal = principal
        self.key = key
        self._epoch = ""
        self._start = 0.0
        self._end = -1.0
        self._windows: tuple[tuple[Budget, int], ...] = ()
        # The window keys of the principal's budgets and of the key's (None for none), as a request's
        # usage record names the live counters it was added to; those of the last ``windows_at``.
        self.live: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        # What the data plane makes of the current windows once (``gateway.dataplane.budgets``: the C array
        # its admission and settling calls walk); dropped when a window rolls over.
        self.native: Any = None

    def windows_at(self, epoch: str, now: float) -> tuple[tuple[Budget, int], ...]:
        """Every budget with the key of its window containing ``now``: the principal's first."""
        if not self._start <= now < self._end or epoch != self._epoch:
            self._refresh(epoch, now)
        return self._windows

    def live_keys(self, epoch: str, now: float) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """``live`` for the windows containing ``now``."""
        self.windows_at(epoch, now)
        return self.live

    def _refresh(self, epoch: str, now: float) -> None:
        both = (*self.principal, *self.key)
        self._windows = tuple((b, b.key_at(epoch, now)) for b in both)
        self._start = max(b._start for b in both)
        self._end = min(b._end for b in both)
        self._epoch = epoch
        self.native = None
        self.live = (
            tuple(b._key for b in self.principal) or None,
            tuple(b._key for b in self.key) or None,
        )


def exceeded_message(budget: Budget, tokens: int, cost: int, now: float | None = None) -> str:
    """What a refused request is told: whose budget, of which period, what was used, when it resets."""
    _, end = budget.window(time.time() if now is None else now)
    resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    if budget.tokens is not None and tokens >= budget.tokens:
        used = f"{tokens} of {budget.tokens} tokens"
    else:
        used = f"{format_money(cost)} of {format_money(budget.cost or 0)} (cost)"
    whose = "this principal" if budget.key_id is None else "this API key"
    return (
        f"Budget exceeded: {whose} has used {used} in its {budget.period} budget period, "
        f"which resets at {resets}."
    )


def window_key(epoch: str, owner: str, period: str, start: float) -> int:
    """Names the live spend of one budget's owner (a principal's id, or ``KEY_OWNER`` and a key's id) in
    one window, in one host's bucket table: ``epoch`` is that table's lifetime, so spend counted live by
    an earlier table (or another host) is never mistaken for this one's."""
    return bucket_key(f"budget:{epoch}:{owner}", f"{period}@{int(start)}")
