"""``BucketTable``: lock-free GCRA rate buckets, concurrency gauges and budget spend in a region shared by
processes (``native/buckets.c``); ``AdmissionPlan`` and ``BudgetWindows``, the limits and the budget
windows one request is admitted against in one C call and settled in another. I/O: none; the bucket
operations read CLOCK_MONOTONIC."""

from __future__ import annotations

import math
from typing import Any, Final, NamedTuple

from gateway.native._ffi import RegionError, WritableBuffer, raise_for, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib
from gateway.native._shared import AtomicWords, SharedBuffer

__all__ = [
    "ADMITTED",
    "LIMIT_CONCURRENCY",
    "LIMIT_REQUESTS",
    "LIMIT_TOKENS",
    "OVER_BUDGET",
    "REFUSED",
    "AdmissionPlan",
    "BucketTable",
    "BudgetWindows",
    "Peek",
    "TakeOutcome",
    "region_size",
]


class TakeOutcome(NamedTuple):
    """The outcome of ``take``. ``retry_after_s`` is 0 when admitted and ``inf`` when ``n > burst``."""

    admitted: bool
    retry_after_s: float
    remaining: int


_NULL = _ffi.NULL
# tuple.__new__ builds a NamedTuple in half the time of its generated __new__; take() is on the request path.
_tuple_new = tuple.__new__


class Peek(NamedTuple):
    """A bucket's state: units admissible now, and seconds until it is full again."""

    remaining: int
    reset_after_s: float


def region_size(capacity: int) -> int:
    """Bytes a ``BucketTable`` of ``capacity`` slots needs (a power of two up to 2**24)."""
    size: int = require_native().gw_bt_region_size(capacity) if 0 < capacity < 2**64 else 0
    if size == 0:
        raise ValueError(f"capacity {capacity} is not a power of two in [1, 2**24]")
    return size


