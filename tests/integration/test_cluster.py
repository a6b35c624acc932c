"""A cluster on loopback: one control-role host and two proxy-role hosts sharing one PostgreSQL.

The proxies follow the control plane's snapshot over its cluster API and send it their usage records;
they keep serving while it is away, from memory or, after a restart, from the last snapshot they saved."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gateway.config import Settings
from gateway.controlplane.fleet.shares import overshoot_bound
from gateway.controlplane.store import open_store
from gateway.controlplane.store._postgres import _WRITE_LOCK as WRITE_LOCK
from gateway.usage_record import UsageRecord, encode_record
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.processes import ROOT, Gateway, MockEngine, basic_config, free_port, stop_all, wait_until

TOKEN = secrets.token_urlsafe(24)
HASH_KEY = secrets.token_hex(32)
ENV = {"GATEWAY_CLUSTER_TOKEN": TOKEN, "GATEWAY_HASH_KEY": HASH_KEY}
OPS = """
[[roles]]
name = "operator"
permissions = ["config:write", "key:create", "key:revoke", "usage:read"]

[[principals]]
name = "ops"
roles = ["operator"]

[[principals]]
name = "limited"
roles = ["chatter"]
limits = { requests_per_minute = 100 }

[[principals]]
name = "capped"
roles = ["chatter"]
budget = { period = "day", tokens = 1000 }
"""


@dataclass
class Cluster:
    tmp: Path
    database: str
    admin_port: int
    config: str
    control: Gateway
    proxies: list[Gateway]

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start_control(self, *more: str) -> Gateway:
        gw = Gateway(
            self.tmp,
            self.config,
            workers=1,
            extra=(
                "--role",
                "control",
                "--admin-port",
                str(self.admin_port),
                "--database",
                self.database,
                *more,
            ),
            env=ENV,
            wait=False,
        )
        wait_until(
            lambda: _get(f"{self.admin_url}/cluster/healthz", TOKEN) == 200, timeout=20, what="control plane"
        )
        return gw

    def start_proxy(self, data_dir: Path | None = None, wait: bool = True) -> Gateway:
        extra = ("--role", "proxy", "--control-url", self.admin_url, "--report-interval", "1")
        if data_dir is not None:
            extra += ("--data-dir", str(data_dir))
        return Gateway(self.tmp, None, workers=2, extra=extra, env=ENV, wait=wait)

    def start_proxies(self, n: int) -> list[Gateway]:
        """``n`` proxy hosts started at once, each then waited for until every worker of it is ready."""
        proxies = [self.start_proxy(wait=False) for _ in range(n)]
        self.proxies += proxies
        for proxy in proxies:
            proxy.wait_ready()
        return proxies

    def stop(self) -> None:
        """The proxy hosts together, then the control plane (the proxies' last usage records go to it)."""
        stop_all(self.proxies)
        self.control.stop()

    def wait_key_live(self, key: str) -> None:
        """Until every worker of every proxy host accepts ``key`` (``GET /v1/models``: no limit or budget
        counts it). One request answered by a host says only that the worker it reached has the key."""
        for proxy in self.proxies:
            proxy.wait_key_live(key)

    def cli(self, *args: str) -> str:
        return self.control.cli(*args, "--database", self.database).stdout.strip()

    def records(self) -> list[str]:
        with open_store(Settings(data_dir=self.tmp, database=self.database)) as store:
            return [r.request_id for r in store.usage.records(limit=100_000)]


def _get(url: str, token: str | None = None) -> int:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.get(url, headers=headers, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def chat(gw: Gateway, key: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 3},
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str, mock_engine: MockEngine) -> Iterator[Cluster]:
    config = basic_config({"a": mock_engine.url}, extra=OPS)
    c = Cluster(tmp_path, postgres_url, free_port(), config, None, [])  # type: ignore[arg-type]  # control set below
    c.control = c.start_control()
    try:
        c.start_proxies(2)
        yield c
    finally:
        c.stop()


def test_cluster_api_needs_the_token(cluster: Cluster) -> None:
    assert _get(f"{cluster.admin_url}/cluster/snapshot") == 401
    assert _get(f"{cluster.admin_url}/cluster/snapshot", "wrong") == 401
    resp = httpx.get(f"{cluster.admin_url}/cluster/snapshot", headers={"authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200 and resp.headers["etag"] == f'"{resp.json()["revision"]}"'
    again = httpx.get(
        f"{cluster.admin_url}/cluster/snapshot",
        headers={"authorization": f"Bearer {TOKEN}", "if-none-match": resp.headers["etag"]},
    )
    assert again.status_code == 304 and again.content == b""


def test_a_key_made_through_the_admin_api_works_on_every_proxy_and_stops_when_revoked(
    cluster: Cluster,
) -> None:
    ops = cluster.cli("keys", "create", "--principal", "ops")
    auth = {"authorization": f"Bearer {ops}"}
    wait_until(
        lambda: httpx.get(f"{cluster.admin_url}/admin/whoami", headers=auth).status_code == 200,
        what="admin key live",
    )
    made = httpx.post(
        f"{cluster.admin_url}/admin/keys", json={"principal": "alice", "name": "k1"}, headers=auth
    )
    assert made.status_code == 201
    key = made.json()["secret"]
    written = time.monotonic()
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, key).status_code == 200, timeout=5, what="key live on a proxy")
    # Within a poll interval or so: the control plane's NOTIFY-woken build, then the proxies' 0.25 s poll.
    assert time.monotonic() - written < 2.0
    assert httpx.delete(f"{cluster.admin_url}/admin/keys/k1", headers=auth).status_code == 200
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, key).status_code == 401, timeout=5, what="key revoked on a proxy")


