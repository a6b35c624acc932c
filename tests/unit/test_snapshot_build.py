"""The snapshot builder: content checked through ``Snapshot.from_doc``, bad rows skipped and counted."""

from __future__ import annotations

import logging
import sqlite3
import time
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from gateway.budget import NANOS, Budget, Price
from gateway.config import Settings
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.specs import (
    BudgetSpec,
    ConfigDoc,
    KeySpec,
    LimitsSpec,
    PriceSpec,
    PrincipalSpec,
)
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.snapshot_build import MAX_LOGGED, build_doc, build_snapshot_doc
from gateway.controlplane.store import Store, open_store
from gateway.errors import ConfigError
from gateway.keys import hash_secret
from gateway.snapshot import Snapshot

HASH_KEY = bytes(range(32))
ALICE_SECRET = "sk-gw-alice-imported-0001"

DOC = parse_config(
    {
        "backends": [
            {"name": "a", "url": "http://127.0.0.1:8001/", "connect_timeout": 2.0},
            {"name": "b", "url": "https://b.example", "protocol": "anthropic", "api_key_env": "B_KEY"},
        ],
        "provider_models": [
            {"name": "llama-8b", "backends": [{"backend": "a", "model": "meta/llama"}, "b"]},
            {"name": "qwen", "backends": ["b"]},
        ],
        "models": [
            {"name": "chat", "chain": ["llama-8b", "qwen"], "aliases": ["gpt-4o-mini", "default"]},
            {"name": "small", "chain": ["qwen"]},
        ],
        "roles": [
            {"name": "user", "permissions": ["model/chat", "usage:read"]},
            {"name": "llama", "permissions": ["model/llama-*"]},
            {"name": "gpt", "permissions": ["model/gpt-*"]},
            {"name": "admin", "permissions": ["model/*"]},
            {"name": "nothing", "permissions": ["key:create"]},
        ],
        "principals": [
            {
                "name": "alice",
                "roles": ["user"],
                "limits": {"requests_per_minute": 100, "tokens_per_minute": 20000, "concurrent_requests": 8},
                "model_limits": {"chat": {"requests_per_minute": 10}, "default": {"tokens_per_minute": 500}},
            },
            {"name": "bob", "roles": ["llama"], "model_limits": {"llama-8b": {"concurrent_requests": 1}}},
            {"name": "carol", "roles": ["gpt"]},
            {"name": "ops", "roles": ["admin"]},
            {"name": "dave", "roles": ["nothing"]},
            {"name": "erin", "roles": []},
        ],
        "keys": [
            {
                "name": "alice-dev",
                "principal": "alice",
                "secret": ALICE_SECRET,
                "limits": {"requests_per_minute": 30},
            }
        ],
    },
    "test",
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    with open_store(settings) as s:
        s.apply_config(DOC, hash_key=HASH_KEY, environ={"B_KEY": "kb"}, actor="test")
        yield s


def _snapshot(store: Store) -> Snapshot:
    doc = build_snapshot_doc(store)
    # What the data plane does: bytes in, frozen objects out.
    return Snapshot.decode(orjson.dumps(doc), generation=1)


def _digest(secret: str) -> bytes:
    return hash_secret(secret, HASH_KEY)


def test_document_header_and_backends(store: Store) -> None:
    doc = build_snapshot_doc(store)
    assert (doc["schema"], doc["revision"], doc["skipped"]) == (1, store.revision(), 0)
    assert doc["built_at"] == pytest.approx(time.time(), abs=60)
    snap = Snapshot.from_doc(doc, 3)
    assert snap.generation == 3
    a, b = snap.backends["a"], snap.backends["b"]
    assert (a.url, a.api_key, a.protocol, a.connect_timeout, a.first_byte_timeout) == (
        "http://127.0.0.1:8001",
        None,
        "openai",
        2.0,
        60.0,
    )
    assert (b.url, b.api_key, b.protocol) == ("https://b.example", "kb", "anthropic")


def test_routes_flatten_chains_and_aliases_share_targets(store: Store) -> None:
    snap = _snapshot(store)
    assert set(snap.routes) == {"chat", "gpt-4o-mini", "default", "small", "llama-8b", "qwen"}
    chat = snap.routes["chat"]
    assert (chat.canonical, chat.kind) == ("chat", "frontend")
    assert [(t.provider_model, t.backend.name, t.upstream_model) for t in chat.targets] == [
        ("llama-8b", "a", "meta/llama"),
        ("llama-8b", "b", "llama-8b"),
        ("qwen", "b", "qwen"),
    ]
    for alias in ("gpt-4o-mini", "default"):
        route = snap.routes[alias]
        assert (route.canonical, route.kind, route.targets) == ("chat", "frontend", chat.targets)
    llama = snap.routes["llama-8b"]
    assert (llama.canonical, llama.kind, len(llama.targets)) == ("llama-8b", "provider", 2)


@pytest.mark.parametrize(
    ("principal", "allow_all", "models"),
    [
        ("alice", False, {"chat", "gpt-4o-mini", "default"}),  # a frontend model grants its aliases
        ("bob", False, {"llama-8b"}),  # glob over provider model names
        ("carol", False, {"chat", "gpt-4o-mini", "default"}),  # an alias counts as its frontend model
        ("ops", True, {"chat", "gpt-4o-mini", "default", "small", "llama-8b", "qwen"}),
        ("dave", False, set()),  # non-model permissions grant no route
        ("erin", False, set()),
    ],
)
def test_principal_grants(store: Store, principal: str, allow_all: bool, models: set[str]) -> None:
    snap = _snapshot(store)
    (p,) = [p for p in snap.principals.values() if p.name == principal]
    assert (p.allow_all, set(p.models)) == (allow_all, models)
    assert p.id == next(i.id for i in store.principals() if i.name == principal)


def test_keys_map_hash_to_principal(store: Store) -> None:
    live_id, live = store.create_key("bob", None, time.time() + 3600, HASH_KEY, actor="test")
    revoked_id, revoked = store.create_key("bob", "gone", None, HASH_KEY, actor="test")
    store.revoke_key(revoked_id, actor="test")
    _, expired = store.create_key("bob", "old", time.time() - 1, HASH_KEY, actor="test")
    snap = _snapshot(store)
    alice = snap.keys[_digest(ALICE_SECRET)]
    assert (alice.principal.name, alice.expires_at) == ("alice", None)
    entry = snap.keys[_digest(live)]
    assert (entry.id, entry.principal.name) == (live_id, "bob")
    assert entry.expires_at is not None and entry.expires_at > time.time()
    assert _digest(revoked) not in snap.keys
    assert _digest(expired) not in snap.keys
    assert len(snap.keys) == 2
    assert snap.skipped == 0


def test_limits_in_the_document(store: Store) -> None:
    store.create_key("bob", "bob-cli", None, HASH_KEY, LimitsSpec(tokens_per_minute=7), actor="test")
    doc = build_snapshot_doc(store)
    by_name = {p["name"]: p for p in doc["principals"].values()}
    # Only the limits that are set; no "limits" or "model_limits" at all where none is.
    assert by_name["alice"]["limits"] == {"rpm": 100, "tpm": 20000, "concurrency": 8}
    assert by_name["alice"]["model_limits"] == {"chat": {"rpm": 10}, "default": {"tpm": 500}}
    assert "limits" not in by_name["bob"]
    assert by_name["bob"]["model_limits"] == {"llama-8b": {"concurrency": 1}}
    assert not {"limits", "model_limits"} & set(by_name["ops"])
    names = {k.id: k.name for k in store.list_keys()}
    assert {names[k["id"]]: k.get("limits") for k in doc["keys"].values()} == {
        "alice-dev": {"rpm": 30},
        "bob-cli": {"tpm": 7},
    }


def test_limits_decode_with_distinct_bucket_keys(store: Store) -> None:
    snap = _snapshot(store)
    alice = next(p for p in snap.principals.values() if p.name == "alice")
    assert alice.limits is not None
    assert (alice.limits.rpm, alice.limits.tpm, alice.limits.concurrency) == (100, 20000, 8)
    assert alice.model_limits is not None
    chat, default = alice.model_limits["chat"], alice.model_limits["default"]
    assert (chat.rpm, chat.tpm, chat.concurrency) == (10, None, None)
    assert (default.rpm, default.tpm) == (None, 500)
    key = snap.keys[_digest(ALICE_SECRET)].limits
    assert key is not None and (key.rpm, key.tpm, key.concurrency) == (30, None, None)
    ops = next(p for p in snap.principals.values() if p.name == "ops")
    assert (ops.limits, ops.model_limits) == (None, None)
    # Every scope and every kind of limit names its own bucket.
    scopes = [alice.limits, chat, default, key]
    assert len({s.scope for s in scopes}) == len(scopes)
    bucket_keys = [k for s in scopes for k in (s.rpm_key, s.tpm_key, s.concurrency_key)]
    assert len(set(bucket_keys)) == len(bucket_keys)


def _raw(settings: Settings) -> sqlite3.Connection:
    conn = sqlite3.connect(settings.sqlite_path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")  # to plant rows the store itself would refuse
    return conn


_KEY_COLUMNS = "id, name, principal_id, key_hash, created_at, expires_at, revoked_at, managed_by"

BAD_ROWS: list[tuple[str, str, int]] = [
    (
        "key whose principal is gone",
        f"INSERT INTO api_keys ({_KEY_COLUMNS}) "
        f"VALUES ('k1', NULL, 'ghost', '{'ab' * 32}', 0, NULL, NULL, 'cli')",
        1,
    ),
    ("key hash not hex", "UPDATE api_keys SET key_hash = 'not-hex'", 1),
    ("key expiry unparsable", "UPDATE api_keys SET expires_at = 'soon'", 1),
    (
        "provider model backend missing",
        "INSERT INTO provider_model_backends VALUES ('qwen', 9, 'nope', 'q')",
        1,
    ),
    # The backend goes, and so does llama-8b's entry naming it: two rows.
    ("backend timeout unparsable", "UPDATE backends SET connect_timeout = 'abc' WHERE name = 'a'", 2),
    ("backend protocol unknown", "UPDATE backends SET protocol = 'grpc' WHERE name = 'a'", 2),
    ("backend url invalid", "UPDATE backends SET url = 'nope' WHERE name = 'a'", 2),
    ("alias of unknown model", "INSERT INTO model_aliases VALUES ('orphan', 'ghost')", 1),
    ("chain entry unknown", "INSERT INTO model_chain VALUES ('small', 9, 'ghost')", 1),
    (
        "principal role unknown",
        "INSERT INTO principal_roles (principal_id, role) SELECT id, 'ghost' FROM principals",
        6,
    ),
    ("permission of unknown role", "INSERT INTO role_permissions VALUES ('ghost', 'model/*')", 1),
    # A key whose limits cannot be read is left out rather than let through unlimited.
    ("key limit unparsable", "UPDATE api_keys SET limit_rpm = 'many'", 1),
    ("key limit fractional", "UPDATE api_keys SET limit_concurrency = 2.5", 1),
    (
        "model limits of unknown principal",
        "INSERT INTO principal_model_limits (principal_id, model, limit_rpm) VALUES ('ghost', 'chat', 1)",
        1,
    ),
    (
        "model limits with invalid model name",
        "INSERT INTO principal_model_limits (principal_id, model, limit_rpm) "
        "SELECT id, 'a b', 1 FROM principals WHERE name = 'ops'",
        1,
    ),
]


@pytest.mark.parametrize(("sql", "count"), [r[1:] for r in BAD_ROWS], ids=[r[0] for r in BAD_ROWS])
def test_bad_row_is_skipped_counted_and_logged(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture, sql: str, count: int
) -> None:
    good = _snapshot(store)
    with _raw(settings) as conn:
        conn.execute(sql)
    with caplog.at_level(logging.WARNING, logger="gateway.snapshot"):
        snap = _snapshot(store)
    assert snap.skipped == count
    assert len([r for r in caplog.records if r.name == "gateway.snapshot"]) == count
    # Everything else still made it in.
    assert set(snap.routes) == set(good.routes) - {"orphan"}
    assert {p.name for p in snap.principals.values()} == {p.name for p in good.principals.values()}


@pytest.mark.parametrize(
    ("sql", "count"),
    [
        # alice, her role, her key, her two model limits
        ("UPDATE principals SET limit_tpm = 'lots' WHERE name = 'alice'", 5),
        ("UPDATE principals SET limit_rpm = 1e300 WHERE name = 'alice'", 5),
        # alice (at her second model limit, after the first was read), her role, her key
        ("UPDATE principal_model_limits SET limit_rpm = 'x' WHERE model = 'default'", 3),
    ],
)
def test_principal_with_unreadable_limits_is_left_out(
    store: Store, settings: Settings, sql: str, count: int
) -> None:
    with _raw(settings) as conn:
        conn.execute(sql)
    snap = _snapshot(store)
    # Fail closed: alice is skipped, and with her every row naming her; everyone else is unaffected.
    assert "alice" not in {p.name for p in snap.principals.values()}
    assert _digest(ALICE_SECRET) not in snap.keys
    assert snap.skipped == count
    assert len(snap.principals) == 5


def test_provider_model_without_usable_backend_drops_dependent_routes(
    store: Store, settings: Settings
) -> None:
    with _raw(settings) as conn:
        conn.execute("DELETE FROM backends WHERE name = 'b'")
    snap = _snapshot(store)
    # qwen loses its only backend, so it and "small" (chain: qwen) go; chat keeps its llama target on a.
    assert "qwen" not in snap.routes and "small" not in snap.routes
    assert [(t.provider_model, t.backend.name) for t in snap.routes["chat"].targets] == [("llama-8b", "a")]
    # llama-8b's and qwen's rows on b, qwen itself, the chain entries naming qwen in chat and small, small.
    assert snap.skipped == 6


def test_many_bad_rows_log_a_summary(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [(f"bad{i}", None, "ghost", f"{i:064x}", 0.0, None, None, "cli") for i in range(MAX_LOGGED + 5)]
    with _raw(settings) as conn:
        conn.executemany(f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    with caplog.at_level(logging.WARNING, logger="gateway.snapshot"):
        doc = build_snapshot_doc(store)
    assert doc["skipped"] == MAX_LOGGED + 5
    records = [r for r in caplog.records if r.name == "gateway.snapshot"]
    assert len(records) == MAX_LOGGED + 1
    assert "5 not logged individually" in records[-1].getMessage()


def test_ten_thousand_keys(store: Store) -> None:
    principals = tuple(PrincipalSpec(f"p{i}", ("user",)) for i in range(100))
    keys = tuple(KeySpec(f"k{i}", f"p{i % 100}", f"sk-gw-bulk-secret-{i:08d}") for i in range(10_000))
    store.apply_config(
        replace(DOC, principals=principals, keys=keys),
        hash_key=HASH_KEY,
        environ={"B_KEY": "x"},
        actor="test",
    )
    snap = _snapshot(store)
    assert len(snap.keys) == 10_000
    assert snap.skipped == 0
    for i in range(10_000):
        entry = snap.keys[_digest(f"sk-gw-bulk-secret-{i:08d}")]
        assert entry.principal.name == f"p{i % 100}"
    assert all(p.models == frozenset({"chat", "gpt-4o-mini", "default"}) for p in snap.principals.values())


# --- prices and budgets -------------------------------------------------------------------------------


def _priced(doc: ConfigDoc) -> ConfigDoc:
    """``doc`` with llama-8b and chat priced (chat without a cached price), budgets for alice (a month and
    a day) and bob, and one of her key's own."""
    llama, qwen = doc.provider_models
    chat, small = doc.models
    alice, bob, *others = doc.principals
    return replace(
        doc,
        provider_models=(replace(llama, price=PriceSpec(1.0, 2.0, 0.5)), qwen),
        models=(replace(chat, price=PriceSpec(0.15, 0.6)), small),
        principals=(
            replace(
                alice,
                budgets=(BudgetSpec("month", 1_000_000, 50.0, (0.8, 1.0)), BudgetSpec("day", None, 5.0)),
            ),
            replace(bob, budgets=(BudgetSpec("6h", 5000),)),
            *others,
        ),
        keys=(replace(doc.keys[0], budgets=(BudgetSpec("day", 2000, None, (0.5,)),)),),
    )


PRICED = _priced(DOC)


@pytest.fixture
def priced(store: Store) -> Store:
    store.apply_config(PRICED, hash_key=HASH_KEY, environ={"B_KEY": "kb"}, actor="test")
    return store


def test_prices_in_the_routes(priced: Store) -> None:
    doc = build_snapshot_doc(priced)
    assert doc["skipped"] == 0
    assert {name: route.get("price") for name, route in doc["routes"].items()} == {
        # A frontend model's price, its cached price defaulting to its input price, on it and its aliases;
        # not the price of the provider models in its chain.
        "chat": [0.15, 0.6, 0.15],
        "gpt-4o-mini": [0.15, 0.6, 0.15],
        "default": [0.15, 0.6, 0.15],
        "llama-8b": [1.0, 2.0, 0.5],
        "qwen": None,
        "small": None,
    }
    assert "price" not in doc["routes"]["small"]
    snap = Snapshot.decode(orjson.dumps(doc), generation=1)
    for name in ("chat", "gpt-4o-mini", "default"):
        assert snap.routes[name].price == Price(150.0, 600.0, 150.0)
    assert snap.routes["llama-8b"].price == Price(1000.0, 2000.0, 500.0)
    assert (snap.routes["qwen"].price, snap.routes["small"].price) == (None, None)
    chat_price = snap.routes["gpt-4o-mini"].price
    assert chat_price is not None and chat_price.cost(10, 0, 0) == 1500


def test_budgets_in_the_principals_and_keys(priced: Store) -> None:
    doc = build_snapshot_doc(priced)
    by_name = {p["name"]: p for p in doc["principals"].values()}
    assert by_name["alice"]["budgets"] == [
        {"period": "month", "tokens": 1_000_000, "cost": 50.0, "alerts": [0.8, 1.0]},
        {"period": "day", "cost": 5.0},
    ]
    assert by_name["bob"]["budgets"] == [{"period": "6h", "tokens": 5000}]
    # The first again as "budget", which proxy hosts of the version before read.
    assert by_name["alice"]["budget"] == by_name["alice"]["budgets"][0]
    assert [name for name, p in by_name.items() if "budgets" in p] == ["alice", "bob"]
    # The budgets sit beside the limits, which are unchanged.
    assert by_name["alice"]["limits"] == {"rpm": 100, "tpm": 20000, "concurrency": 8}
    assert by_name["bob"]["model_limits"] == {"llama-8b": {"concurrency": 1}}
    key_doc = doc["keys"][_digest(ALICE_SECRET).hex()]
    assert key_doc["budgets"] == [{"period": "day", "tokens": 2000, "alerts": [0.5]}]
    assert key_doc["name"] == "alice-dev"  # alerts and the dry run name it

    snap = Snapshot.decode(orjson.dumps(doc), generation=1)
    ids = {p.name: p.id for p in priced.principals()}
    alice, bob = snap.principals[ids["alice"]], snap.principals[ids["bob"]]
    assert alice.budgets == (
        Budget(ids["alice"], "month", 1_000_000, 50 * NANOS, (0.8, 1.0)),
        Budget(ids["alice"], "day", None, 5 * NANOS),
    )
    assert bob.budgets == (Budget(ids["bob"], "6h", 5000, None),)
    assert snap.principals[ids["ops"]].budgets == ()
    # A key answers to its principal's budgets (the same objects) and to its own.
    key = snap.keys[_digest(ALICE_SECRET)]
    assert key.budgets is not None and key.budgets.principal is alice.budgets
    assert key.budgets.key == (Budget(f"key:{key.id}", "day", 2000, None, (0.5,)),)
    assert key.name == "alice-dev"
    # An older document's single budget still decodes, as the one budget of its principal.
    old = orjson.loads(orjson.dumps(doc))
    del old["principals"][ids["bob"]]["budgets"]
    assert Snapshot.from_doc(old, 2).principals[ids["bob"]].budgets == bob.budgets


def test_reapplying_without_prices_and_budgets_drops_them(priced: Store) -> None:
    priced.apply_config(DOC, hash_key=HASH_KEY, environ={"B_KEY": "kb"}, actor="test")
    doc = build_snapshot_doc(priced)
    assert [name for name, route in doc["routes"].items() if "price" in route] == []
    assert [p["name"] for p in doc["principals"].values() if "budgets" in p] == []
    assert [k for k in doc["keys"].values() if "budgets" in k] == []


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("UPDATE principal_budgets SET period = 'week'", "unreadable budget period 'week'"),
        ("UPDATE principal_budgets SET period = '30s'", "unreadable budget period '30s'"),
        ("UPDATE principal_budgets SET tokens = 'lots'", "unreadable budget tokens 'lots'"),
        ("UPDATE principal_budgets SET tokens = 2.5", "unreadable budget tokens 2.5"),
        ("UPDATE principal_budgets SET tokens = 10000000000000", "unreadable budget tokens 10000000000000"),
        ("UPDATE principal_budgets SET cost = 'x'", "unreadable budget cost 'x'"),
        ("UPDATE principal_budgets SET cost = 1e300", "unreadable budget cost 1e+300"),
        ("UPDATE principal_budgets SET tokens = NULL, cost = NULL", "a budget without tokens or cost"),
        ("UPDATE principal_budgets SET alerts = '[2]'", "unreadable budget alerts '[2]'"),
        ("UPDATE principal_budgets SET alerts = 'x'", "unreadable budget alerts 'x'"),
    ],
)
def test_principal_with_unreadable_budget_is_left_out(
    priced: Store, settings: Settings, caplog: pytest.LogCaptureFixture, sql: str, why: str
) -> None:
    ids = {p.name: p.id for p in priced.principals()}  # before the damage: principals() reads budgets too
    with _raw(settings) as conn:
        alice = "(SELECT id FROM principals WHERE name = 'alice')"
        conn.execute(f"{sql} WHERE principal_id = {alice} AND period = 'month'")  # her first of two
    with caplog.at_level(logging.WARNING, logger="gateway.snapshot"):
        snap = _snapshot(priced)
    # Fail closed, as for unreadable limits: alice, her role and her key are skipped (her model limits
    # were taken before her budget was read, so they are dropped with her without being counted).
    assert snap.skipped == 3
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.snapshot"]
    assert messages[0] == f"snapshot build: skipping principal {ids['alice']!r}: {why}"
    assert len(messages) == 3
    assert "alice" not in {p.name for p in snap.principals.values()}
    assert _digest(ALICE_SECRET) not in snap.keys
    assert len(snap.principals) == 5
    # Bob's budget is unaffected.
    assert snap.principals[ids["bob"]].budgets == (Budget(ids["bob"], "6h", 5000, None),)


def test_key_with_unreadable_budget_is_left_out(
    priced: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with _raw(settings) as conn:
        conn.execute("UPDATE key_budgets SET tokens = 'lots'")
    with caplog.at_level(logging.WARNING, logger="gateway.snapshot"):
        snap = _snapshot(priced)
    assert snap.skipped == 1  # fail closed: the key is refused rather than unlimited
    assert _digest(ALICE_SECRET) not in snap.keys
    assert any("unreadable budget tokens 'lots'" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("sql", "unpriced"),
    [
        ("UPDATE models SET price_input = 'x' WHERE name = 'chat'", {"chat", "gpt-4o-mini", "default"}),
        ("UPDATE models SET price_output = NULL WHERE name = 'chat'", {"chat", "gpt-4o-mini", "default"}),
        ("UPDATE models SET price_output = -1 WHERE name = 'chat'", {"chat", "gpt-4o-mini", "default"}),
        ("UPDATE models SET price_output = 1e7 WHERE name = 'chat'", {"chat", "gpt-4o-mini", "default"}),
        (
            "UPDATE models SET price_cached_input = 'y' WHERE name = 'chat'",
            {"chat", "gpt-4o-mini", "default"},
        ),
        ("UPDATE provider_models SET price_cached_input = -0.5 WHERE name = 'llama-8b'", {"llama-8b"}),
    ],
)
def test_unreadable_price_is_skipped_and_the_route_kept(
    priced: Store, settings: Settings, caplog: pytest.LogCaptureFixture, sql: str, unpriced: set[str]
) -> None:
    good = _snapshot(priced)
    with _raw(settings) as conn:
        conn.execute(sql)
    with caplog.at_level(logging.WARNING, logger="gateway.snapshot"):
        snap = _snapshot(priced)
    assert snap.skipped == 1
    (record,) = [r for r in caplog.records if r.name == "gateway.snapshot"]
    (name,) = {"chat", "llama-8b"} & unpriced
    assert record.getMessage().startswith(
        f"snapshot build: skipping price of model {name!r}: unreadable price"
    )
    # Every route is still there with its targets; only the unreadable price is gone.
    assert set(snap.routes) == set(good.routes)
    assert all(snap.routes[n].targets == good.routes[n].targets for n in good.routes)
    assert {n for n, r in snap.routes.items() if r.price is None} == unpriced | {"qwen", "small"}
    assert all(snap.routes[n].price == good.routes[n].price for n in set(good.routes) - unpriced)
    # The principals are untouched.
    assert {p.name for p in snap.principals.values()} == {p.name for p in good.principals.values()}


PATTERN_DOC = parse_config(
    {
        "backends": [{"name": "a", "url": "http://127.0.0.1:8001/"}],
        "provider_models": [{"name": "big", "backends": ["a"]}, {"name": "fast", "backends": ["a"]}],
        "models": [
            {
                "name": "chat",
                "chain": ["big"],
                "aliases": ["claude-*", "gpt-4o"],
                "price": {"input": 1, "output": 2},
            },
            {"name": "small", "chain": ["fast"], "aliases": ["claude-*-haiku-*", "claude-haiku-*"]},
        ],
        "roles": [
            {"name": "user", "permissions": ["model/chat"]},
            {"name": "small", "permissions": ["model/small"]},
        ],
        "principals": [{"name": "alice", "roles": ["user"]}, {"name": "bob", "roles": ["small"]}],
    },
    "test",
)


def test_pattern_aliases_map_the_names_a_client_picks(settings: Settings) -> None:
    """One entry (``claude-*``) for every name Claude Code asks for; exact names win, then the most
    specific pattern; a matched name is authorised, priced and routed as its alias."""
    with open_store(settings) as s:
        s.apply_config(PATTERN_DOC, hash_key=HASH_KEY, environ={}, actor="test")
        doc = build_snapshot_doc(s)
    assert list(doc["alias_patterns"]) == ["claude-*-haiku-*", "claude-haiku-*", "claude-*"]
    assert not any("*" in name for name in doc["routes"])
    snap = Snapshot.decode(orjson.dumps(doc), generation=1)
    opus = snap.route("claude-opus-4-5")
    assert opus is not None and (opus.name, opus.canonical) == ("claude-*", "chat")
    assert opus.price == snap.routes["chat"].price and opus.targets == snap.routes["chat"].targets
    for name in ("claude-3-5-haiku-20241022", "claude-haiku-4-5"):
        route = snap.route(name)
        assert route is not None and route.canonical == "small", name
    assert snap.route("gpt-4o") is snap.routes["gpt-4o"]  # exact names never go through patterns
    assert snap.route("gpt-4o-mini") is None and snap.route("Claude-opus") is None  # case-sensitive
    assert snap.route("claude-opus-4-5") is opus  # remembered
    (alice,) = [p for p in snap.principals.values() if p.name == "alice"]
    (bob,) = [p for p in snap.principals.values() if p.name == "bob"]
    assert alice.may_use("claude-*") and not alice.may_use("claude-haiku-*")
    assert bob.may_use("claude-haiku-*") and not bob.may_use("claude-*")
    assert "claude-opus-4-5" not in alice.models  # the listing (/v1/models) names no pattern


def test_a_credential_pool_is_folded_into_its_backend_and_exported_back(settings: Settings) -> None:
    cfg = parse_config(
        {
            "backends": [
                {
                    "name": "openai",
                    "url": "https://api.example",
                    "credentials": [
                        {"name": "k1", "api_key_env": "K1", "requests_per_minute": 500, "cool_down": 10},
                        {"name": "k2", "api_key": "sk-literal-k2"},
                    ],
                },
            ],
            "provider_models": [{"name": "gpt", "backends": ["openai"], "context_window": 128000}],
            "models": [{"name": "chat", "chain": ["gpt"], "context_failover": True}],
            "keys": [],
        },
        "test",
    )
    assert [b.name for b in cfg.backends] == ["openai", "openai/k1", "openai/k2"]
    with open_store(settings) as store:
        store.apply_config(cfg, hash_key=HASH_KEY, environ={"K1": "sk-from-env-k1"}, actor="test")
        doc = build_snapshot_doc(store)
        assert list(doc["backends"]) == ["openai"]
        assert doc["backends"]["openai"]["credentials"] == [
            {"name": "k1", "api_key": "sk-from-env-k1", "rpm": 500, "cool_down": 10.0},
            {"name": "k2", "api_key": "sk-literal-k2"},
        ]
        assert doc["context_windows"] == {"gpt": 128000}
        assert doc["routes"]["chat"]["context_failover"] is True
        snap = Snapshot.from_doc(doc, 1)
        k1, k2 = snap.backends["openai"].credentials
        assert (k1.name, k1.rpm, k1.tpm, k1.cool_down, k1.scope) == ("k1", 500, None, 10.0, "c:openai/k1")
        assert "sk-" not in repr(k2)
        assert snap.routes["chat"].targets[0].context_window == 128000
        # What `gateway export` writes reads back to the same document (the env variable by name; a
        # literal key never leaves the store).
        exported = parse_config(tomllib.loads(dump_config(store.config_doc())), "export")
        assert exported == replace(cfg, backends=tuple(replace(b, api_key=None) for b in cfg.backends))


def test_a_pool_whose_credentials_are_all_gone_is_skipped(settings: Settings) -> None:
    cfg = parse_config(
        {
            "backends": [{"name": "p", "url": "http://h", "credentials": [{"name": "k", "api_key": "x"}]}],
            "provider_models": [{"name": "m", "backends": ["p"]}],
        },
        "test",
    )
    with open_store(settings) as store:
        store.apply_config(cfg, hash_key=HASH_KEY, actor="test")
        rows = [r for r in store.read_state().routing if r[0] == "backend"]
        assert rows == [("backend", "p/k", '{"credential_of":"p"}')]
        state = replace(store.read_state(), backends=[b for b in store.read_state().backends if b[0] == "p"])
        doc = build_doc(state)
        assert "p" not in doc["backends"] and doc["skipped"] >= 1


def test_flow_control_fields_travel_from_the_file_to_the_data_plane(settings: Settings) -> None:
    cfg = parse_config(
        {
            "backends": [
                {
                    "name": "a",
                    "url": "http://127.0.0.1:8001",
                    "max_concurrency": 2,
                    "kv_high_water": 0.9,
                    "reserved_places": 1,
                }
            ],
            "provider_models": [{"name": "pm", "backends": ["a"]}],
            "models": [
                {"name": "chat", "chain": ["pm"], "aliases": ["bulk-*"], "priority": "sheddable"},
                {"name": "plain", "chain": ["pm"]},
            ],
            "roles": [{"name": "user", "permissions": ["model/*"]}],
            "principals": [
                {"name": "alice", "roles": ["user"], "priority": "critical", "weight": 3},
                {"name": "bob", "roles": ["user"]},
            ],
            "keys": [
                {
                    "name": "alice-batch",
                    "principal": "alice",
                    "secret": "sk-gw-alice-batch-0001",
                    "priority": "sheddable",
                },
                {"name": "alice-dev", "principal": "alice", "secret": "sk-gw-alice-dev-00001"},
                {"name": "bob-dev", "principal": "bob", "secret": "sk-gw-bob-dev-0000001"},
            ],
        },
        "test",
    )
    with open_store(settings) as store:
        store.apply_config(cfg, hash_key=HASH_KEY, environ={}, actor="test")
        doc = build_snapshot_doc(store)
        snap = Snapshot.from_doc(doc, 1)
        # `gateway export` writes them back.
        exported = parse_config(tomllib.loads(dump_config(store.config_doc())), "export")
    assert exported.principals == cfg.principals and exported.keys[0].priority == "sheddable"
    assert exported.models == cfg.models and exported.backends[0].kv_high_water == 0.9
    assert exported.backends[0].reserved_places == 1
    assert snap.backends["a"].kv_high_water == 0.9 and snap.backends["a"].reserved_places == 1
    chat, plain = snap.routes["chat"], snap.routes["plain"]
    assert snap.route("bulk-x") is not None and snap.route("bulk-x").priority == 2  # type: ignore[union-attr]
    alice_batch = snap.keys[hash_secret("sk-gw-alice-batch-0001", HASH_KEY)]
    alice_dev = snap.keys[hash_secret("sk-gw-alice-dev-00001", HASH_KEY)]
    bob_dev = snap.keys[hash_secret("sk-gw-bob-dev-0000001", HASH_KEY)]
    assert (alice_dev.principal.weight, bob_dev.principal.weight) == (3, 1)
    # The most specific wins: the key's, then the principal's, then the model's; none: standard.
    assert alice_batch.flow_class(plain) == 2  # the key says sheddable over its principal's critical
    assert alice_dev.flow_class(chat) == 0  # the principal's critical over the model's sheddable
    assert bob_dev.flow_class(chat) == 2  # the model's
    assert bob_dev.flow_class(plain) == 1  # standard


@pytest.mark.parametrize(
    ("section", "fields", "expected"),
    [
        (
            "principals",
            {"priority": "urgent"},
            'principals[0].priority: must be one of "critical", "standard"',
        ),
        ("principals", {"weight": 0}, "principals[0].weight: must be a whole number from 1 to 1000"),
        ("principals", {"weight": 1.5}, "principals[0].weight: must be a whole number"),
        ("keys", {"priority": 1}, "keys[0].priority: must be one of"),
        ("models", {"priority": "high"}, "models[0].priority: must be one of"),
        ("backends", {"kv_high_water": 1.5}, "backends[0].kv_high_water: must be a fraction"),
        ("backends", {"reserved_places": -1}, "backends[0].reserved_places: must be a whole number"),
        ("backends", {"reserved_places": 1}, "backends[0].reserved_places: must be fewer than the backend's"),
        (
            "backends",
            {"max_concurrency": 2, "reserved_places": 2},
            "backends[0].reserved_places: must be fewer than the backend's max_concurrency",
        ),
    ],
)
def test_flow_control_fields_are_checked(section: str, fields: dict[str, object], expected: str) -> None:
    raw: dict[str, list[dict[str, object]]] = {
        "backends": [{"name": "a", "url": "http://127.0.0.1:8001"}],
        "provider_models": [{"name": "pm", "backends": ["a"]}],
        "models": [{"name": "chat", "chain": ["pm"]}],
        "roles": [{"name": "user", "permissions": ["model/*"]}],
        "principals": [{"name": "alice", "roles": ["user"]}],
        "keys": [{"name": "k", "principal": "alice"}],
    }
    raw[section][0].update(fields)
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "test")
    assert expected in str(err.value)
