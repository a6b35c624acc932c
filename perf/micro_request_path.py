"""The proxy worker's whole request path in one process, counted: ``ProxyApp.__rsgi__`` for a small chat
completion, from a stand-in for granian's protocol object to an upstream in another process and back,
with the worker's own parts (shared regions, limiter, budgets, usage ring, client and backend gates) built
as ``gateway.dataplane.worker`` builds them. What it leaves out is granian's side (the Rust server, its
threads and hand-overs) and the kernel's, which ``perf.ab`` measures in the running server.

Configurations: ``bare`` (no limits, budget, price or usage records, as perf.bench's ``gateway-bare``),
``full`` (every limit, a budget, a price, usage records and the route trace, as ``gateway``) and ``full``
without the route trace. Requests go one at a time on uvloop; the upstream answers each with the same
bytes over a kept-alive connection, in a child process of its own, so that it is not counted.

    .venv/bin/python -m perf.micro_request_path                  # CPU µs per request (timing)
    .venv/bin/python -m perf.micro_request_path --instructions   # instructions per request (callgrind)

``--instructions`` runs each configuration in a child under valgrind's callgrind for 1,000 and for 3,000
requests; the difference over 2,000 is one request's instructions, which the machine's load does not move.
I/O: a loopback upstream process, shared-memory segments (removed at the end), stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import orjson

from gateway.config import Settings
from gateway.dataplane.accounting import Accounting
from gateway.dataplane.app import ProxyApp
from gateway.dataplane.backend_load import BackendLoad
from gateway.dataplane.budgets import BudgetGuard
from gateway.dataplane.clients import ClientLimiter, TrustedProxies
from gateway.dataplane.limits import Limiter
from gateway.dataplane.usage_log import UsageLog
from gateway.keys import hash_secret
from gateway.native import AtomicWords, BucketTable, UsageRing
from gateway.shm.holdings import Holdings
from gateway.shm.regions import RegionSizes, SharedRegions
from gateway.shm.worker_stats import WorkerStats
from gateway.snapshot import Snapshot
from perf.callgrind import instructions
from perf.targets import die_with_parent

HASH_KEY = bytes(range(32))
SECRET = "sk-gw-bench-0001"
BODY = orjson.dumps({"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
    }
)
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(ANSWER),
    ANSWER,
)
_KEPT: list[tuple[SharedRegions, ProxyApp]] = []
# (label, every limit, a budget and a price, usage records, route trace)
CONFIGS = {
    "bare": ("bare: no limits, budget or records", False, False, False),
    "full": ("full: every limit, a budget, a price, records, route trace", True, True, True),
    "full-no-trace": ("full without the route trace", True, True, False),
}


def snapshot(upstream: str, accounted: bool) -> Snapshot:
    principal: dict[str, Any] = {"name": "bench", "allow_all": True, "models": []}
    route: dict[str, Any] = {"canonical": "chat", "kind": "frontend", "targets": [["m", "e", "m"]]}
    if accounted:
        principal["limits"] = {"rpm": 10**9, "tpm": 10**12, "concurrency": 100_000}
        principal["budgets"] = [{"period": "day", "tokens": 10**12, "cost": 10**9}]
        route["price"] = [0.15, 0.6, 0.15]
    doc = {
        "schema": 1,
        "revision": 1,
        "backends": {"e": {"url": upstream}},
        "routes": {"chat": route},
        "principals": {"p1": principal},
        "keys": {hash_secret(SECRET, HASH_KEY).hex(): {"id": "k1", "principal": "p1", "expires_at": None}},
    }
    return Snapshot.from_doc(doc, 1)


class _Headers:
    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def get(self, key: str, default: None = None, /) -> str | None:
        for k, v in self.pairs:
            if k == key:
                return v
        return default

    def get_all(self, key: str, /) -> list[str]:
        return [v for k, v in self.pairs if k == key]

    def items(self) -> list[tuple[str, str]]:
        return list(self.pairs)


class _Scope:
    method = "POST"
    path = "/v1/chat/completions"
    query_string = ""
    client = "127.0.0.1:50000"
    server = "127.0.0.1:8080"
    headers = _Headers(
        [
            ("content-type", "application/json"),
            ("content-length", str(len(BODY))),
            ("authorization", f"Bearer {SECRET}"),
        ]
    )


class _Proto:
    """granian's protocol object for one request, as little as the app uses of it."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = 0

    async def __call__(self) -> bytes:
        return BODY

    async def client_disconnect(self) -> None:
        await asyncio.Event().wait()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes, /) -> None:
        self.status = status


