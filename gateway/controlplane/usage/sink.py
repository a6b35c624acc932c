"""The control worker's end of the usage pipeline: drain the proxy workers' rings into the store, and
keep each budget's *base* spend in shared memory.

Draining reads a batch from every ring without consuming it, writes the decoded records in one
transaction (a request id already stored is skipped), and only then advances each ring's tail. A crash in
between replays the batch, which inserts nothing twice: every record is written exactly once, and a
control-worker restart loses none (the rings live in the supervisor's segment).

A budget's spend in the current window is ``live + base`` (see ``gateway.dataplane.budgets``). Workers add
every request they charge to the live counter named by the window's key; the record carries that key. So
the base is exactly the window's stored spend *not* carried by that key: records from before this bucket
table existed, from other hosts, or from workers that had no budget for the principal yet. It is
recomputed from the store at start, when budgets change, when a window rolls over, and every
``refresh_interval`` seconds (which picks up other hosts); in between, each newly stored record that the
live counter does not hold is added to the base as it is drained. Recomputing only ever happens between
drains, in this one task, so no record is counted twice or missed.
I/O: the store; the shared usage rings and bucket table.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.budget import Budget, window_key
from gateway.controlplane.store import Store
from gateway.controlplane.usage.budget_alerts import Alert, BudgetAlerts
from gateway.controlplane.usage.metrics import Metrics
from gateway.controlplane.usage.otel import OtelExporter
from gateway.controlplane.usage.requests_view import FlightRecorder
from gateway.native import BucketTable, UsageRing
from gateway.usage_record import (
    UsageRecord,
    access_line,
    decode_record,
    record_from_values,
    records_from_values,
)

__all__ = ["UsageSink"]

log = logging.getLogger("gateway.controlplane")

BATCH_PER_RING = 2048


@dataclass(slots=True)
class _Base:
    key: int
    start: float
    end: float
    tokens: int
    cost: int


class UsageSink:
    def __init__(
        self,
        store: Store,
        ring: UsageRing,
        table: BucketTable,
        epoch: str,
        *,
        refresh_interval: float = 30.0,
        recent: int = 0,
    ) -> None:
        self.store = store
        self.recent = FlightRecorder(recent)  # the last finished requests, for the admin API and UI
        self.exporter: OtelExporter | None = None  # OpenTelemetry export of the sampled records, when on
        self.ring = ring
        self.table = table
        self.epoch = epoch
        self.refresh_interval = refresh_interval
        self.budgets: dict[str, Budget] = {}
        self.metrics = Metrics()
        # Where access-log lines go (the control worker's stdout), or None for none.
        self.access_log: Callable[[bytes], object] | None = None
        self.principal_names: dict[str, str] = {}
        self.alerts = BudgetAlerts()
        self.bases: dict[str, _Base] = {}
        self.malformed = 0
        self.written = 0
        self._refreshed_at = 0.0

    # -- draining -------------------------------------------------------------------------------------
    def drain(self) -> int:
        """Move one batch from every ring into the store; returns how many ring entries were consumed.
        Raises StoreError (the rings are then left as they were, to be drained again).

        The cyclic garbage collector is paused meanwhile: a batch allocates tens of thousands of objects
        (decoded values, records, rows), none of them in a cycle, which would otherwise set off several
        collections per batch that walk the whole control worker's heap and find nothing to free."""
        if not gc.isenabled():
            return self._drain()
        gc.disable()
        try:
            return self._drain()
        finally:
            gc.enable()

    def _drain(self) -> int:
        ring = self.ring
        taken: list[tuple[int, int]] = []
        records: list[UsageRecord] = []
        for index in range(ring.rings):
            raw = ring.read(index, BATCH_PER_RING)
            if not raw:
                continue
            taken.append((index, len(raw)))
            records += self._decode(index, raw)
        if not taken:
            return 0
        self.write(records)
        for index, n in taken:
            ring.advance(index, n)
        return sum(n for _, n in taken)

    def write(self, records: list[UsageRecord]) -> None:
        """Write records (from the rings, or from a proxy-role host) once each, and fold the new ones that
        the live counters do not hold into their budgets' base. Raises StoreError."""
        new = self.store.usage.insert(records, self._folds if self.bases else None)  # no base: none folds
        self.written += len(records)
        self._fold(new)
        self.recent.add(records)
        if self.exporter is not None:
            self.exporter.add(records)
        self.metrics.observe(records, self.principal_names)
        if self.access_log is not None and records:
            names = self.principal_names
            self.access_log(b"".join(access_line(r, names.get(r.principal_id)) for r in records))

    def _decode(self, index: int, raw: list[bytes]) -> list[UsageRecord]:
        """The ring's batch decoded in one parse and checked as a whole; record by record (dropping the
        unreadable ones) only when the batch as a whole is not valid current-version records."""
        try:
            values = orjson.loads(b"[" + b",".join(raw) + b"]")
        except orjson.JSONDecodeError:
            values = None
        if values is not None and len(values) != len(raw):  # a slot held more than one value
            values = None
        if values is not None:
            records = records_from_values(values)
            if records is not None:
                return records
        out: list[UsageRecord] = []
        for i, data in enumerate(raw):
            try:
                out.append(record_from_values(values[i]) if values is not None else decode_record(data))
            except ValueError as exc:
                self.malformed += 1
                log.error("dropping an unreadable usage record from ring %d: %s", index, exc)
        return out

    def pending(self) -> int:
        return sum(self.ring.pending(i) for i in range(self.ring.rings))

    # -- budgets --------------------------------------------------------------------------------------
    def set_budgets(self, principals: dict[str, Any], now: float | None = None) -> None:
        """Take the budgets of a newly published snapshot document's principals, and recompute."""
        self.principal_names = {pid: str(doc.get("name", pid)) for pid, doc in principals.items()}
        budgets = {}
        for pid, doc in principals.items():
            budget = Budget.from_doc(pid, doc.get("budget"))
            if budget is not None:
                budgets[pid] = budget
        self.budgets = budgets
        self.alerts.set_thresholds(principals)
        self.recompute(now)

    def check_alerts(self, now: float | None = None) -> list[Alert]:
        """The budget alerts newly due, from each budget's current window spend (live plus base)."""
        now = time.time() if now is None else now
        spend = {pid: self.table.spend(base.key) for pid, base in self.bases.items()}
        return self.alerts.check(self.budgets, spend, self.principal_names, now)

    def tick(self, now: float | None = None) -> None:
        """Recompute when a window rolled over or the refresh interval passed."""
        now = time.time() if now is None else now
        rolled = any(not base.start <= now < base.end for base in self.bases.values())
        if rolled or now - self._refreshed_at >= self.refresh_interval:
            self.recompute(now)

    def recompute(self, now: float | None = None) -> None:
        """Set every budget's base from the store. Call between drains only."""
        now = time.time() if now is None else now
        by_window: dict[tuple[float, float], list[str]] = {}
        for pid, budget in self.budgets.items():
            by_window.setdefault(budget.window(now), []).append(pid)
        bases: dict[str, _Base] = {}
        for (start, end), pids in by_window.items():
            for pid in pids:
                key = window_key(self.epoch, pid, self.budgets[pid].period, start)
                bases[pid] = _Base(key, start, end, 0, 0)
            for row in self.store.usage.spend(start, end, pids):
                base = bases[row.principal_id]
                if row.budget_key != base.key:
                    base.tokens += row.tokens
                    base.cost += row.cost_nanos
        for base in bases.values():
            self.table.spend_set_base(base.key, base.tokens, base.cost)
        self.bases = bases
        self._refreshed_at = now

    def bases_for(self, epoch: str, now: float | None = None) -> dict[str, list[int]]:
        """The base spend another host's bucket table needs, for every budget's current window: what the
        store holds that the live counter of that host (named by its ``epoch``) does not. Keyed by the
        window key (as a decimal string) in that host's table."""
        now = time.time() if now is None else now
        by_window: dict[tuple[float, float], list[str]] = {}
        for pid, budget in self.budgets.items():
            by_window.setdefault(budget.window(now), []).append(pid)
        out: dict[str, list[int]] = {}
        for (start, end), pids in by_window.items():
            keys = {pid: window_key(epoch, pid, self.budgets[pid].period, start) for pid in pids}
            base = {pid: [0, 0] for pid in pids}
            for row in self.store.usage.spend(start, end, pids):
                if row.budget_key != keys[row.principal_id]:
                    base[row.principal_id][0] += row.tokens
                    base[row.principal_id][1] += row.cost_nanos
            out.update({str(keys[pid]): value for pid, value in base.items()})
        return out

    def _folds(self, r: UsageRecord) -> bool:
        """Whether a record, once stored, belongs in its budget's base: it spent something in the
        current window of a budget whose live counter does not hold it."""
        base = self.bases.get(r.principal_id)
        return (
            base is not None
            and r.budget_key != base.key
            and base.start <= r.ts < base.end
            and (r.total_tokens > 0 or r.cost_nanos > 0)
        )

    def _fold(self, records: list[UsageRecord]) -> None:
        """Add newly stored records that the live counter does not hold to their budget's base."""
        changed: set[str] = set()
        for r in records:
            base = self.bases[r.principal_id]
            base.tokens += r.total_tokens
            base.cost += r.cost_nanos
            changed.add(r.principal_id)
        for pid in changed:
            base = self.bases[pid]
            self.table.spend_set_base(base.key, base.tokens, base.cost)
