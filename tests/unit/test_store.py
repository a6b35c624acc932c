"""The store on both drivers: migrations, declarative apply, revision bumps, key create/revoke/list/expiry.

Tests taking the ``settings`` or ``store`` fixture run once on SQLite and once on a throwaway PostgreSQL
database; those about one driver's own behaviour say so with ``sqlite_only``."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import psycopg
import pytest

from gateway.body_record import BodyRecord
from gateway.config import Settings
from gateway.controlplane.bodies.redaction import Redactor
from gateway.controlplane.bodies.retention import purge as purge_bodies
from gateway.controlplane.bodies.stored import StoredBodies, stored_bodies
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.specs import (
    BudgetSpec,
    ConfigDoc,
    KeySpec,
    LimitsSpec,
    PriceSpec,
    PrincipalSpec,
    RoleSpec,
)
from gateway.controlplane.store import (
    OwnershipConflict,
    SqliteDriver,
    Store,
    StoreConflict,
    StoreError,
    apply_migrations,
    available_migrations,
    open_store,
)
from gateway.controlplane.store._migrate import Migration, split_statements
from gateway.controlplane.store._postgres import PostgresDriver
from gateway.controlplane.usage.retention import purge
from gateway.errors import ConfigError
from gateway.keys import hash_secret
from gateway.usage_record import UsageRecord

HASH_KEY = bytes(range(32))
SECRET = "sk-gw-imported-secret-0001"

DOC = parse_config(
    {
        "backends": [
            {"name": "a", "url": "http://127.0.0.1:8001", "connect_timeout": 2.0},
            {"name": "b", "url": "http://127.0.0.1:8002", "api_key_env": "B_KEY"},
        ],
        "provider_models": [
            {"name": "llama", "backends": [{"backend": "a", "model": "meta/llama"}, "b"]},
            {"name": "qwen", "backends": ["b"]},
        ],
        "models": [{"name": "chat", "chain": ["llama", "qwen"], "aliases": ["gpt-4o-mini"]}],
        "roles": [
            {"name": "user", "permissions": ["model/chat"]},
            {"name": "admin", "permissions": ["model/*", "key:create"]},
        ],
        "principals": [
            {
                "name": "alice",
                "roles": ["user"],
                "limits": {"requests_per_minute": 100, "tokens_per_minute": 20000},
                "model_limits": {
                    "chat": {"requests_per_minute": 10},
                    "gpt-4o-mini": {"concurrent_requests": 2},
                },
            },
            {"name": "ops", "roles": ["admin", "user"]},
        ],
        "keys": [
            {
                "name": "alice-dev",
                "principal": "alice",
                "secret": SECRET,
                "limits": {"concurrent_requests": 3},
            }
        ],
    },
    "test",
)
ENV = {"B_KEY": "secret-b"}


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgres":
        return Settings(data_dir=tmp_path / "data", database=request.getfixturevalue("postgres_url"))
    return Settings(data_dir=tmp_path / "data")


def sqlite_only(settings: Settings) -> None:
    if settings.database is not None:
        pytest.skip("about SQLite itself")


class _PgRaw:
    """A raw PostgreSQL connection that reads like sqlite3's: ``?`` placeholders, commit on success."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url)

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> psycopg.Cursor[tuple[object, ...]]:
        return self.conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]

    def __enter__(self) -> _PgRaw:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.conn.commit()
        self.conn.close()


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    with open_store(settings) as s:
        yield s


def _raw(settings: Settings) -> sqlite3.Connection | _PgRaw:
    """A connection of the store's own driver, for looking at (and breaking) rows directly."""
    if settings.database is not None:
        return _PgRaw(settings.database)
    return sqlite3.connect(settings.sqlite_path)


def _apply(store: Store, doc: ConfigDoc = DOC) -> int:
    return store.apply_config(doc, hash_key=HASH_KEY, environ=ENV, actor="test")


# --- opening and migrating ----------------------------------------------------------------------------------


def test_open_creates_data_dir_wal_and_records_migrations(settings: Settings) -> None:
    sqlite_only(settings)
    with open_store(settings) as store:
        assert store.revision() == 0
    assert settings.sqlite_path.is_file()
    with _raw(settings) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m.version for m in available_migrations()]
    assert versions[0] == 1


def test_migrations_are_recorded(settings: Settings) -> None:
    with open_store(settings):
        pass
    with _raw(settings) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m.version for m in available_migrations()]


def test_reopening_applies_nothing_twice(settings: Settings) -> None:
    sqlite_only(settings)
    open_store(settings).close()
    driver = SqliteDriver(settings.sqlite_path)
    try:
        assert apply_migrations(driver) == []
    finally:
        driver.close()


def test_failed_migration_leaves_nothing_behind(tmp_path: Path) -> None:
    driver = SqliteDriver(tmp_path / "m.sqlite3")
    broken = Migration(1, "broken", "CREATE TABLE t1 (x TEXT);\nCREATE TABLEX nope;\n")
    try:
        with pytest.raises(StoreError):
            apply_migrations(driver, [broken])
        with driver.transaction(write=False) as tx:
            assert tx.query("SELECT name FROM sqlite_master WHERE name = 't1'") == []
            assert tx.query("SELECT version FROM schema_migrations") == []
    finally:
        driver.close()


def test_split_statements_drops_comments_and_blank_lines() -> None:
    sql = (
        "-- header; with a semicolon\nCREATE TABLE a (\n  x TEXT -- note; here\n);\n"
        "\nINSERT INTO a VALUES ('y');\n"
    )
    assert split_statements(sql) == ["CREATE TABLE a (\n  x TEXT\n)", "INSERT INTO a VALUES ('y')"]


