"""Entry point of a forked proxy worker: granian's embeddable server on the shared port.

Every proxy worker binds the same address with SO_REUSEPORT (granian does this on Linux), so the kernel
spreads connections and a dead worker takes only its own connections with it. We run granian's embedded
server rather than its multi-process one because our supervisor must own the fork: it creates the shared
memory first, decides restarts and backoff, and orders the drain (proxies before the control worker).
SIGTERM first has every answer say ``Connection: close`` and keeps the listener open for the drain delay
and then while clients still send (``closing``), so that no kept-alive connection is closed under a
request; then it stops accepting and returns once in-flight requests and streams have finished. The
supervisor's grace period bounds that, and what is left of it lets usage records still waiting for ring
space get in.
Its event loop stamps a heartbeat into its statistics slot twice a second; the supervisor replaces a worker
whose stamp is older than ``--heartbeat-timeout``. I/O: the listening socket.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
import time
from collections.abc import Coroutine
from typing import Any

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server

from gateway.config import Settings
from gateway.dataplane.accounting import Accounting
from gateway.dataplane.app import ProxyApp
from gateway.dataplane.backend_load import BackendLoad
from gateway.dataplane.body_log import BodyLog
from gateway.dataplane.budgets import BudgetGuard
from gateway.dataplane.clients import ClientLimiter, TrustedProxies
from gateway.dataplane.closing import stop_accepting, wait_quiet
from gateway.dataplane.limits import Limiter
from gateway.dataplane.usage_log import UsageLog
from gateway.native import AtomicWords, BucketTable, PrefixIndex, SpanRing, UsageRing
from gateway.shm.holdings import Holdings
from gateway.shm.regions import SharedRegions
from gateway.shm.snapshot_slot import SnapshotReader
from gateway.shm.worker_stats import HEARTBEAT_INTERVAL, WorkerStats

__all__ = ["run_proxy_worker"]

log = logging.getLogger("gateway.dataplane")

# When a young collection starts: once this many objects allocated since the last one are still alive.
# With the default 700, the objects of the requests in flight alone (twenty-odd each) passed it at 64
# connections, and a worker ran a young collection every few dozen requests, ~70 µs each, only to find
# every object alive: a request makes no reference cycles. 10,000 is passed only from about 400 requests
# in flight per worker, where a collection then walks at most that many objects (about a millisecond).
YOUNG_OBJECTS = 10_000
# Seconds at most a draining worker that no longer accepts waits for the requests of the connections it
# accepted last (it stops sooner, once none has come for closing.QUIET).
SETTLE = 1.0


def run_loop(kind: str, main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on the event loop ``kind`` names. uvloop by default: granian's threads hand every
    request to the loop with ``call_soon_threadsafe``, and asyncio's selector loop answers each one with a
    write to its self-pipe; measured, uvloop serves 10-20% more requests per worker (perf/README.md,
    "Event loop"). ``asyncio`` stays available, and is used when uvloop cannot be imported."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: running on asyncio's loop")
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def run_proxy_worker(settings: Settings, shared: SharedRegions, index: int, hash_key: bytes) -> int:
    table = BucketTable(shared.buckets)
    holdings = Holdings(AtomicWords(shared.holdings), index)
    released = holdings.recover(table)
    if released:
        log.warning("released %d concurrency places the previous proxy worker %d held", released, index + 1)
    usage = UsageLog(UsageRing(shared.usage), index) if settings.usage_records else None
    limiter = Limiter(table, holdings, shared=settings.role == "proxy", headers=settings.rate_limit_headers)
    bodies = BodyLog(SpanRing(shared.bodies), index) if shared.bodies is not None else None
    accounting = Accounting(limiter, BudgetGuard(table, shared.epoch), usage, settings, bodies)
    stats = WorkerStats(shared.stats)
    load = BackendLoad(
        table, holdings, stats, PrefixIndex(shared.prefix) if shared.prefix is not None else None
    )
    clients = ClientLimiter(
        table,
        holdings,
        max_requests=settings.client_max_requests,
        rate=settings.client_rate,
        burst=settings.client_burst,
        slots=settings.client_slots,
        trusted=TrustedProxies(settings.trusted_proxies),
    )
    app = ProxyApp(
        settings, hash_key, SnapshotReader(shared.snapshot), accounting, (stats, index), load, clients
    )
    raise_file_limit(settings.backpressure)
    # Everything alive now (modules, the app, what the fork inherited) lives as long as the worker: move it
    # out of the collector's sight, so that full collections walk only what requests allocate. Measured:
    # without this, full collections cost about a fifth of a small request's throughput.
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])
    pin_to_core(settings, index)
    run_loop(settings.event_loop, _serve(settings, app, usage, (stats, index)))
    return 0


def head_timeout_ms(seconds: float) -> int:
    """granian's header read timeout for ``--head-timeout``; 0 (or less) turns it off, which hyper does
    not offer, so it becomes a day."""
    return int(seconds * 1000) if seconds > 0 else 86_400_000


def raise_file_limit(connections: int) -> int:
    """Raise this worker's soft RLIMIT_NOFILE toward its hard limit so that ``connections`` client sockets
    (``--backpressure``) plus the upstream ones fit; returns the soft limit now. Below that, accept fails
    with EMFILE long before granian's cap, and a flood of idle connections starves everyone else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 4096  # upstream connections, the listener, shared memory, logs
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit to %d: %s", want, exc)
    if soft != resource.RLIM_INFINITY and soft < connections:
        log.warning(
            "open-files limit %d is below --backpressure %d: raise LimitNOFILE (systemd) or ulimit -n",
            soft,
            connections,
        )
    return soft