class BucketTable(SharedBuffer):
    """GCRA rate buckets and concurrency gauges, keyed by ``bucket_key``, in a region shared by processes.

    A bucket's only state is its TAT (theoretical arrival time), so ``rate_per_second`` and ``burst`` are
    arguments of every call: changing a limit keeps what was consumed. Emission interval
    ``T = 1e9 / rate`` ns (rounded; at least 1 ns), tolerance ``burst * T``; spans saturate at 2**61 ns
    (73 years), so a limit whose burst takes longer than that to refill admits less than its burst. Slots
    are claimed for good: size the table for every key a process lifetime will see. Each method is one C
    call; the ``*_at`` variants take ``now_ns`` on ``time.monotonic_ns()``'s clock (CLOCK_MONOTONIC)
    instead of reading it.
    """

    __slots__ = ("_out",)

    def __init__(self, buf: WritableBuffer) -> None:
        """Attach to a region that ``create_layout`` initialised."""
        super().__init__(buf)
        if _lib.gw_bt_capacity(self._base, self._size) < 0:
            self.close()
            raise RegionError("region is not an initialised bucket table (or is smaller than it says)")
        self._out = _ffi.new("int64_t[6]")

    @classmethod
    def create_layout(cls, buf: WritableBuffer, capacity: int) -> BucketTable:
        """Zero and initialise a region (before other processes use it) and attach to it."""
        size = region_size(capacity)
        with memoryview(buf) as view:
            if view.nbytes < size:
                raise RegionError(f"a table of {capacity} slots needs {size} bytes, not {view.nbytes}")
        with _ffi.from_buffer("char[]", buf, require_writable=True) as base:
            rc = _lib.gw_bt_init(base, len(base), capacity)
        if rc != _lib.GW_OK:
            raise_for(rc)
        return cls(buf)

    @property
    def capacity(self) -> int:
        capacity: int = _lib.gw_bt_capacity(self._base, self._size)
        if capacity < 0:
            raise_for(capacity)
        return capacity

    def take(self, key: int, rate_per_second: float, burst: int, n: int = 1) -> TakeOutcome:
        """Admit ``n`` units if they fit within ``burst`` at ``rate_per_second``; otherwise say when."""
        out = self._out
        try:
            rc = _lib.gw_bt_take(self._base, self._size, key, rate_per_second, burst, n, -1, out)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc == 1:
            return _tuple_new(TakeOutcome, (True, 0.0, out[1]))
        return self._refusal(rc, out)

    def take_at(self, key: int, rate_per_second: float, burst: int, n: int, now_ns: int) -> TakeOutcome:
        """``take`` at an explicit time on CLOCK_MONOTONIC."""
        out = self._out
        try:
            rc = _lib.gw_bt_take(self._base, self._size, key, rate_per_second, burst, n, _now(now_ns), out)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc == 1:
            return _tuple_new(TakeOutcome, (True, 0.0, out[1]))
        return self._refusal(rc, out)

    @staticmethod
    def _refusal(rc: int, out: Any) -> TakeOutcome:
        if rc == 0:
            return _tuple_new(TakeOutcome, (False, out[0] / 1e9, out[1]))
        if rc == 2:
            return _tuple_new(TakeOutcome, (False, math.inf, out[1]))
        raise_for(rc)

    def settle(self, key: int, rate_per_second: float, delta_units: int) -> None:
        """Charge (``delta_units > 0``, debt allowed) or refund (< 0, never beyond a full bucket) units
        without an admission check, e.g. once a response's real token count is known."""
        self._settle(key, rate_per_second, delta_units, -1)

    def settle_at(self, key: int, rate_per_second: float, delta_units: int, now_ns: int) -> None:
        self._settle(key, rate_per_second, delta_units, _now(now_ns))

    def _settle(self, key: int, rate_per_second: float, delta_units: int, now_ns: int) -> None:
        try:
            rc = _lib.gw_bt_settle(self._base, self._size, key, rate_per_second, delta_units, now_ns)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            raise_for(rc)

    def peek(self, key: int, rate_per_second: float, burst: int) -> Peek:
        """Read-only state; an unknown key reads as a full bucket (and is not claimed)."""
        return self._peek(key, rate_per_second, burst, -1)

    def peek_at(self, key: int, rate_per_second: float, burst: int, now_ns: int) -> Peek:
        return self._peek(key, rate_per_second, burst, _now(now_ns))

    def _peek(self, key: int, rate_per_second: float, burst: int, now_ns: int) -> Peek:
        out = self._out
        try:
            rc = _lib.gw_bt_peek(self._base, self._size, key, rate_per_second, burst, now_ns, out)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            raise_for(rc)
        return Peek(out[0], out[1] / 1e9)

    def acquire(self, key: int, limit: int) -> bool:
        """Take one of ``limit`` concurrent places; ``False`` when all are taken."""
        try:
            rc: int = _lib.gw_bt_acquire(self._base, self._size, key, limit)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            raise_for(rc)
        return rc == 1

    def release(self, key: int) -> int:
        """Give a place back; returns the new count, which never goes below 0."""
        return self._gauge_call(_lib.gw_bt_release, key)

    def gauge(self, key: int) -> int:
        """Places currently taken (0 for an unknown key)."""
        return self._gauge_call(_lib.gw_bt_gauge, key)

    def spend_add(self, key: int, tokens: int, cost: int) -> None:
        """Add to a budget window's live spend (tokens and cost in nano-units)."""
        try:  # ``_spend_call``, inline: once per request
            rc: int = _lib.gw_bt_spend_add(self._base, self._size, key, tokens, cost)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            raise_for(rc)

    def spend_set_base(self, key: int, tokens: int, cost: int) -> None:
        """Set a budget window's base spend: what the live counter does not hold."""
        self._spend_call(_lib.gw_bt_spend_set_base, key, tokens, cost)

    def spend(self, key: int) -> tuple[int, int]:
        """A budget window's spend, live plus base: ``(tokens, cost)``; zeros for an unknown key."""
        out = self._out
        rc = _lib.gw_bt_spend_read(self._base, self._size, key, out)
        if rc != 0:
            raise_for(rc)
        return out[0] + out[2], out[1] + out[3]

    def spend_parts(self, key: int) -> tuple[int, int, int, int]:
        """``(live tokens, live cost, base tokens, base cost)`` of a budget window."""
        out = self._out
        rc = _lib.gw_bt_spend_read(self._base, self._size, key, out)
        if rc != 0:
            raise_for(rc)
        return out[0], out[1], out[2], out[3]

    def _spend_call(self, fn: Any, key: int, tokens: int, cost: int) -> None:
        try:
            rc: int = fn(self._base, self._size, key, tokens, cost)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            raise_for(rc)

    def _gauge_call(self, fn: Any, key: int) -> int:
        try:
            rc: int = fn(self._base, self._size, key)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            raise_for(rc)
        return rc

    # -- noted places and admission plans: one C call each ---------------------------------------------
    def enter(self, key: int, limit: int, notes: AtomicWords | None, note: int) -> bool:
        """``acquire``, with the place noted in word 0 of the block at byte offset ``note`` of ``notes``
        (written before the place is taken; cleared again when it was not). ``note < 0``: not noted."""
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        try:
            rc: int = _lib.gw_bt_enter(self._base, self._size, key, limit, base, size, note)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            raise_for(rc)
        return rc == 1

    def leave(self, key: int, notes: AtomicWords | None, note: int) -> int:
        """``release``, clearing the place's note; returns the gauge's new value."""
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        rc: int = _lib.gw_bt_leave(self._base, self._size, key, base, size, note)
        if rc < 0:
            raise_for(rc)
        return rc

    def admit(
        self,
        plan: AdmissionPlan,
        tokens: int,
        notes: AtomicWords | None,
        note: int,
        windows: BudgetWindows | None = None,
    ) -> tuple[int, Any]:
        """A request's admission in one C call (see ``gw_bt_admit``): every budget window of ``windows``
        under its limits, then what the request needs from every limit of ``plan``, all or nothing.
        Returns ``ADMITTED``, ``REFUSED`` or ``OVER_BUDGET``, and the C call's six outcome words, valid
        until the next call on this table. ``OVER_BUDGET``: ``[0]`` the window's index, ``[1], [2]`` its
        spend (tokens, cost). Otherwise ``[0]`` is -1 when admitted, else the refusing limit's index, and
        ``[1]`` its wait in ns (-1: never); ``[2], [3]`` and ``[4], [5]`` are the index and remaining units
        of the requests and tokens buckets with the fewest left (index -1: none)."""
        out = self._out
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        if windows is None:
            rc = _lib.gw_bt_admit(
                self._base, self._size, _NULL, 0, plan.limits, plan.n, tokens, base, size, note, -1, out
            )
        else:
            rc = _lib.gw_bt_admit(
                self._base, self._size, windows.windows, windows.n, plan.limits, plan.n, tokens,
                base, size, note, -1, out,
            )  # fmt: skip
        if rc < 0:
            raise_for(rc)
        return rc, out

    def finish(
        self,
        plan: AdmissionPlan,
        tokens: int,
        used: int,
        notes: AtomicWords | None,
        note: int,
        windows: BudgetWindows | None = None,
        spend_tokens: int = 0,
        spend_cost: int = 0,
    ) -> int:
        """End a request ``admit`` let in with ``tokens``, in one C call (see ``gw_bt_finish``): settle its
        token buckets to ``used`` (none when ``used < 0``), give its gauge places back and clear their
        notes, and add ``spend_tokens`` and ``spend_cost`` to every budget window of ``windows``. Returns
        how many windows hold the spend: all of them, or fewer when the table had no slot for the next."""
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        try:
            if windows is None:
                rc: int = _lib.gw_bt_finish(
                    self._base, self._size, plan.limits, plan.n, tokens, used, base, size, note,
                    _NULL, 0, 0, 0, -1,
                )  # fmt: skip
            else:
                rc = _lib.gw_bt_finish(
                    self._base, self._size, plan.limits, plan.n, tokens, used, base, size, note,
                    windows.windows, windows.n, spend_tokens, spend_cost, -1,
                )  # fmt: skip
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            raise_for(rc)
        return rc