@pytest.mark.parametrize(
    ("database", "message"),
    [
        ("mysql://h/db", "unsupported database URL"),
        ("sqlite:///", "unsupported database URL"),
    ],
)
def test_unsupported_database_urls(tmp_path: Path, database: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(Settings(data_dir=tmp_path, database=database))


def test_explicit_sqlite_url(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere" / "x.sqlite3"
    with open_store(Settings(data_dir=tmp_path, database=f"sqlite:///{path}")) as store:
        assert store.revision() == 0
    assert path.is_file()


def test_store_at_migration_1_migrates_to_the_latest_keeping_rows(settings: Settings) -> None:
    sqlite_only(settings)
    settings.sqlite_path.parent.mkdir(parents=True)
    driver = SqliteDriver(settings.sqlite_path)
    try:
        assert apply_migrations(driver, available_migrations()[:1]) == [1]
        with driver.transaction(write=True) as tx:  # rows as the 0001 schema had them
            tx.execute("INSERT INTO principals (id, name) VALUES ('p1', 'old')")
            tx.execute(
                "INSERT INTO api_keys (id, name, principal_id, key_hash, created_at, expires_at, revoked_at, "
                "managed_by) VALUES ('k1', 'old-key', 'p1', ?, 0, NULL, NULL, 'cli')",
                ("ab" * 32,),
            )
            tx.execute("UPDATE config_revision SET revision = 7")
    finally:
        driver.close()
    with open_store(settings) as store:
        assert store.revision() == 7
        (old,) = store.principals()
        assert (old.name, old.active_keys, old.limits, old.model_limits, old.budgets) == (
            "old",
            1,
            None,
            (),
            (),
        )
        (key,) = store.list_keys()
        assert (key.name, key.limits) == ("old-key", None)
        # The new schema is usable at once: limits round-trip through apply.
        _apply(store)
        assert store.config_doc().principals[0].limits == LimitsSpec(100, 20000)
    with _raw(settings) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m.version for m in available_migrations()]


def test_a_principal_s_one_budget_and_its_alerts_move_into_its_budgets(settings: Settings) -> None:
    driver = _driver(settings)
    try:  # a store at migration 12: one budget per principal in its columns, alerts as a routing entry
        apply_migrations(driver, [m for m in available_migrations() if m.version <= 12])
        with driver.transaction(write=True) as tx:
            tx.execute(
                "INSERT INTO principals (id, name, budget_period, budget_tokens, budget_cost) VALUES "
                "('p1', 'alice', 'month', 1000, 2.5), ('p2', 'bob', 'day', NULL, 0.5), ('p3', 'carol', NULL, "
                "NULL, NULL)"
            )
            tx.execute(
                "INSERT INTO routing_entries (kind, name, body) VALUES ('alerts', 'alice', '[0.5, 1.0]')"
            )
            tx.execute(
                "INSERT INTO usage_records (request_id, ts, principal_id, key_id, model, backend, status, "
                "prompt_tokens, completion_tokens, cached_tokens, total_tokens, usage_source, cost_nanos, "
                "latency_ms, ttfb_ms, budget_key, client_request_id, attempts) "
                "VALUES ('req-0', 1800000000.0, 'p1', 'k1', 'chat', 'a', 200, 4, 6, 0, 10, 'reported', 1000, "
                "1.5, 1.0, -5, NULL, 1)"
            )
    finally:
        driver.close()
    with open_store(settings) as store:
        assert {p.name: p.budgets for p in store.principals()} == {
            "alice": (BudgetSpec("month", 1000, 2.5, (0.5, 1.0)),),
            "bob": (BudgetSpec("day", None, 0.5),),
            "carol": (),
        }
        (old,) = store.usage.records()
        assert (old.budget_keys, old.key_budget_keys) == ([2**64 - 5], None)  # its one counter, unsigned
    with _raw(settings) as conn:
        assert conn.execute("SELECT COUNT(*) FROM routing_entries WHERE kind = 'alerts'").fetchone() == (0,)


def _driver(settings: Settings) -> SqliteDriver | PostgresDriver:
    if settings.database is not None:
        return PostgresDriver(settings.database)
    settings.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteDriver(settings.sqlite_path)


def _usage(i: int, tag: str | None = None, status: int = 200) -> UsageRecord:
    return UsageRecord(
        f"req-{i}", 1_800_000_000.0 + i, "p1", "k1", "chat", "a", status, 4, 6, 0, 10, "reported", 1000,
        1.5, 1.0, None, None, 1, tag,
    )  # fmt: skip


def test_usage_tags_are_stored_and_grouped_also_for_rows_from_before_them(settings: Settings) -> None:
    driver = _driver(settings)
    try:  # a store at migration 8 holding a record written before tags existed
        apply_migrations(driver, [m for m in available_migrations() if m.version <= 8])
        with driver.transaction(write=True) as tx:
            tx.execute(
                "INSERT INTO usage_records (request_id, ts, principal_id, key_id, model, backend, status, "
                "prompt_tokens, completion_tokens, cached_tokens, total_tokens, usage_source, cost_nanos, "
                "latency_ms, ttfb_ms, budget_key, client_request_id, attempts) "
                "VALUES ('req-0', 1800000000.0, 'p1', 'k1', 'chat', 'a', 200, 4, 6, 0, 10, 'reported', 1000, "
                "1.5, 1.0, NULL, NULL, 1)"
            )
    finally:
        driver.close()
    with open_store(settings) as store:
        store.usage.insert([_usage(1, "red-team"), _usage(2, "red-team", 500), _usage(3, "x" * 500)])
        assert {r.request_id: r.tag for r in store.usage.records()} == {
            "req-0": None,
            "req-1": "red-team",
            "req-2": "red-team",
            "req-3": "x" * 500,
        }
        groups = store.usage.summary(1_700_000_000.0, 1_900_000_000.0, "tag")
        assert {g.group: (g.requests, g.errors, g.total_tokens) for g in groups} == {
            "-": (1, 0, 10),
            "red-team": (2, 1, 20),
            "x" * 500: (1, 0, 10),
        }
        hourly = store.usage.summary(1_700_000_000.0, 1_900_000_000.0, "tag", 3600)
        assert {(g.group, g.requests) for g in hourly} == {("-", 1), ("red-team", 2), ("x" * 500, 1)}


def test_route_traces_are_stored_and_found_by_either_request_id(settings: Settings) -> None:
    trace = [["a", "m-a", "connect", None, 1.5], ["b", "m-b", 200, 3.25, 10.0]]
    span = ["0af7651916cd43dd8448eb211c80319c", None, "b7ad6b7169203331", ["00f067aa0ba902b7"]]
    traced = _usage(1)._replace(attempts=2, rule="big", trace=trace, span=span, client_request_id="mine")
    again = _usage(2)._replace(client_request_id="mine")  # a client reusing its id
    with open_store(settings) as store:
        store.usage.insert([traced, again, _usage(3)])
        assert store.usage.find("req-1") == [traced]
        assert store.usage.find("mine") == [again, traced]  # newest first
        assert store.usage.find("req-3")[0].trace is None
        assert store.usage.find("nothing") == []
        assert {r.request_id: r.rule for r in store.usage.records()} == {
            "req-1": "big",
            "req-2": None,
            "req-3": None,
        }


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE principals SET limit_rpm = 0",
        "UPDATE api_keys SET limit_tpm = -1",
        "INSERT INTO principal_model_limits (principal_id, model, limit_concurrency) "
        "SELECT id, 'chat', 0 FROM principals WHERE name = 'ops'",
        "UPDATE principal_budgets SET tokens = 0",
        "UPDATE principal_budgets SET cost = -1.5",
        "UPDATE key_budgets SET cost = 0",
    ],
)
def test_schema_refuses_non_positive_limits(store: Store, settings: Settings, sql: str) -> None:
    _apply(store, PRICED)
    refused = (sqlite3.IntegrityError, psycopg.errors.CheckViolation)
    with _raw(settings) as conn, pytest.raises(refused, match=r"(?i)check constraint"):
        conn.execute(sql)