def test_usage_from_every_proxy_lands_once(cluster: Cluster) -> None:
    key = cluster.cli("keys", "create", "--principal", "alice")
    cluster.wait_key_live(key)
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, key).status_code == 200, timeout=5, what="key live")
    ids = set()
    for i in range(60):
        r = chat(cluster.proxies[i % 2], key)
        assert r.status_code == 200
        ids.add(r.headers["x-request-id"])
    wait_until(lambda: ids <= set(cluster.records()), timeout=10, what="usage at the control plane")
    time.sleep(0.5)
    got = cluster.records()
    assert len(got) == len(set(got)) == 62  # the two probes above, and the sixty


def test_usage_reports_and_shares_never_change_the_snapshot_revision(cluster: Cluster) -> None:
    """Traffic on every proxy (usage batches, budget spend, reports answered with shares) leaves the
    snapshot's revision as it was: a poll with its ETag stays 304. Only a configuration write moves it."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    key = cluster.cli("keys", "create", "--principal", "capped")
    cluster.wait_key_live(key)
    first = httpx.get(f"{cluster.admin_url}/cluster/snapshot", headers=auth)
    etag = first.headers["etag"]
    ids = {chat(cluster.proxies[i % 2], key).headers["x-request-id"] for i in range(30)}
    wait_until(lambda: ids <= set(cluster.records()), timeout=10, what="usage at the control plane")
    time.sleep(2.5)  # two report intervals: shares and budget bases answered meanwhile
    again = httpx.get(f"{cluster.admin_url}/cluster/snapshot", headers={**auth, "if-none-match": etag})
    assert again.status_code == 304
    cluster.cli("keys", "create", "--principal", "alice")  # a configuration write
    wait_until(
        lambda: (
            httpx.get(
                f"{cluster.admin_url}/cluster/snapshot", headers={**auth, "if-none-match": etag}
            ).status_code
            == 200
        ),
        timeout=5,
        what="a new revision",
    )


def test_kill_9_of_a_proxy_host_s_supervisor_loses_no_usage(
    cluster: Cluster, mock_engine: MockEngine
) -> None:
    """Its workers get SIGTERM from the kernel; the control slot ships records until the proxies, still
    finishing their requests, have all gone."""
    key = cluster.cli("keys", "create", "--principal", "alice")
    host = cluster.proxies[0]
    wait_until(lambda: chat(host, key).status_code == 200, timeout=5, what="key live")
    pids = host.worker_pids("control") + host.worker_pids()
    mock_engine.configure(delay=0.05)  # so that requests are in flight when the supervisor dies
    answers: list[httpx.Response] = []

    def one(_: int) -> None:
        try:
            answers.append(chat(host, key))
        except httpx.HTTPError:
            pass  # sent after the listeners closed: never served, never recorded

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(one, i) for i in range(200)]
        wait_until(lambda: len(answers) >= 40, timeout=30, what="requests served")
        host.proc.send_signal(signal.SIGKILL)
        for f in futures:
            f.result()
    served = {r.headers["x-request-id"] for r in answers if r.status_code == 200}
    wait_until(lambda: not any(_alive(p) for p in pids), timeout=40, what="the host's workers gone")
    wait_until(lambda: served <= set(cluster.records()), timeout=10, what="every served request stored")
    got = cluster.records()
    assert len(got) == len(set(got))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_proxies_outlive_the_control_plane(cluster: Cluster) -> None:
    key = cluster.cli("keys", "create", "--principal", "alice")
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, key).status_code == 200, timeout=5, what="key live")
    cluster.control.stop()
    # Both keep serving, say so in /healthz, and keep the usage they produce meanwhile.
    ids = set()
    for proxy in cluster.proxies:
        wait_until(
            lambda p=proxy: httpx.get(p.url + "/healthz").json()["control_plane"] == "degraded",
            timeout=10,
            what="outage noticed",
        )
        for _ in range(5):
            r = chat(proxy, key)
            assert r.status_code == 200
            ids.add(r.headers["x-request-id"])
    # A proxy restarted meanwhile serves from the last snapshot it saved.
    first = cluster.proxies[0]
    data_dir = first.data_dir
    first.stop()
    restarted = cluster.start_proxy(data_dir)
    cluster.proxies[0] = restarted
    r = chat(restarted, key)
    assert r.status_code == 200
    ids.add(r.headers["x-request-id"])
    body = httpx.get(restarted.url + "/healthz").json()
    assert body["status"] == "ok"
    # The control plane comes back: every record made during the outage lands, once.
    cluster.control = cluster.start_control()
    wait_until(lambda: ids <= set(cluster.records()), timeout=30, what="spooled usage delivered")
    for proxy in cluster.proxies:
        wait_until(
            lambda p=proxy: httpx.get(p.url + "/healthz").json()["control_plane"] == "ok",
            timeout=35,
            what="control plane seen again",
        )
    got = cluster.records()
    assert len(got) == len(set(got))


def test_proxy_role_refuses_to_start_without_what_it_needs(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path), "--role", "proxy"]
    clean = {k: v for k, v in os.environ.items() if k not in ENV}
    cases = [
        ([], {}, "--control-url"),
        (["--control-url", "http://127.0.0.1:1"], {}, "GATEWAY_CLUSTER_TOKEN"),
        (["--control-url", "http://127.0.0.1:1"], {"GATEWAY_CLUSTER_TOKEN": "t"}, "GATEWAY_HASH_KEY"),
    ]
    for args, env, message in cases:
        done = subprocess.run(
            [*base, *args], cwd=ROOT, capture_output=True, text=True, env={**clean, **env}, timeout=30
        )
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_postgres_down_fails_writes_closed_keeps_reads_and_loses_no_usage(
    cluster: Cluster, postgres_server: PostgresServer
) -> None:
    user = cluster.cli("keys", "create", "--principal", "root")  # root: model/* only, no admin rights
    ops = cluster.cli("keys", "create", "--principal", "ops")
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, user).status_code == 200, timeout=5, what="key live")
    auth = {"authorization": f"Bearer {ops}"}
    wait_until(
        lambda: httpx.get(f"{cluster.admin_url}/admin/whoami", headers=auth).status_code == 200,
        what="admin key live",
    )
    postgres_server.stop()
    try:
        made = httpx.post(
            f"{cluster.admin_url}/admin/keys", json={"principal": "alice"}, headers=auth, timeout=15
        )
        assert made.status_code == 503
        assert made.json()["error"]["code"] == "service_unavailable"
        listed = httpx.get(f"{cluster.admin_url}/admin/principals", headers=auth, timeout=15)
        assert listed.status_code == 200 and listed.headers["x-gateway-source"] == "snapshot"
        assert "ops" in {p["name"] for p in listed.json()}
        ids = set()
        for i in range(20):
            r = chat(cluster.proxies[i % 2], user)
            assert r.status_code == 200
            ids.add(r.headers["x-request-id"])
        time.sleep(1.0)  # the proxies try to deliver, are refused with 503, and keep the batches
    finally:
        postgres_server.start()
    wait_until(lambda: ids <= set(cluster.records()), timeout=40, what="usage delivered after the outage")
    got = cluster.records()
    assert len(got) == len(set(got))
    made = httpx.post(
        f"{cluster.admin_url}/admin/keys", json={"principal": "alice"}, headers=auth, timeout=15
    )
    assert made.status_code == 201  # writes work again


def test_notify_wakes_the_control_plane_before_its_poll(
    tmp_path: Path, postgres_url: str, mock_engine: MockEngine
) -> None:
    """With a revision poll of a minute, a key written by another process is live within a second or two:
    PostgreSQL's NOTIFY told the control worker."""
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}),
        workers=1,
        extra=("--database", postgres_url, "--revision-poll-interval", "60"),
    )
    try:
        key = gw.cli("keys", "create", "--principal", "alice", "--database", postgres_url).stdout.strip()
        written = time.monotonic()
        wait_until(lambda: chat(gw, key).status_code == 200, timeout=10, what="key live through NOTIFY")
        assert time.monotonic() - written < 5
    finally:
        gw.stop()


