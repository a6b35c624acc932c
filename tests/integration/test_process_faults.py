"""Faults of the process model (issue 18, items 6 to 9): a full disk under the data directory, ``kill -9``
of the supervisor and of the control worker, a proxy worker that stops answering, and a huge body sent to
the admin port. Against the real gateway, the mock engine and real signals; the full-disk case mounts a
small tmpfs, so it runs as root only."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until
from tests.integration.test_admin_api import ADMIN_ROLES
from tests.integration.test_usage import BUDGETED, chat, ready_key, records

pytestmark = pytest.mark.slow


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) / 1024


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_stored(gw: Gateway, ids: set[str], timeout: float = 30.0) -> None:
    """Until every request id in ``ids`` is stored, then check that each is stored exactly once."""
    wait_until(lambda: ids <= {r.request_id for r in records(gw)}, timeout=timeout, what="records stored")
    got = [r.request_id for r in records(gw)]
    assert len(got) == len(set(got)), "a record was stored twice"


def burst(gw: Gateway, key: str, n: int, threads: int = 8) -> list[httpx.Response]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: chat(gw, key, 1 + i % 5, stream=i % 3 == 0), range(n)))


# -- item 8: the admin port reads no body past its limit -------------------------------------------------
def _send_body(port: int, head: bytes, total: int, chunked: bool) -> tuple[int, bytes]:
    """Send ``head`` and up to ``total`` bytes of body until the server stops taking them; returns how many
    bytes went out and the start of the answer."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head)
        piece = b"x" * 65536
        frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
        try:
            while sent < total:
                s.sendall(frame)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        try:
            answer = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    return sent, answer


