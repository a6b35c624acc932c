"""Credential pools through a running gateway: a backend holding several API keys of one provider. A key
the provider refuses (401/403) is disabled and reported, a key it rate-limits (429) cools down for its
Retry-After, the next key is tried, each key keeps its own quota, one attempt budget covers keys and
failover targets together, the usage record names the key (never the secret), and the fleet view shows
each key's state. Two mock engines: one standing for the provider (it answers per key), one a spare."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from tests.fixtures.processes import Gateway, MockEngine, free_port, wait_until

SECRETS = {"a": "sk-provider-key-a-000001", "b": "sk-provider-key-b-000002", "c": "sk-provider-key-c-000003"}
CLIENT = "sk-test-credentials-00001"


def config(provider: str, spare: str) -> str:
    creds = "".join(
        f'\n[[backends.credentials]]\nname = "key-{n}"\napi_key_env = "PROVIDER_KEY_{n.upper()}"\n'
        + ("requests_per_minute = 2\n" if n == "c" else "")
        for n in SECRETS
    )
    return f"""
[[backends]]
name = "provider"
url = "{provider}"
connect_timeout = 1.0
{creds}
[[backends]]
name = "spare"
url = "{spare}"
connect_timeout = 1.0

[[provider_models]]
name = "pm-provider"
backends = [{{ backend = "provider", model = "m" }}]

[[provider_models]]
name = "pm-spare"
backends = [{{ backend = "spare", model = "m" }}]

[[models]]
name = "chat"
chain = ["pm-provider", "pm-spare"]

[[models]]
name = "only-provider"
chain = ["pm-provider"]

[[roles]]
name = "user"
permissions = ["model/*", "config:read", "usage:read"]

[[principals]]
name = "alice"
roles = ["user"]

[[keys]]
name = "alice"
principal = "alice"
secret = "{CLIENT}"
"""


class Env:
    def __init__(self, tmp: Path) -> None:
        self.provider, self.spare = MockEngine(tmp), MockEngine(tmp)
        self.admin_port = free_port()
        self.gw = Gateway(
            tmp,
            config(self.provider.url, self.spare.url),
            workers=1,  # one worker's turn and state: which key comes next is then known
            extra=(
                "--admin-port",
                str(self.admin_port),
                "--backend-cool-down",
                "0",
                "--retry-backoff",
                "0.01",
            ),
            env={f"PROVIDER_KEY_{n.upper()}": s for n, s in SECRETS.items()},
        )
        self.gw.wait_key_live(CLIENT, probes=2)

    def post(self, model: str = "chat") -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return httpx.post(
            self.gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {CLIENT}"},
            json=body,
            timeout=10,
        )

    def keys_used(self) -> list[str]:
        """Which provider key each request to the provider presented, by its name."""
        by_secret = {f"Bearer {s}": n for n, s in SECRETS.items()}
        return [
            by_secret[r["headers"]["authorization"]]
            for r in self.provider.requests()
            if r["path"] == "/v1/chat/completions"
        ]

    def credentials_view(self) -> dict[str, Any]:
        hosts = httpx.get(
            f"http://127.0.0.1:{self.admin_port}/admin/fleet",
            headers={"authorization": f"Bearer {CLIENT}"},
            timeout=10,
        ).json()["hosts"]
        view: dict[str, Any] = hosts[0].get("credentials", {})
        return view

    def stop(self) -> None:
        self.gw.stop()
        self.provider.stop()
        self.spare.stop()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.stop()


def test_keys_take_turns_and_each_keeps_its_quota(env: Env) -> None:
    for _ in range(9):
        assert env.post().status_code == 200
    # In turn, except that key-c takes 2 requests a minute (a burst of 2): at its third turn its quota is
    # spent and the next key serves.
    assert env.keys_used() == ["a", "b", "c", "a", "b", "c", "a", "b", "a"]
    assert env.spare.requests() == []


def test_a_refused_key_is_disabled_and_a_limited_one_cools_down(env: Env) -> None:
    env.provider.configure(key_status={SECRETS["a"]: 401, SECRETS["b"]: 429}, retry_after="2")
    resp = env.post()
    assert resp.status_code == 200
    assert env.keys_used() == ["a", "b", "c"]  # one request: three keys, the third answered
    assert env.spare.requests() == []
    wait_until(
        lambda: (
            {n: c["state"] for n, c in env.credentials_view().items()}
            == {"provider/key-a": "disabled", "provider/key-b": "cooling", "provider/key-c": "ok"}
        ),
        what="credential states in the fleet view",
    )
    view = env.credentials_view()
    assert view["provider/key-a"]["last_error"] == "HTTP 401"
    assert 0 < view["provider/key-b"]["cooling_for"] <= 2
    assert all(s not in str(view) for s in SECRETS.values())
    assert "credential key-a of backend provider answered HTTP 401" in env.gw.log.read_text()
    # While key-b cools and key-a is disabled, only key-c is tried; its quota (2 a minute) then runs out
    # and the request fails over to the spare backend within the same attempt budget.
    env.provider.reset()
    assert env.post().status_code == 200
    assert env.keys_used() == ["c"]
    assert env.post().status_code == 200
    assert env.keys_used() == ["c"] and len(env.spare.requests()) == 1
    time.sleep(2.1)  # key-b's Retry-After has passed: it is back; key-a stays disabled
    assert env.post().status_code == 200
    assert env.keys_used() == ["c", "b"]


def test_the_attempt_budget_covers_keys_and_targets_and_records_name_the_key(env: Env) -> None:
    env.provider.configure(key_status={s: 429 for s in SECRETS.values()}, retry_after="30")
    resp = env.post("only-provider")
    # Every key rate-limited and no other target: the provider's last 429 is the answer.
    assert resp.status_code == 429
    assert len(env.keys_used()) == 3
    # Now every key cools: nothing of the provider is tried, the chain's spare answers.
    assert env.post().status_code == 200
    assert len(env.keys_used()) == 3 and len(env.spare.requests()) == 1
    resp = env.post("only-provider")
    assert resp.status_code == 502
    assert "no credential of backend provider is usable now" in resp.json()["error"]["message"]

    def records() -> list[Any]:
        with open_store(Settings(data_dir=env.gw.data_dir)) as store:
            return store.usage.records(limit=100)

    wait_until(lambda: len(records()) >= 2, what="usage records")
    by_status = {r.status: r for r in records()}
    assert by_status[429].backend is not None and by_status[429].backend.startswith("provider/key-")
    assert by_status[429].attempts == 3
    # Each route trace entry names the credential it was tried with (by name, never the secret).
    tried = by_status[429].trace
    assert tried is not None
    assert sorted(step[0] for step in tried) == ["provider/key-a", "provider/key-b", "provider/key-c"]
    assert all(step[2] == 429 for step in tried)
    assert all(s not in str(tried) for s in SECRETS.values())
    assert by_status[200].backend == "spare"
