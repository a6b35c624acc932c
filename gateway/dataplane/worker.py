"""Entry point of a forked proxy worker: granian's embeddable server on the shared port.

Every proxy worker binds the same address with SO_REUSEPORT (granian does this on Linux), so the kernel
spreads connections and a dead worker takes only its own connections with it. We run granian's embedded
server rather than its multi-process one because our supervisor must own the fork: it creates the shared
memory first, decides restarts and backoff, and orders the drain (proxies before the control worker).
SIGTERM stops accepting and returns once in-flight requests and streams have finished; the supervisor's
grace period bounds that. I/O: the listening socket.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from granian.constants import Interfaces
from granian.server.embed import Server

from gateway.config import Settings
from gateway.dataplane.app import ProxyApp
from gateway.dataplane.limits import Limiter
from gateway.native import BucketTable
from gateway.shm.snapshot_slot import SnapshotReader

__all__ = ["run_proxy_worker"]

log = logging.getLogger("gateway.dataplane")


def run_proxy_worker(
    settings: Settings, snapshot_buf: memoryview, bucket_buf: memoryview, hash_key: bytes
) -> int:
    app = ProxyApp(settings, hash_key, SnapshotReader(snapshot_buf), Limiter(BucketTable(bucket_buf)))
    asyncio.run(_serve(settings, app))
    return 0


async def _serve(settings: Settings, app: ProxyApp) -> None:
    server = Server(
        app,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.RSGI,
        backpressure=settings.backpressure,
        backlog=2048,
        log_enabled=False,
    )

    def stop() -> None:
        app.draining = True
        server.stop()  # type: ignore[no-untyped-call]

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop)
    await server.serve()
