"""The usage table's time partitions on PostgreSQL: migrating an unpartitioned table keeps its rows (in
the partition of everything before), the control worker's day partitions take a day's records (those
the default partition caught before included), retention drops whole partitions and counts their rows,
a replayed batch still inserts nothing twice, and every index on the table is one a query uses."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from gateway.controlplane.store import apply_migrations, available_migrations
from gateway.controlplane.store._postgres import PostgresDriver
from gateway.controlplane.store._usage import UsageStore
from gateway.usage_record import UsageRecord

DAY = 86400.0
T0 = 1_900_000_000.0 - 1_900_000_000.0 % DAY  # a UTC midnight in 2030, after the migration's cut


def _record(i: int, ts: float, principal: str = "p1") -> UsageRecord:
    return UsageRecord(
        f"req-{i:06d}", ts, principal, "k1", "chat", "a", 200, 4, 6, 0, 10, "reported", 1000, 1.5, 1.0, [1]
    )


@pytest.fixture
def driver(postgres_url: str) -> Iterator[PostgresDriver]:
    d = PostgresDriver(postgres_url)
    yield d
    d.close()


def _partitions(url: str) -> dict[str, int]:
    """Each partition of the usage table and how many rows it holds."""
    with psycopg.connect(url) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'usage_records'::regclass"
            )
        ]
        return {n: int(conn.execute(f"SELECT COUNT(*) FROM {n}").fetchone()[0]) for n in names}  # type: ignore[index]


def test_migrating_an_unpartitioned_table_keeps_its_rows(driver: PostgresDriver, postgres_url: str) -> None:
    apply_migrations(driver, [m for m in available_migrations("postgresql") if m.version <= 16])
    old = UsageStore(driver)
    old._partitioned, old._key = False, "request_id"  # as the table was before 0017
    old.insert([_record(i, 1_700_000_000.0 + i) for i in range(50)])
    assert apply_migrations(driver) == [17]
    usage = UsageStore(driver)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'usage_records'").fetchone() == (
            "p",
        )
    assert _partitions(postgres_url) == {"usage_records_before": 50, "usage_records_default": 0}
    assert usage.count() == 50
    assert usage.find("req-000007")[0] == _record(7, 1_700_000_007.0)
    # A batch replayed over the migrated rows inserts nothing twice, and new rows go in beside them.
    usage.insert([_record(i, 1_700_000_000.0 + i) for i in range(40, 60)])
    assert usage.count() == 60


def test_day_partitions_take_their_records_and_retention_drops_them(
    driver: PostgresDriver, postgres_url: str
) -> None:
    apply_migrations(driver)
    usage = UsageStore(driver)
    usage.insert([_record(0, T0 + 5)])  # before its day's partition exists: the default partition holds it
    assert _partitions(postgres_url)["usage_records_default"] == 1
    made = usage.make_partitions(T0, ahead=2)
    assert made == ["usage_records_d20300317", "usage_records_d20300318", "usage_records_d20300319"]
    assert usage.make_partitions(T0, ahead=2) == []  # made once
    batch = [_record(i, T0 + i * DAY / 4) for i in range(1, 12)]
    usage.insert(batch)
    usage.insert(batch)  # replayed: nothing twice
    held = _partitions(postgres_url)
    assert held["usage_records_default"] == 0  # the early record moved into its day's partition
    assert [held[n] for n in made] == [4, 4, 4]
    # Retention up to the third day's start: the first two days' partitions go whole, their 8 rows counted
    # (and the partition of everything before the migration, empty here).
    assert usage.prune(T0 + 2 * DAY, 1000) == 8
    assert set(_partitions(postgres_url)) == {
        "usage_records_d20300319",
        "usage_records_default",
    }
    assert usage.count() == 4
    assert usage.purged_before() == T0 + 2 * DAY
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT purged_rows FROM usage_retention").fetchone() == (8,)


@pytest.mark.parametrize(
    ("query", "index"),
    [
        # The key: a batch's duplicates, and a request looked up by its id.
        ("SELECT * FROM usage_records WHERE request_id = 'req-000001'", "usage_records_d20300317_pkey"),
        # Spend summed for a window not kept in counters, and a window opened: the principal's records.
        (
            f"SELECT SUM(total_tokens) FROM usage_records WHERE principal_id = 'p1' AND ts >= {T0} "
            f"AND ts < {T0 + DAY}",
            "usage_records_d20300317_principal_id_ts_idx",
        ),
        # The newest records (gateway usage records, the admin API): the end time.
        ("SELECT * FROM usage_records ORDER BY ts DESC LIMIT 5", "usage_records_d20300317_ts_idx"),
        # A request looked up by the id its client sent.
        (
            "SELECT * FROM usage_records WHERE client_request_id = 'c-1'",
            "usage_records_d20300317_client_request_id_idx",
        ),
        # The records stored with figures clamped.
        (
            "SELECT * FROM usage_records WHERE clamped IS NOT NULL ORDER BY ts DESC LIMIT 5",
            "usage_records_d20300317_ts_idx1",
        ),
    ],
)
def test_every_index_is_used_by_a_query(
    driver: PostgresDriver, postgres_url: str, query: str, index: str
) -> None:
    apply_migrations(driver)
    usage = UsageStore(driver)
    usage.make_partitions(T0, ahead=0)
    usage.insert([_record(i, T0 + i, f"p{i % 50}") for i in range(2000)])
    with psycopg.connect(postgres_url) as conn:
        conn.execute("ANALYZE usage_records")
        conn.execute("SET enable_seqscan = off")  # a tiny table: what matters is that an index serves it
        plan = "\n".join(str(r[0]) for r in conn.execute(f"EXPLAIN {query}"))
        indexes = {
            str(r[0])
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'usage_records_d20300317'"
            )
        }
    assert index in plan
    assert len(indexes) == 5  # and there are no more than these five