def build(name: str, upstream: str, regions: SharedRegions) -> ProxyApp:
    """The app as ``run_proxy_worker`` builds it, on private segments."""
    _, accounted, usage_on, trace = CONFIGS[name]
    settings = Settings(usage_records=usage_on, route_trace=trace)
    table = BucketTable(regions.buckets)
    holdings = Holdings(AtomicWords(regions.holdings), 0)
    usage = UsageLog(UsageRing(regions.usage), 0) if usage_on else None
    accounting = Accounting(Limiter(table, holdings), BudgetGuard(table, regions.epoch), usage, settings)
    stats = WorkerStats(regions.stats)
    clients = ClientLimiter(
        table, holdings, max_requests=settings.client_max_requests, rate=settings.client_rate,
        burst=settings.client_burst, slots=settings.client_slots,
        trusted=TrustedProxies(settings.trusted_proxies),
    )  # fmt: skip
    app = ProxyApp(
        settings, HASH_KEY, None, accounting, (stats, 0), BackendLoad(table, holdings, stats), clients
    )
    app.snapshot = snapshot(upstream, accounted)
    return app


async def serve_requests(app: ProxyApp, regions: SharedRegions, n: int) -> None:
    loop = asyncio.get_running_loop()
    app.__rsgi_init__(loop)
    ring = UsageRing(regions.usage)
    try:
        for i in range(n):
            proto = _Proto()
            await app.__rsgi__(_Scope(), proto)  # type: ignore[arg-type]
            if proto.status != 200:
                raise RuntimeError(f"request {i} got {proto.status}")
            if i % 1000 == 999:  # the control worker's part: empty the ring
                ring.advance(0, ring.pending(0))
    finally:
        app.__rsgi_del__(loop)


def run(name: str, upstream: str, n: int) -> float:
    """Serve ``n`` requests through configuration ``name``; returns the CPU seconds they took."""
    import uvloop

    # Segments are marked for removal when made: the kernel frees them when this process exits. Until then
    # they and the app stay referenced: the app's wrappers point into the segments, which the collector
    # must never unmap under them.
    regions = SharedRegions.create(RegionSizes(1, 1 << 20, 4096, 4096))
    app = build(name, upstream, regions)
    _KEPT.append((regions, app))
    uvloop.run(serve_requests(app, regions, 200))  # warm: connections, plans, caches
    started = time.process_time()
    uvloop.run(serve_requests(app, regions, n))
    return time.process_time() - started


def upstream_process() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perf.micro_request_path", "--upstream", str(port)], preexec_fn=die_with_parent
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the upstream did not start")


class _Upstream(asyncio.Protocol):
    """Answers every request head it reads (the bench body is small: head and body arrive together)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(RESPONSE)


async def serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Upstream, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    parser.add_argument("-n", type=int, default=20_000, help="requests per timing (default 20,000)")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        asyncio.run(serve_upstream(args.upstream))
        return
    if args.child:
        name, upstream, n = args.child
        run(name, upstream, int(n))
        return
    proc, upstream = upstream_process()
    try:
        if args.instructions:
            print("| configuration | instructions per request | vs bare |")
            print("|---|---:|---:|")
            bare = 0.0
            for name, (label, *_) in CONFIGS.items():
                few, many = (
                    instructions("perf.micro_request_path", "--child", name, upstream, str(n))
                    for n in (1000, 3000)
                )
                per = (many - few) / 2000
                bare = bare or per
                print(f"| {label} | {per:,.0f} | {per / bare - 1:+.1%} |")
        else:
            print("| configuration | CPU µs per request (best of 3) | vs bare |")
            print("|---|---:|---:|")
            bare = 0.0
            for name, (label, *_) in CONFIGS.items():
                per = min(run(name, upstream, args.n) for _ in range(3)) / args.n * 1e6
                bare = bare or per
                print(f"| {label} | {per:.1f} | {per / bare - 1:+.1%} |")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)


if __name__ == "__main__":
    os.environ.setdefault("GATEWAY_LOG_LEVEL", "warning")
    main()
