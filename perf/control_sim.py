"""``python -m perf.control_sim --hosts 500``: N simulated proxy hosts against one real control host.

Starts PostgreSQL from Debian's packages (as the tests do) and ``gateway serve --role control`` on it,
then runs N simulated proxy hosts in this process, each with its own keep-alive connection, doing what a
real proxy host's control slot does over the cluster API, in its wire format:

- ``GET /cluster/snapshot`` with ``If-None-Match`` every ``--poll`` seconds (0.25, the proxies' default);
- ``POST /cluster/usage`` every ``--ship`` seconds with ``--records`` usage records (each the array a proxy
  worker encodes, ``gateway.usage_record.encode_record``, encoded when the batch is sent);
- ``POST /cluster/report`` every ``--report`` seconds (10), with a few scopes of traffic.

Like a real host's control slot, a host sends one request at a time on its connection: a poll that falls
due while a usage batch is in flight goes out when the batch is answered, and a poll whose whole interval
passed meanwhile is skipped. Each host is an ``asyncio.Protocol`` on uvloop driven by timer callbacks
(no task per host), sending pre-encoded requests (the poll is the same bytes until the ETag changes) and
reading only the status line, ``Content-Length`` and ``ETag`` of the answers (the body of a usage answer
too, for its count), so that the simulator costs the machine as little as it can: on the same cores as
the control host, whatever it spends is taken from the thing it measures.

Hosts connect before the timed run and start spread over one interval. Prints the polls' latency (p50,
p99, max) from request sent to answer read, polls done against polls intended (a simulator that falls
behind says so), how late the simulator's own timers fired (its event loop's delay, which every latency
it measures includes), 304s, errors and timeouts, the usage records accepted per second, and the CPU
seconds that the simulator, the control host, PostgreSQL and the rest of the machine used over the run.
``--postgres-down S`` stops PostgreSQL for S seconds in the middle of the run and reports the polls sent
during the outage on their own line: they must be answered from memory.
I/O: subprocesses (PostgreSQL, the gateway), loopback HTTP, temp directories, /proc (CPU accounting).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import orjson
import uvloop

from gateway.usage_record import UsageRecord, encode_record

if TYPE_CHECKING:
    from tests.fixtures.postgres import PostgresServer

_POLL, _USAGE, _REPORT = 1, 2, 3  # what a host has in flight (0: nothing)
# uvloop's timers have millisecond resolution and may fire up to a millisecond before their time: work due
# that soon is done now rather than re-armed for a fraction of a millisecond.
_EARLY = 0.002
_RECONNECT = 0.5  # seconds before a host whose connection failed tries again (a real host's first backoff)


@dataclass
class Figures:
    polls: list[float] = field(default_factory=list)  # seconds from sent to answered, 200 or 304
    polls_down: list[float] = field(default_factory=list)  # the same, sent while PostgreSQL was down
    lag: list[float] = field(default_factory=list)  # how late each timer of the simulator's fired
    intended: int = 0
    sent: int = 0
    skipped: int = 0  # polls that fell due while the host waited for an answer, and passed before it came
    not_modified: int = 0
    errors: int = 0  # answers other than 200 (304 for polls), connections refused or lost mid-answer
    timeouts: int = 0
    accepted: int = 0
    refused: int = 0  # records in batches answered other than 200, or not answered in time
    reports: int = 0


class Simulation:
    """What the hosts share: the arguments, the figures, the request bytes, the run's times."""

    def __init__(self, args: argparse.Namespace, port: int, token: str) -> None:
        self.args = args
        self.port = port
        self.fig = Figures()
        self.head = f"host: 127.0.0.1:{port}\r\nauthorization: Bearer {token}\r\n".encode()
        self._polls: dict[bytes | None, bytes] = {}
        self.start = self.until = self.last_poll = math.inf
        self.down = (math.inf, math.inf)  # when PostgreSQL was stopped and when it was back (monotonic)
        self.hosts: list[Host] = []

    def poll_request(self, etag: bytes | None) -> bytes:
        request = self._polls.get(etag)
        if request is None:
            match = b"if-none-match: " + etag + b"\r\n" if etag else b""
            request = b"GET /cluster/snapshot HTTP/1.1\r\n" + self.head + match + b"\r\n"
            self._polls[etag] = request
        return request

    def post_request(self, path: bytes, body: bytes) -> bytes:
        return b"".join(
            (
                b"POST ", path, b" HTTP/1.1\r\n", self.head,
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body), body,
            )
        )  # fmt: skip


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (lowercase, with its leading CRLF and colon) in a lowercased head."""
    at = head.find(name)
    if at < 0:
        return None
    end = head.find(b"\r\n", at + len(name))
    return head[at + len(name) : end if end >= 0 else len(head)].strip()


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


class Host(asyncio.Protocol):
    """One simulated proxy host: its connection to the control plane and its schedule."""

    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim = sim
        self.index = index
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.etag: bytes | None = None
        self.buf = bytearray()
        self.kind = 0
        self.sent = 0.0
        self.length = -1  # the answer's body length, -1 until its head is read
        self.body_at = 0
        self.status = 0
        self.seq = 0
        self.poll_at = self.ship_at = self.report_at = math.inf
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    async def connect(self) -> None:
        connecting = self.loop.create_connection(lambda: self, "127.0.0.1", self.sim.port)
        await asyncio.wait_for(connecting, self.sim.args.timeout)

    def begin(self, start: float) -> None:
        """Start the schedule: this host's first poll, batch and report spread over their intervals."""
        args, share = self.sim.args, self.index / self.sim.args.hosts
        self.poll_at = start + args.poll * share
        self.ship_at = start + args.ship * share if args.records else math.inf
        self.report_at = start + args.report * share
        self.sim.fig.intended += max(0, math.ceil((self.sim.last_poll - self.poll_at) / args.poll))
        self.pump()

    # -- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.buf.clear()
        self.length = -1
        if self.kind:
            self._failed()
        if time.monotonic() < self.sim.until:
            self.loop.create_task(self._reconnect())

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.length < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            self.status = int(head[9:12])
            length = _header(head, b"\r\ncontent-length:")
            if length is None and self.status not in (204, 304):
                # granian answers every route of the cluster API with a Content-Length; anything else is a
                # fault of the server's that the count should show, not a body to guess the end of.
                self.sim.fig.errors += 1
                self.kind = 0
                assert self.transport is not None
                self.transport.abort()
                return
            self.length = int(length) if length is not None else 0
            self.body_at = end + 4
            if self.kind == _POLL and self.status == 200:
                self.etag = _header(head, b"\r\netag:")
        end = self.body_at + self.length
        if len(buf) < end:
            return
        body = bytes(buf[self.body_at : end]) if self.kind == _USAGE else b""
        del buf[:end]
        self.length = -1
        self._answered(time.monotonic(), body)

    # -- the schedule -------------------------------------------------------------------------------------
    def pump(self) -> None:
        """Send what is due, or arm the timer for when something will be."""
        if self.kind or self.transport is None:
            return
        now = time.monotonic()
        if now >= self.sim.until:
            return
        due, args, sim = now + _EARLY, self.sim.args, self.sim
        if self.poll_at <= due and self.poll_at < sim.last_poll:
            after = _next(self.poll_at, args.poll, now)
            sim.fig.skipped += round((after - self.poll_at) / args.poll) - 1
            self.poll_at = after
            sim.fig.sent += 1
            self._send(_POLL, sim.poll_request(self.etag), now)
        elif self.ship_at <= due:
            self.ship_at = _next(self.ship_at, args.ship, now)
            self.seq += 1
            self._send(
                _USAGE, sim.post_request(b"/cluster/usage", _records(self.index, self.seq, args.records)), now
            )
        elif self.report_at <= due:
            self.report_at = _next(self.report_at, args.report, now)
            report = {
                "host": f"sim-{self.index}",
                "role": "proxy",
                "traffic": {"p:p1": 10, "k:k1": 10},
                "held": {},
            }
            self._send(_REPORT, sim.post_request(b"/cluster/report", orjson.dumps(report)), now)
        else:
            self.timer_at = min(self.poll_at, self.ship_at, self.report_at)
            self.timer = self.loop.call_later(self.timer_at - now, self._wake)

    def _wake(self) -> None:
        self.sim.fig.lag.append(max(0.0, time.monotonic() - self.timer_at))
        self.timer = None
        self.pump()

    def _send(self, kind: int, request: bytes, now: float) -> None:
        assert self.transport is not None
        self.kind, self.sent = kind, now
        self.transport.write(request)

    def _answered(self, now: float, body: bytes) -> None:
        fig, kind, status = self.sim.fig, self.kind, self.status
        self.kind = 0
        if kind == _POLL:
            if status in (200, 304):
                fig.not_modified += status == 304
                down = self.sim.down
                (fig.polls_down if down[0] <= self.sent < down[1] else fig.polls).append(now - self.sent)
            else:
                fig.errors += 1
        elif kind == _USAGE:
            try:
                fig.accepted += int(orjson.loads(body)["accepted"]) if status == 200 else 0
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                status = 0
            if status != 200:
                fig.refused += self.sim.args.records
        elif kind == _REPORT:
            if status == 200:
                fig.reports += 1
            else:
                fig.errors += 1
        self.pump()

    def timed_out(self, now: float) -> None:
        if self.kind and now - self.sent > self.sim.args.timeout and self.transport is not None:
            self.sim.fig.timeouts += 1
            if self.kind == _USAGE:
                self.sim.fig.refused += self.sim.args.records
            self.kind = 0
            self.transport.abort()  # a late answer would be taken for the next request's: start afresh

    def _failed(self) -> None:
        self.sim.fig.errors += 1
        if self.kind == _USAGE:
            self.sim.fig.refused += self.sim.args.records
        self.kind = 0

    async def _reconnect(self) -> None:
        while time.monotonic() < self.sim.until:
            try:
                await self.connect()
            except OSError:  # TimeoutError too
                self.sim.fig.errors += 1
                await asyncio.sleep(_RECONNECT)
                continue
            self.pump()
            return

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()


