"""Budget enforcement on the request path: refuse a principal whose spend in the current window has
reached its budget, and add what each finished request spent.

Enforced after the fact, like the reference design: a request is admitted while the spend *before* it is
under the budget, so the request that crosses the line completes and the next one is refused with 402.
Counting mid-stream would mean parsing every frame.

The spend of the current window lives in the shared bucket table under the window's key
(``gateway.budget.window_key``): the *live* part, which proxy workers add to as requests finish, and the
*base*, which the control worker sets from the store (spend the live part does not hold: from before this
gateway started, or from other hosts). I/O: none (shared memory only).
"""

from __future__ import annotations

import time

from gateway.budget import Budget, format_money
from gateway.errors import BudgetExceeded
from gateway.native import BucketTable

__all__ = ["BudgetGuard"]


class BudgetGuard:
    def __init__(self, table: BucketTable, epoch: str) -> None:
        self.table = table
        self.epoch = epoch

    def check(self, budget: Budget, now: float) -> None:
        """Raise BudgetExceeded when the current window's spend has reached the budget."""
        tokens, cost = self.table.spend(budget.key_at(self.epoch, now))
        if budget.exceeded(tokens, cost):
            raise _exceeded(budget, tokens, cost)

    def charge(self, budget: Budget, now: float, tokens: int, cost_nanos: int) -> int:
        """Add one finished request's spend to the live counter; returns the counter's key."""
        key = budget.key_at(self.epoch, now)
        if tokens or cost_nanos:
            self.table.spend_add(key, tokens, cost_nanos)
        return key


def _exceeded(budget: Budget, tokens: int, cost: int) -> BudgetExceeded:
    _, end = budget.window(time.time())
    resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    if budget.tokens is not None and tokens >= budget.tokens:
        used = f"{tokens} of {budget.tokens} tokens"
    else:
        used = f"{format_money(cost)} of {format_money(budget.cost or 0)} (cost)"
    return BudgetExceeded(
        f"Budget exceeded: this principal has used {used} in its {budget.period} budget period, "
        f"which resets at {resets}."
    )
