"""Admission against the rate limits of a request's scopes, on the token buckets in shared memory.

A request is checked against every scope that has limits — its principal, its key, and its principal on
the model name it used — after authorisation and before anything is sent upstream. Requests and tokens
per minute are GCRA buckets (burst = the per-minute amount, refilled continuously); tokens are reserved
from the request's estimate and settled against the real usage afterwards (debt allowed). Concurrency is a
gauge taken for the request's lifetime. Every bucket operation is one atomic C call on the shared table,
so a limit is exact across all workers of the host. I/O: none (shared memory only).

A worker killed with ``kill -9`` cannot give its gauges back, so each worker notes the gauges it holds
in its own area of a shared segment (``Holdings``) before taking them; the worker the supervisor starts in
its place releases whatever is still noted there. Rate buckets need no such care: what a killed request
took stays taken, as it would have had the request finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.errors import RateLimited
from gateway.native import AtomicWords, BucketTable
from gateway.snapshot import KeyEntry

__all__ = ["HOLD_SLOTS", "Holdings", "Limiter", "Ticket", "estimate_tokens"]

# Bytes per token for the prompt estimate: a common rule of thumb for English text and JSON overhead.
BYTES_PER_TOKEN = 4
# Gauges one worker can note at once (up to three per request: principal, key, principal and model).
HOLD_SLOTS = 16384


class Holdings:
    """One worker's notes of the concurrency gauges it holds: a word per held gauge (its key; 0 = free)
    in the worker's own slice of a shared segment, which outlives the worker."""

    def __init__(self, words: AtomicWords, index: int, slots: int = HOLD_SLOTS) -> None:
        self.words = words
        self.base = index * slots * 8
        self.slots = slots
        self.free = list(range(slots - 1, -1, -1))
        self.unnoted = 0

    def recover(self, table: BucketTable) -> int:
        """Release every gauge a previous worker in this slice still held; returns how many."""
        released = 0
        for i in range(self.slots):
            offset = self.base + 8 * i
            key = self.words.load(offset)
            if key:
                table.release(key)
                self.words.store(offset, 0)
                released += 1
        return released

    def note(self, key: int) -> int:
        """Note a gauge about to be taken; returns the note's slot (-1 when every slot is in use)."""
        if not self.free:
            self.unnoted += 1
            return -1
        slot = self.free.pop()
        self.words.store(self.base + 8 * slot, key)
        return slot

    def erase(self, slot: int) -> None:
        if slot >= 0:
            self.words.store(self.base + 8 * slot, 0)
            self.free.append(slot)


def estimate_tokens(body_len: int, max_tokens: int | None, default_completion: int) -> tuple[int, int]:
    """``(prompt, total)`` tokens to reserve before dispatch: the prompt estimated from the body size, plus
    the completion budget the client asked for (or the configured default). Settled to the real count
    afterwards."""
    prompt = body_len // BYTES_PER_TOKEN
    return prompt, prompt + (max_tokens if max_tokens is not None else default_completion)


@dataclass(slots=True)
class Ticket:
    """What one admitted request holds: tokens reserved per scope and concurrency slots taken."""

    taken: list[tuple[int, float, int]]  # (bucket key, rate per second, units) taken from rate buckets
    reserved: list[tuple[int, float, int]]  # the token reservations among them, settled at the end
    held: list[tuple[int, int]]  # concurrency gauges this request holds, with their Holdings slot
    headers: list[tuple[str, str]]