def test_fleet_view_lists_every_host_with_its_workers_and_backends(cluster: Cluster) -> None:
    user = cluster.cli("keys", "create", "--principal", "root")
    ops = cluster.cli("keys", "create", "--principal", "ops")
    cluster.wait_key_live(user)
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, user).status_code == 200, timeout=5, what="key live")
        for _ in range(5):
            assert chat(proxy, user).status_code == 200
    auth = {"authorization": f"Bearer {ops}"}

    def proxies_seen() -> list[dict[str, object]]:
        resp = httpx.get(f"{cluster.admin_url}/admin/fleet", headers=auth)
        if resp.status_code != 200:
            return []
        hosts = [h for h in resp.json()["hosts"] if h["role"] == "proxy"]
        done = [h for h in hosts if h["backends"].get("a", {}).get("answered", 0) >= 6]  # type: ignore[union-attr]
        return done if len(done) == 2 else []

    wait_until(lambda: bool(proxies_seen()), timeout=15, what="both proxies reported their traffic")
    hosts = httpx.get(f"{cluster.admin_url}/admin/fleet", headers=auth).json()["hosts"]
    assert [h["role"] for h in hosts].count("control") == 1
    for host in (h for h in hosts if h["role"] == "proxy"):
        assert len(host["proxy_workers"]) == 2
        assert {w["kind"] for w in host["supervisor"]["workers"]} == {"control", "proxy"}
        assert host["control_plane"] == "ok" and host["backends"]["a"]["failed"] == 0


