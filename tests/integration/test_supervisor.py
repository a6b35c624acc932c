"""The process model under change: config writes and reloads while requests flow, a worker killed
under load, and a drain that lets an in-flight stream finish."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until

pytestmark = pytest.mark.slow


class Load:
    """Requests on fresh connections (so SO_REUSEPORT spreads them over every worker) until stopped."""

    def __init__(self, gw: Gateway, key: str, threads: int = 3) -> None:
        self.gw, self.key = gw, key
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = httpx.post(
                    self.gw.url + "/v1/chat/completions",
                    timeout=10,
                    headers={"authorization": f"Bearer {self.key}"},
                    json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 1},
                )
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def answers(gw: Gateway, key: str, n: int = 40) -> list[int]:
    return [
        httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"}).status_code
        for _ in range(n)
    ]


@pytest.fixture
def engine(tmp_path) -> Iterator[MockEngine]:  # type: ignore[no-untyped-def]
    e = MockEngine(tmp_path)
    yield e
    e.stop()


def test_config_changes_reach_every_worker_within_a_second(tmp_path, engine: MockEngine) -> None:  # type: ignore[no-untyped-def]
    gw = Gateway(tmp_path, basic_config({"a": engine.url}), workers=4)
    try:
        steady = gw.create_key("alice")
        wait_until(lambda: set(answers(gw, steady, 8)) == {200}, what="first key")
        load = Load(gw, steady)
        try:
            time.sleep(0.5)
            fresh = gw.cli("keys", "create", "--principal", "alice", "--name", "fresh").stdout.strip()
            time.sleep(1.0)
            assert set(answers(gw, fresh)) == {200}
            gw.cli("keys", "revoke", "fresh")
            time.sleep(1.0)
            assert set(answers(gw, fresh)) == {401}
            # SIGHUP re-reads the file: a principal added to it becomes usable without a restart.
            gw.config_path.write_text(
                basic_config({"a": engine.url}) + '\n[[principals]]\nname = "carol"\nroles = ["chatter"]\n'
            )
            gw.signal(signal.SIGHUP)
            wait_until(
                lambda: gw.cli("keys", "create", "--principal", "carol", check=False).returncode == 0,
                what="carol applied",
            )
            carol = gw.cli("keys", "list", "--principal", "carol").stdout
            assert "carol" in carol
            time.sleep(0.5)
        finally:
            load.stop()
        assert load.failures == []
        assert load.ok > 20
    finally:
        assert gw.stop() == 0


def test_killed_worker_is_restarted_while_others_serve(tmp_path, engine: MockEngine) -> None:  # type: ignore[no-untyped-def]
    gw = Gateway(tmp_path, basic_config({"a": engine.url}), workers=3)
    try:
        key = gw.create_key("alice")
        wait_until(lambda: set(answers(gw, key, 8)) == {200}, what="key")
        victim = gw.worker_pids()[0]
        load = Load(gw, key)
        try:
            time.sleep(0.3)
            os.kill(victim, signal.SIGKILL)
            ok_at_kill = load.ok
            wait_until(
                lambda: victim not in gw.worker_pids() and len(gw.worker_pids()) == 3,
                timeout=15,
                what="worker restarted",
            )
            time.sleep(0.5)
        finally:
            load.stop()
        assert load.ok > ok_at_kill, "the other workers kept serving"
        restarted = [w for w in gw.state()["workers"] if w["restarts"]]
        assert len(restarted) == 1 and restarted[0]["pid"] != victim
        # Only requests that were inside the killed worker may fail; everything after the restart works.
        assert len(load.failures) <= 3 * 2
        assert set(answers(gw, key)) == {200}
    finally:
        assert gw.stop() == 0


def test_sigterm_lets_a_stream_finish_then_exits_zero(tmp_path, engine: MockEngine) -> None:  # type: ignore[no-untyped-def]
    gw = Gateway(tmp_path, basic_config({"a": engine.url}), workers=2)
    key = gw.create_key("alice")
    wait_until(lambda: set(answers(gw, key, 8)) == {200}, what="key")
    engine.configure(token_delay=0.1)
    got: list[bytes] = []
    first = threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST",
            gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={
                "model": "chat",
                "messages": [{"role": "user", "content": "q"}],
                "max_tokens": 20,
                "stream": True,
            },
            timeout=30,
        ) as r:
            for chunk in r.iter_raw():
                got.append(chunk)
                first.set()

    t = threading.Thread(target=stream)
    t.start()
    assert first.wait(10)
    gw.signal(signal.SIGTERM)
    t.join(30)
    assert gw.proc.wait(30) == 0
    body = b"".join(got)
    assert body.rstrip().endswith(b"data: [DONE]")
    direct = httpx.post(
        engine.url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": "mock-model",
            "messages": [{"role": "user", "content": "q"}],
            "max_tokens": 20,
            "stream": True,  # the client asked for no usage: the gateway withholds the chunk it asked for
        },
    ).content
    assert body.count(b"data: ") == direct.count(b"data: ")


def test_systemd_notify_protocol(tmp_path: Path, mock_engine: MockEngine) -> None:
    """READY=1 once every proxy worker serves, WATCHDOG=1 at half WATCHDOG_USEC, STOPPING=1 on SIGTERM."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"}
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2, env=env, wait=False)
    try:
        messages: list[str] = []
        while "READY=1" not in messages:
            messages.append(sock.recv(4096).decode())
        # At READY every worker answers: fresh connections spread over both, all ready.
        assert all(httpx.get(gw.url + "/readyz", timeout=2).status_code == 200 for _ in range(16))
        pets = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            messages.append(sock.recv(4096).decode())
            pets += messages[-1] == "WATCHDOG=1"
        assert pets >= 4  # every half second
        gw.signal(signal.SIGTERM)
        while "STOPPING=1" not in messages:
            messages.append(sock.recv(4096).decode())
        assert gw.proc.wait(30) == 0
        assert any(m.startswith("STATUS=") for m in messages)
    finally:
        gw.stop()
        sock.close()


