"""Opt-in body logs end to end, against real processes: a gateway logging one principal's bodies and not
another's, redaction proven on the store itself (its rows and its files), a stream rebuilt, the size
cap, sampling 0, the bodies:read permission, a full ring dropping and counting, and retention."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.body_record import BodyRecord
from gateway.config import Settings
from gateway.controlplane.bodies.redaction import Redactor
from gateway.controlplane.bodies.stored import stored_bodies
from gateway.controlplane.store import open_store
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until
from tests.integration.test_cluster import OPS, Cluster

EMAIL, CARD, NOTE, TICKET = (
    "maria.lopez@example.org",
    "4111 1111 1111 1111",
    "pin 8841 for the vault",
    "TICKET-42",
)
CONFIG = """
[[body_logs]]
name = "alice-debug"
principals = ["alice"]
max_bytes = 3000
redact_paths = ["metadata.note"]
redact_patterns = ["email", "card", { name = "ticket", regex = "TICKET-[0-9]+" }]
retention_days = 2

[[body_logs]]
name = "root-never"
principals = ["root"]
sample = 0

[[roles]]
name = "auditor"
permissions = ["usage:read", "bodies:read", "config:read"]

[[roles]]
name = "viewer"
permissions = ["usage:read"]

[[principals]]
name = "ops"
roles = ["auditor"]

