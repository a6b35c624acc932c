"""Backends' load as one proxy worker sees and changes it: requests in flight per backend, counted in the
host's shared bucket table so that every worker reads the same number; the flow-control gate in front of
each backend; and the engines' figures the host's scraper publishes.

In flight: every attempt on a backend takes a place in that backend's gauge (with the gate's ceiling as
the limit when it has one) and gives it back when the answer has been relayed. Places are noted in the
worker's holdings, so a worker killed with ``kill -9`` loses none (the next worker in its slot releases
them). A backend whose gate is full is passed over for the next target; when every target's gate is full
the request waits — bounded by the backend's ``queue_size`` places across the host and ``queue_timeout``
seconds — and then gets 503 with Retry-After. Waiting wakes on this worker's releases and re-checks every
``POLL`` seconds for other workers'. No I/O beyond the shared mappings; the engine document is re-read by a
background task, never on the request path.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

import orjson

from gateway.errors import GateFull
from gateway.native import BucketTable, PrefixIndex
from gateway.routing.load import EngineState, engine_states
from gateway.shm.bucket_keys import backend_keys
from gateway.shm.holdings import Holdings
from gateway.shm.worker_stats import WorkerStats

if TYPE_CHECKING:
    from gateway.snapshot import Backend, Target

__all__ = ["NO_CEILING", "POLL", "BackendLoad", "Place"]

NO_CEILING = 1 << 40  # a gauge without a gate still counts, under a limit nothing reaches
POLL = 0.02


class Place:
    """One place taken in a backend's gauge; ``BackendLoad.leave`` gives it back (once)."""

    __slots__ = ("key", "note")

    def __init__(self, key: int, note: int) -> None:
        self.key = key
        self.note = note


class BackendLoad:
    def __init__(
        self,
        table: BucketTable | None,
        holdings: Holdings | None,
        stats: WorkerStats | None = None,
        prefix: PrefixIndex | None = None,
    ) -> None:
        self.table = table
        self.holdings = holdings
        self.notes = holdings.words if holdings is not None else None
        self.stats = stats
        self.engines: dict[str, EngineState] = {}
        self.cooling: dict[str, float] = {}  # backend -> monotonic time it may be tried again (passive)
        self.unhealthy = False  # some engine failed its probes
        self._keys: dict[str, tuple[int, int]] = {}
        self._local: dict[str, int] = {}  # without a table (tests): this worker's own counts
        self._freed = asyncio.Event()
        self._waiting = 0  # requests of this worker waiting for a gate
        self._engine_seq = b""
        self._prefix = prefix
        # backend -> [prompt bytes cache_aware sent it, of which the index said it held]: for /metrics
        self.prefixes: dict[str, list[int]] = {}

    def prefix_index(self) -> PrefixIndex | None:
        if self._prefix is None:  # no host segment (a worker under test): this process's own, made once
            self._prefix = PrefixIndex.private()
        return self._prefix

    def note_prefix(self, backend: str, prompt_bytes: int, matched_bytes: int) -> None:
        seen = self.prefixes.get(backend)
        if seen is None:
            seen = self.prefixes[backend] = [0, 0]
        seen[0] += prompt_bytes
        seen[1] += matched_bytes

    # -- Load (gateway.routing.load) -------------------------------------------------------------------
    def in_flight(self, backend: str) -> int:
        if self.table is None:
            return self._local.get(backend, 0)
        return self.table.gauge(self._key(backend)[0])

    def engine(self, backend: str) -> EngineState | None:
        return self.engines.get(backend)

    def available(self, backend: str) -> bool:
        until = self.cooling.get(backend)
        if until is not None:
            if until > time.monotonic():
                return False
            del self.cooling[backend]  # the next request tries it; one more failure takes it out again
        state = self.engines.get(backend)
        return state is None or state.healthy

    def cool(self, backend: str, seconds: float) -> None:
        """Passive health: leave ``backend`` out for ``seconds`` (0: passive health is off)."""
        if seconds:
            self.cooling[backend] = time.monotonic() + seconds

    @property
    def degraded(self) -> bool:
        return self.unhealthy or bool(self.cooling)

    # -- places and gates --------------------------------------------------------------------------------
    def _key(self, backend: str) -> tuple[int, int]:
        keys = self._keys.get(backend)
        if keys is None:
            keys = self._keys[backend] = backend_keys(backend)
        return keys

    def ceiling(self, backend: Backend) -> int:
        if backend.max_concurrency is None:
            return NO_CEILING
        state = self.engines.get(backend.name)
        if state is not None and state.ceiling is not None:
            return max(1, min(state.ceiling, backend.max_concurrency))
        return backend.max_concurrency

    def enter(self, backend: Backend) -> Place | None:
        """A place on ``backend``, or None when its gate is at its ceiling."""
        if self.table is None:
            self._local[backend.name] = self._local.get(backend.name, 0) + 1
            return Place(0, -1)
        return self._take(self._key(backend.name)[0], self.ceiling(backend))

    def leave(self, backend: Backend, place: Place) -> None:
        if self.table is None:
            self._local[backend.name] -= 1
        else:
            self._give(place)
        if self._waiting:
            self._freed.set()
            self._freed = asyncio.Event()

    async def wait(self, targets: list[Target]) -> tuple[Target, Place]:
        """A place on the first of ``targets`` whose gate opens, within the first one's queue bounds."""
        first = targets[0].backend
        queue_key = self._key(first.name)[1]
        queued = self._take(queue_key, first.queue_size) if self.table is not None else None
        if queued is None:
            raise self._refusal(first, "its queue is full")
        self._waiting += 1
        try:
            deadline = time.monotonic() + first.queue_timeout
            while True:
                for target in targets:
                    place = self.enter(target.backend)
                    if place is not None:
                        return target, place
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._refusal(first, f"no place freed within {first.queue_timeout:g} s")
                try:
                    await asyncio.wait_for(self._freed.wait(), min(POLL, left))
                except TimeoutError:
                    pass
        finally:
            self._waiting -= 1
            self._give(queued)

    def _take(self, key: int, limit: int) -> Place | None:
        """One of ``limit`` places on gauge ``key``, noted in a block of this worker's holdings."""
        assert self.table is not None
        holdings = self.holdings
        note = holdings.take() if holdings is not None else -1
        if self.table.enter(key, limit, self.notes, note):
            return Place(key, note)
        if holdings is not None:
            holdings.give(note)
        return None

    def _give(self, place: Place) -> None:
        assert self.table is not None
        self.table.leave(place.key, self.notes, place.note)
        if self.holdings is not None:
            self.holdings.give(place.note)

    @staticmethod
    def _refusal(backend: Backend, why: str) -> GateFull:
        retry = max(1, math.ceil(backend.queue_timeout))
        return GateFull(
            f"the backends for this model are saturated ({why}); retry later",
            headers={"retry-after": str(retry)},
        )

    # -- the engines' document -----------------------------------------------------------------------------
    def refresh_engines(self) -> bool:
        """Re-read the scraper's document when it changed; True when it did."""
        if self.stats is None:
            return False
        raw = self.stats.read(self.stats.engine_slot)
        if raw is None or raw == self._engine_seq:
            return False
        self._engine_seq = raw
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        self.engines = engine_states(doc)
        self.unhealthy = any(not s.healthy for s in self.engines.values())
        return True
