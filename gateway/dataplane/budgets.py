"""Budget enforcement on the request path: refuse a request when any budget it answers to (each of its
principal's and each of its key's, one per period) has reached its limit in the current window, and add
what each finished request spent to every one of them.

Enforced after the fact, like the reference design: a request is admitted while the spend *before* it is
under every budget, so the request that crosses a line completes and the next one is refused with 402.
Counting mid-stream would mean parsing every frame.

The spend of a budget's current window lives in the shared bucket table under the window's key
(``gateway.budget.window_key``): the *live* part, which proxy workers add to as requests finish, and the
*base*, which the control worker sets from the store (spend the live part does not hold: from before this
gateway started, or from other hosts). One read per window to check, one add per window to charge; the
window keys come cached from the key's ``BudgetSet``. I/O: none (shared memory only).
"""

from __future__ import annotations

import logging

from gateway.budget import BudgetSet, exceeded_message
from gateway.errors import BudgetExceeded
from gateway.native import BucketTable, NativeError

__all__ = ["BudgetGuard"]

log = logging.getLogger("gateway.dataplane")


class BudgetGuard:
    def __init__(self, table: BucketTable, epoch: str) -> None:
        self.table = table
        self.epoch = epoch

    def check(self, budgets: BudgetSet, now: float) -> None:
        """Raise BudgetExceeded when the current window's spend has reached any of the budgets."""
        spend = self.table.spend
        for budget, key in budgets.windows_at(self.epoch, now):
            tokens, cost = spend(key)
            if budget.exceeded(tokens, cost):
                raise BudgetExceeded(exceeded_message(budget, tokens, cost, now))

    def charge(
        self, budgets: BudgetSet, now: float, tokens: int, cost_nanos: int, request_id: str = "-"
    ) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """Add one finished request's spend to the live counter of every window; returns the keys of those
        it was added to (the principal's budgets', the key's), for the request's usage record.

        A table that refuses one (it is full) is logged, not raised: the record then names only the
        counters that hold the spend, and the control worker adds it to the others' bases from the store,
        so no window counts it twice or misses it."""
        windows = budgets.windows_at(self.epoch, now)
        if tokens or cost_nanos:
            add = self.table.spend_add
            key = 0
            try:
                for _, key in windows:
                    add(key, tokens, cost_nanos)
            except NativeError as exc:
                log.error("adding request %s to a budget window failed: %s", request_id, exc)
                # The windows before the one refused hold it (a set's window keys are distinct).
                failed = [k for _, k in windows].index(key)
                return _only(budgets.live, {k for _, k in windows[:failed]})
        return budgets.live


def _only(
    live: tuple[tuple[int, ...] | None, tuple[int, ...] | None], added: set[int]
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    principal, key = live
    return (
        tuple(k for k in principal if k in added) or None if principal else None,
        tuple(k for k in key if k in added) or None if key else None,
    )