def test_unreadable_limit_is_a_store_error(store: Store, settings: Settings) -> None:
    sqlite_only(settings)  # PostgreSQL's column types refuse such a row in the first place
    _apply(store)
    with _raw(settings) as conn:  # text passes SQLite's CHECK (limit_rpm > 0): text sorts above numbers
        conn.execute("UPDATE principals SET limit_rpm = 'many' WHERE name = 'ops'")
    with pytest.raises(StoreError, match="unreadable limit 'many'"):
        store.principals()


# --- declarative apply --------------------------------------------------------------------------------------


def test_apply_imports_everything_and_bumps_once(store: Store, settings: Settings) -> None:
    assert _apply(store) == 1
    assert store.revision() == 1
    assert store.config_doc() == replace(
        DOC,
        # Keys come without their secret (the env variable's name is kept, its value is not exported);
        # the store lists roles and permissions ordered by name.
        roles=(RoleSpec("admin", ("key:create", "model/*")), RoleSpec("user", ("model/chat",))),
        keys=(KeySpec("alice-dev", "alice", None, None, LimitsSpec(concurrent_requests=3)),),
    )
    with _raw(settings) as conn:
        sealed = conn.execute("SELECT api_key FROM backends WHERE name = 'b'").fetchone()[0]
        (stored,) = conn.execute("SELECT key_hash FROM api_keys").fetchone()
    assert stored == hash_secret(SECRET, HASH_KEY).hex()
    # The credential is sealed at rest; the snapshot's rows carry it opened.
    assert sealed.startswith("v1:") and "secret-b" not in sealed
    assert {row[0]: row[3] for row in store.read_state().backends} == {"a": None, "b": "secret-b"}


def test_apply_again_bumps_again_and_keeps_principal_ids(store: Store) -> None:
    _apply(store)
    ids = {p.name: p.id for p in store.principals()}
    assert _apply(store) == 2
    assert {p.name: p.id for p in store.principals()} == ids


def test_apply_removes_what_the_file_no_longer_names(store: Store) -> None:
    _apply(store)
    cli_key, _ = store.create_key("ops", "ops-cli", None, HASH_KEY, actor="test")
    store.create_key("alice", None, None, HASH_KEY, actor="test")
    smaller = parse_config(
        {
            "backends": [{"name": "a", "url": "http://127.0.0.1:8001"}],
            "provider_models": [{"name": "llama", "backends": ["a"]}],
            "roles": [{"name": "admin", "permissions": ["model/*"]}],
            "principals": [{"name": "ops", "roles": ["admin"]}],
        },
        "smaller",
    )
    assert _apply(store, smaller) == 4
    doc = store.config_doc()
    assert [b.name for b in doc.backends] == ["a"]
    assert [m.name for m in doc.provider_models] == ["llama"]
    assert doc.models == ()
    assert [r.name for r in doc.roles] == ["admin"]
    assert [p.name for p in store.principals()] == ["ops"]
    # alice is gone, and with her both her file key and her CLI key; ops's CLI key survives.
    assert [k.id for k in store.list_keys()] == [cli_key]