[[principals]]
name = "watcher"
roles = ["viewer"]
"""


@dataclass
class Env:
    gw: Gateway
    engine: MockEngine
    admin: str
    keys: dict[str, str]

    def chat(self, who: str, content: str, **extra: Any) -> httpx.Response:
        body = {"model": "chat" if who != "bob" else "pm-m", "max_tokens": 5, **extra}
        body["messages"] = [{"role": "user", "content": content}]
        return httpx.post(
            self.gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.keys[who]}"},
            json=body,
            timeout=30,
        )

    def request(self, rid: str, who: str = "ops") -> dict[str, Any]:
        """The finished request as ``who`` sees it, once its usage record and (for ops) bodies are in."""
        got: dict[str, Any] = {}

        def found() -> bool:
            r = httpx.get(
                f"{self.admin}/admin/requests/{rid}",
                headers={"authorization": f"Bearer {self.keys[who]}"},
                timeout=10,
            )
            if r.status_code != 200:
                return False
            got.clear()
            got.update(r.json())
            return who != "ops" or got.get("bodies") is not None

        wait_until(found, timeout=20, what=f"request {rid} recorded")
        return got

    def bodies_of(self, rid: str) -> Any:
        """``bodies`` of a recorded request as ops (bodies:read) sees it: null when none were logged."""
        self.request(rid, "watcher")  # its usage record is in
        time.sleep(0.5)  # the drain runs every 0.1 s: bodies logged with it would be stored by now
        answer = httpx.get(
            f"{self.admin}/admin/requests/{rid}",
            headers={"authorization": f"Bearer {self.keys['ops']}"},
            timeout=10,
        ).json()
        assert "bodies" in answer  # ops holds bodies:read: the member is there, null when none was logged
        return answer["bodies"]

    def store_rows(self) -> list[dict[str, Any]]:
        """Every row of request_bodies, read from the SQLite file directly."""
        conn = sqlite3.connect(self.gw.data_dir / "gateway.sqlite3")
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM request_bodies")]
        finally:
            conn.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("bodies")
    engine = MockEngine(tmp)
    port = free_port()
    extra = ("--admin-port", str(port), "--engine-scrape-interval", "0", "--body-ring-slots", "16")
    gw = Gateway(tmp, basic_config({"m": engine.url}, extra=CONFIG), workers=1, extra=extra)
    try:
        keys = {who: gw.create_key(who) for who in ("alice", "bob", "root", "ops", "watcher")}
        gw.wait_key_live(keys["alice"])
        yield Env(gw, engine, f"http://127.0.0.1:{port}", keys)
    finally:
        gw.stop()
        engine.stop()


@pytest.fixture(autouse=True)
def _reset(env: Env) -> None:
    env.engine.reset()


def test_bodies_are_logged_for_one_principal_redacted_and_nothing_unredacted_is_stored(env: Env) -> None:
    answer_text = f"I wrote to {EMAIL} about {TICKET}"
    env.engine.configure(
        raw_response=orjson.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "mock-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer_text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17},
            }
        ).decode()
    )  # fmt: skip
    r = env.chat("alice", f"mail {EMAIL}, card {CARD}", metadata={"note": NOTE})
    assert r.status_code == 200 and EMAIL in r.text  # the client gets its answer untouched
    doc = env.request(r.headers["x-request-id"])
    bodies = doc["bodies"]
    assert bodies["rule"] == "alice-debug" and bodies["redactions"] == 5
    request = bodies["request"]
    assert request["kind"] == "json" and not request["truncated"]
    assert request["body"]["messages"][0]["content"] == "mail [REDACTED:email], card [REDACTED:card]"
    assert request["body"]["metadata"] == {"note": "[REDACTED]"}
    content = bodies["response"]["body"]["choices"][0]["message"]["content"]
    assert content == "I wrote to [REDACTED:email] about [REDACTED:ticket]"

    # bob has no entry: his request is recorded, its bodies are not.
    r = env.chat("bob", f"bob's mail {EMAIL}")
    assert r.status_code == 200
    assert env.bodies_of(r.headers["x-request-id"]) is None

    # The store itself: no row, and no byte of its files, holds what was redacted.
    rows = env.store_rows()
    assert rows and all(row["principal_id"] != "" for row in rows)
    for row in rows:
        text = " ".join(str(v) for v in row.values())
        assert EMAIL not in text and "4111" not in text and NOTE not in text and TICKET not in text
    for path in env.gw.data_dir.glob("gateway.sqlite3*"):
        data = path.read_bytes()
        assert EMAIL.encode() not in data and NOTE.encode() not in data and TICKET.encode() not in data


def test_bodies_need_their_own_permission(env: Env) -> None:
    r = env.chat("alice", "hello")
    rid = r.headers["x-request-id"]
    assert env.request(rid)["bodies"]["request"]["body"]["messages"][0]["content"] == "hello"
    seen = env.request(rid, "watcher")  # usage:read without bodies:read
    assert "bodies" not in seen and seen["request_id"] == rid and seen["attempts"]


def test_a_stream_is_stored_rebuilt(env: Env) -> None:
    env.engine.configure(tokens=6)
    r = env.chat("alice", "count", stream=True)
    assert r.status_code == 200 and r.text.count("data: ") > 6
    response = env.request(r.headers["x-request-id"])["bodies"]["response"]
    assert response["kind"] == "json" and response["stream_events"] > 6
    message = response["body"]["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "tok tok tok tok tok"}  # max_tokens 5
    assert (
        response["body"]["object"] == "chat.completion"
        and response["body"]["usage"]["completion_tokens"] == 5
    )

    # An Anthropic client's stream (translated from the OpenAI backend) is rebuilt as a message.
    m = httpx.post(
        env.gw.url + "/v1/messages",
        headers={"x-api-key": env.keys["alice"]},
        json={
            "model": "chat",
            "max_tokens": 3,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        timeout=30,
    )
    assert m.status_code == 200
    message_doc = env.request(m.headers["x-request-id"])["bodies"]["response"]["body"]
    assert message_doc["type"] == "message" and message_doc["content"] == [
        {"type": "text", "text": "tok tok tok"}
    ]
    assert message_doc["stop_reason"] == "max_tokens"

    shown = env.gw.cli("requests", "show", r.headers["x-request-id"], "--bodies").stdout
    assert "rebuilt from" in shown and '"content": "tok tok tok tok tok"' in shown
    as_json = orjson.loads(
        env.gw.cli("requests", "show", r.headers["x-request-id"], "--bodies", "--json").stdout
    )
    assert as_json["bodies"]["response"]["body"]["choices"][0]["message"]["content"] == "tok tok tok tok tok"


def test_the_size_cap_truncates_and_says_so(env: Env) -> None:
    long = "word " * 1000 + f"and at the end {EMAIL}"
    r = env.chat("alice", long)
    request = env.request(r.headers["x-request-id"])["bodies"]["request"]
    assert request["truncated"] and request["size"] > 5000
    assert request["kind"] == "json"  # closed where it was cut, then redacted
    kept = request["body"]["messages"][0]["content"]
    assert kept.startswith("word word") and len(kept) < 3000 and EMAIL not in kept
    assert "truncated at the entry's max_bytes" in env.gw.cli("requests", "show", r.headers["x-request-id"],
                                                              "--bodies").stdout  # fmt: skip


def test_sampling_0_logs_nothing(env: Env) -> None:
    ids = []
    for _ in range(5):
        r = env.chat("root", "root's question")
        assert r.status_code == 200
        ids.append(r.headers["x-request-id"])
    assert all(env.bodies_of(rid) is None for rid in ids)
    assert not [row for row in env.store_rows() if row["request_id"] in ids]


def test_a_full_ring_drops_and_counts(env: Env) -> None:
    def dropped_metric() -> int:
        text = httpx.get(env.admin + "/metrics", timeout=10).text
        line = next(
            ln
            for ln in text.splitlines()
            if ln.startswith('gateway_body_logs_dropped_total{reason="ring_full"}')
        )
        return int(line.split()[-1])

    before = dropped_metric()
    (control,) = env.gw.worker_pids("control")
    big = "x" * 2500  # one or two 4 KiB slots a request, of the ring's 16
    os.kill(control, signal.SIGSTOP)  # nobody drains: the ring fills
    ids = set()
    try:
        for _ in range(20):
            r = env.chat("alice", big)
            assert r.status_code == 200  # requests never wait for the ring
            ids.add(r.headers["x-request-id"])
        health = httpx.get(env.gw.url + "/healthz", timeout=5).json()
        assert health["status"] == "ok" and health["body_logs_dropped"] >= before + 4
    finally:
        os.kill(control, signal.SIGCONT)
    wait_until(lambda: dropped_metric() >= before + 4, what="drops in /metrics")
    fleet = httpx.get(
        env.admin + "/admin/fleet", headers={"authorization": f"Bearer {env.keys['ops']}"}
    ).json()
    assert fleet["hosts"][0]["body_logs"]["dropped"] == dropped_metric()
    # What did fit (every request's bodies but those dropped) is stored once the control worker is back;
    # only then has the ring room again, and it takes bodies again.
    fitted = len(ids) - (dropped_metric() - before)
    wait_until(
        lambda: len([row for row in env.store_rows() if row["request_id"] in ids]) == fitted,
        what="the bodies that fitted stored",
    )
    r = env.chat("alice", "after the outage")
    assert env.request(r.headers["x-request-id"])["bodies"]["request"]["body"]["messages"][0]["content"] == (
        "after the outage"
    )


def logged_long_ago(request_id: str, days: float) -> BodyRecord:
    return BodyRecord(
        request_id, time.time() - days * 86400, "p", "k", "chat", 200, "alice-debug", "x", "openai",
        "/v1/chat/completions", False, 2, 2, "backend", b"{}", b"{}",
    )  # fmt: skip


def test_retention_purges_old_bodies(env: Env, tmp_path: Path) -> None:
    settings = Settings(data_dir=env.gw.data_dir)
    record = logged_long_ago("old-body", 10)
    with open_store(settings) as store:
        store.bodies.insert([stored_bodies(record, Redactor(), 2)])  # expired 8 days ago
        assert store.bodies.get("old-body") is not None
    pruned = env.gw.cli("requests", "prune")
    assert pruned.stdout.strip() == "1"
    with open_store(settings) as store:
        assert store.bodies.get("old-body") is None
        live = store.bodies.count()
        assert live > 0  # the bodies logged above are within their two days
        assert store.audit_log(1)[0].action == "bodies.purge"
    assert env.gw.cli("requests", "prune", "--older-than", "0").stdout.strip() == str(live)
    with open_store(settings) as store:
        assert store.bodies.count() == 0
    refused = env.gw.cli("requests", "prune", "--older-than", "-1", check=False)
    assert refused.returncode == 2 and "--older-than" in refused.stderr


def test_the_control_worker_purges_expired_bodies_at_start(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"m": mock_engine.url}, extra=CONFIG), workers=1)
    settings = Settings(data_dir=gw.data_dir)
    try:
        assert gw.stop() == 0
        expired = logged_long_ago("expired", 3)
        with open_store(settings) as store:
            store.bodies.insert([stored_bodies(expired, Redactor(), 2)])
        gw = Gateway(tmp_path, basic_config({"m": mock_engine.url}, extra=CONFIG), workers=1, port=gw.port)
        with open_store(settings) as store:
            wait_until(lambda: store.bodies.get("expired") is None, what="expired bodies purged")
            assert any(
                e.action == "bodies.purge" and e.actor.startswith("gateway") for e in store.audit_log(5)
            )
    finally:
        gw.stop()


def test_a_proxy_host_redacts_and_sends_bodies_to_its_control_plane(
    tmp_path: Path, postgres_url: str, mock_engine: MockEngine
) -> None:
    """On PostgreSQL, through the cluster API: the proxy-role host redacts before anything leaves it."""
    config = basic_config({"a": mock_engine.url}, extra=OPS + CONFIG.replace('"ops"', '"auditors"'))
    cluster = Cluster(tmp_path, postgres_url, free_port(), config, None, [])  # type: ignore[arg-type]
    cluster.control = cluster.start_control()
    try:
        proxy = cluster.start_proxy()
        cluster.proxies = [proxy]
        key = cluster.cli("keys", "create", "--principal", "alice")
        proxy.wait_key_live(key)  # in both workers: the next request may land on either
        r = httpx.post(
            proxy.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": f"to {EMAIL}"}],
                  "metadata": {"note": NOTE}},
            timeout=10,
        )  # fmt: skip
        assert r.status_code == 200
        settings = Settings(data_dir=tmp_path, database=postgres_url)
        with open_store(settings) as store:
            wait_until(lambda: store.usage.find(r.headers["x-request-id"]), timeout=15, what="usage recorded")
            found = store.usage.find(r.headers["x-request-id"])
            wait_until(lambda: store.bodies.get(found[0].request_id) is not None, timeout=15, what="bodies")
            stored = store.bodies.get(found[0].request_id)
        assert stored is not None and stored.rule == "alice-debug" and stored.redactions == 2
        body = orjson.loads(stored.request_body or "")
        assert (
            body["messages"][0]["content"] == "to [REDACTED:email]"
            and body["metadata"]["note"] == "[REDACTED]"
        )
    finally:
        for gw in [*cluster.proxies, cluster.control]:
            gw.stop()
