"""PostgreSQL away when the gateway starts: --role all and --role control start anyway, serve their
last-known-good snapshot, say they are degraded (/healthz, the fleet view), and catch up once the
database answers, applying the config file they could not apply at start."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.fixtures.postgres import PostgresServer
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until

VIEWER = """
[[roles]]
name = "viewer"
permissions = ["config:read", "key:create"]

[[principals]]
name = "viewer"
roles = ["viewer"]
"""
TOKEN = "cluster-token-for-the-outage-test"
ENV = {"GATEWAY_CLUSTER_TOKEN": TOKEN}


def _chat(gw: Gateway, key: str) -> int:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 3},
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    ).status_code


def _get(url: str, key: str | None = None) -> httpx.Response | None:
    try:
        return httpx.get(url, headers={"authorization": f"Bearer {key}"} if key else {}, timeout=5)
    except httpx.HTTPError:
        return None


def _answers(url: str, key: str) -> bool:
    r = _get(url, key)
    return r is not None and r.status_code == 200


@pytest.mark.parametrize("role", ["all", "control"])
def test_start_without_the_database_serves_the_last_known_good_and_recovers(
    tmp_path: Path, postgres_url: str, postgres_server: PostgresServer, mock_engine: MockEngine, role: str
) -> None:
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    extra = ("--role", role, "--database", postgres_url, "--admin-port", str(admin_port))
    config = basic_config({"a": mock_engine.url}, extra=VIEWER)

    def start(port: int | None = None) -> Gateway:
        gw = Gateway(tmp_path, config, workers=1, extra=extra, env=ENV, wait=role == "all", port=port)
        if role == "control":
            wait_until(lambda: _answers(admin + "/cluster/healthz", TOKEN), timeout=20, what="control plane")
        return gw

    gw = start()
    key = gw.cli("keys", "create", "--principal", "viewer", "--database", postgres_url).stdout.strip()
    wait_until(lambda: _answers(admin + "/admin/whoami", key), what="key live")
    if role == "all":
        gw.wait_key_live(key)
    assert gw.stop() == 0
    sealed = (gw.data_dir / "last-known-good.sealed").read_bytes()
    assert key.encode() not in sealed and b"viewer" not in sealed  # sealed, not plain JSON
    assert (gw.data_dir / "last-known-good.sealed").stat().st_mode & 0o077 == 0

    postgres_server.stop()
    try:
        # The file changes while the database is away: the gateway applies it once it answers.
        config += '\n[[principals]]\nname = "carol"\nroles = ["chatter"]\n'
        down = start(port=gw.port)
        try:
            assert down.proc.poll() is None
            whoami = _get(admin + "/admin/whoami", key)  # the key is known from the last-known-good snapshot
            assert whoami is not None and whoami.status_code == 200
            fleet = _get(admin + "/admin/fleet", key)
            assert fleet is not None and fleet.status_code == 200
            own = fleet.json()["hosts"][0]
            assert own["status"] == "degraded" and own["store"]["state"] == "unreachable"
            write = httpx.post(admin + "/admin/keys", json={"principal": "viewer"},
                               headers={"authorization": f"Bearer {key}"}, timeout=10)  # fmt: skip
            assert write.status_code == 503
            if role == "all":
                assert _chat(down, key) in (403, 404)  # authenticated from the snapshot (viewer lacks chat)
                health = httpx.get(down.url + "/healthz", timeout=5).json()
                assert health["control_plane"] == "degraded" and "store" in health["control_plane_detail"]
            else:
                snap = _get(admin + "/cluster/snapshot", TOKEN)
                assert snap is not None and snap.status_code == 200
        finally:
            postgres_server.start()
        # Back: the pending file is applied and published, and the degraded state ends.
        wait_until(lambda: "carol" in gw.cli("principals", "list", "--database", postgres_url).stdout,
                   timeout=30, what="config applied after the outage")  # fmt: skip

        def healthy() -> bool:
            r = _get(admin + "/admin/fleet", key)
            return r is not None and r.json()["hosts"][0]["status"] == "ok"

        wait_until(healthy, timeout=30, what="store reached")
        if role == "all":
            wait_until(lambda: httpx.get(down.url + "/healthz").json()["control_plane"] == "ok",
                       what="healthz ok")  # fmt: skip
            alice = down.cli(
                "keys", "create", "--principal", "alice", "--database", postgres_url
            ).stdout.strip()
            wait_until(lambda: _chat(down, alice) == 200, timeout=15, what="new key published")
        assert down.stop() == 0
    finally:
        if postgres_server.proc is None:
            postgres_server.start()