def test_status_shows_workers_and_backends(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2)
    try:
        key = gw.create_key("alice")
        body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
        headers = {"authorization": f"Bearer {key}"}
        wait_until(
            lambda: (
                httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers).status_code == 200
            ),
            what="key live",
        )

        def shown() -> bool:
            out = gw.cli("status").stdout
            return "backend a" in out and "answered=" in out

        wait_until(shown, timeout=10, what="backends in gateway status")
        out = gw.cli("status").stdout
        assert "role=all" in out and "source=local store" in out
        assert out.count("in_flight=") >= 3  # two workers and the backend
        assert out.count("heartbeat=") == 2  # each proxy worker's, seconds ago
        for name in ("control", "proxy-1", "proxy-2"):
            assert name in out
    finally:
        gw.stop()


def _cores_allowed(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs at least two usable cores")
def test_proxy_workers_are_pinned_one_per_core(tmp_path: Path, mock_engine: MockEngine) -> None:
    cores = sorted(os.sched_getaffinity(0))
    pinned = Gateway(
        tmp_path, basic_config({"a": mock_engine.url}), workers=3, extra=("--cpu-affinity", "on")
    )
    auto = ("--cpu-affinity", "auto")  # pins only when there are as many workers as cores
    workers = 3 if len(cores) != 3 else 2
    unpinned = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=workers, extra=auto)
    try:
        seen = [_cores_allowed(pid) for pid in pinned.worker_pids()]
        assert all(len(allowed) == 1 for allowed in seen), seen
        # Worker i on the i-th usable core, round robin: every core gets one before any gets two.
        assert {next(iter(a)) for a in seen} == set(cores[: min(3, len(cores))])
        # granian's threads inherit the worker's core.
        for pid in pinned.worker_pids():
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert len(os.sched_getaffinity(int(tid))) == 1
        assert all(_cores_allowed(pid) == set(cores) for pid in unpinned.worker_pids())
        key = pinned.create_key("alice")
        wait_until(lambda: set(answers(pinned, key, 8)) == {200}, what="pinned workers serve")
    finally:
        assert pinned.stop() == 0
        assert unpinned.stop() == 0
