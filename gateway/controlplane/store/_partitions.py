"""The usage table's time partitions on PostgreSQL: one per UTC day (``usage_records_dYYYYMMDD``), made
days ahead by the control worker (``ensure``), and dropped whole by retention once all they hold is older
than what it purges (``drop_before``); a default partition (``usage_records_default``) takes any record
no day's partition holds (one from far in the past or the future, or one that came before its day's
partition was made), and is purged row by row like SQLite's one table. Migration 0017 made the table
partitioned and the table it was into the partition of everything before (``usage_records_before``).

A day's partition made while the default partition holds records of that day takes them over: made as a
table of its own, the rows moved into it, then attached (PostgreSQL refuses a partition whose rows the
default partition already holds). Every statement runs in the caller's write transaction.
I/O: the store's catalog and usage tables, through the transaction it is given.
"""

from __future__ import annotations

import math
import re
import time

from gateway.controlplane.store._driver import Transaction

__all__ = ["DAY", "drop_before", "ensure", "partitions"]

DAY = 86400
_BOUND = re.compile(r"FROM \((MINVALUE|'?[-0-9.e+]+'?)\) TO \((MAXVALUE|'?[-0-9.e+]+'?)\)")


def partitions(tx: Transaction) -> list[tuple[str, float, float]]:
    """The usage table's range partitions as ``(name, start, end)``, oldest first (not the default)."""
    rows = tx.query(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'usage_records'::regclass"
    )
    out = []
    for name, bound in rows:
        m = _BOUND.search(str(bound))
        if m is None:
            continue  # DEFAULT
        out.append((str(name), _value(m.group(1)), _value(m.group(2))))
    return sorted(out, key=lambda p: (p[1], p[2]))


def ensure(tx: Transaction, now: float, ahead: int = 2) -> list[str]:
    """Make the day partitions from today's to ``ahead`` days on that no partition covers yet; returns
    the names made."""
    have = partitions(tx)
    made = []
    first = math.floor(now / DAY) * DAY
    for start in range(first, first + (ahead + 1) * DAY, DAY):
        end = start + DAY
        if any(s < end and start < e for _, s, e in have):
            continue
        name = "usage_records_d" + time.strftime("%Y%m%d", time.gmtime(start))
        bounds = f"FOR VALUES FROM ({start}) TO ({end})"
        if tx.query(
            "SELECT 1 FROM usage_records_default WHERE ts >= ? AND ts < ? LIMIT 1", (float(start), float(end))
        ):
            tx.execute(f"CREATE TABLE {name} (LIKE usage_records INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
            tx.execute(
                f"WITH moved AS (DELETE FROM usage_records_default WHERE ts >= ? AND ts < ? RETURNING *) "
                f"INSERT INTO {name} SELECT * FROM moved",
                (float(start), float(end)),
            )
            tx.execute(f"ALTER TABLE usage_records ATTACH PARTITION {name} {bounds}")
        else:
            tx.execute(f"CREATE TABLE {name} PARTITION OF usage_records {bounds}")
        have.append((name, float(start), float(end)))
        made.append(name)
    return made


def drop_before(tx: Transaction, before: float) -> tuple[int, float]:
    """Drop the partitions that end by ``before`` (all their records older than it); returns the rows
    they held and the latest end dropped (0.0 when none was)."""
    rows, until = 0, 0.0
    for name, _, end in partitions(tx):
        if end > before:
            break
        rows += int(tx.query(f"SELECT COUNT(*) FROM {name}")[0][0])
        tx.execute(f"DROP TABLE {name}")
        until = max(until, end)
    return rows, until


def _value(text: str) -> float:
    if text == "MINVALUE":
        return -math.inf
    if text == "MAXVALUE":
        return math.inf
    return float(text.strip("'"))