def test_file_key_removed_from_file_is_deleted_cli_key_kept(store: Store) -> None:
    _apply(store)
    cli_key, _ = store.create_key("alice", "alice-cli", None, HASH_KEY, actor="test")
    _apply(store, replace(DOC, keys=()))
    assert [(k.id, k.managed_by) for k in store.list_keys()] == [(cli_key, "cli")]


def test_file_key_upsert_rotates_hash_and_keeps_it_without_secret(store: Store, settings: Settings) -> None:
    _apply(store)
    (key,) = store.list_keys()
    rotated = "sk-gw-imported-secret-0002"
    _apply(store, replace(DOC, keys=(KeySpec("alice-dev", "ops", rotated, 2e9),)))
    (after,) = store.list_keys()
    assert (after.id, after.principal, after.expires_at) == (key.id, "ops", 2e9)
    assert after.hash_prefix == hash_secret(rotated, HASH_KEY).hex()[:8] != key.hash_prefix
    _apply(store, replace(DOC, keys=(KeySpec("alice-dev", "alice", None, None),)))
    (again,) = store.list_keys()
    assert (again.hash_prefix, again.principal, again.expires_at) == (after.hash_prefix, "alice", None)


def test_file_listing_a_cli_key_adopts_it(store: Store) -> None:
    _apply(store)
    key_id, _ = store.create_key("alice", "adopted", None, HASH_KEY, actor="test")
    _apply(store, replace(DOC, keys=(*DOC.keys, KeySpec("adopted", "alice"))))
    assert {k.id: k.managed_by for k in store.list_keys()}[key_id] == "file"


def test_apply_sets_replaces_and_clears_limits(store: Store, settings: Settings) -> None:
    _apply(store)
    alice = next(p for p in store.principals() if p.name == "alice")
    assert alice.limits == LimitsSpec(100, 20000)
    assert alice.model_limits == (
        ("chat", LimitsSpec(requests_per_minute=10)),
        ("gpt-4o-mini", LimitsSpec(concurrent_requests=2)),
    )
    assert [k.limits for k in store.list_keys()] == [LimitsSpec(concurrent_requests=3)]
    changed = replace(
        DOC,
        principals=(
            PrincipalSpec("alice", ("user",), None, (("chat", LimitsSpec(tokens_per_minute=5)),)),
            PrincipalSpec("ops", ("admin",), LimitsSpec(concurrent_requests=1)),
        ),
        keys=(KeySpec("alice-dev", "alice"),),
    )
    _apply(store, changed)
    assert {p.name: (p.limits, p.model_limits) for p in store.principals()} == {
        "alice": (None, (("chat", LimitsSpec(tokens_per_minute=5)),)),
        "ops": (LimitsSpec(concurrent_requests=1), ()),
    }
    assert [k.limits for k in store.list_keys()] == [None]
    assert store.config_doc().principals == changed.principals
    # Removing a principal removes its model limits with it.
    _apply(store, replace(changed, principals=changed.principals[1:], keys=()))
    with _raw(settings) as conn:
        assert conn.execute("SELECT COUNT(*) FROM principal_model_limits").fetchone()[0] == 0


PRICED = replace(
    DOC,
    provider_models=(
        replace(DOC.provider_models[0], price=PriceSpec(1.0, 2.0, 0.25)),
        replace(DOC.provider_models[1], price=PriceSpec(0.0, 0.0)),  # free, which is not unpriced
    ),
    models=(replace(DOC.models[0], price=PriceSpec(0.15, 0.6)),),
    principals=(
        replace(
            DOC.principals[0],
            budgets=(BudgetSpec("month", 1_000_000, 50.5, (0.8, 1.0)), BudgetSpec("day", 20_000)),
        ),
        replace(DOC.principals[1], budgets=(BudgetSpec("7d", None, 0.1 + 0.2),)),
    ),
    keys=(replace(DOC.keys[0], budgets=(BudgetSpec("day", 5000, None, (0.5,)),)),),
)


def _prices(doc: ConfigDoc) -> dict[str, PriceSpec | None]:
    prices = {pm.name: pm.price for pm in doc.provider_models}
    return prices | {m.name: m.price for m in doc.models}


def test_apply_stores_prices_and_budgets(store: Store, settings: Settings) -> None:
    _apply(store, PRICED)
    doc = store.config_doc()
    assert _prices(doc) == {
        "llama": PriceSpec(1.0, 2.0, 0.25),
        "qwen": PriceSpec(0.0, 0.0, None),
        "chat": PriceSpec(0.15, 0.6, None),  # no cached price stays unset, not defaulted to the input one
    }
    budgets = {
        "alice": (BudgetSpec("month", 1_000_000, 50.5, (0.8, 1.0)), BudgetSpec("day", 20_000)),
        "ops": (BudgetSpec("7d", None, 0.30000000000000004),),
    }
    assert {p.name: p.budgets for p in doc.principals} == budgets
    # Everything else round-trips as before.
    assert doc == replace(
        PRICED,
        roles=(RoleSpec("admin", ("key:create", "model/*")), RoleSpec("user", ("model/chat",))),
        keys=(
            KeySpec(
                "alice-dev",
                "alice",
                None,
                None,
                LimitsSpec(concurrent_requests=3),
                budgets=(BudgetSpec("day", 5000, None, (0.5,)),),
            ),
        ),
    )
    assert {p.name: p.budgets for p in store.principals()} == budgets
    assert [k.budgets for k in store.list_keys()] == [(BudgetSpec("day", 5000, None, (0.5,)),)]
    with _raw(settings) as conn:
        rows = conn.execute(
            "SELECT name, price_input, price_output, price_cached_input FROM models "
            "UNION ALL SELECT name, price_input, price_output, price_cached_input FROM provider_models "
            "ORDER BY 1"
        ).fetchall()
        stored = conn.execute(
            "SELECT p.name, b.seq, b.period, b.tokens, b.cost, b.alerts FROM principal_budgets b "
            "JOIN principals p ON p.id = b.principal_id ORDER BY p.name, b.seq"
        ).fetchall()
    assert rows == [("chat", 0.15, 0.6, None), ("llama", 1.0, 2.0, 0.25), ("qwen", 0.0, 0.0, None)]
    assert stored == [
        ("alice", 0, "month", 1_000_000, 50.5, "[0.8,1.0]"),
        ("alice", 1, "day", 20_000, None, None),
        ("ops", 0, "7d", None, 0.30000000000000004, None),
    ]


