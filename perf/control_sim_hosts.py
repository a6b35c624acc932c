"""The simulated proxy hosts of ``perf.control_sim``, run in a process of their own (``python -m
perf.control_sim_hosts``, started by ``perf.control_sim``), so that what they cost the machine is counted
apart from the control host and PostgreSQL they measure.

N hosts, each with its own keep-alive connection, do what a real proxy host's control slot does over the
cluster API, in its wire format:

- ``GET /cluster/snapshot`` with ``If-None-Match`` every ``poll`` seconds (0.25, the proxies' default);
- ``POST /cluster/usage`` every ``ship`` seconds with the records the host made since its last batch at
  ``rate`` records a second (``records_due``; each record the array a proxy worker encodes,
  ``gateway.usage_record.encode_record``, made from one encoded template per run so that the simulator's
  cost per record stays a fraction of a microsecond);
- ``POST /cluster/report`` every ``report`` seconds (10), with a few scopes of traffic.

Like a real host's control slot, a host sends one request at a time on its connection: a poll that falls
due while a usage batch is in flight goes out when the batch is answered, and a poll whose whole interval
passed meanwhile is skipped. Like a real host's spool, a host keeps every batch until it is answered
``200``: a ``503`` with ``Retry-After`` (``ingest_busy``) has it sent again after that long (spread by a
quarter either way, as ``fleet.remote`` does), any other failure (an error, a lost connection, no answer
within ``timeout``) after a backoff of 0.5 s doubling to 30 s; batches made meanwhile queue behind it.
After the timed run no new records are made and no polls sent, and the hosts send what they still hold
for up to ``drain`` seconds, so that a run can check that every record made was stored once.

Each host is an ``asyncio.Protocol`` on uvloop driven by timer callbacks (no task per host), sending
pre-encoded requests (the poll is the same bytes until the ETag changes) and reading only the status line,
``Content-Length``, ``ETag`` and ``Retry-After`` of the answers (and a usage answer's body, for its count).

Parameters come as JSON in the environment variable ``CONTROL_SIM_HOSTS``; the process writes ``start``
and ``end`` lines to stdout when the measured seconds begin and end (the parent samples CPU then), and
its figures as JSON to the file ``CONTROL_SIM_FIGURES`` names.
I/O: loopback HTTP to the control host, stdout, the figures' file.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import cast

import orjson
import uvloop

from gateway.usage_record import UsageRecord, encode_record

__all__ = ["Figures", "Params", "records_due"]

_POLL, _USAGE, _REPORT = 1, 2, 3  # what a host has in flight (0: nothing)
# uvloop's timers have millisecond resolution and may fire up to a millisecond before their time: work due
# that soon is done now rather than re-armed for a fraction of a millisecond.
_EARLY = 0.002
_RECONNECT = 0.5  # seconds before a host whose connection failed tries again (a real host's first backoff)
_BACKOFF_MAX = 30.0
_BATCH_MAX = 4096  # records per POST at most: a host behind sends what it owes in several batches


@dataclass
class Params:
    port: int
    token: str
    hosts: int
    seconds: float  # measured, after the warm-up
    warmup: float  # seconds of load before the measured ones (the store's pipeline filling up)
    poll: float
    ship: float
    rate: float  # records a second per host
    report: float
    timeout: float
    drain: float
    tag: str  # request ids start with it: the run's records are told apart from every other's
    principal: str  # the principal id the records name


@dataclass
class Figures:
    start: float = 0.0  # monotonic: when the load began, when the measured seconds began and ended
    measured: float = 0.0
    until: float = 0.0
    # (sent, seconds to answer, 1 for a 304 else 0), answered 200 or 304
    polls: list[tuple[float, float, int]] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)  # how late each timer of the simulator's fired
    intended: int = 0
    sent: int = 0
    skipped: int = 0  # polls that fell due while the host waited for an answer, and passed before it came
    not_modified: int = 0
    errors: int = 0  # answers other than 200 (304 for polls, 503 ingest_busy for usage), connections lost
    timeouts: int = 0
    made: int = 0  # records made (all in the timed run)
    accepted: int = 0  # records answered 200, the drain included
    accepted_in_run: int = 0  # of them, those answered within the measured seconds
    batches: list[float] = field(default_factory=list)  # seconds from sent to answered: 200s measured
    busy: int = 0  # batches answered 503 ingest_busy
    busy_records: int = 0
    left: int = 0  # records still held when the drain ran out
    reports: int = 0


def records_due(rate: float, ship: float, k: int) -> int:
    """Records a host has made by its ``k``-th batch (from 1), at ``rate`` a second, a batch every ``ship``
    seconds: the whole part of what the rate gives, so that the batches sum to the rate over the run
    however its fraction falls (0.3 records a batch: 0, 0, 1, 0, 0, 1, ...)."""
    return math.floor(k * rate * ship + 1e-9)


class Simulation:
    """What the hosts share: the parameters, the figures, the request bytes, the run's times."""

    def __init__(self, params: Params) -> None:
        self.p = params
        self.fig = Figures()
        self.head = f"host: 127.0.0.1:{params.port}\r\nauthorization: Bearer {params.token}\r\n".encode()
        self._polls: dict[bytes | None, bytes] = {}
        self.start = self.measured = self.until = self.last_poll = self.drain_until = math.inf
        self.hosts: list[Host] = []
        marker = encode_record(
            UsageRecord(
                "@@ID@@", 0.5, params.principal, "k1", "chat", "a", 200, 12, 16, 0, 28, "reported", 1234,
                0.8, 0.7, None,
            )
        )  # fmt: skip
        self._record = marker.replace(b"%", b"%%").replace(b'"@@ID@@",0.5,', b'"%s",%s,')

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

    def usage_body(self, host: int, seq: int, n: int) -> bytes:
        """A batch of ``n`` records of host ``host``, its ``seq``-th, ending now."""
        ts, form, prefix = repr(time.time()).encode(), self._record, f"{self.p.tag}{host:04x}{seq:06x}"
        return b"[" + b",".join([form % (f"{prefix}{i:04x}".encode(), ts) for i in range(n)]) + b"]"


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (lowercase, with its leading CRLF and colon) in a lowercased head."""
    at = head.find(name)
    if at < 0:
        return None
    end = head.find(b"\r\n", at + len(name))
    return head[at + len(name) : end if end >= 0 else len(head)].strip()


class Host(asyncio.Protocol):
    """One simulated proxy host: its connection to the control plane, its schedule and its spool."""

    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim = sim
        self.index = index
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.etag: bytes | None = None
        self.retry_after: bytes | None = None
        self.buf = bytearray()
        self.kind = 0
        self.sent = 0.0
        self.length = -1  # the answer's body length, -1 until its head is read
        self.body_at = 0
        self.status = 0
        self.batches = 0  # batch times passed (``records_due``'s k)
        self.made = 0
        self.seq = 0
        self.spool: deque[tuple[bytes, int]] = deque()  # (request, records), oldest first
        self.retry_at = 0.0
        self.backoff = _RECONNECT
        self.poll_at = self.ship_at = self.report_at = math.inf
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    async def connect(self) -> None:
        connecting = self.loop.create_connection(lambda: self, "127.0.0.1", self.sim.p.port)
        await asyncio.wait_for(connecting, self.sim.p.timeout)

    def begin(self, start: float) -> None:
        """Start the schedule: this host's first poll, batch and report spread over their intervals."""
        p, share = self.sim.p, self.index / self.sim.p.hosts
        self.poll_at = start + p.poll * share
        self.ship_at = start + p.ship * share if p.rate else math.inf
        self.report_at = start + p.report * share
        self.sim.fig.intended += max(0, math.ceil((self.sim.last_poll - self.poll_at) / p.poll))
        self.pump()

    # -- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.buf.clear()
        self.length = -1
        if self.kind:
            self._failed(time.monotonic())
        if time.monotonic() < self.sim.drain_until:
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
                assert self.transport is not None
                self.transport.abort()  # connection_lost counts it
                return
            self.length = int(length) if length is not None else 0
            self.body_at = end + 4
            if self.kind == _POLL and self.status == 200:
                self.etag = _header(head, b"\r\netag:")
            self.retry_after = _header(head, b"\r\nretry-after:") if self.status == 503 else None
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
        sim, p = self.sim, self.sim.p
        live = now < sim.until
        if not live and (not self.spool or now >= sim.drain_until):
            return
        due = now + _EARLY
        if live and self.poll_at <= due and self.poll_at < sim.last_poll:
            after = _next(self.poll_at, p.poll, now)
            sim.fig.skipped += round((after - self.poll_at) / p.poll) - 1
            self.poll_at = after
            sim.fig.sent += 1
            self._send(_POLL, sim.poll_request(self.etag), now)
            return
        if live and self.ship_at <= due:
            self._make(now)
        if self.spool and self.retry_at <= due:
            self._send(_USAGE, self.spool[0][0], now)
            return
        if live and self.report_at <= due:
            self.report_at = _next(self.report_at, p.report, now)
            report = {
                "host": f"sim-{self.index}",
                "role": "proxy",
                "traffic": {"p:p1": 10, "k:k1": 10},
                "held": {},
            }
            self._send(_REPORT, sim.post_request(b"/cluster/report", orjson.dumps(report)), now)
            return
        at = self.retry_at if self.spool else math.inf
        if live:
            at = min(
                at, self.poll_at if self.poll_at < sim.last_poll else math.inf, self.ship_at, self.report_at
            )
        if at < math.inf:
            self.timer_at = at
            self.timer = self.loop.call_later(max(0.0, at - now), self._wake)

    def _make(self, now: float) -> None:
        """The records made since the last batch time, into the spool (in batches of at most _BATCH_MAX)."""
        p = self.sim.p
        after = _next(self.ship_at, p.ship, now)
        self.batches += round((after - self.ship_at) / p.ship)
        self.ship_at = after
        n = records_due(p.rate, p.ship, self.batches) - self.made
        self.made += n
        self.sim.fig.made += n
        while n > 0:
            part = min(n, _BATCH_MAX)
            n -= part
            self.seq += 1
            body = self.sim.usage_body(self.index, self.seq, part)
            self.spool.append((self.sim.post_request(b"/cluster/usage", body), part))

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
                fig.polls.append((self.sent, now - self.sent, int(status == 304)))
            else:
                fig.errors += 1
        elif kind == _USAGE:
            n = self.spool[0][1]
            try:
                accepted = int(orjson.loads(body)["accepted"]) if status == 200 else 0
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                status = 0
            if status == 200:
                self.spool.popleft()
                self.backoff = _RECONNECT
                fig.accepted += accepted
                if self.sim.measured <= now <= self.sim.until:
                    fig.accepted_in_run += accepted
                if self.sim.measured <= self.sent and now <= self.sim.until:
                    fig.batches.append(now - self.sent)
            elif status == 503 and self.retry_after is not None:
                fig.busy += 1
                fig.busy_records += n
                self.retry_at = now + float(self.retry_after) * random.uniform(0.75, 1.25)
            else:
                fig.errors += 1
                self._back_off(now)
        elif kind == _REPORT:
            if status == 200:
                fig.reports += 1
            else:
                fig.errors += 1
        self.pump()

    def _back_off(self, now: float) -> None:
        self.retry_at = now + self.backoff
        self.backoff = min(self.backoff * 2, _BACKOFF_MAX)

    def timed_out(self, now: float) -> None:
        if self.kind and now - self.sent > self.sim.p.timeout and self.transport is not None:
            self.sim.fig.timeouts += 1
            if self.kind == _USAGE:
                self._back_off(now)  # the batch stays in the spool: the store may have it, and skips it then
            self.kind = 0
            self.transport.abort()  # a late answer would be taken for the next request's: start afresh

    def _failed(self, now: float) -> None:
        self.sim.fig.errors += 1
        if self.kind == _USAGE:
            self._back_off(now)
        self.kind = 0

    async def _reconnect(self) -> None:
        while time.monotonic() < self.sim.drain_until:
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


