"""``python -m perf.client_micro``: CPU µs per request of aiohttp's client versus ``UpstreamClient``.

Both clients, in turn and in this one process, POST a small JSON body to the nginx mock engine (one nginx
worker answering a fixed 284-byte completion) over keep-alive connections: first one request at a time,
then ``--concurrency`` at a time. The figure is this process's CPU time (``time.process_time``, user +
system) divided by the number of requests, so nginx's own work is not in it. The clients are configured
as the gateway configures them (aiohttp: ``auto_decompress=False``, no cookie jar, the same skipped
headers) and read the whole body, as the gateway's relay does for a response with a length.

I/O: an nginx subprocess on a loopback port and a temp directory, both removed at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from perf.targets import NginxService

__all__ = ["main"]

BODY = b'{"model":"mock-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
HEADERS = [("content-type", "application/json"), ("user-agent", "client-micro")]

Send = Callable[[], Awaitable[int]]


async def _aiohttp_sender(url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    target = url + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=30)

    async def send() -> int:
        async with asyncio.timeout(35):  # what forward.py wrapped every aiohttp request in
            resp = await session.request(
                "POST", target, data=BODY, headers=dict(HEADERS), allow_redirects=False, timeout=timeout
            )
        try:
            await resp.read()
        finally:
            resp.release()
        return resp.status

    return send, session.close


async def _lean_sender(url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    from gateway.dataplane.http_client import UpstreamClient

    client = UpstreamClient()

    async def send() -> int:
        resp = await client.request(
            url,
            "POST",
            "/v1/chat/completions",
            HEADERS,
            BODY,
            connect_timeout=5,
            first_byte_timeout=30,
            read_timeout=30,
        )
        try:
            await resp.read()
        finally:
            resp.release()
        return resp.status

    return send, client.close


async def _measure(send: Send, requests: int, concurrency: int) -> tuple[float, float]:
    """(CPU µs per request, requests per wall second)."""
    per_worker = requests // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            if await send() != 200:
                raise RuntimeError("non-200 answer from the mock engine")

    await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up: open the connections
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = per_worker * concurrency
    return cpu / done * 1e6, done / wall


async def _run(url: str, requests: int, concurrency: int, rounds: int) -> None:
    makers = {"aiohttp": _aiohttp_sender, "UpstreamClient": _lean_sender}
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):  # interleaved, so background load hits both alike
        for name, make in makers.items():
            send, close = await make(url)
            try:
                for conc in (1, concurrency):
                    results.setdefault((name, conc), []).append(await _measure(send, requests, conc))
            finally:
                await close()
    print(f"{'client':<16}{'concurrency':>12}{'CPU µs/req (best)':>20}{'req/s (best)':>14}")
    for (name, conc), runs in results.items():
        cpu = min(r[0] for r in runs)
        rate = max(r[1] for r in runs)
        print(f"{name:<16}{conc:>12}{cpu:>20.1f}{rate:>14.0f}")
    for conc in (1, concurrency):
        a = min(r[0] for r in results[("aiohttp", conc)])
        b = min(r[0] for r in results[("UpstreamClient", conc)])
        print(f"concurrency {conc}: aiohttp / UpstreamClient CPU per request = {a / b:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", "--requests", type=int, default=4000, help="requests per measurement")
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="client-micro-"))
    upstream = NginxService.upstream(tmp).start()
    try:
        coro = _run(upstream.url, args.requests, args.concurrency, args.rounds)
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(coro)
        else:
            asyncio.run(coro)
    finally:
        upstream.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
