"""Admission against the rate limits of a request's scopes, on the token buckets in shared memory.

A request is checked against every scope that has limits — its principal, its key, and its principal on
the model name it used — after authorisation and before anything is sent upstream. Requests and tokens
per minute are GCRA buckets (burst = the per-minute amount, refilled continuously); tokens are reserved
from the request's estimate and settled against the real usage afterwards (debt allowed). Concurrency is a
gauge taken for the request's lifetime. A request's limits are one plan (``AdmissionPlan``), taken all or
nothing in one C call and settled in another, on atomics in the shared table, so a limit is exact across
all workers of the host. The request's budget windows (``gateway.dataplane.budgets``) ride in the same two
calls: checked before any limit is taken, charged as the limits are settled. I/O: none (shared memory
only).

A worker killed with ``kill -9`` cannot give its gauges back, so each worker notes the gauges it holds
in its own area of a shared segment (``gateway.shm.holdings.Holdings``) before taking them; the worker the
supervisor starts in its place releases whatever is still noted there. Rate buckets need no such care:
what a killed request took stays taken, as it would have had the request finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.dataplane.budgets import over_budget
from gateway.errors import RateLimited
from gateway.native import (
    ADMITTED,
    LIMIT_CONCURRENCY,
    LIMIT_REQUESTS,
    LIMIT_TOKENS,
    OVER_BUDGET,
    AdmissionPlan,
    BucketTable,
    BudgetWindows,
)
from gateway.shm.holdings import Holdings
from gateway.snapshot import KeyEntry, Limits

__all__ = ["Limiter", "Ticket", "estimate_tokens"]

# Bytes per token for the prompt estimate: a common rule of thumb for English text and JSON overhead.
BYTES_PER_TOKEN = 4
# Plans cached per worker before the cache starts over (each is a few hundred bytes).
PLAN_CACHE = 8192


def estimate_tokens(body_len: int, max_tokens: int | None, default_completion: int) -> tuple[int, int]:
    """``(prompt, total)`` tokens to reserve before dispatch: the prompt estimated from the body size, plus
    the completion budget the client asked for (or the configured default). Settled to the real count
    afterwards."""
    prompt = body_len // BYTES_PER_TOKEN
    return prompt, prompt + (max_tokens if max_tokens is not None else default_completion)


class _Plan:
    """The limits of one (key, model name) as one C array, with what the request path says about them."""

    __slots__ = ("admission", "headers", "scopes", "what")

    def __init__(self, scopes: list[Limits], shares: dict[str, float] | None, default_share: float) -> None:
        rows: list[tuple[int, int, int, float]] = []
        for scope in scopes:
            share = 1.0 if shares is None else shares.get(scope.scope, default_share)
            for counts_tokens, limit, bucket, rate in scope.rates:
                if share != 1.0:  # this host's part of a limit shared across hosts
                    limit, rate = max(1, int(limit * share)), rate * share
                rows.append((LIMIT_TOKENS if counts_tokens else LIMIT_REQUESTS, bucket, limit, rate))
            if scope.concurrency is not None:
                places = scope.concurrency if share == 1.0 else max(1, int(scope.concurrency * share))
                rows.append((LIMIT_CONCURRENCY, scope.concurrency_key, places, 0.0))
        self.admission = AdmissionPlan(rows)
        self.scopes = tuple(scope.scope for scope in scopes)
        names = {LIMIT_REQUESTS: "requests per minute", LIMIT_TOKENS: "tokens per minute"}
        self.what = [(names.get(kind, "concurrent requests"), limit) for kind, _, limit, _ in rows]
        # Per limit, the x-ratelimit-* headers of a requests or tokens bucket, by what remains of it.
        self.headers = [
            _HeaderRow(_TOKENS if kind == LIMIT_TOKENS else _REQUESTS, limit, rate)
            for kind, _, limit, rate in rows
        ]


@dataclass(slots=True)
class Ticket:
    """What one admitted request holds: its plan, the tokens it reserved, its note block, and the
    rate-limit headers its answer carries."""

    plan: _Plan
    tokens: int
    note: int
    headers: list[tuple[str, str]]


class Limiter:
    """``headers=False`` (``--no-rate-limit-headers``) leaves the x-ratelimit-* headers off admitted answers.
    ``shared=True`` on proxy-role hosts: each scope's limits are scaled by this host's share of them
    (``set_shares``, from the control plane; see ``gateway.controlplane.fleet.shares``), and the requests each
    scope admits are counted in ``traffic`` for the next reconciliation.

    A (key, model) pair's limits become a plan once, cached by the key entry's identity (entries are
    immutable and replaced with each snapshot generation), so admitting a request is one C call and
    finishing it another."""

    def __init__(
        self,
        table: BucketTable,
        holdings: Holdings | None = None,
        *,
        shared: bool = False,
        headers: bool = True,
    ) -> None:
        self.table = table
        self.headers = headers  # the x-ratelimit-* headers on admitted answers
        self.holdings = holdings
        self.notes = holdings.words if holdings is not None else None
        self.shares: dict[str, float] | None = {} if shared else None
        self.default_share = 1.0
        self.traffic: dict[str, int] = {}
        self._plans: dict[tuple[int, str], tuple[KeyEntry, _Plan | None]] = {}

    def set_shares(self, shares: dict[str, float], default: float) -> None:
        if self.shares is not None and (shares != self.shares or default != self.default_share):
            self.shares = shares
            self.default_share = default
            self._plans.clear()

    def forget_plans(self) -> None:
        """Drop the cached plans (a new snapshot replaced the key entries they were made for)."""
        self._plans.clear()

    def plan(self, key: KeyEntry, model: str) -> _Plan | None:
        cached = self._plans.get((id(key), model))
        if cached is not None and cached[0] is key:
            return cached[1]
        principal = key.principal
        model_limits = principal.model_limits.get(model) if principal.model_limits else None
        scopes = [s for s in (principal.limits, key.limits, model_limits) if s is not None]
        plan = _Plan(scopes, self.shares, self.default_share) if scopes else None
        if len(self._plans) >= PLAN_CACHE:
            self._plans.clear()
        self._plans[(id(key), model)] = (key, plan)
        return plan

    def admit(
        self, key: KeyEntry, model: str, tokens: int, windows: BudgetWindows | None = None
    ) -> Ticket | None:
        """Check the budget ``windows`` and take what the request needs from every scope, in one C call; or
        take nothing and raise BudgetExceeded or RateLimited. None, checking nothing, when the request has
        no limits (its budgets, if any, are then ``BudgetGuard``'s alone)."""
        cached = self._plans.get((id(key), model))  # ``plan``'s cache hit, inline: once per request
        plan = cached[1] if cached is not None and cached[0] is key else self.plan(key, model)
        if plan is None:
            return None
        holdings = self.holdings
        if holdings is not None and plan.admission.gauges:
            # ``Holdings.take``, its common case inline
            note = holdings.free.pop() if holdings.free else holdings.take()
        else:
            note = -1
        rc, out = self.table.admit(plan.admission, tokens, self.notes, note, windows)
        if rc == OVER_BUDGET:
            if holdings is not None:
                holdings.give(note)
            assert windows is not None
            raise over_budget(windows, out)
        if self.shares is not None:
            traffic = self.traffic
            for scope in plan.scopes:
                traffic[scope] = traffic.get(scope, 0) + 1
        if rc != ADMITTED:
            if holdings is not None:
                holdings.give(note)
            what, limit = plan.what[out[0]]
            raise _refused(what, limit, math.inf if out[1] < 0 else out[1] / 1e9)
        headers: list[tuple[str, str]] = []
        if self.headers:
            if out[2] >= 0:
                headers += plan.headers[out[2]].at(out[3])
            if out[4] >= 0:
                headers += plan.headers[out[4]].at(out[5])
        return Ticket(plan, tokens, note, headers)

    def finish(
        self,
        ticket: Ticket,
        used_tokens: int | None,
        windows: BudgetWindows | None = None,
        spend_tokens: int = 0,
        spend_cost: int = 0,
    ) -> int:
        """Settle reserved tokens against what the request really used (when known), release concurrency,
        and add the request's spend to its budget ``windows``, in one C call; returns how many windows hold
        the spend (``gw_bt_finish``)."""
        used = -1 if used_tokens is None else used_tokens
        note = ticket.note
        added = self.table.finish(
            ticket.plan.admission, ticket.tokens, used, self.notes, note, windows, spend_tokens, spend_cost
        )
        if note >= 0 and self.holdings is not None:
            self.holdings.free.append(note)  # Holdings.give, inline: once per request
        ticket.note = -1
        return added


_REQUESTS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests")
_TOKENS = ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


class _HeaderRow:
    """One bucket's three x-ratelimit-* headers: its limit, what remains of it, and how long until it is full
    again (OpenAI's ``1.5s``). They depend on nothing but what remains (the limit and the rate are the
    plan's), so the triple last made is kept and handed out again while what remains is the same: a bucket
    that stays near full, as a large limit does, costs one comparison; one whose remainder keeps changing
    formats it each time. One triple per row, whatever clients do: plans are cached by the thousand."""

    __slots__ = ("_last", "_last_remaining", "_limit", "limit", "rate", "remaining_name", "reset_name")

    def __init__(self, names: tuple[str, str, str], limit: int, rate: float) -> None:
        self._limit = (names[0], str(limit))
        self.remaining_name, self.reset_name = names[1], names[2]
        self.limit, self.rate = limit, rate
        self._last_remaining = -1
        self._last: tuple[tuple[str, str], ...] = ()

    def at(self, remaining: int) -> tuple[tuple[str, str], ...]:
        left = remaining if remaining > 0 else 0
        if left == self._last_remaining:
            return self._last
        self._last_remaining = left
        self._last = headers = (
            self._limit,
            (self.remaining_name, str(left)),
            (self.reset_name, f"{(self.limit - left) / self.rate:.3f}s"),
        )
        return headers


def _refused(what: str, limit: int, retry_after: float) -> RateLimited:
    seconds = 60 if math.isinf(retry_after) else max(1, math.ceil(retry_after))
    return RateLimited(
        f"Rate limit reached: {limit} {what}. Retry after {seconds}s.", headers={"retry-after": str(seconds)}
    )
