"""Route traces end to end: a request that fails over, one that every target refuses, and one still in
flight, seen through ``GET /admin/requests``, ``GET /admin/requests/ID`` and ``gateway requests show``
by the x-request-id the client got."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, refusing_socket, wait_until

RULES = """
[[models.rules]]
name = "big"
when = { headers = { x-size = "big" } }
route = ["pm-dead", "pm-first", "pm-second"]

[[roles]]
name = "accountant"
permissions = ["usage:read"]

[[principals]]
name = "finance"
roles = ["accountant"]
"""


@dataclass
class Env:
    gw: Gateway
    admin: str
    first: MockEngine
    second: MockEngine
    key: str
    admin_key: str

    def chat(self, **headers: str) -> httpx.Response:
        return httpx.post(
            self.gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.key}", **headers},
            json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2},
            timeout=30,
        )

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.admin + path, headers={"authorization": f"Bearer {self.admin_key}"}, timeout=10)

    def request(self, request_id: str) -> dict[str, Any]:
        """The finished request, once the control worker has it."""
        got: dict[str, Any] = {}

        def found() -> bool:
            r = self.get(f"/admin/requests/{request_id}")
            if r.status_code == 200:
                got.update(r.json())
            return r.status_code == 200

        wait_until(found, timeout=20, what=f"request {request_id} recorded")
        return got


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("trace")
    first, second = MockEngine(tmp), MockEngine(tmp)
    hold = refusing_socket()
    dead = f"http://127.0.0.1:{hold.getsockname()[1]}"
    config = basic_config(
        {"dead": dead, "first": first.url, "second": second.url}, chain=["pm-second"], extra=RULES
    )
    port = free_port()
    extra = ("--admin-port", str(port), "--backend-cool-down", "0", "--engine-scrape-interval", "0")
    gw = Gateway(tmp, config, workers=2, extra=extra)
    try:
        key, admin_key = gw.create_key("alice"), gw.create_key("finance")
        gw.wait_key_live(key)
        e = Env(gw, f"http://127.0.0.1:{port}", first, second, key, admin_key)
        wait_until(lambda: e.get("/admin/requests").status_code == 200, what="admin key live")
        yield e
    finally:
        gw.stop()
        first.stop()
        second.stop()
        hold.close()


@pytest.fixture(autouse=True)
def _reset(env: Env) -> None:
    env.first.reset()
    env.second.reset()


def test_a_failover_shows_every_attempt_and_the_rule(env: Env) -> None:
    env.first.configure(fail_status=503)
    r = env.chat(**{"x-size": "big"})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    doc = env.request(rid)
    assert doc["id"] == rid == doc["request_id"] and doc["rule"] == "big" and doc["tries"] == 3
    assert doc["backend"] == "second" and doc["status"] == 200
    attempts = doc["attempts"]
    assert [(a["backend"], a["status"], a["error"]) for a in attempts] == [
        ("dead", None, "connect"),
        ("first", 503, None),
        ("second", 200, None),
    ]
    assert [a["next_because"] for a in attempts] == ["no connection", "HTTP 503", None]
    assert attempts[0]["ttfb_ms"] is None and attempts[0]["duration_ms"] >= 0
    for a in attempts[1:]:
        assert 0 < a["ttfb_ms"] <= a["duration_ms"] < doc["latency_ms"] + 1
    assert all(a["provider_model"] == f"pm-{a['backend']}" for a in attempts)

    recent = env.get("/admin/requests?failover=1").json()["recent"]
    assert rid in [x["id"] for x in recent] and all(x["tries"] > 1 for x in recent)

    # The CLI reads the store: the same trace, as JSON and as a table.
    wait_until(lambda: env.gw.cli("requests", "show", rid, check=False).returncode == 0, what="stored")
    shown = orjson.loads(env.gw.cli("requests", "show", rid, "--json").stdout)
    assert shown["attempts"] == attempts and shown["rule"] == "big" and shown["principal"] == "alice"
    text = env.gw.cli("requests", "show", rid).stdout
    assert "rule big" in text and "no connection" in text and "HTTP 503" in text
    missing = env.gw.cli("requests", "show", "no-such-request", check=False)
    assert missing.returncode == 2 and "no finished request" in missing.stderr


def test_the_client_s_own_request_id_finds_it(env: Env) -> None:
    r = env.chat(**{"x-request-id": "client-trace-41"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "client-trace-41"
    doc = env.request("client-trace-41")
    assert doc["request_id"] == r.headers["x-gateway-request-id"] and doc["rule"] is None
    assert [(a["backend"], a["status"]) for a in doc["attempts"]] == [("second", 200)]


@pytest.mark.parametrize(
    "client_id",
    ["a/b", "/lead", "trail/", "a//b", "q?x=1&y", "h#f", "p%2Fc", "%", "..", ".", "~!$&'()*+,;=:@[]\\^`{|}"],
)
def test_every_id_the_proxy_accepts_is_found(env: Env, client_id: str) -> None:
    # The proxy takes any printable ASCII id (accounting._CLIENT_ID); the admin API finds each by its
    # percent-encoded path segment. "a/b" was a 404 before: the id was one segment, and "%2F" reaches the
    # admin port decoded, as "/".
    r = env.chat(**{"x-request-id": client_id})
    assert r.status_code == 200 and r.headers["x-request-id"] == client_id
    # Dots encoded too: an id "." or ".." would otherwise be a dot-segment, resolved away by the client.
    doc = env.request(quote(client_id, safe="").replace(".", "%2E"))
    assert doc["id"] == client_id and doc["request_id"] == r.headers["x-gateway-request-id"]


def test_when_every_target_fails_the_refusal_has_a_trace_and_an_id(env: Env) -> None:
    env.first.configure(fail_status=500)
    env.second.configure(fail_status=502)
    r = env.chat(**{"x-size": "big"})
    assert r.status_code == 502  # the last answer, verbatim
    doc = env.request(r.headers["x-request-id"])
    assert doc["status"] == 502 and doc["tries"] == 3
    assert [a["status"] or a["error"] for a in doc["attempts"]] == ["connect", 500, 502]

    env.first.configure(fail_status=None)
    env.second.configure(fail_status=None)
    bad = env.get("/admin/requests/definitely-not-a-request")
    assert bad.status_code == 404 and "no finished request" in bad.json()["error"]["message"]
    assert env.get("/admin/requests?limit=0").status_code == 400


def test_a_request_in_flight_is_listed_live_then_recent(env: Env) -> None:
    env.second.configure(delay=2.0)
    done: list[httpx.Response] = []
    t = threading.Thread(target=lambda: done.append(env.chat(**{"x-request-id": "slow-one"})))
    t.start()
    try:
        live: list[dict[str, Any]] = []

        def listed() -> bool:
            live[:] = [x for x in env.get("/admin/requests").json()["live"] if x["id"] == "slow-one"]
            return bool(live)

        wait_until(listed, timeout=5, interval=0.1, what="slow request listed live")
        assert (
            live[0]["model"] == "chat" and live[0]["backend"] == "second" and live[0]["principal"] == "alice"
        )
        assert live[0]["running_s"] >= 0
    finally:
        t.join(30)
        env.second.configure(delay=0.0)
    assert done and done[0].status_code == 200
    assert env.request("slow-one")["attempts"][0]["ttfb_ms"] >= 2000
