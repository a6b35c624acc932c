"""Budget enforcement on the request path: refuse a request when any budget it answers to (each of its
principal's and each of its key's, one per period) has reached its limit in the current window, and add
what each finished request spent to every one of them.

Enforced after the fact, like the reference design: a request is admitted while the spend *before* it is
under every budget, so the request that crosses a line completes and the next one is refused with 402.
Counting mid-stream would mean parsing every frame.

The spend of a budget's current window lives in the shared bucket table under the window's key
(``gateway.budget.window_key``): the *live* part, which proxy workers add to as requests finish, and the
*base*, which the control worker sets from the store (spend the live part does not hold: from before this
gateway started, or from other hosts). A request's windows go to C as one array (``BudgetWindows``, made
once per window and cached on the key's ``BudgetSet``), checked in the same call that takes its rate
limits and charged in the same call that settles them (``gateway.dataplane.limits``); with no limits, in a
call of their own here. I/O: none (shared memory only).
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.budget import BudgetSet, exceeded_message
from gateway.errors import BudgetExceeded
from gateway.native import OVER_BUDGET, AdmissionPlan, BucketTable, BudgetWindows

__all__ = ["BudgetGuard", "over_budget"]

log = logging.getLogger("gateway.dataplane")

Live = tuple[tuple[int, ...] | None, tuple[int, ...] | None]


class BudgetGuard:
    def __init__(self, table: BucketTable, epoch: str) -> None:
        self.table = table
        self.epoch = epoch
        self._no_limits = AdmissionPlan([])  # the plan of a request that has budgets and no rate limits

    def windows(self, budgets: BudgetSet, now: float) -> BudgetWindows:
        """The C array of the windows containing ``now``: the principal's budgets', then the key's."""
        windows = budgets.windows_at(self.epoch, now)  # drops ``native`` when a window rolled over
        native: BudgetWindows | None = budgets.native
        if native is None:
            native = BudgetWindows(
                [(key, b.tokens, b.cost) for b, key in windows], tuple(b for b, _ in windows)
            )
            budgets.native = native
        return native

    def check(self, budgets: BudgetSet, now: float) -> None:
        """Raise BudgetExceeded when the current window's spend has reached any of the budgets (for a
        request without rate limits: the limiter checks them in its own call)."""
        self.check_windows(self.windows(budgets, now))

    def check_windows(self, windows: BudgetWindows) -> None:
        """``check`` of the windows ``windows`` made, in one C call."""
        rc, out = self.table.admit(self._no_limits, 0, None, -1, windows)
        if rc == OVER_BUDGET:
            raise over_budget(windows, out)

    def charge(
        self, budgets: BudgetSet, now: float, tokens: int, cost_nanos: int, request_id: str = "-"
    ) -> Live:
        """Add one finished request's spend to the live counter of every window (for a request without
        rate limits); returns the keys of those it was added to (the principal's budgets', the key's), for
        the request's usage record."""
        windows = self.windows(budgets, now)
        return held(budgets, windows, self.charge_windows(windows, tokens, cost_nanos), request_id)

    def charge_windows(self, windows: BudgetWindows, tokens: int, cost_nanos: int) -> int:
        """``charge`` of the windows ``windows`` made, in one C call; how many of them hold the spend."""
        return self.table.finish(self._no_limits, 0, -1, None, -1, windows, tokens, cost_nanos)


def over_budget(windows: BudgetWindows, out: Any) -> BudgetExceeded:
    """The refusal of a request whose admission call said ``OVER_BUDGET``: ``out`` names the window."""
    return BudgetExceeded(exceeded_message(windows.budgets[out[0]], out[1], out[2]))


def held(budgets: BudgetSet, windows: BudgetWindows, added: int, request_id: str) -> Live:
    """The live counters that hold a request's spend, as its usage record names them: all of the windows,
    or those before the one the table refused (it is full). A refusal is logged, not raised: the record
    then names only the counters that hold the spend, and the control worker adds it to the others' bases
    from the store, so no window counts it twice or misses it."""
    if added == windows.n:
        return budgets.live
    log.error("adding request %s to a budget window failed: the bucket table is full", request_id)
    holding = set(windows.keys[:added])  # a set's window keys are distinct
    principal, key = budgets.live
    return (
        tuple(k for k in principal if k in holding) or None if principal else None,
        tuple(k for k in key if k in holding) or None if key else None,
    )