def test_apply_replaces_and_clears_prices_and_budgets(store: Store, settings: Settings) -> None:
    _apply(store, PRICED)
    ids = {p.name: p.id for p in store.principals()}
    changed = replace(
        PRICED,
        provider_models=(DOC.provider_models[0], PRICED.provider_models[1]),
        models=(replace(DOC.models[0], price=PriceSpec(0.2, 0.8, 0.1)),),
        principals=(
            replace(DOC.principals[0], budgets=(BudgetSpec("day", 10),)),
            DOC.principals[1],
        ),
        keys=DOC.keys,
    )
    _apply(store, changed)
    doc = store.config_doc()
    assert _prices(doc) == {"llama": None, "qwen": PriceSpec(0.0, 0.0), "chat": PriceSpec(0.2, 0.8, 0.1)}
    # The cost limit alice had before is gone, not kept beside the new token limit.
    assert {p.name: p.budgets for p in store.principals()} == {"alice": (BudgetSpec("day", 10),), "ops": ()}
    assert [k.budgets for k in store.list_keys()] == [()]
    assert {p.name: p.id for p in store.principals()} == ids  # budgets change, ids do not
    # Re-applying the document without any prices or budgets clears them all.
    _apply(store)
    doc = store.config_doc()
    assert _prices(doc) == {"llama": None, "qwen": None, "chat": None}
    assert [p.budgets for p in doc.principals] == [(), ()]
    assert [p.budgets for p in store.principals()] == [(), ()]
    with _raw(settings) as conn:
        assert conn.execute("SELECT COUNT(*) FROM principal_budgets").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM key_budgets").fetchone() == (0,)
        assert conn.execute(
            "SELECT COUNT(*) FROM models WHERE price_input IS NOT NULL OR price_output IS NOT NULL "
            "OR price_cached_input IS NOT NULL"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT COUNT(*) FROM provider_models WHERE price_input IS NOT NULL "
            "OR price_output IS NOT NULL OR price_cached_input IS NOT NULL"
        ).fetchone() == (0,)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE principal_budgets SET cost = 'x'",
        "UPDATE principal_budgets SET tokens = 'lots'",
        "UPDATE principal_budgets SET alerts = '[7]'",
    ],
)
def test_unreadable_budget_is_a_store_error(store: Store, settings: Settings, sql: str) -> None:
    sqlite_only(settings)  # PostgreSQL's column types refuse such a row in the first place
    _apply(store, PRICED)
    with _raw(settings) as conn:  # text passes SQLite's CHECK (> 0): text sorts above numbers
        conn.execute(f"{sql} WHERE principal_id = (SELECT id FROM principals WHERE name = 'ops')")
    with pytest.raises(StoreError, match="unreadable budget"):
        store.principals()


def test_key_budgets_from_the_cli_are_kept_until_a_file_adopts_the_key(
    store: Store, settings: Settings
) -> None:
    _apply(store)
    day = BudgetSpec("day", 1000, None, (0.5, 1.0))
    month = BudgetSpec("month", None, 3.0)
    store.create_key("ops", "ops-cli", None, HASH_KEY, budgets=(day, month), actor="t")
    listed = {k.name: k.budgets for k in store.list_keys("ops")}
    assert listed == {"ops-cli": (day, month)}
    entry = store.audit_log(1)[0]
    assert orjson.loads(entry.after or "")["budgets"] == [
        {"period": "day", "tokens": 1000, "alerts": [0.5, 1.0]},
        {"period": "month", "cost": 3.0},
    ]
    assert [(b.principal, b.key, b.spec.period) for b in store.budgets()] == [
        ("ops", "ops-cli", "day"),
        ("ops", "ops-cli", "month"),
    ]
    _apply(store)  # a file that does not name the key leaves its budgets alone
    assert {k.name: k.budgets for k in store.list_keys("ops")} == listed
    _apply(store, replace(DOC, keys=(*DOC.keys, KeySpec("ops-cli", "ops", budgets=(BudgetSpec("6h", 9),)))))
    assert {k.name: k.budgets for k in store.list_keys("ops")} == {"ops-cli": (BudgetSpec("6h", 9),)}
    # The same checks as a file's: one budget per period, at most four.
    for bad, why in (
        ((day, day), "another budget has the period 'day'"),
        (tuple(BudgetSpec(f"{h}h", 1) for h in range(1, 6)), "at most 4 budgets"),
        ((BudgetSpec("week", 1),), "budgets\\[0\\].period: must be"),
    ):
        with pytest.raises(ConfigError, match=why):
            store.create_key("ops", None, None, HASH_KEY, budgets=bad, actor="t")
    # A key that goes takes its budgets with it.
    _apply(store, replace(DOC, principals=DOC.principals[:1], keys=()))
    with _raw(settings) as conn:
        assert conn.execute("SELECT COUNT(*) FROM key_budgets").fetchone() == (0,)