def test_a_limit_is_shared_across_hosts_within_its_bound(cluster: Cluster) -> None:
    """100 requests per minute over two proxy hosts: after traffic went to one host only, that host holds
    most of the limit and the idle one its floor (half); a burst at both then admits at most the documented
    bound, (2H - 1)/H = 1.5 times the limit, and the idle host admits its floor."""
    key = cluster.cli("keys", "create", "--principal", "limited")
    busy, idle = cluster.proxies
    cluster.wait_key_live(key)
    started = time.monotonic()
    probes = 0
    for proxy in cluster.proxies:
        wait_until(lambda p=proxy: chat(p, key).status_code == 200, timeout=5, what="key live")
        probes += 1
    first = sum(chat(busy, key).status_code == 200 for _ in range(40))
    assert first == 40  # within the busy host's share even before any reconciliation (half of 100)
    time.sleep(2.5)  # reports every second: the busy host's share grows, the idle one keeps its floor

    def burst(proxy: Gateway) -> list[int]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda _: chat(proxy, key).status_code, range(150)))

    with ThreadPoolExecutor(2) as pool:
        at_busy, at_idle = pool.map(burst, [busy, idle])
    elapsed = time.monotonic() - started
    ok_busy, ok_idle = at_busy.count(200), at_idle.count(200)
    assert at_busy.count(200) + at_busy.count(429) == 150 and at_idle.count(200) + at_idle.count(429) == 150
    total = probes + first + ok_busy + ok_idle
    refill = int(elapsed * 1.5 * 100 / 60) + 1  # what the shares refill at most while the test runs
    assert total <= overshoot_bound(2) * 100 + refill, (first, ok_busy, ok_idle, elapsed)
    assert ok_idle >= 50 - 1  # its floor: half the limit, less the one probe it admitted


def _throwaway_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca, ca_key = tmp / "ca.pem", tmp / "ca.key"
    cert, key, csr = tmp / "server.pem", tmp / "server.key", tmp / "server.csr"
    ext = tmp / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run = lambda *args: subprocess.run(["openssl", *args], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=test-ca")
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(ext),
    )  # fmt: skip
    return ca, cert, key


