"""Usage records in the store: idempotent batch inserts, spend per budget window (of principals and of
keys), and summaries; and the records the control worker set aside or clamped (``usage_rejected``, the
``clamped`` column), for an operator to read.

Records arrive in batches from the control worker, which reads them out of the proxy workers' rings. A
batch may be replayed after a crash (the ring's tail only moves once the batch is committed), so insert
skips request ids already present and reports which records were new. All SQL is portable; the rows
themselves go through the driver's ``insert_new`` (many-row INSERTs on SQLite, COPY on PostgreSQL).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.budget import KEY_OWNER
from gateway.controlplane.store import _partitions as partitions
from gateway.controlplane.store import _spend as counters
from gateway.controlplane.store._driver import Driver
from gateway.controlplane.store._spend import WindowSpend
from gateway.usage_record import UsageRecord, to_unsigned64

__all__ = ["RejectedRecord", "UsageStore", "UsageSummaryRow", "WindowSpend"]

_COLUMNS = (
    "request_id, ts, principal_id, key_id, model, backend, status, prompt_tokens, completion_tokens, "
    "cached_tokens, total_tokens, usage_source, cost_nanos, latency_ms, ttfb_ms, budget_keys, "
    "client_request_id, attempts, tag, cut, rule, trace, span, key_budget_keys"
)
_NAMES = tuple(_COLUMNS.split(", "))  # as many as a record has fields, in its order
# Read back: the record's columns and the one budget counter of a row from before record version 7.
_READ = f"{_COLUMNS}, budget_key"
_CHUNK = 500  # ids per IN (...) lookup: well under every driver's parameter limit
_row = UsageRecord.row
_REJECTED = ("id", "ts", "source", "reason", "record")


@dataclass(frozen=True, slots=True)
class RejectedRecord:
    """A usage record set aside: what came (as text), where from, why it could not be stored, and when.
    ``id`` is a hash of what came, so that setting the same record aside again (a replayed batch) adds
    nothing."""

    id: str
    ts: float
    source: str  # "ring" (this host's proxy workers) or "cluster" (a proxy host's batch)
    reason: str
    record: str

    @classmethod
    def of(cls, data: bytes | str, source: str, reason: str, now: float | None = None) -> RejectedRecord:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        # Text any database holds: bytes that are not UTF-8 escaped, no NUL (PostgreSQL's text refuses it).
        text = raw.decode("utf-8", "backslashreplace").replace("\x00", "\\u0000")
        reason = reason.replace("\x00", "\\u0000")
        now = time.time() if now is None else now
        return cls(hashlib.sha256(raw).hexdigest(), now, source, reason, text)

    def doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts,
            "source": self.source,
            "reason": self.reason,
            "record": self.record,
        }


@dataclass(frozen=True, slots=True)
class UsageSummaryRow:
    group: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_nanos: int
    errors: int  # requests whose status was not 2xx
    bucket_start: float | None = None  # unix seconds, when grouped by time bucket too


class UsageStore:
    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        # PostgreSQL's table is partitioned by time (``_partitions``), and a partitioned table's unique key
        # must hold the partition key: there a record is known by its request id and its end time.
        self._partitioned = driver.dialect == "postgresql"
        self._key = "request_id, ts" if self._partitioned else "request_id"

    def insert(
        self,
        records: Sequence[UsageRecord],
        watch: Callable[[UsageRecord], bool] | None = None,
        clamped: Mapping[str, Sequence[str]] | None = None,
    ) -> list[UsageRecord]:
        """Write the records not stored yet, in one transaction (a stored request id is skipped).

        Returns which of the records ``watch`` selects were new: those this transaction inserted, as the
        insert itself says (each key's first record), so that no lookup of the stored ids comes before
        it. That lookup (``request_id IN (...)`` per 500 ids, bounded by the batch's end times) cost
        PostgreSQL more than the insert on a fleet's budgeted records, all of them watched, and grew with
        the batches that the store joins when it is behind. ``clamped`` names, by request id, the fields
        of records whose figures were clamped (``bound_record``); they are stored with those names.
        Raises StoreDataError (or StoreConflict) when the database refused a value of one of them: then
        nothing was written."""
        if not records:
            return []
        watched = list(filter(watch, records)) if watch is not None else []
        with self._driver.transaction(write=True) as tx:
            # Owners with budgets keep their spend in counters (``_spend``), to which only the records this
            # transaction inserts add: the driver says which those are.
            periods = counters.budgeted(tx, records)
            counted = bool(periods)
            returning = counted or bool(watched)
            # The rows as exact tuples (sqlite3 binds those fastest), made as the driver reads them: a
            # record's own values with its trace and budget key lists as JSON text (``UsageRecord.row``).
            inserted: list[Any] = []
            if not clamped:
                inserted = tx.insert_new(
                    "usage_records", _NAMES, self._key, map(_row, records), returning=returning
                )
            else:  # rare: the flagged ones apart, so that the others' rows stay as they are made
                plain = [r for r in records if r.request_id not in clamped]
                flagged = [
                    (*_row(r), ",".join(clamped[r.request_id])) for r in records if r.request_id in clamped
                ]
                if plain:
                    inserted += tx.insert_new(
                        "usage_records", _NAMES, self._key, map(_row, plain), returning=returning
                    )
                if flagged:
                    inserted += tx.insert_new(
                        "usage_records", (*_NAMES, "clamped"), self._key, flagged, returning=returning
                    )
            keys = {tuple(k) for k in inserted}
            if counted and keys:
                counters.add_new(tx, _first_of(records, set(keys)), periods)
        return list(_first_of(watched, keys)) if watched else []

    def set_aside(self, rejected: Sequence[RejectedRecord]) -> None:
        """Keep records that could not be stored, once each (by their hash), in one transaction."""
        if not rejected:
            return
        rows = [(r.id, r.ts, r.source, r.reason, r.record) for r in rejected]
        with self._driver.transaction(write=True) as tx:
            tx.insert_new("usage_rejected", _REJECTED, "id", rows)

    def rejected(self, *, limit: int = 100) -> list[RejectedRecord]:
        """The records most recently set aside, newest first."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                f"SELECT {', '.join(_REJECTED)} FROM usage_rejected ORDER BY ts DESC, id LIMIT ?", (limit,)
            )
        return [RejectedRecord(str(r[0]), float(r[1]), str(r[2]), str(r[3]), str(r[4])) for r in rows]

    def clamped(self, *, limit: int = 100) -> list[tuple[str, float, tuple[str, ...]]]:
        """The most recent records stored with figures clamped: ``(request_id, ts, fields)``, newest first."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                "SELECT request_id, ts, clamped FROM usage_records WHERE clamped IS NOT NULL "
                "ORDER BY ts DESC, request_id LIMIT ?",
                (limit,),
            )
        return [(str(r[0]), float(r[1]), tuple(str(r[2]).split(","))) for r in rows]

    def prune(self, before: float, batch: int) -> int:
        """Delete up to ``batch`` of the oldest records that ended before ``before``, in one short
        transaction; returns how many went. ``purged_before`` then says from when on records are whole.
        On PostgreSQL the day partitions that end by ``before`` are dropped whole first (their rows
        count, beyond ``batch``); what is left (the default partition's) goes row by row."""
        with self._driver.transaction(write=True) as tx:
            dropped = partitions.drop_before(tx, before)[0] if self._partitioned else 0
            rows = tx.query(
                "SELECT request_id, ts FROM usage_records WHERE ts < ? ORDER BY ts LIMIT ?", (before, batch)
            )
            if not rows:
                tx.execute(
                    "UPDATE usage_retention SET purged_before = ?, purged_rows = purged_rows + ? "
                    "WHERE id = 1 AND purged_before < ?",
                    (before, dropped, before),
                )
                counters.drop_ended(tx)
                return dropped
            for i in range(0, len(rows), _CHUNK):
                chunk = [r[0] for r in rows[i : i + _CHUNK]]
                tx.execute(
                    f"DELETE FROM usage_records WHERE request_id IN ({', '.join(['?'] * len(chunk))}) "
                    "AND ts < ?",
                    [*chunk, before],
                )
            # Everything older than the newest record deleted is gone too (the batch was the oldest);
            # when the batch was not full, everything before ``before`` is.
            done = before if len(rows) < batch else float(rows[-1][1])
            tx.execute(
                "UPDATE usage_retention SET purged_before = CASE WHEN purged_before < ? THEN ? "
                "ELSE purged_before END, purged_rows = purged_rows + ? WHERE id = 1",
                (done, done, dropped + len(rows)),
            )
            counters.drop_ended(tx)  # windows whose records are all gone now
            return dropped + len(rows)

    def make_partitions(self, now: float, ahead: int = 2) -> list[str]:
        """Make the usage table's day partitions from ``now``'s to ``ahead`` days on (PostgreSQL; nothing
        on SQLite); returns the names made."""
        if not self._partitioned:
            return []
        with self._driver.transaction(write=True) as tx:
            return partitions.ensure(tx, now, ahead)

    def purged_before(self) -> float:
        """Records that ended before this time may have been purged (0.0: none ever were)."""
        with self._driver.transaction(write=False) as tx:
            return float(tx.query("SELECT purged_before FROM usage_retention WHERE id = 1")[0][0])

    def count(self) -> int:
        with self._driver.transaction(write=False) as tx:
            return int(tx.query("SELECT COUNT(*) FROM usage_records")[0][0])

    def spend(
        self, start: float, end: float, principal_ids: Sequence[str] | None = None
    ) -> list[WindowSpend]:
        """Tokens and cost per principal, in all and held by each live counter, for records that ended in
        [start, end): from the spend counters where a budget of the principal keeps that window, summed
        from the records otherwise (and for every principal when ``principal_ids`` is None)."""
        sql = (
            "SELECT principal_id, budget_keys, SUM(total_tokens), SUM(cost_nanos) FROM usage_records "
            "WHERE ts >= ? AND ts < ?"
        )
        group = " GROUP BY principal_id, budget_keys"
        with self._driver.transaction(write=False) as tx:
            if principal_ids is None:
                return list(counters.from_groups(tx.query(sql + group, (start, end))).values())
            kept, rest = counters.read(tx, principal_ids, start, end)
            rows: list[Sequence[Any]] = []
            for i in range(0, len(rest), _CHUNK):
                chunk = list(rest[i : i + _CHUNK])
                marks = ", ".join(["?"] * len(chunk))
                rows += tx.query(f"{sql} AND principal_id IN ({marks}){group}", [start, end, *chunk])
        return [*kept.values(), *counters.from_groups(rows).values()]

    def key_spend(self, start: float, end: float, principal_of: Mapping[str, str]) -> list[WindowSpend]:
        """Tokens and cost per key of ``principal_of`` (key id -> its principal's id), in all and held by
        each of the key's own live counters, for records that ended in [start, end): from the spend
        counters where a budget of the key keeps that window, else summed from the records (the principal
        narrows the search to its index)."""
        sql = (
            "SELECT key_id, key_budget_keys, SUM(total_tokens), SUM(cost_nanos) FROM usage_records "
            "WHERE ts >= ? AND ts < ?"
        )
        rows: list[Sequence[Any]] = []
        with self._driver.transaction(write=False) as tx:
            kept, keys = counters.read(tx, sorted(principal_of), start, end, KEY_OWNER)
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i : i + _CHUNK]
                owners = sorted({principal_of[k] for k in chunk})
                rows += tx.query(
                    f"{sql} AND principal_id IN ({', '.join(['?'] * len(owners))}) "
                    f"AND key_id IN ({', '.join(['?'] * len(chunk))}) GROUP BY key_id, key_budget_keys",
                    [start, end, *owners, *chunk],
                )
        return [*kept.values(), *counters.from_groups(rows).values()]

    def summary(self, start: float, end: float, by: str, bucket: int | None = None) -> list[UsageSummaryRow]:
        """Totals for records that ended in [start, end), grouped by principal name, key, model, backend or
        usage tag (``-`` for none), and by time bucket of ``bucket`` seconds (aligned to the Unix epoch)
        when given."""
        group = {
            "principal": "COALESCE(p.name, u.principal_id)",
            "key": "u.key_id",
            "model": "u.model",
            "backend": "COALESCE(u.backend, '-')",
            "tag": "COALESCE(u.tag, '-')",
        }.get(by)
        if group is None:
            raise ValueError(f"cannot group usage by {by!r}")
        sums = (
            "COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(total_tokens), SUM(cost_nanos), "
            "SUM(CASE WHEN status >= 200 AND status < 300 THEN 0 ELSE 1 END)"
        )
        inner = (
            f"SELECT {group} AS g, floor(u.ts / ?) * ? AS b, u.prompt_tokens, u.completion_tokens, "
            "u.total_tokens, u.cost_nanos, u.status FROM usage_records u "
            "LEFT JOIN principals p ON p.id = u.principal_id WHERE u.ts >= ? AND u.ts < ?"
        )
        size = float(bucket) if bucket else 1e12  # one bucket for everything when not asked
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                f"SELECT g, b, {sums} FROM ({inner}) t GROUP BY g, b ORDER BY b, g", (size, size, start, end)
            )
        out = []
        for r in rows:
            requests, prompt, completion, total, cost, errors = (int(v or 0) for v in r[2:8])
            start_of = float(r[1]) if bucket else None
            out.append(
                UsageSummaryRow(str(r[0]), requests, prompt, completion, total, cost, errors, start_of)
            )
        return out

    def records(self, *, limit: int = 100, principal_id: str | None = None) -> list[UsageRecord]:
        """The most recent records, newest first."""
        sql = f"SELECT {_READ} FROM usage_records"
        params: list[str | int] = []
        if principal_id is not None:
            sql += " WHERE principal_id = ?"
            params.append(principal_id)
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(sql + " ORDER BY ts DESC, request_id LIMIT ?", [*params, limit])
        return [_record(r) for r in rows]

    def find(self, request_id: str) -> list[UsageRecord]:
        """The records of the request with this id: the gateway's own, or the client's ``x-request-id``
        (which several requests may share), newest first."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                f"SELECT {_READ} FROM usage_records WHERE request_id = ? "
                f"UNION ALL SELECT {_READ} FROM usage_records WHERE client_request_id = ? "
                "AND request_id <> ? ORDER BY ts DESC LIMIT 20",
                [request_id, request_id, request_id],
            )
        return [_record(r) for r in rows]


def _record(r: Sequence[Any]) -> UsageRecord:
    keys, trace, span, own, before = r[15], r[21], r[22], r[23], r[24]
    if keys is None and before is not None:
        budget_keys: Any = [to_unsigned64(before)]  # a row from before record version 7
    else:
        budget_keys = _json(keys)
    values = [*r[:15], budget_keys, r[16], 1 if r[17] is None else r[17], r[18], r[19], r[20]]
    values += [_json(trace), _json(span), _json(own)]
    return UsageRecord._make(values)


def _json(text: object) -> Any:
    return orjson.loads(text) if isinstance(text, str) else None


def _first_of(records: Sequence[UsageRecord], keys: set[tuple[Any, ...]]) -> Iterator[UsageRecord]:
    """The records whose key (request id, and end time where it is part of the key) is in ``keys``, each
    key's first only (the one an insert stores)."""
    if not keys:
        return
    # Every key has the same width: the table's key, (request id, end time) on PostgreSQL.
    width = len(next(iter(keys)))
    for r in records:
        key = (r.request_id, r.ts) if width == 2 else (r.request_id,)
        if key in keys:
            keys.discard(key)
            yield r