class Limiter:
    """``shared=True`` on proxy-role hosts: each scope's limits are scaled by this host's share of them
    (``set_shares``, from the control plane; see ``gateway.controlplane.shares``), and the requests each
    scope admits are counted in ``traffic`` for the next reconciliation."""

    def __init__(self, table: BucketTable, holdings: Holdings | None = None, *, shared: bool = False) -> None:
        self.table = table
        self.holdings = holdings
        self.shares: dict[str, float] | None = {} if shared else None
        self.default_share = 1.0
        self.traffic: dict[str, int] = {}

    def set_shares(self, shares: dict[str, float], default: float) -> None:
        if self.shares is not None:
            self.shares = shares
            self.default_share = default

    def admit(self, key: KeyEntry, model: str, tokens: int) -> Ticket | None:
        """Take what the request needs from every scope, or take nothing and raise RateLimited."""
        principal = key.principal
        model_limits = principal.model_limits.get(model) if principal.model_limits else None
        if principal.limits is None and key.limits is None and model_limits is None:
            return None
        table = self.table
        ticket = Ticket([], [], [], [])
        take = table.take
        taken, reserved, held = ticket.taken, ticket.reserved, ticket.held
        requests: tuple[int, int, float] | None = None  # the tightest bucket: (remaining, limit, rate)
        tokens_left: tuple[int, int, float] | None = None
        shares = self.shares
        try:
            for scope in (principal.limits, key.limits, model_limits):
                if scope is None:
                    continue
                share = 1.0
                if shares is not None:
                    share = shares.get(scope.scope, self.default_share)
                    self.traffic[scope.scope] = self.traffic.get(scope.scope, 0) + 1
                for counts_tokens, limit, bucket, rate in scope.rates:
                    if share != 1.0:  # this host's part of a limit shared across hosts
                        limit, rate = max(1, int(limit * share)), rate * share
                    # A request bigger than the burst still fits an empty bucket.
                    units = (tokens if tokens < limit else limit) if counts_tokens else 1
                    got = take(bucket, rate, limit, units)
                    if not got.admitted:
                        what = "tokens per minute" if counts_tokens else "requests per minute"
                        raise _refused(what, limit, got.retry_after_s)
                    taken.append((bucket, rate, units))
                    if counts_tokens:
                        reserved.append((bucket, rate, units))
                        if tokens_left is None or got.remaining < tokens_left[0]:
                            tokens_left = (got.remaining, limit, rate)
                    elif requests is None or got.remaining < requests[0]:
                        requests = (got.remaining, limit, rate)
                if scope.concurrency is not None:
                    concurrency = (
                        scope.concurrency if share == 1.0 else max(1, int(scope.concurrency * share))
                    )
                    # Noted before it is taken: a crash in between makes the successor release one
                    # that was never taken (briefly admitting one more), never leak one for good.
                    slot = self.holdings.note(scope.concurrency_key) if self.holdings is not None else -1
                    if not table.acquire(scope.concurrency_key, concurrency):
                        if self.holdings is not None:
                            self.holdings.erase(slot)
                        raise _refused("concurrent requests", concurrency, 1.0)
                    held.append((scope.concurrency_key, slot))
        except RateLimited:
            for bucket, rate, units in taken:  # nothing a refused request took may stay taken
                table.settle(bucket, rate, -units)
            self.release(ticket)
            raise
        if requests is not None:
            ticket.headers += _headers("requests", *requests)
        if tokens_left is not None:
            ticket.headers += _headers("tokens", *tokens_left)
        return ticket

    def finish(self, ticket: Ticket, used_tokens: int | None) -> None:
        """Settle reserved tokens against what the request really used (when known); release concurrency."""
        if used_tokens is not None:
            for bucket, rate, reserved in ticket.reserved:
                if used_tokens != reserved:
                    self.table.settle(bucket, rate, used_tokens - reserved)
        self.release(ticket)

    def release(self, ticket: Ticket) -> None:
        for bucket, slot in ticket.held:
            self.table.release(bucket)
            if self.holdings is not None:
                self.holdings.erase(slot)
        ticket.held.clear()


def _headers(kind: str, remaining: int, limit: int, rate: float) -> list[tuple[str, str]]:
    remaining = remaining if remaining > 0 else 0
    return [
        (f"x-ratelimit-limit-{kind}", str(limit)),
        (f"x-ratelimit-remaining-{kind}", str(remaining)),
        (f"x-ratelimit-reset-{kind}", f"{(limit - remaining) / rate:.3f}s"),
    ]


def _refused(what: str, limit: int, retry_after: float) -> RateLimited:
    seconds = 60 if math.isinf(retry_after) else max(1, math.ceil(retry_after))
    return RateLimited(
        f"Rate limit reached: {limit} {what}. Retry after {seconds}s.", headers={"retry-after": str(seconds)}
    )
