"""The snapshot builder: content checked through ``Snapshot.from_doc``, bad rows skipped and counted."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.configfile import KeySpec, PrincipalSpec, parse_config
from gateway.controlplane.snapshot_build import MAX_LOGGED, build_snapshot_doc
from gateway.controlplane.store import Store, open_store
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
            {"name": "alice", "roles": ["user"]},
            {"name": "bob", "roles": ["llama"]},
            {"name": "carol", "roles": ["gpt"]},
            {"name": "ops", "roles": ["admin"]},
            {"name": "dave", "roles": ["nothing"]},
            {"name": "erin", "roles": []},
        ],
        "keys": [{"name": "alice-dev", "principal": "alice", "secret": ALICE_SECRET}],
    },
    "test",
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    with open_store(settings) as s:
        s.apply_config(DOC, hash_key=HASH_KEY, environ={"B_KEY": "kb"})
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
    live_id, live = store.create_key("bob", None, time.time() + 3600, HASH_KEY)
    revoked_id, revoked = store.create_key("bob", "gone", None, HASH_KEY)
    store.revoke_key(revoked_id)
    _, expired = store.create_key("bob", "old", time.time() - 1, HASH_KEY)
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


def _raw(settings: Settings) -> sqlite3.Connection:
    conn = sqlite3.connect(settings.sqlite_path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")  # to plant rows the store itself would refuse
    return conn


BAD_ROWS: list[tuple[str, str, int]] = [
    (
        "key whose principal is gone",
        "INSERT INTO api_keys VALUES ('k1', NULL, 'ghost', '" + "ab" * 32 + "', 0, NULL, NULL, 'cli')",
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
        conn.executemany("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
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
        replace(DOC, principals=principals, keys=keys), hash_key=HASH_KEY, environ={"B_KEY": "x"}
    )
    snap = _snapshot(store)
    assert len(snap.keys) == 10_000
    assert snap.skipped == 0
    for i in range(10_000):
        entry = snap.keys[_digest(f"sk-gw-bulk-secret-{i:08d}")]
        assert entry.principal.name == f"p{i % 100}"
    assert all(p.models == frozenset({"chat", "gpt-4o-mini", "default"}) for p in snap.principals.values())