def test_a_huge_unauthenticated_body_is_refused_as_it_arrives(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    port = free_port()
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1, extra=("--admin-port", str(port)))
    try:
        control = gw.worker_pids("control")[0]
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200, what="admin up")
        before = rss_mib(control)
        total = 200 * 1024 * 1024
        declared = (
            b"POST /admin/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % total
        )
        sent, answer = _send_body(port, declared, total, chunked=False)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"request_too_large" in answer
        # Without a declared length the body is counted as it comes, and cut past 16 KiB.
        chunked = (
            b"POST /admin/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        sent_chunked, answer = _send_body(port, chunked, total, chunked=True)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        grown = rss_mib(control) - before
        assert sent < total and sent_chunked < total, "the server took the whole body"
        assert grown < 8, f"the control worker grew by {grown:.1f} MiB"
        # A login of normal size still gets its answer (401 for a wrong key), and the worker lives.
        r = httpx.post(f"http://127.0.0.1:{port}/admin/login", json={"key": "nope"})
        assert r.status_code == 401
        assert gw.worker_pids("control") == [control]
    finally:
        gw.stop()


# -- item 7: a control worker restarted by kill -9 answers at once ----------------------------------------
def test_a_restarted_control_worker_answers_without_a_config_change(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    port = free_port()
    config = basic_config({"a": mock_engine.url}, extra=ADMIN_ROLES) + BUDGETED.format(
        budget='period = "day", tokens = 100000'
    )
    gw = Gateway(
        tmp_path,
        config,
        workers=1,
        extra=("--admin-port", str(port)),
        env={"GATEWAY_CLUSTER_TOKEN": "t" * 32},
    )
    try:
        ops = {"authorization": f"Bearer {gw.create_key('ops')}"}
        capped = ready_key(gw, "capped")
        assert chat(gw, capped, 5).status_code == 200
        admin = f"http://127.0.0.1:{port}"
        routes = ["/admin/whoami", "/admin/principals", "/admin/keys", "/admin/config", "/admin/budgets"]
        wait_until(lambda: httpx.get(admin + "/admin/whoami", headers=ops).status_code == 200, what="ops key")
        revision = httpx.get(admin + "/cluster/healthz", headers={"authorization": "Bearer " + "t" * 32})
        control = gw.worker_pids("control")[0]
        os.kill(control, signal.SIGKILL)
        wait_until(lambda: gw.worker_pids("control") not in ([], [control]), what="control worker respawned")
        respawned = time.monotonic()

        def all_answer() -> bool:
            got = [httpx.get(admin + path, headers=ops, timeout=2).status_code for path in routes]
            snapshot = httpx.get(admin + "/cluster/snapshot", headers={"authorization": "Bearer " + "t" * 32})
            return got == [200] * len(routes) and snapshot.status_code == 200

        wait_until(all_answer, timeout=10, what="admin and cluster routes answer")
        assert time.monotonic() - respawned < 10
        budgets = httpx.get(admin + "/admin/budgets", headers=ops).json()
        assert any("capped" in str(b) for b in budgets), budgets
        # No config change was needed: the revision is the one before the kill.
        after = httpx.get(admin + "/cluster/healthz", headers={"authorization": "Bearer " + "t" * 32})
        assert after.json()["revision"] == revision.json()["revision"]
    finally:
        gw.stop()


# -- item 9: a stopped proxy worker is replaced ---------------------------------------------------------
def test_a_stopped_worker_is_replaced_and_its_connections_are_served(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    config = basic_config({"a": mock_engine.url})
    gw = Gateway(tmp_path, config, workers=2, extra=("--heartbeat-timeout", "2"))
    victim = 0
    try:
        key = ready_key(gw, "alice")
        served: set[str] = {r.headers["x-request-id"] for r in burst(gw, key, 20)}
        victim = gw.worker_pids()[0]
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_until(lambda: not pid_alive(victim) or victim not in gw.worker_pids(), timeout=10, what="killed")
        # The state file names the victim until the supervisor has reaped it: replaced means two workers
        # and the victim not among them.
        wait_until(
            lambda: victim not in (pids := gw.worker_pids()) and len(pids) == 2, timeout=10, what="replaced"
        )
        replaced_in = time.monotonic() - stopped_at
        # Fresh connections (SO_REUSEPORT spreads them over both listeners) are all served now, quickly.
        after = burst(gw, key, 30)
        assert [r.status_code for r in after] == [200] * 30
        served |= {r.headers["x-request-id"] for r in after}
        assert replaced_in < 6, f"replaced after {replaced_in:.1f}s"
        state = gw.state()["workers"]
        assert sum(w["restarts"] for w in state if w["kind"] == "proxy") == 1
        assert "missed its heartbeat" in gw.log.read_text()
        wait_stored(gw, served)  # every completed request's record, the stopped worker's included
    finally:
        if victim and pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
        gw.stop()


def test_a_busy_moment_is_not_a_hang(tmp_path: Path, mock_engine: MockEngine) -> None:
    """A worker stopped for less than the timeout is left alone."""
    config = basic_config({"a": mock_engine.url})
    gw = Gateway(tmp_path, config, workers=1, extra=("--heartbeat-timeout", "3"))
    try:
        victim = gw.worker_pids()[0]
        os.kill(victim, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(victim, signal.SIGCONT)
        time.sleep(2.5)
        assert gw.worker_pids() == [victim]
    finally:
        gw.stop()


# -- item 6: a full disk, and kill -9 of the supervisor ---------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs, mounted for this test and unmounted after it."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)]
    done = subprocess.run(mount, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill the filesystem to its last byte; returns the filler file."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\1" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_degrades_but_serves_and_loses_no_record(
    small_disk: Path, tmp_path: Path, mock_engine: MockEngine
) -> None:
    data = small_disk / "data"  # the data directory on the small disk; the log stays off it
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2, extra=("--data-dir", str(data)))
    gw.data_dir = data
    try:
        key = ready_key(gw, "alice")
        served = {r.headers["x-request-id"] for r in burst(gw, key, 20)}
        wait_stored(gw, served)
        supervisor_pid = gw.proc.pid
        filler = fill(small_disk)
        full = burst(gw, key, 100)
        assert [r.status_code for r in full] == [200] * 100, "serving went on"
        served |= {r.headers["x-request-id"] for r in full}

        def degraded() -> bool:
            body = httpx.get(gw.url + "/healthz").json()
            return bool(body["status"] == "degraded" and "full" in body.get("store_detail", ""))

        wait_until(degraded, timeout=10, what="/healthz degraded")
        time.sleep(2.5)  # past a state-file write: the supervisor survives it
        assert gw.proc.poll() is None and pid_alive(supervisor_pid)
        assert len(gw.worker_pids()) == 2
        # A control worker killed while the disk is full comes back on it, and loses nothing either.
        control = gw.worker_pids("control")[0]
        os.kill(control, signal.SIGKILL)
        wait_until(lambda: not pid_alive(control), what="control worker gone")
        more = burst(gw, key, 20)
        assert [r.status_code for r in more] == [200] * 20
        served |= {r.headers["x-request-id"] for r in more}
        filler.unlink()
        wait_stored(gw, served)  # by the control worker that replaced the killed one
        assert len(records(gw)) == len(served)
        wait_until(lambda: httpx.get(gw.url + "/healthz").json()["status"] == "ok", what="/healthz ok again")
        log = gw.log.read_text()
        assert "Traceback" not in log
        assert "not written" in log and "store unavailable" in log  # the disk was full for both
    finally:
        gw.stop()


def test_kill_9_of_the_supervisor_loses_no_record(tmp_path: Path, mock_engine: MockEngine) -> None:
    """The workers get SIGTERM from the kernel when the supervisor dies: the proxies finish what they
    serve, and the control worker drains the rings until the last proxy has gone."""
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2)
    pids: list[int] = []
    try:
        key = ready_key(gw, "alice")
        pids = gw.worker_pids("control") + gw.worker_pids()
        mock_engine.configure(delay=0.02)  # so that requests are in flight when the supervisor dies
        answers: list[httpx.Response] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            try:
                r = chat(gw, key, 1 + i % 5, stream=i % 3 == 0)
            except httpx.HTTPError:
                return  # sent after the listeners closed: never served, never recorded
            with lock:
                answers.append(r)

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(one, i) for i in range(300)]
            wait_until(lambda: len(answers) >= 60, timeout=30, what="requests served")
            gw.proc.send_signal(signal.SIGKILL)  # with requests in flight in both proxy workers
            for f in futures:
                f.result()
        wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=40, what="workers gone")
        served = {r.headers["x-request-id"] for r in answers if r.status_code == 200}
        assert len(served) >= 60
        got = [r.request_id for r in records(gw)]
        assert len(got) == len(set(got))
        missing = served - set(got)
        assert not missing, f"{len(missing)} of {len(served)} served requests have no record"
    finally:
        for p in pids:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
        gw.stop()
