"""``python -m perf.control_sim --hosts 500``: N simulated proxy hosts against one real control host.

Starts PostgreSQL from Debian's packages (as the tests do) and ``gateway serve --role control`` on it,
then runs N simulated proxy hosts in this process, each with its own keep-alive connection, doing what a
real proxy host's control slot does over the cluster API, in its wire format:

- ``GET /cluster/snapshot`` with ``If-None-Match`` every ``--poll`` seconds (0.25, the proxies' default);
- ``POST /cluster/usage`` every ``--ship`` seconds with ``--records`` usage records (each the array a proxy
  worker encodes, ``gateway.usage_record.encode_record``);
- ``POST /cluster/report`` every ``--report`` seconds (10), with a few scopes of traffic.

Hosts start spread over one poll interval. Prints the polls' latency (p50, p99, max), how many were 304,
errors and timeouts, and the usage records accepted per second. ``--postgres-down S`` stops PostgreSQL for
S seconds in the middle of the run and reports the polls during the outage on their own line: they must be
answered from memory. I/O: subprocesses (PostgreSQL, the gateway), loopback HTTP, temp directories.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from gateway.usage_record import UsageRecord, encode_record


@dataclass
class Figures:
    polls: list[float] = field(default_factory=list)
    polls_down: list[float] = field(default_factory=list)
    not_modified: int = 0
    errors: int = 0
    timeouts: int = 0
    accepted: int = 0
    refused: int = 0


def _records(host: int, seq: int, n: int) -> bytes:
    now = time.time()
    recs = [
        encode_record(
            UsageRecord(
                f"sim{host:04x}{seq:08x}{i:04x}", now, "p1", "k1", "chat", "a", 200, 12, 16, 0, 28,
                "reported", 1234, 0.8, 0.7, None,
            )
        )
        for i in range(n)
    ]  # fmt: skip
    return b"[" + b",".join(recs) + b"]"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def simulate_host(
    index: int, url: str, token: str, args: argparse.Namespace, until: float, down: list[float], fig: Figures
) -> None:
    headers = {"authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection, as a proxy host's httpx client
    async with aiohttp.ClientSession(url, headers=headers, timeout=timeout, connector=connector) as session:
        await asyncio.sleep(args.poll * index / args.hosts)
        etag: str | None = None
        next_ship = time.monotonic() + args.ship * (index / args.hosts)
        next_report = time.monotonic() + args.report * (index / args.hosts)
        seq = 0
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                async with session.get(
                    "/cluster/snapshot", headers={"if-none-match": etag} if etag else {}
                ) as resp:
                    await resp.read()
                    if resp.status == 304:
                        fig.not_modified += 1
                    elif resp.status == 200:
                        etag = resp.headers.get("etag")
                    else:
                        fig.errors += 1
                took = time.monotonic() - started
                (fig.polls_down if down[0] <= started < down[1] else fig.polls).append(took)
            except TimeoutError:
                fig.timeouts += 1
            except aiohttp.ClientError:
                fig.errors += 1
            now = time.monotonic()
            if args.records and now >= next_ship:
                next_ship = now + args.ship
                seq += 1
                try:
                    async with session.post(
                        "/cluster/usage", data=_records(index, seq, args.records)
                    ) as resp:
                        await resp.read()
                        if resp.status == 200:
                            fig.accepted += args.records
                        else:
                            fig.refused += args.records
                except (TimeoutError, aiohttp.ClientError):
                    fig.refused += args.records
            if now >= next_report:
                next_report = now + args.report
                report = {
                    "host": f"sim-{index}",
                    "role": "proxy",
                    "traffic": {"p:p1": 10, "k:k1": 10},
                    "held": {},
                }
                try:
                    async with session.post("/cluster/report", data=orjson.dumps(report)) as resp:
                        await resp.read()
                except (TimeoutError, aiohttp.ClientError):
                    fig.errors += 1
            await asyncio.sleep(max(0.0, args.poll - (time.monotonic() - started)))


async def run(args: argparse.Namespace, url: str, token: str, server: object) -> Figures:
    fig = Figures()
    until = time.monotonic() + args.seconds
    down = [float("inf"), float("inf")]
    tasks = [
        asyncio.create_task(simulate_host(i, url, token, args, until, down, fig)) for i in range(args.hosts)
    ]
    if args.postgres_down:
        await asyncio.sleep((args.seconds - args.postgres_down) / 2)
        down[0] = time.monotonic()
        await asyncio.to_thread(server.stop)  # type: ignore[attr-defined]
        down[0] = time.monotonic()
        down[1] = down[0] + args.postgres_down
        await asyncio.sleep(args.postgres_down)
        await asyncio.to_thread(server.start)  # type: ignore[attr-defined]
    await asyncio.gather(*tasks)
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.control_sim", description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between snapshot polls per host")
    parser.add_argument("--ship", type=float, default=1.0, help="seconds between usage batches per host")
    parser.add_argument("--records", type=int, default=10, help="usage records per batch (0: none)")
    parser.add_argument("--report", type=float, default=10.0, help="seconds between health reports per host")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--postgres-down", type=float, default=0.0, help="seconds of PostgreSQL outage")
    args = parser.parse_args()

    from tests.fixtures.postgres import PostgresServer, _bindir
    from tests.fixtures.processes import Gateway, basic_config, free_port, wait_until

    bindir = _bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed (Debian's postgresql package)")
    tmp = Path(tempfile.mkdtemp(prefix="gateway-control-sim-"))
    server = PostgresServer(bindir, Path(tempfile.mkdtemp(prefix="gateway-control-sim-postgres-")))
    server.start()
    token = secrets.token_urlsafe(24)
    env = {"GATEWAY_CLUSTER_TOKEN": token, "GATEWAY_HASH_KEY": secrets.token_hex(32)}
    admin_port = free_port()
    control = None
    try:
        database = server.url(server.create_database())
        control = Gateway(
            tmp,
            basic_config({"a": "http://127.0.0.1:9"}),
            workers=1,
            extra=("--role", "control", "--admin-port", str(admin_port), "--database", database),
            env=env,
            wait=False,
        )
        url = f"http://127.0.0.1:{admin_port}"
        import httpx

        wait_until(
            lambda: (
                httpx.get(f"{url}/cluster/healthz", headers={"authorization": f"Bearer {token}"}).status_code
                == 200
            ),
            timeout=30,
            what="control plane",
        )
        load = os.getloadavg()[0]
        fig = asyncio.run(run(args, url, token, server))
    finally:
        if control is not None:
            control.stop()
        server.stop()
    polls = fig.polls
    print(
        f"hosts {args.hosts}, {args.seconds:.0f} s, poll every {args.poll} s, {args.records} records every "
        f"{args.ship} s per host; load average at start {load:.2f}"
    )
    print(
        f"polls {len(polls)} ({fig.not_modified} were 304): p50 {_pct(polls, 0.5) * 1000:.1f} ms, "
        f"p99 {_pct(polls, 0.99) * 1000:.1f} ms, max {max(polls, default=0) * 1000:.1f} ms; "
        f"errors {fig.errors}, timeouts {fig.timeouts}"
    )
    if args.postgres_down:
        down = fig.polls_down
        print(
            f"polls while PostgreSQL was down ({args.postgres_down:.0f} s): {len(down)}, "
            f"p50 {_pct(down, 0.5) * 1000:.1f} ms, p99 {_pct(down, 0.99) * 1000:.1f} ms"
        )
    print(
        f"usage records accepted {fig.accepted} ({fig.accepted / args.seconds:,.0f}/s), refused {fig.refused}"
    )


if __name__ == "__main__":
    main()