def pin_to_core(settings: Settings, index: int) -> int | None:
    """Pin this worker to one core, before granian starts its threads (they inherit it); returns the core.

    Each request crosses threads several times (granian's runtime thread reads it, its blocking thread
    hands it to the event loop, the body and the answer cross back), and for a small answer a hand-over
    within one core is cheaper than one that wakes another. A stream is the other way round: granian's
    thread writes each chunk while the loop reads the next, which needs two cores. Measured
    (perf/README.md): pinned, small answers gain a few percent of req/s and 256-token streams lose ~10%
    of streams/s, so it is off unless asked for. Only where the worker may run on several cores."""
    mode = settings.cpu_affinity
    if mode not in ("auto", "on", "off"):
        log.warning("unknown cpu affinity %r (auto, on or off): taking off, the default", mode)
        mode = "off"
    if mode == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or (mode == "auto" and settings.workers != len(cores)):
        return None
    core = cores[index % len(cores)]
    try:
        os.sched_setaffinity(0, {core})
    except OSError as exc:
        log.warning("could not pin proxy worker %d to core %d: %s", index + 1, core, exc)
        return None
    return core


async def _beat(stats: WorkerStats, index: int) -> None:
    """Stamp this worker's heartbeat from its event loop, so that a worker whose loop stops (a stopped
    process, a wedged loop) stops stamping and the supervisor replaces it. One task for the worker's
    life, twice a second: nothing on the request path."""
    pid = os.getpid()
    while True:
        stats.beat(index, pid, time.monotonic())
        await asyncio.sleep(HEARTBEAT_INTERVAL)


async def _serve(
    settings: Settings, app: ProxyApp, usage: UsageLog | None, slot: tuple[WorkerStats, int]
) -> None:
    server = Server(
        app,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.RSGI,
        backpressure=settings.backpressure,
        backlog=2048,
        # HTTP/1.1 only: with granian's default (auto, which also takes h2c prior knowledge) a connection
        # that never sends a byte is never closed; in http1 mode hyper's header read timer runs from
        # accept, so silent and dribbling connections are both cut at head_timeout. The gateway sits behind
        # a load balancer or clients that speak HTTP/1.1; h2c is not offered.
        http=HTTPModes.http1,
        http1_settings=HTTP1Settings(header_read_timeout=head_timeout_ms(settings.head_timeout)),
        log_enabled=False,
    )
    stopping_since: list[float] = []
    winding: list[asyncio.Task[None]] = []

    async def wind_down() -> None:
        # /readyz answers 503 and every answer says Connection: close from now on. The listener stays
        # open for the drain delay so that a load balancer has time to notice and stop sending, then while
        # clients still send on kept-alive connections (each is told to close by its next answer), so that
        # granian's stop, which closes the idle ones at once, closes none under a request.
        app.draining = True
        await asyncio.sleep(settings.drain_delay)
        left = max(0.0, settings.grace_period - settings.drain_delay) / 2  # half left for in-flight work
        left -= await wait_quiet(app, min(settings.drain_window, left))
        # Then no new connection, and a moment for those just accepted to bring their requests: hyper
        # closes a connection whose request it has not read yet as soon as granian stops.
        if stop_accepting(settings.port):
            await wait_quiet(app, min(SETTLE, max(0.0, left)))
        else:
            log.warning("could not stop the listener from accepting: connections opened now may be cut")
        server.stop()  # type: ignore[no-untyped-call]  # granian's embedded server has no annotations

    def stop() -> None:
        if not stopping_since:
            stopping_since.append(time.monotonic())
            winding.append(loop.create_task(wind_down()))

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop)
    heartbeat = loop.create_task(_beat(*slot))
    await server.serve()
    heartbeat.cancel()
    if usage is not None and usage.backlog:
        spent = time.monotonic() - stopping_since[0] if stopping_since else 0.0
        await usage.drain(max(1.0, settings.grace_period - spent - 1.0))
