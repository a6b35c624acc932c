"""``python -m perf.client_compare``: which upstream HTTP client a granian RSGI proxy should use.

The same minimal proxy (granian's embedded server, RSGI, one process) forwards every request to the
nginx mock engine with (a) ``httpx.AsyncClient`` or (b) ``aiohttp.ClientSession(auto_decompress=False)``;
wrk drives each at 64 connections in turn, and the req/s, latency and CPU µs per request are printed side
by side. It is why httpx stays off the request path; perf/client_micro.py compares aiohttp with our
own client.
I/O: subprocesses (nginx, the proxy under test, wrk), a temp directory, /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perf.loadgen import run_wrk, write_script
from perf.targets import ROOT, NginxService, Service, http_request

__all__ = ["main"]

CLIENTS = ("httpx", "aiohttp")
BODY = b'{"model":"mock-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
HEADERS = {"Content-Type": "application/json"}


class MinimalProxy:
    """RSGI app: read the request body, POST it upstream, answer with the upstream's status and body."""

    def __init__(self, client: str, upstream: str) -> None:
        self.client = client
        self.upstream = upstream
        self.session: Any = None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Called on the serving loop, so the client's pool belongs to the loop that uses it.
        if self.client == "httpx":
            import httpx

            limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
            self.session = httpx.AsyncClient(base_url=self.upstream, limits=limits)
        else:
            import aiohttp

            connector = aiohttp.TCPConnector(limit=0)
            self.session = aiohttp.ClientSession(self.upstream, connector=connector, auto_decompress=False)

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        body = await proto()
        headers = {"content-type": scope.headers.get("content-type") or "application/json"}
        if self.client == "httpx":
            resp = await self.session.post(scope.path, content=body, headers=headers)
            status, data, ctype = resp.status_code, resp.content, resp.headers.get("content-type", "")
        else:
            async with self.session.post(scope.path, data=body, headers=headers) as resp:
                status, data, ctype = resp.status, await resp.read(), resp.headers.get("content-type", "")
        proto.response_bytes(status, [("content-type", ctype)], data)


async def _serve(client: str, port: int, upstream: str) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    server = Server(
        MinimalProxy(client, upstream),
        address="127.0.0.1",
        port=port,
        interface=Interfaces.RSGI,
        backlog=2048,
    )
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
    await server.serve()


class ProxyService(Service):
    """This module re-run with ``--serve CLIENT``: the proxy under test, in its own process."""

    def __init__(self, workdir: Path, client: str, upstream: str) -> None:
        self.name = f"proxy-{client}"
        super().__init__(workdir)
        self.client = client
        self.upstream = upstream

    def start(self) -> ProxyService:
        argv = [sys.executable, "-m", "perf.client_compare", "--serve", self.client]
        self._spawn([*argv, "--port", str(self.port), "--upstream", self.upstream], cwd=ROOT)
        self._wait(
            lambda: http_request(self.port, "POST", "/", BODY, HEADERS)[0] == 200, 15.0, "POST answering 200"
        )
        return self


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="perf-clients-") as tmp:
        workdir = Path(tmp)
        script = write_script(workdir / "chat.lua", BODY, HEADERS)
        upstream = NginxService.upstream(workdir)
        try:
            upstream.start()
            for client in args.clients:
                proxy = ProxyService(workdir, client, upstream.url)
                try:
                    proxy.start()
                    url = proxy.url + "/v1/chat/completions"
                    run_wrk(url, script, args.connections, 1)  # warm-up: connections, pools, caches
                    tree = proxy.tree()
                    before = tree.sample()
                    result = run_wrk(url, script, args.connections, args.duration)
                    cpu = tree.sample().cpu_seconds_since(before)
                finally:
                    proxy.stop()
                rows.append(
                    {"client": client, "cpu_us": cpu * 1e6 / max(result.requests, 1), **result.as_dict()}
                )
        finally:
            upstream.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.client_compare", description=__doc__.split("\n")[0])
    p.add_argument("-d", "--duration", type=int, default=5, help="seconds per client (5)")
    p.add_argument("-c", "--connections", type=int, default=64, help="wrk connections (64)")
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset of httpx,aiohttp")
    p.add_argument("--serve", choices=CLIENTS, help=argparse.SUPPRESS)  # internal: run one proxy
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.port, args.upstream))
        return 0
    args.clients = [c for c in args.clients.split(",") if c in CLIENTS]
    rows = compare(args)
    print(f"minimal granian RSGI proxy, 1 process, wrk -t2 -c{args.connections} -d{args.duration}s\n")
    print("| client | req/s | p50 ms | p99 ms | non-2xx | socket errors | CPU µs/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['client']} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['non_2xx']} "
            f"| {r['socket_errors']} | {r['cpu_us']:.1f} |"
        )
    return 0  # errors are part of the comparison (httpx's timeouts are the finding), not a failure


if __name__ == "__main__":
    sys.exit(main())
