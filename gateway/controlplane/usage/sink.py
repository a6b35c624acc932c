"""The control worker's end of the usage pipeline: drain the proxy workers' rings into the store, and
keep each budget window's *base* spend in shared memory.

Draining reads a batch from every ring without consuming it, writes the decoded records in one
transaction (a request id already stored is skipped), and only then advances each ring's tail. A crash in
between replays the batch, which inserts nothing twice: every record is written exactly once, and a
control-worker restart loses none (the rings live in the supervisor's segment).

Every budget (each of a principal's, each of a key's, one per period) has its own window and its own
spend there, ``live + base`` (see ``gateway.dataplane.budgets``). Workers add every request to the live
counter of each window it answers to, named by the window's key; the record lists those keys, the
principal's budgets' and the key's apart. So a window's base is exactly its stored spend (the principal's,
or the key's) *not* carried by its key: records from before this bucket table existed, from other hosts,
or from workers that did not have that budget yet. It is recomputed from the store at start, when budgets
change, when a window rolls over, and every ``refresh_interval`` seconds (which picks up other hosts); in
between, each newly stored record that a window's live counter does not hold is added to that base as it
is drained. Recomputing only ever happens between drains, in this one task, so no record is counted twice
or missed in any window.

No record stops the drain (``write``): each is checked before it is stored (``bound_record``): figures
out of their columns' bounds are clamped, and the record stored with the names of the fields that were
(the ``clamped`` column); a record that cannot be stored as it is (not JSON, the wrong types, an end time
that is not a number) is set aside in ``usage_rejected`` with the reason, for an operator to read. A batch
the database refuses for a value (``StoreDataError``, not an outage) is written again record by record,
and only the records it still refuses are set aside. Both are counted in the metrics
(``gateway_usage_records_clamped_total``, ``gateway_usage_records_rejected_total``) and logged once per
reason, not per record, so that a flood of them does not flood the log. A record set aside is consumed
from its ring like a stored one: each record is stored or set aside exactly once.
I/O: the store; the shared usage rings and bucket table.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.budget import KEY_OWNER, Budget, budgets_from_doc, window_key
from gateway.controlplane.store import Store, StoreConflict, StoreDataError, StoreError
from gateway.controlplane.store._usage import RejectedRecord, WindowSpend
from gateway.controlplane.usage.budget_alerts import Alert, BudgetAlerts, WatchedWindow
from gateway.controlplane.usage.metrics import Metrics
from gateway.controlplane.usage.otel import OtelExporter
from gateway.controlplane.usage.requests_view import FlightRecorder
from gateway.native import BucketTable, UsageRing
from gateway.usage_record import (
    UsageRecord,
    access_line,
    bound_record,
    decode_record,
    encode_record,
    record_from_values,
    records_from_values,
)

__all__ = ["UsageSink"]

log = logging.getLogger("gateway.controlplane")

BATCH_PER_RING = 2048


@dataclass(slots=True)
class _Base:
    """One budget's current window in a host's bucket table: its live counter's key, and the spend the
    store holds that the counter does not."""

    budget: Budget
    key: int
    start: float
    end: float
    tokens: int = 0
    cost: int = 0


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
        self.budgets: list[Budget] = []  # every principal's and every key's, from the last snapshot
        self.key_principal: dict[str, str] = {}  # key id -> principal id, of keys with budgets
        self.key_names: dict[str, str] = {}  # key id -> its name (its id when it has none)
        self.metrics = Metrics()
        # Where access-log lines go (the control worker's stdout), or None for none.
        self.access_log: Callable[[bytes], object] | None = None
        self.principal_names: dict[str, str] = {}
        self.alerts = BudgetAlerts()
        self.bases: list[_Base] = []
        # The same bases by owner: what a record's principal and key find their windows by.
        self._principal_bases: dict[str, list[_Base]] = {}
        self._key_bases: dict[str, list[_Base]] = {}
        self.written = 0
        self._logged: set[str] = set()  # the reasons for setting records aside or clamping them, logged
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
        rejected: list[RejectedRecord] = []
        for index in range(ring.rings):
            raw = ring.read(index, BATCH_PER_RING)
            if not raw:
                continue
            taken.append((index, len(raw)))
            records += self._decode(raw, rejected)
        if not taken:
            return 0
        self.write(records, rejected)
        for index, n in taken:
            ring.advance(index, n)
        return sum(n for _, n in taken)

    def write(
        self, records: list[UsageRecord], rejected: list[RejectedRecord] | None = None, source: str = "ring"
    ) -> None:
        """Write records (from the rings, or from a proxy-role host) once each, their figures clamped into
        bounds, and fold the new ones that the live counters do not hold into their budgets' base; set
        aside ``rejected`` (records that did not decode) and those that cannot be stored. Raises
        StoreError when the store is unavailable (nothing is then lost: writing again stores each record
        once)."""
        rejected = list(rejected or ())
        records, clamped = self._bound(records, rejected, source)
        watch = self._folds if self.bases else None  # no base: none folds
        try:
            new = self.store.usage.insert(records, watch, clamped)
        except (StoreDataError, StoreConflict):
            records, new = self._insert_each(records, watch, clamped, rejected, source)
        if rejected:
            self.store.usage.set_aside(rejected)
            for r in rejected:
                self.metrics.count_rejected(r.reason.split(":", 1)[0])
                self._log_once(
                    r.reason,
                    "usage record from %s set aside in usage_rejected (%s); further ones are counted in "
                    "gateway_usage_records_rejected_total, not logged",
                    r.source,
                    r.reason,
                )
        self.written += len(records)
        self._fold(new)
        self.recent.add(records)
        if self.exporter is not None:
            self.exporter.add(records)
        self.metrics.observe(records, self.principal_names)
        if self.access_log is not None and records:
            names = self.principal_names
            self.access_log(b"".join(access_line(r, names.get(r.principal_id)) for r in records))

    def _bound(
        self, records: list[UsageRecord], rejected: list[RejectedRecord], source: str
    ) -> tuple[list[UsageRecord], dict[str, tuple[str, ...]]]:
        """The records with their figures clamped into bounds, and the clamped fields by request id;
        those that cannot be (no finite end time) go to ``rejected``."""
        clamped: dict[str, tuple[str, ...]] = {}
        out = records
        for i, record in enumerate(records):
            try:
                bounded, fields = bound_record(record)
            except ValueError as exc:
                self._reject(rejected, _encoded(record), source, "invalid", str(exc))
                bounded, fields = None, ()
            if bounded is record:
                if out is not records:
                    out.append(record)
                continue
            if out is records:  # the first record that changes: copy the ones before it
                out = records[:i]
            if bounded is not None:
                out.append(bounded)
                clamped[bounded.request_id] = fields
                for field in fields:
                    self.metrics.count_clamped(field)
                    self._log_once(
                        f"clamped {field}",
                        "usage record %s stored with %s clamped into its bounds (e.g. a usage figure no "
                        "column holds); further ones are counted in gateway_usage_records_clamped_total, "
                        "not logged",
                        record.request_id,
                        field,
                    )
        return out, clamped

    def _insert_each(
        self,
        records: list[UsageRecord],
        watch: Callable[[UsageRecord], bool] | None,
        clamped: dict[str, tuple[str, ...]],
        rejected: list[RejectedRecord],
        source: str,
    ) -> tuple[list[UsageRecord], list[UsageRecord]]:
        """The database refused a value of the batch: write its records one at a time, setting aside
        those it refuses; returns the records stored and the new ones ``watch`` selects. A store that
        fails otherwise meanwhile raises, after those stored so far are folded into the bases."""
        stored: list[UsageRecord] = []
        new: list[UsageRecord] = []
        try:
            for record in records:
                try:
                    new += self.store.usage.insert([record], watch, clamped)
                except (StoreDataError, StoreConflict) as exc:
                    self._reject(rejected, _encoded(record), source, "refused", exc.message)
                else:
                    stored.append(record)
        except StoreError:
            self._fold(new)
            raise
        return stored, new

    @staticmethod
    def _reject(into: list[RejectedRecord], data: bytes, source: str, kind: str, why: str) -> None:
        """A record to set aside, with ``kind`` (the reason's class, the metric's label) first in its
        reason; ``write`` counts and logs it."""
        into.append(RejectedRecord.of(data, source, f"{kind}: {why}"))

    def _log_once(self, reason: str, message: str, *args: object) -> None:
        # A bounded set: reasons name a field or a class of error, with no figure of the record; should a
        # store's messages vary without end, at most a few hundred distinct reasons are logged.
        if reason in self._logged or len(self._logged) >= 256:
            return
        self._logged.add(reason)
        log.error(message, *args)

    def _decode(self, raw: list[bytes], rejected: list[RejectedRecord]) -> list[UsageRecord]:
        """The ring's batch decoded in one parse and checked as a whole; record by record (setting the
        unreadable ones aside into ``rejected``) only when the batch as a whole is not valid
        current-version records."""
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
                kind = "invalid" if values is not None or _is_json(data) else "undecodable"
                self._reject(rejected, data, "ring", kind, str(exc).split(":", 1)[0])
        return out

    def pending(self) -> int:
        return sum(self.ring.pending(i) for i in range(self.ring.rings))

    # -- budgets --------------------------------------------------------------------------------------
    def set_budgets(
        self, principals: dict[str, Any], keys: dict[str, Any] | None = None, *, now: float | None = None
    ) -> None:
        """Take the budgets of a newly published snapshot document's principals and keys, and recompute."""
        self.principal_names = {pid: str(doc.get("name", pid)) for pid, doc in principals.items()}
        budgets = [b for pid, doc in principals.items() for b in budgets_from_doc(pid, doc)]
        self.key_principal, self.key_names = {}, {}
        for entry in (keys or {}).values():
            if not entry.get("budgets") or entry.get("principal") not in principals:
                continue
            key_id = str(entry["id"])
            own = budgets_from_doc(KEY_OWNER + key_id, entry)
            if own:
                budgets += own
                self.key_principal[key_id] = str(entry["principal"])
                self.key_names[key_id] = str(entry.get("name") or key_id)
        self.budgets = budgets
        self.recompute(now)

    def watched(self) -> list[WatchedWindow]:
        """Every budget's current window with its spend, live plus base, as the request path sees it."""
        out = []
        for base in self.bases:
            tokens, cost = self.table.spend(base.key)
            key_id = base.budget.key_id
            if key_id is None:
                principal = self.principal_names.get(base.budget.owner, base.budget.owner)
                out.append(WatchedWindow(base.budget, principal, None, tokens, cost))
            else:
                pid = self.key_principal.get(key_id, "")
                principal = self.principal_names.get(pid, pid)
                out.append(
                    WatchedWindow(base.budget, principal, self.key_names.get(key_id, key_id), tokens, cost)
                )
        return out

    def check_alerts(self, now: float | None = None) -> list[Alert]:
        """The budget alerts newly due, from each budget's current window spend (live plus base)."""
        return self.alerts.check(self.watched(), time.time() if now is None else now)

    def tick(self, now: float | None = None) -> None:
        """Recompute when a window rolled over or the refresh interval passed."""
        now = time.time() if now is None else now
        rolled = any(not base.start <= now < base.end for base in self.bases)
        if rolled or now - self._refreshed_at >= self.refresh_interval:
            self.recompute(now)

    def recompute(self, now: float | None = None) -> None:
        """Set every budget window's base from the store. Call between drains only."""
        now = time.time() if now is None else now
        bases = self._bases(self.epoch, now)
        for base in bases:
            self.table.spend_set_base(base.key, base.tokens, base.cost)
        self.bases = bases
        self._principal_bases, self._key_bases = {}, {}
        for base in bases:
            key_id = base.budget.key_id
            if key_id is None:
                self._principal_bases.setdefault(base.budget.owner, []).append(base)
            else:
                self._key_bases.setdefault(key_id, []).append(base)
        self._refreshed_at = now

    def bases_for(self, epoch: str, now: float | None = None) -> dict[str, list[int]]:
        """The base spend another host's bucket table needs, for every budget's current window: what the
        store holds that the live counter of that host (named by its ``epoch``) does not. Keyed by the
        window key (as a decimal string) in that host's table."""
        now = time.time() if now is None else now
        return {str(base.key): [base.tokens, base.cost] for base in self._bases(epoch, now)}

    def _bases(self, epoch: str, now: float) -> list[_Base]:
        """Every budget's current window in the table of ``epoch``, its base summed from the store: one
        query per distinct window for the principals' budgets, one for the keys'."""
        by_window: dict[tuple[float, float], list[_Base]] = {}
        for budget in self.budgets:
            start, end = budget.window(now)
            base = _Base(budget, window_key(epoch, budget.owner, budget.period, start), start, end)
            by_window.setdefault((start, end), []).append(base)
        out: list[_Base] = []
        for (start, end), bases in by_window.items():
            principal: dict[str, list[_Base]] = {}
            key: dict[str, list[_Base]] = {}
            for base in bases:
                key_id = base.budget.key_id
                if key_id is None:
                    principal.setdefault(base.budget.owner, []).append(base)
                else:
                    key.setdefault(key_id, []).append(base)
            if principal:
                _add_unheld(principal, self.store.usage.spend(start, end, list(principal)))
            if key:
                owners = {k: self.key_principal[k] for k in key}
                _add_unheld(key, self.store.usage.key_spend(start, end, owners))
            out += bases
        return out

    def _folds(self, r: UsageRecord) -> bool:
        """Whether a record, once stored, belongs in any budget's base: it spent something in the
        current window of a budget (its principal's or its key's) whose live counter does not hold it."""
        if r.total_tokens <= 0 and r.cost_nanos <= 0:
            return False
        # Plain loops: this runs for every record stored, most of them with nothing to fold.
        for base in self._principal_bases.get(r.principal_id, ()):
            if _misses(base, r.ts, r.budget_keys):
                return True
        for base in self._key_bases.get(r.key_id, ()):  # noqa: SIM110 (no generator per record)
            if _misses(base, r.ts, r.key_budget_keys):
                return True
        return False

    def _fold(self, records: list[UsageRecord]) -> None:
        """Add newly stored records to the bases of the windows whose live counters do not hold them."""
        changed: dict[int, _Base] = {}
        for r in records:
            for base in self._principal_bases.get(r.principal_id, ()):
                if _misses(base, r.ts, r.budget_keys):
                    base.tokens += r.total_tokens
                    base.cost += r.cost_nanos
                    changed[base.key] = base
            for base in self._key_bases.get(r.key_id, ()):
                if _misses(base, r.ts, r.key_budget_keys):
                    base.tokens += r.total_tokens
                    base.cost += r.cost_nanos
                    changed[base.key] = base
        for base in changed.values():
            self.table.spend_set_base(base.key, base.tokens, base.cost)


def _encoded(record: UsageRecord) -> bytes:
    """A record as it is set aside: as it was encoded, or its Python form should that fail."""
    try:
        return encode_record(record)
    except orjson.JSONEncodeError:
        return repr(tuple(record)).encode()


def _is_json(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def _misses(base: _Base, ts: float, keys: Sequence[int] | None) -> bool:
    """Whether a record that ended at ``ts`` belongs in ``base``'s window without its live counter
    holding it (``keys``: the counters the record names for the same owner)."""
    return base.start <= ts < base.end and (keys is None or base.key not in keys)


def _add_unheld(bases: dict[str, list[_Base]], rows: list[WindowSpend]) -> None:
    """Add to each owner's bases the spend their live counters do not hold."""
    for row in rows:
        for base in bases.get(row.owner_id, ()):
            tokens, cost = row.unheld(base.key)
            base.tokens += tokens
            base.cost += cost