def _next(at: float, every: float, now: float) -> float:
    """The next time after ``at`` on its schedule that is not already past: a late host skips, not bunches."""
    at += every
    if at < now:
        at += math.ceil((now - at) / every) * every
    return at


# -- CPU accounting ---------------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float]:
    """The parent pid and the CPU seconds (user and system) of process ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read()
    fields = text[text.rindex(b")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named root process and all its descendants alive now."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stats[int(name)] = _proc_stat(int(name))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[str, float] = {}
    for label, root in roots.items():
        todo, total = [root], 0.0
        while todo:
            pid = todo.pop()
            total += stats.get(pid, (0, 0.0))[1]
            todo += children.get(pid, [])
        totals[label] = total
    return totals


def machine_cpu() -> float:
    """CPU seconds all cores have spent busy since boot (not idle, not waiting on I/O)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _TICK


@dataclass
class CpuUse:
    seconds: float  # wall-clock seconds the accounting covers
    simulator: float
    control: float
    postgres: float
    machine: float


async def run(
    args: argparse.Namespace,
    port: int,
    token: str,
    roots: Callable[[], dict[str, int]],
    server: PostgresServer,
) -> tuple[Figures, CpuUse]:
    sim = Simulation(args, port, token)
    sim.hosts = [Host(sim, i) for i in range(args.hosts)]
    for i in range(0, args.hosts, 100):  # connect in groups: a backlog's worth at a time
        await asyncio.gather(*(host.connect() for host in sim.hosts[i : i + 100]))
    unconnected = sum(host.transport is None for host in sim.hosts)
    if unconnected:
        raise RuntimeError(f"{unconnected} of {args.hosts} hosts have no connection to the control plane")
    sim.start = time.monotonic() + 0.1
    sim.until = sim.start + args.seconds
    # The polls intended are those due before the end; a microsecond's margin keeps the last host 0 would
    # send (due at the end itself, give or take a rounding of its sum) out of both the count and the run.
    sim.last_poll = sim.until - 1e-6
    for host in sim.hosts:
        host.begin(sim.start)

    async def sweep() -> None:
        while time.monotonic() < sim.until + args.timeout:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for host in sim.hosts:
                host.timed_out(now)

    sweeper = asyncio.create_task(sweep())
    before, own, busy, started = process_cpu(roots()), os.times(), machine_cpu(), time.monotonic()
    if args.postgres_down:
        await asyncio.sleep((args.seconds - args.postgres_down) / 2)
        sim.down = (time.monotonic(), math.inf)  # polls sent while it stops count as sent during the outage
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(args.postgres_down)
        sim.down = (sim.down[0], time.monotonic())
        await asyncio.to_thread(server.start)
    await asyncio.sleep(max(0.0, sim.until - time.monotonic()))
    after, own_after, busy_after = process_cpu(roots()), os.times(), machine_cpu()
    cpu = CpuUse(
        time.monotonic() - started,
        own_after.user + own_after.system - own.user - own.system,
        after["control"] - before["control"],
        after["postgres"] - before["postgres"],
        busy_after - busy,
    )
    while any(host.kind for host in sim.hosts) and time.monotonic() < sim.until + args.timeout:
        await asyncio.sleep(0.05)  # the answers still in flight
    sweeper.cancel()
    for host in sim.hosts:
        host.close()
    return sim.fig, cpu


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: list[float]) -> str:
    p50, p99, top = _pct(values, 0.5), _pct(values, 0.99), max(values, default=0.0)
    return f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {top * 1000:.1f} ms"