def test_proxies_follow_a_control_plane_over_tls(
    tmp_path: Path, postgres_url: str, mock_engine: MockEngine
) -> None:
    ca, cert, key = _throwaway_ca(tmp_path)
    admin_port = free_port()
    control = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}),
        workers=1,
        extra=(
            "--role", "control", "--admin-port", str(admin_port), "--database", postgres_url,
            "--admin-tls-cert", str(cert), "--admin-tls-key", str(key),
        ),
        env=ENV,
        wait=False,
    )  # fmt: skip
    url = f"https://127.0.0.1:{admin_port}"
    proxies: list[Gateway] = []
    try:
        wait_until(
            lambda: _tls_get(f"{url}/cluster/healthz", ca) == 200, timeout=20, what="control plane over TLS"
        )
        base = ("--role", "proxy", "--control-url", url)
        trusting = Gateway(tmp_path, None, workers=1, extra=(*base, "--control-ca", str(ca)), env=ENV)
        proxies.append(trusting)
        secret = control.cli(
            "keys", "create", "--principal", "alice", "--database", postgres_url
        ).stdout.strip()
        wait_until(lambda: chat(trusting, secret).status_code == 200, timeout=10, what="key over TLS")
        # Without the CA, the control plane's certificate is not trusted: that proxy never syncs.
        doubting = Gateway(tmp_path, None, workers=1, extra=base, env=ENV, wait=False)
        proxies.append(doubting)
        wait_until(
            lambda: _healthz(doubting) == "degraded", timeout=20, what="untrusted control plane refused"
        )
    finally:
        stop_all(proxies)
        control.stop()


def _tls_get(url: str, ca: Path) -> int:
    try:
        return httpx.get(
            url, headers={"authorization": f"Bearer {TOKEN}"}, verify=str(ca), timeout=2
        ).status_code
    except httpx.HTTPError:
        return 0


def _healthz(gw: Gateway) -> str:
    try:
        return str(httpx.get(gw.url + "/healthz", timeout=2).json().get("control_plane", ""))
    except (httpx.HTTPError, ValueError):
        return ""


@pytest.mark.parametrize(
    ("principal", "own"),
    [("capped", ()), ("limited", ("--budget", '{ period = "day", tokens = 1000 }'))],
    ids=["principal", "key"],
)
def test_a_budget_counts_every_host(
    cluster: Cluster, mock_engine: MockEngine, principal: str, own: tuple[str, ...]
) -> None:
    """1000 tokens a day (the principal's budget, or the key's own), 400-token answers, spread over two
    proxy hosts: the third request crosses the budget on the host that had seen only its own, and after
    that both hosts refuse."""
    mock_engine.configure(tokens=1000)
    key = cluster.cli("keys", "create", "--principal", principal, *own)
    first, second = cluster.proxies
    cluster.wait_key_live(key)

    def ask(proxy: Gateway) -> int:
        return httpx.post(
            proxy.url + "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 399},
            headers={"authorization": f"Bearer {key}"},
            timeout=10,
        ).status_code

    wait_until(lambda: ask(first) == 200, timeout=5, what="key live")  # 400 tokens, on the first host
    assert ask(first) == 200  # 800
    # The second host learns of the first one's 800 within a report or two; its own request still fits.
    time.sleep(2.5)
    assert ask(second) == 200  # 1200: crosses
    time.sleep(2.5)  # the second host's record reaches the store, the first host's next report brings it
    assert ask(first) == 402  # on its own, the first host has seen only 800
    assert ask(second) == 402


@contextmanager
def held_up_store(
    cluster: Cluster, postgres_url: str, record: bytes
) -> Iterator[tuple[psycopg.Connection[Any], Future[httpx.Response]]]:
    """The store falls behind: PostgreSQL's write lock held (release it with the connection given), and a
    batch of ``record`` in the control plane's hands, waiting for it (its answer, the future given)."""
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    with psycopg.connect(postgres_url, autocommit=True) as lock, ThreadPoolExecutor(1) as pool:
        lock.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
        in_hand = pool.submit(
            httpx.post,
            f"{cluster.admin_url}/cluster/usage",
            content=b"[" + record + b"]",
            headers=auth,
            timeout=60,
        )
        yield lock, in_hand


