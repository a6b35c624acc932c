"""The proxy worker's end of the usage pipeline: one record per forwarded request into this worker's
ring in shared memory, which the control worker drains into the store.

Pushing is one C call that copies a few hundred bytes; it never blocks and never does I/O. When the ring
is full (the control worker is restarting, or the database is slow) records wait in a local backlog that
a background task moves into the ring as space frees up, oldest first, so nothing is lost unless the
backlog itself overflows (``BACKLOG_LIMIT`` records, logged and counted). On shutdown the worker gives the
backlog its grace period to drain. I/O: none.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque

from gateway.native import UsageRing

__all__ = ["UsageLog"]

log = logging.getLogger("gateway.dataplane")

BACKLOG_LIMIT = 1_000_000
FLUSH_INTERVAL = 0.05


class UsageLog:
    def __init__(self, ring: UsageRing, index: int) -> None:
        self.ring = ring
        self.index = index
        self.backlog: deque[bytes] = deque()
        self.lost = 0
        # Request ids: 64 random bits per worker process, then a counter. Unique across restarts and hosts
        # without coordination, and cheap: no system call per request.
        self._prefix = secrets.token_hex(8)
        self._counter = 0

    def request_id(self) -> str:
        self._counter += 1
        return f"{self._prefix}{self._counter:08x}"

    def push(self, record: bytes) -> None:
        if not self.backlog and self.ring.push(self.index, record):
            return
        if len(self.backlog) >= BACKLOG_LIMIT:
            self.lost += 1
            if self.lost == 1 or self.lost % 10_000 == 0:
                log.error("usage backlog full: %d usage records lost so far", self.lost)
            return
        self.backlog.append(record)

    def flush(self) -> int:
        """Move what fits from the backlog into the ring; returns how many records are still waiting."""
        backlog, ring, index = self.backlog, self.ring, self.index
        while backlog and ring.push(index, backlog[0]):
            backlog.popleft()
        return len(backlog)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            if self.backlog:
                self.flush()

    async def drain(self, timeout: float) -> None:
        """On shutdown: wait up to ``timeout`` seconds for the backlog to fit into the ring."""
        deadline = time.monotonic() + timeout
        while self.flush() and time.monotonic() < deadline:
            await asyncio.sleep(FLUSH_INTERVAL)
        if self.backlog:
            log.error("shutting down with %d usage records that did not fit the ring", len(self.backlog))