def report(args: argparse.Namespace, fig: Figures, cpu: CpuUse, load: tuple[float, float]) -> None:
    polls = fig.polls
    done = len(polls) + len(fig.polls_down)
    print(
        f"hosts {args.hosts}, {args.seconds:.0f} s, poll every {args.poll} s, {args.records} records every "
        f"{args.ship} s per host; load average {load[0]:.2f} at start, {load[1]:.2f} at end"
    )
    print(
        f"polls done {done} of {fig.intended} intended ({done / max(1, fig.intended):.0%}), {fig.sent} sent, "
        f"{fig.skipped} skipped (due while the host waited for an earlier answer), {fig.not_modified} "
        f"were 304: {'with PostgreSQL up ' if args.postgres_down else ''}{_ms(polls)}; errors {fig.errors}, "
        f"timeouts {fig.timeouts}"
    )
    if args.postgres_down:
        print(
            f"polls sent while PostgreSQL was down ({args.postgres_down:.0f} s): {len(fig.polls_down)}, "
            f"{_ms(fig.polls_down)}"
        )
    print(f"simulator's timers fired late by {_ms(fig.lag)} (its own event loop's delay)")
    print(
        f"usage records accepted {fig.accepted} ({fig.accepted / args.seconds:,.0f}/s), "
        f"refused {fig.refused}; reports answered {fig.reports}"
    )
    per_poll = 1e6 / max(1, done)
    # /proc/stat and the processes' own counters tick apart: a quiet machine's rest may come out a few
    # tenths of a second below zero.
    rest = max(0.0, cpu.machine - cpu.simulator - cpu.control - cpu.postgres)
    print(
        f"CPU seconds over {cpu.seconds:.1f} s on {os.cpu_count()} cores: simulator {cpu.simulator:.1f} "
        f"({cpu.simulator / cpu.seconds:.0%} of a core, {cpu.simulator * per_poll:.0f} µs per poll), "
        f"control host {cpu.control:.1f} ({cpu.control / cpu.seconds:.0%}, "
        f"{cpu.control * per_poll:.0f} µs per poll), "
        f"PostgreSQL {cpu.postgres:.1f}, the rest of the machine {rest:.1f}"
        + (" (PostgreSQL's omits the processes the outage stopped)" if args.postgres_down else "")
    )


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
        gateway_pid = control.proc.pid

        def roots() -> dict[str, int]:  # PostgreSQL's pid changes when the outage restarts it
            assert server.proc is not None
            return {"control": gateway_pid, "postgres": server.proc.pid}

        load = os.getloadavg()[0]
        fig, cpu = uvloop.run(run(args, admin_port, token, roots, server))
        load_end = os.getloadavg()[0]
    finally:
        if control is not None:
            control.stop()
        server.stop()
    report(args, fig, cpu, (load, load_end))


if __name__ == "__main__":
    main()