def test_apply_keeps_cli_key_limits_until_the_file_adopts_it(store: Store) -> None:
    _apply(store)
    store.create_key("ops", "ops-cli", None, HASH_KEY, LimitsSpec(requests_per_minute=7), actor="test")
    _apply(store)
    assert {k.name: k.limits for k in store.list_keys("ops")} == {"ops-cli": LimitsSpec(7)}
    _apply(store, replace(DOC, keys=(*DOC.keys, KeySpec("ops-cli", "ops"))))
    assert {k.name: k.limits for k in store.list_keys("ops")} == {"ops-cli": None}


def test_revoked_key_stays_revoked_after_apply(store: Store) -> None:
    _apply(store)
    store.revoke_key("alice-dev", actor="test")
    _apply(store)
    (key,) = store.list_keys()
    assert key.status() == "revoked"


@pytest.mark.parametrize(
    ("doc", "kwargs", "message"),
    [
        # A file must resolve its variables (an API write resending the stored reference need not).
        (
            DOC,
            {"environ": {}, "owner": "file:/x.toml"},
            "backends[1].api_key_env: environment variable B_KEY",
        ),
        (DOC, {"environ": {"B_KEY": ""}, "owner": "file:/x.toml"}, "B_KEY is not set"),
        (DOC, {"environ": ENV, "hash_key": None}, "a hash key is needed"),
        (
            replace(DOC, keys=(KeySpec("never-created", "alice"),)),
            {"environ": ENV, "hash_key": HASH_KEY},
            "keys[0]: no key named 'never-created' exists yet",
        ),
    ],
)
def test_failed_apply_changes_nothing(
    store: Store, doc: ConfigDoc, kwargs: dict[str, object], message: str
) -> None:
    _apply(store)
    before = store.config_doc()
    with pytest.raises(ConfigError, match=re.escape(message)):
        store.apply_config(doc, **kwargs, actor="test")  # type: ignore[arg-type]
    assert store.revision() == 1
    assert store.config_doc() == before


def test_imported_secret_equal_to_a_stored_key_conflicts(store: Store) -> None:
    _apply(store)
    _, cli_secret = store.create_key("ops", "ops-cli", None, HASH_KEY, actor="test")
    with pytest.raises(StoreConflict, match="already used by key"):
        _apply(store, replace(DOC, keys=(*DOC.keys, KeySpec("clash", "ops", cli_secret))))
    assert store.revision() == 2


def test_file_key_may_take_over_the_secret_of_a_key_it_removes(store: Store) -> None:
    _apply(store)
    _apply(store, replace(DOC, keys=(KeySpec("renamed", "alice", SECRET),)))
    assert [k.name for k in store.list_keys()] == ["renamed"]


# --- keys ---------------------------------------------------------------------------------------------------


