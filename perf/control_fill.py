"""The usage table of ``perf.control_sim``'s PostgreSQL: filled to N rows before a run, and read back after
one to say whether every accepted record was stored once.

``prefill`` makes the usage table look like that of a fleet that has run for ``days`` days: the empty
partition migration 0017 made of everything before its next midnight (``usage_records_before``) is
dropped, and one day partition (``usage_records_dYYYYMMDD``, as ``_partitions.ensure`` names them) per day
from ``days`` days ago to today is made as a table of its own, filled server-side (``INSERT ... SELECT
generate_series``: no rows cross the wire), then attached, so that its indexes are built once, sorted,
rather than row by row; then vacuumed and analysed, as autovacuum would have left a month-old table. The
rows are spread evenly over the days up to a minute ago, over 1,000 principals and 10,000 keys; one row
in a hundred is the simulated hosts' own principal's, whose budget windows (``usage_spend``) then open
from them with the first batch the hosts send, as they would on a live table (``_spend``). The default
partition stays empty.

``stored`` counts, after a run, the rows whose request ids carry the run's tag (only the partitions from
the run's start on are read), and how many distinct ids those are; ``spend_check`` compares the spend
counters of the hosts' principal with the sum of its records in the same windows; ``top_statements``
reads ``pg_stat_statements`` where the server loaded it.
I/O: the database, through psycopg.
"""

from __future__ import annotations

import math
import time
from typing import Any

import psycopg

__all__ = ["DAY", "prefill", "spend_check", "stored", "top_statements"]

DAY = 86400
PRINCIPALS = 1000
KEYS = 10_000


def _day_name(start: int) -> str:
    return "usage_records_d" + time.strftime("%Y%m%d", time.gmtime(start))


def prefill(url: str, rows: int, days: int, principal_id: str, now: float | None = None) -> float:
    """Fill the usage table to ``rows`` rows over the last ``days`` days (today's included); returns the
    seconds it took. The table must be empty (a fresh database, right after the control host migrated)."""
    began = time.monotonic()
    now = time.time() if now is None else now
    today = math.floor(now / DAY) * DAY
    first = today - (days - 1) * DAY
    span = (now - 60.0) - first  # the rows end between the first midnight and a minute ago
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT COUNT(*) FROM usage_records").fetchone() != (0,):
            raise RuntimeError("prefill needs an empty usage table")
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("ALTER TABLE usage_records DETACH PARTITION usage_records_before")
        conn.execute("DROP TABLE usage_records_before")
        have = {
            str(r[0])
            for r in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'usage_records'::regclass"
            )
        }
        for start in range(first, today + DAY, DAY):
            name = _day_name(start)
            # Row g ends at first + span * g / rows: the rows of this day are those g whose time falls in it.
            low = max(1, math.ceil((start - first) / span * rows))
            high = min(rows, math.ceil((start + DAY - first) / span * rows) - 1)
            values = (start, start + DAY - 1e-3, first, span, rows, principal_id, low, high)
            if name in have:  # made by the control worker already (the days ahead): fill in place
                conn.execute(_fill(name), values)
                continue
            conn.execute(f"CREATE TABLE {name} (LIKE usage_records INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
            if high >= low:
                conn.execute(_fill(name), values)
            bounds = f"FOR VALUES FROM ({start}) TO ({start + DAY})"
            conn.execute(f"ALTER TABLE usage_records ATTACH PARTITION {name} {bounds}")
        conn.execute("VACUUM ANALYZE usage_records")
    return time.monotonic() - began


def _fill(table: str) -> Any:
    # Parameters: the day's start and last millisecond, first, span, rows, the hosts' principal, low, high
    # (the bounds keep a row that rounding put past its day's edge inside the day). Tokens and costs vary
    # a little so that sums are not trivially equal; request ids are 'pre' and the row's number.
    return (
        f"INSERT INTO {table} (request_id, ts, principal_id, key_id, model, backend, status, "
        "prompt_tokens, completion_tokens, cached_tokens, total_tokens, usage_source, cost_nanos, "
        "latency_ms, ttfb_ms, attempts) "
        "SELECT 'pre' || g, greatest(%s, least(%s, %s + %s * g / %s::float8)), "
        f"CASE WHEN mod(g, 100) = 0 THEN %s ELSE 'prefill-p' || mod(g, {PRINCIPALS}) END, "
        f"'prefill-k' || mod(g, {KEYS}), 'chat', 'a', 200, 10 + mod(g, 7), 16 + mod(g, 5), 0, "
        "26 + mod(g, 7) + mod(g, 5), 'reported', 1000 + mod(g, 13), 800.0, 700.0, 1 "
        "FROM generate_series(%s::bigint, %s::bigint) g"
    )


def stored(url: str, tag: str, since: float) -> tuple[int, int]:
    """Rows whose request id starts with ``tag``, stored with an end time from ``since`` on, and how many
    distinct request ids they hold."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT request_id) FROM usage_records WHERE ts >= %s "
            "AND request_id LIKE %s",
            (since, tag + "%"),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def count_all(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM usage_records").fetchone()
    assert row is not None
    return int(row[0])


def spend_check(url: str, principal_id: str) -> list[tuple[str, int, int]]:
    """For each spend counter window of ``principal_id`` (its totals, ``held`` 0): the period, the tokens
    the counter holds, and the tokens its records in that window sum to."""
    with psycopg.connect(url, autocommit=True) as conn:
        windows = conn.execute(
            "SELECT period, window_start, window_end, tokens FROM usage_spend WHERE owner = %s AND held = 0 "
            "ORDER BY period",
            (principal_id,),
        ).fetchall()
        out = []
        for period, start, end, tokens in windows:
            row = conn.execute(
                "SELECT COALESCE(SUM(total_tokens), 0) FROM usage_records WHERE principal_id = %s "
                "AND ts >= %s AND ts < %s",
                (principal_id, start, end),
            ).fetchone()
            assert row is not None
            out.append((str(period), int(tokens), int(row[0])))
    return out


def reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def top_statements(url: str, limit: int = 8) -> list[tuple[float, int, float, str]]:
    """The statements that took the server's time since the last reset: total ms, calls, rows, text."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT total_exec_time, calls, rows, regexp_replace(query, '\\s+', ' ', 'g') "
            "FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT %s",
            (limit,),
        ).fetchall()
    return [(float(r[0]), int(r[1]), float(r[2]), str(r[3])[:160]) for r in rows]