REFUSED: Final = 0
ADMITTED: Final = 1
OVER_BUDGET: Final = 3
LIMIT_REQUESTS: Final = 0
LIMIT_TOKENS: Final = 1
LIMIT_CONCURRENCY: Final = 2


class AdmissionPlan:
    """The limits one request is admitted against, as the C array ``gw_bt_admit`` walks: ``(kind, key,
    limit, rate per second)`` each, ``kind`` one of ``LIMIT_REQUESTS``, ``LIMIT_TOKENS`` (``limit`` is the
    burst) or ``LIMIT_CONCURRENCY`` (``limit`` places; the rate is unused). Immutable once built."""

    __slots__ = ("gauges", "limits", "n")

    def __init__(self, limits: list[tuple[int, int, int, float]]) -> None:
        require_native()
        if len(limits) > _lib.GW_PLAN_MAX:
            raise ValueError(f"a plan has at most {_lib.GW_PLAN_MAX} limits")
        self.n = len(limits)
        self.limits: Any = _ffi.new("gw_limit[]", max(1, self.n))
        for i, (kind, key, limit, rate) in enumerate(limits):
            entry = self.limits[i]
            entry.kind, entry.key, entry.limit = kind, key, limit
            entry.rate_per_s = rate if kind != LIMIT_CONCURRENCY else 1.0
        self.gauges = sum(1 for kind, *_ in limits if kind == LIMIT_CONCURRENCY)


class BudgetWindows:
    """The budget windows one request answers to, as the C array ``gw_bt_admit`` checks and
    ``gw_bt_finish`` adds spend to: ``(key, tokens, cost)`` each, the window's spend key and its limits
    per window (None: no limit of that kind). ``budgets`` says what each window stands for, for the caller
    to name the one that refused. Immutable once built."""

    __slots__ = ("budgets", "keys", "n", "windows")

    def __init__(
        self, windows: list[tuple[int, int | None, int | None]], budgets: tuple[Any, ...] = ()
    ) -> None:
        require_native()
        if len(windows) > _lib.GW_PLAN_MAX:
            raise ValueError(f"at most {_lib.GW_PLAN_MAX} budget windows")
        self.n = len(windows)
        self.keys = tuple(key for key, _, _ in windows)
        self.budgets = budgets
        self.windows: Any = _ffi.new("gw_window[]", max(1, self.n))
        for i, (key, tokens, cost) in enumerate(windows):
            entry = self.windows[i]
            entry.key = key
            entry.tokens = -1 if tokens is None else tokens
            entry.cost = -1 if cost is None else cost


def _now(now_ns: int) -> int:
    if now_ns < 0:
        raise ValueError("now_ns must be >= 0")
    return now_ns