def test_create_key_stores_only_the_hash(store: Store, settings: Settings) -> None:
    _apply(store)
    key_id, secret = store.create_key("ops", "ops-1", None, HASH_KEY, actor="test")
    assert secret.startswith("sk-gw-")
    assert store.revision() == 2
    with _raw(settings) as conn:
        rows = conn.execute("SELECT * FROM api_keys").fetchall()
        (key_hash,) = conn.execute("SELECT key_hash FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    assert all(secret not in map(str, row) for row in rows)
    assert key_hash == hash_secret(secret, HASH_KEY).hex()
    if settings.database is None:
        assert secret.encode() not in settings.sqlite_path.read_bytes()


@pytest.mark.parametrize(
    "limits", [None, LimitsSpec(), LimitsSpec(60), LimitsSpec(None, 1000, 2), LimitsSpec(1, 2, 3)]
)
def test_create_key_with_limits(store: Store, limits: LimitsSpec | None) -> None:
    _apply(store)
    key_id, _ = store.create_key("ops", None, None, HASH_KEY, limits, actor="test")
    expected = None if limits is None or limits.is_empty() else limits
    assert {k.id: k.limits for k in store.list_keys("ops")} == {key_id: expected}


@pytest.mark.parametrize(
    ("principal", "name", "limits", "error", "message"),
    [
        ("bob", None, None, ConfigError, "no principal named 'bob'"),
        ("ops", "alice-dev", None, StoreConflict, "a key named 'alice-dev' already exists"),
        ("ops", "has space", None, ConfigError, "key name must be 1-200 characters"),
        ("ops", None, LimitsSpec(0), ConfigError, "key limit requests_per_minute must be a positive integer"),
        ("ops", None, LimitsSpec(None, None, -1), ConfigError, "key limit concurrent_requests must be"),
    ],
)
def test_create_key_errors(
    store: Store,
    principal: str,
    name: str | None,
    limits: LimitsSpec | None,
    error: type[Exception],
    message: str,
) -> None:
    _apply(store)
    with pytest.raises(error, match=message):
        store.create_key(principal, name, None, HASH_KEY, limits, actor="test")
    assert store.revision() == 1


def test_revoke_by_id_and_by_name_bumps_once(store: Store) -> None:
    _apply(store)
    key_id, _ = store.create_key("ops", "ops-1", None, HASH_KEY, actor="test")
    store.revoke_key(key_id, actor="test")
    assert store.revision() == 3
    store.revoke_key(key_id, actor="test")  # already revoked: nothing changes
    assert store.revision() == 3
    store.revoke_key("alice-dev", actor="test")
    assert store.revision() == 4
    assert {k.name: k.status() for k in store.list_keys()} == {"ops-1": "revoked", "alice-dev": "revoked"}
    with pytest.raises(ConfigError, match="no key with id or name 'nope'"):
        store.revoke_key("nope", actor="test")


def test_list_keys_filters_and_reports_expiry(store: Store) -> None:
    _apply(store)
    past = time.time() - 10
    expired_id, _ = store.create_key("ops", "old", past, HASH_KEY, actor="test")
    live_id, _ = store.create_key("ops", None, time.time() + 3600, HASH_KEY, actor="test")
    ops = store.list_keys("ops")
    assert [(k.id, k.status()) for k in ops] == [(expired_id, "expired"), (live_id, "active")]
    assert ops[0].expires_at == past
    assert ops[1].name is None and ops[1].managed_by == "cli" and len(ops[1].hash_prefix) == 8
    assert [k.name for k in store.list_keys("alice")] == ["alice-dev"]
    assert len(store.list_keys()) == 3
    with pytest.raises(ConfigError, match="no principal named 'bob'"):
        store.list_keys("bob")
    assert {p.name: (p.roles, p.active_keys) for p in store.principals()} == {
        "alice": (("user",), 1),
        "ops": (("admin", "user"), 1),
    }


def test_second_connection_sees_commits(settings: Settings) -> None:
    with open_store(settings) as writer, open_store(settings) as reader:
        assert reader.revision() == 0
        _apply(writer)
        assert reader.revision() == 1
        assert len(reader.list_keys()) == 1


# --- ownership, audit, credentials, retention (issue 20) ----------------------------------------------------

FILE = "file:/etc/gateway/gateway.toml"


def test_a_file_owns_what_it_declares_and_leaves_the_store_s_entries(store: Store) -> None:
    store.apply_config(DOC, actor=FILE, owner=FILE, hash_key=HASH_KEY, environ=ENV)
    extra = PrincipalSpec("erin", ("user",))
    doc = store.config_doc()
    store.apply_config(replace(doc, principals=(*doc.principals, extra)), actor="ops (key k)")
    assert store.owners()[("principals", "alice")] == FILE and ("principals", "erin") not in store.owners()
    # The file drops ops: ops goes (the file owned it), erin stays (the store's), alice is the file's.
    fewer = replace(DOC, principals=DOC.principals[:1])
    store.apply_config(fewer, actor=FILE, owner=FILE, hash_key=HASH_KEY, environ=ENV)
    assert [p.name for p in store.principals()] == ["alice", "erin"]
    changes = store.audit_log(1)[0]
    assert (changes.actor, changes.action, changes.target) == (FILE, "config.apply", FILE)
    assert orjson.loads(changes.after or "") == {"removed": {"principals": ["ops"]}}
    # A file that declares a store entry takes it over; the audit entry says whose it became.
    store.apply_config(
        replace(fewer, principals=(*fewer.principals, extra)),
        actor=FILE,
        owner=FILE,
        hash_key=HASH_KEY,
        environ=ENV,
    )
    assert store.owners()[("principals", "erin")] == FILE
    assert orjson.loads(store.audit_log(1)[0].after or "") == {"owner_changed": {"principals": ["erin"]}}


def test_the_store_may_not_change_or_remove_what_a_file_owns(store: Store) -> None:
    store.apply_config(DOC, actor=FILE, owner=FILE, hash_key=HASH_KEY, environ=ENV)
    doc = store.config_doc()
    revision = store.revision()
    changed = replace(doc, principals=(replace(doc.principals[0], roles=("admin",)), *doc.principals[1:]))
    with pytest.raises(OwnershipConflict, match="principals/alice is owned by the config file /etc/gateway"):
        store.apply_config(changed, actor="ops")
    with pytest.raises(OwnershipConflict, match="cannot be removed"):
        store.apply_config(replace(doc, principals=doc.principals[1:]), actor="ops")
    # The document as the API shows it (credentials left out) applies without changing anything.
    store.apply_config(doc, actor="ops")
    assert store.revision() == revision + 1
    assert orjson.loads(store.audit_log(1)[0].after or "") == {}
    assert OwnershipConflict.status == 409


def test_credentials_are_sealed_write_only_and_rotatable(store: Store, settings: Settings) -> None:
    inline = replace(DOC.backends[0], api_key="sk-inline-credential")
    _apply(store, replace(DOC, backends=(inline, DOC.backends[1])))
    with _raw(settings) as conn:
        rows = conn.execute("SELECT name, api_key FROM backends ORDER BY name").fetchall()
    assert all(str(v).startswith("v1:") for _, v in rows) and "sk-inline" not in str(rows)
    assert [b.api_key for b in store.config_doc().backends] == [None, None]
    shown = store.backend_credentials()
    assert (shown["a"].source, shown["b"].source) == ("inline", "env:B_KEY")
    assert len(shown["a"].fingerprint) == 8
    # Applying what the API shows (no credential) keeps the stored one; so does the next rebuild.
    store.apply_config(store.config_doc(), actor="ops", environ=ENV)
    assert {r[0]: r[3] for r in store.read_state().backends} == {"a": "sk-inline-credential", "b": "secret-b"}
    # Rotation: re-sealed with a new key, same fingerprints, still readable.
    assert store.vault is not None
    new = store.vault.with_current(bytes(range(1, 33)))
    assert store.seal_credentials(new, actor="cli:root") == 2
    assert store.backend_credentials() == shown
    assert {r[0]: r[3] for r in store.read_state().backends} == {"a": "sk-inline-credential", "b": "secret-b"}
    # A store opened without the new key cannot open them: the snapshot builder skips such backends.
    with open_store(settings) as other:
        assert all(r[3] is not None and not isinstance(r[3], str) for r in other.read_state().backends)
        # Other writes still work and keep such a credential sealed as it is; giving it again re-seals it.
        with _raw(settings) as conn:
            sealed_b = conn.execute("SELECT api_key FROM backends WHERE name = 'b'").fetchone()[0]
        again = replace(DOC.backends[0], api_key="sk-given-again")
        other.apply_config(replace(other.config_doc(), backends=(again, DOC.backends[1])), actor="ops")
        with _raw(settings) as conn:
            assert conn.execute("SELECT api_key FROM backends WHERE name = 'b'").fetchone()[0] == sealed_b
        assert {r[0]: r[3] for r in other.read_state().backends}["a"] == "sk-given-again"


def test_credentials_stored_in_the_clear_by_older_versions_are_sealed_on_open(settings: Settings) -> None:
    with open_store(settings) as store:
        _apply(store)
    with _raw(settings) as conn:
        conn.execute("UPDATE backends SET api_key = 'sk-legacy-plain' WHERE name = 'a'")
        if isinstance(conn, sqlite3.Connection):
            conn.commit()
    with open_store(settings) as store:
        assert {r[0]: r[3] for r in store.read_state().backends}["a"] == "sk-legacy-plain"
        assert store.audit_log(1)[0].action == "secrets.seal"
    with _raw(settings) as conn:
        value = conn.execute("SELECT api_key FROM backends WHERE name = 'a'").fetchone()[0]
    assert value.startswith("v1:")


def test_key_writes_are_audited_by_name(store: Store) -> None:
    _apply(store)
    key_id, _ = store.create_key("ops", "ops-admin", None, HASH_KEY, actor="cli:root")
    store.revoke_key(key_id, actor="cli:root")
    store.revoke_key(key_id, actor="cli:root")  # already revoked: nothing changes, nothing is audited
    revoke, create = store.audit_log(2)
    assert (create.actor, create.action, create.target) == ("cli:root", "key.create", "keys/ops-admin")
    assert (revoke.action, revoke.target) == ("key.revoke", "keys/ops-admin")
    assert orjson.loads(revoke.after or "") == {"id": key_id, "name": "ops-admin", "principal": "ops"}
    assert len(store.audit_log(100)) == 3  # and the apply's


def test_prune_keeps_what_a_budget_window_counts(store: Store) -> None:
    budgeted = replace(DOC.principals[0], budgets=(BudgetSpec("day", 1000, None),))
    _apply(store, replace(DOC, principals=(budgeted, *DOC.principals[1:])))
    day = 86400.0
    now = 1_800_000_000.0 // day * day + 12 * 3600  # noon of a day
    old = [_usage(i)._replace(ts=now - day * 40 - i) for i in range(5)]
    today = [_usage(10 + i)._replace(ts=now - 3600 * (i + 1)) for i in range(3)]
    store.usage.insert(old + today)
    spend_before = store.usage.spend(now - 12 * 3600, now + day)
    # Retention of 0.01 days would reach into today's window: the budget's window start holds it back.
    rows, cutoff, held = purge(store, 0.01, "cli:root", now=now)
    assert (rows, held) == (5, now - 12 * 3600) and cutoff == held
    assert store.usage.spend(now - 12 * 3600, now + day) == spend_before
    assert {r.request_id for r in store.usage.records()} == {f"req-{10 + i}" for i in range(3)}
    assert store.usage.purged_before() == cutoff
    entry = store.audit_log(1)[0]
    assert (entry.action, orjson.loads(entry.after or "")["rows"]) == ("usage.purge", 5)
    # Batches: one call deletes at most its batch, the oldest first.
    store.usage.insert([_usage(20 + i)._replace(ts=now - day * 50 - i) for i in range(7)])
    assert store.usage.prune(cutoff, 3) == 3
    assert store.usage.purged_before() == cutoff  # never moves back
    assert store.usage.prune(cutoff, 3) == 3 and store.usage.prune(cutoff, 3) == 1
    assert store.usage.prune(cutoff, 3) == 0


def test_logged_bodies_are_stored_once_read_back_and_purged(store: Store) -> None:
    def logged(request_id: str, ts: float, days: float) -> StoredBodies:
        path, answer = "/v1/chat/completions", b'data: {"choices": []}\n\n'
        rec = BodyRecord(request_id, ts, "p1", "k1", "chat", 200, "debug", "id", "openai", path, True, 2, 9,
                         "backend", b"{}", answer)  # fmt: skip
        return stored_bodies(rec, Redactor(), days)

    now = 1_800_000_000.0
    rows = [logged("b1", now - 86400 * 3, 1), logged("b2", now - 86400 * 3, 7), logged("b3", now, 1)]
    store.bodies.insert(rows)
    store.bodies.insert(rows[:1])  # a replayed batch stores nothing twice
    assert store.bodies.count() == 3
    got = store.bodies.get("b2")
    assert got == rows[1] and got is not None and got.stream_events == 1 and got.response_kind == "json"
    assert got.as_doc()["response"] == {
        "kind": "json", "size": 9, "truncated": False, "body": {"object": "chat.completion", "choices": []},
        "stream_events": 1,
    }  # fmt: skip
    assert store.bodies.get("absent") is None
    assert store.bodies.prune(now, 10) == 1  # b1's day is over; b2 keeps 7 days
    assert purge_bodies(store, "cli:root", now=now) == 0
    assert purge_bodies(store, "cli:root", older_than_days=1, now=now) == 1  # b2, whatever its retention
    assert [store.bodies.get(i) is not None for i in ("b1", "b2", "b3")] == [False, False, True]
    entry = store.audit_log(1)[0]
    assert (entry.action, orjson.loads(entry.after or "")["rows"]) == ("bodies.purge", 1)
