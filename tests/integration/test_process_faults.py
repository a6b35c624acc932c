"""Faults of the process model (issue 18, items 6 to 9): a full disk under the data directory, ``kill -9``
of the supervisor and of the control worker, a proxy worker that stops answering, and a huge body sent to
the admin port. Against the real gateway, the mock engine and real signals; the full-disk case mounts a
small tmpfs, so it runs as root only."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until
from tests.integration.test_usage import chat, ready_key, records

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
        wait_until(lambda: len(gw.worker_pids()) == 2, timeout=10, what="replaced")
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