async def run(params: Params) -> Figures:
    sim = Simulation(params)
    sim.hosts = [Host(sim, i) for i in range(params.hosts)]
    for i in range(0, params.hosts, 100):  # connect in groups: a backlog's worth at a time
        await asyncio.gather(*(host.connect() for host in sim.hosts[i : i + 100]))
    unconnected = sum(host.transport is None for host in sim.hosts)
    if unconnected:
        raise RuntimeError(f"{unconnected} of {params.hosts} hosts have no connection to the control plane")
    sim.start = time.monotonic() + 0.1
    sim.measured = sim.start + params.warmup
    sim.until = sim.measured + params.seconds
    sim.drain_until = sim.until + params.drain
    # The polls intended are those due before the end; a microsecond's margin keeps the last host 0 would
    # send (due at the end itself, give or take a rounding of its sum) out of both the count and the run.
    sim.last_poll = sim.until - 1e-6
    for host in sim.hosts:
        host.begin(sim.start)

    async def sweep() -> None:
        while time.monotonic() < sim.drain_until + params.timeout:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for host in sim.hosts:
                host.timed_out(now)

    sweeper = asyncio.create_task(sweep())
    await asyncio.sleep(max(0.0, sim.measured - time.monotonic()))
    print("start", flush=True)
    await asyncio.sleep(max(0.0, sim.until - time.monotonic()))
    print("end", flush=True)
    # What is in flight, and what the hosts still hold, until the drain runs out.
    while any(host.kind or host.spool for host in sim.hosts) and time.monotonic() < sim.drain_until:
        await asyncio.sleep(0.05)
    sweeper.cancel()
    for host in sim.hosts:
        host.close()
    sim.fig.left = sum(n for host in sim.hosts for _, n in host.spool)
    sim.fig.start, sim.fig.measured, sim.fig.until = sim.start, sim.measured, sim.until
    return sim.fig


def main() -> None:
    params = Params(**orjson.loads(os.environ["CONTROL_SIM_HOSTS"]))
    fig = uvloop.run(run(params))
    # To a file, not down the pipe: the figures run to megabytes, and a line that long once reached the
    # parent cut short.
    with open(os.environ["CONTROL_SIM_FIGURES"], "wb") as f:
        f.write(orjson.dumps(asdict(fig)))


if __name__ == "__main__":
    main()