def test_a_store_that_falls_behind_gets_batches_later_never_lost_nor_twice(
    tmp_path: Path, postgres_url: str, mock_engine: MockEngine
) -> None:
    """With more records waiting for the store than ``--ingest-queue-max`` (1 here), the control plane
    answers usage batches 503 ``ingest_busy`` with Retry-After; the proxy host keeps its batches in its
    spool and sends them again when the store has caught up: every record lands, once."""
    config = basic_config({"a": mock_engine.url}, extra=OPS)
    cluster = Cluster(tmp_path, postgres_url, free_port(), config, None, [])  # type: ignore[arg-type]
    cluster.control = cluster.start_control("--ingest-queue-max", "1")
    try:
        (proxy,) = cluster.start_proxies(1)
        key = cluster.cli("keys", "create", "--principal", "alice")
        cluster.wait_key_live(key)
        live: list[str] = []

        def answered() -> bool:
            resp = chat(proxy, key)
            if resp.status_code == 200:
                live.append(resp.headers["x-request-id"])
            return bool(live)

        wait_until(answered, timeout=5, what="key live")
        # That request's record is stored before the store is made to fall behind: a batch of the proxy
        # host's own must not be the one in the store's hands, or ours would be refused instead.
        wait_until(lambda: live[0] in cluster.records(), timeout=15, what="the first record stored")
        spool = proxy.data_dir / "usage-spool"
        auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
        other = encode_record(
            UsageRecord(
                "from-another-host",
                time.time(),
                "p",
                "k",
                "chat",
                "a",
                200,
                1,
                1,
                0,
                2,
                "reported",
                0,
                1.0,
                1.0,
                None,
            )
        )
        with held_up_store(cluster, postgres_url, other) as (lock, in_hand):
            answers: list[httpx.Response] = []

            def refused() -> bool:
                answers.append(
                    httpx.post(f"{cluster.admin_url}/cluster/usage", content=b"[]", headers=auth, timeout=5)
                )
                return answers[-1].status_code == 503

            wait_until(refused, timeout=10, what="a batch refused as busy")
            busy = answers[-1]
            assert busy.json()["error"]["code"] == "ingest_busy"
            assert 1 <= int(busy.headers["retry-after"]) <= 30
            ids = {chat(proxy, key).headers["x-request-id"] for _ in range(20)}
            # The proxy host's batches were refused too: its records wait in its spool, on disk.
            wait_until(lambda: any(spool.glob("*.json")), timeout=10, what="records spooled")
            lock.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
            assert in_hand.result().status_code == 200
        wait_until(lambda: ids <= set(cluster.records()), timeout=30, what="spooled records stored")
        wait_until(lambda: not any(spool.glob("*.json")), timeout=10, what="spool emptied")
        got = cluster.records()
        assert len(got) == len(set(got))  # nothing twice
        assert "from-another-host" in got
        metrics = httpx.get(f"{cluster.admin_url}/metrics").text
        busy_total = next(
            line for line in metrics.splitlines() if line.startswith("gateway_cluster_usage_busy_total ")
        )
        assert int(busy_total.split()[1]) >= 2  # ours, and at least one of the proxy host's
    finally:
        cluster.stop()


def test_a_report_is_answered_while_the_store_is_held_up(
    tmp_path: Path, postgres_url: str, mock_engine: MockEngine
) -> None:
    """A proxy host reports, syncs its snapshot and ships its usage in turn: a report that waited for its
    budget bases behind a stalled store thread held its usage up for the whole call's deadline, so its
    records reached the spool late. The report is answered without the bases instead."""
    config = basic_config({"a": mock_engine.url}, extra=OPS)
    cluster = Cluster(tmp_path, postgres_url, free_port(), config, None, [])  # type: ignore[arg-type]
    cluster.control = cluster.start_control()
    try:
        auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
        record = encode_record(
            UsageRecord(
                "held-up", time.time(), "p", "k", "chat", "a", 200, 1, 1, 0, 2, "reported", 0, 1.0, 1.0, None
            )
        )
        with held_up_store(cluster, postgres_url, record) as (lock, in_hand):
            time.sleep(0.5)  # the batch reaches the store thread, which then waits for the lock
            report = httpx.post(
                f"{cluster.admin_url}/cluster/report",
                content=b'{"host": "held-up-host", "epoch": "e"}',
                headers=auth,
                timeout=5,  # the proxy host's own deadline is 10 s; before, this waited for the lock
            )
            assert report.status_code == 200
            assert "budget_bases" not in report.json()
            assert not in_hand.done()  # the store was still held up while the report was answered
            lock.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
            assert in_hand.result().status_code == 200
    finally:
        cluster.stop()
