"""Issue 18, item 1: 10,000 connections from one address that never send a byte leave other clients
served (p99 under 1 s while they are held), and are all closed at the head timeout."""

from __future__ import annotations

import os
import resource
import socket
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config

SILENT = int(os.environ.get("EDGE_SILENT", "10000"))
HEAD_TIMEOUT = 5.0
CHAT = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'
FLOOD_FROM = "127.0.0.2"  # the abuser's address; the other clients come from 127.0.0.1


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.fixture
def file_limit() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SILENT + 1024
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the open-files hard limit ({hard}) is below the {need} this test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ten_thousand_silent_connections(tmp_path: Path, file_limit: None, mock_engine: MockEngine) -> None:
    gw = Gateway(
        tmp_path,
        basic_config({"engine": mock_engine.url}),
        workers=2,
        extra=("--engine-scrape-interval", "0", "--head-timeout", str(HEAD_TIMEOUT)),
    )
    socks: list[socket.socket] = []
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        workers = gw.worker_pids()
        before = sum(rss_kib(p) for p in workers)
        started = time.monotonic()
        for _ in range(SILENT):
            s = socket.socket()
            s.bind((FLOOD_FROM, 0))
            s.connect(("127.0.0.1", gw.port))
            socks.append(s)
        opened = time.monotonic() - started
        assert opened < HEAD_TIMEOUT - 2, f"opening took {opened:.1f}s: too slow to measure while held"
        held_rss = sum(rss_kib(p) for p in workers)

        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(CHAT)}\r\nConnection: close\r\n\r\n"
        ).encode() + CHAT

        def one(_: int) -> float:
            """A new client on a new connection (raw: the test process's own cost stays out of it)."""
            t0 = time.monotonic()
            with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as c:
                c.sendall(request)
                got = b""
                while chunk := c.recv(65536):
                    got += chunk
            assert got.startswith(b"HTTP/1.1 200"), got[:100]
            return time.monotonic() - t0

        with ThreadPoolExecutor(4) as pool:
            latencies = sorted(pool.map(one, range(200)))
        measured_by = time.monotonic() - started
        p99 = latencies[int(len(latencies) * 0.99) - 1]
        print(
            f"\n{SILENT} silent connections opened in {opened:.2f}s; workers' RSS {before // 1024} -> "
            f"{held_rss // 1024} MiB ({(held_rss - before) * 1024 // SILENT} bytes each); other clients: "
            f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
            f"measured by {measured_by:.1f}s"
        )
        assert measured_by < HEAD_TIMEOUT, "the silent connections were no longer all held"
        assert p99 < 1.0

        # Then every one of them is closed by the gateway at the head timeout.
        deadline = started + HEAD_TIMEOUT + 10
        open_ones = list(socks)
        while open_ones and time.monotonic() < deadline:
            still = []
            for s in open_ones:
                s.settimeout(0.0)
                try:
                    s.recv(1024)  # b"": closed (anything else would be an answer, then the close)
                except BlockingIOError:
                    still.append(s)
                except OSError:
                    pass
            open_ones = still
            if open_ones:
                time.sleep(0.5)
        closed_at = time.monotonic() - started
        assert not open_ones, f"{len(open_ones)} silent connections still open after {closed_at:.1f}s"
        assert closed_at >= HEAD_TIMEOUT - 1
    finally:
        for s in socks:
            s.close()
        gw.stop()
