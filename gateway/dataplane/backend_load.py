"""Backends' load as one proxy worker sees and changes it: requests in flight per backend, counted in the
host's shared bucket table so that every worker reads the same number; the flow-control gate in front of
each backend; and the engines' figures the host's scraper publishes.

In flight: every attempt on a backend takes a place in that backend's gauge (with the gate's ceiling as
the limit when it has one) and gives it back when the answer has been relayed. Places are noted in the
worker's holdings, so a worker killed with ``kill -9`` loses none (the next worker in its slot releases
them). A backend is saturated when its gate is at its ceiling, or when its engine's last scrape showed the
KV cache at or above ``kv_high_water`` while this host has requests in flight on it; a saturated backend
is passed over for the next target.

When every target is saturated the request waits in this worker's flow queue (``gateway.dataplane.flow``:
strict priority between classes, weighted fair queueing between principals), bounded by the first
target's ``queue_size`` places across the host and its ``queue_timeout`` seconds. A place freed by this
worker dispatches the head of the queue at once; other workers' releases are found by a poll every
``POLL`` seconds while anything waits. At dispatch the waiter's targets are re-ordered (its ``reorder``
callable, else as given) and the first open gate wins. A full queue sheds its newest sheddable waiter for
a newcomer of a higher class, or refuses the newcomer: 429 with Retry-After either way, as for a wait
that ran out. While requests of any worker wait for a backend (its per-class waiting gauges, which also
let a worker leave a freed place to another worker's waiter of a higher class), newcomers of their class
or a lower one queue behind them rather than take a place that frees. A backend's ``reserved_places`` are
kept from sheddable requests: one takes a place only while more than that many are free, so that a
standard or critical request arriving at a fleet that sheddable traffic fills finds a place at once.
While nothing waits, ``enter`` makes one test of this worker's queue and, for a gated backend, reads the
waiting gauges of its class and those above it (one to three C calls).
No I/O beyond the shared mappings; the engine document is re-read by a background task, never on the
request path.
"""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import orjson

from gateway.dataplane.flow import PRIORITIES, SHEDDABLE, STANDARD, WAIT_BUCKETS, FlowQueue, Waiter
from gateway.errors import GateFull
from gateway.native import BucketTable, PrefixIndex
from gateway.routing.load import EngineState, engine_states
from gateway.shm.bucket_keys import backend_keys, flow_keys
from gateway.shm.holdings import Holdings
from gateway.shm.worker_stats import WorkerStats

if TYPE_CHECKING:
    from gateway.snapshot import Backend, Target

__all__ = ["NO_CEILING", "POLL", "BackendLoad", "FlowStats", "Place"]

NO_CEILING = 1 << 40  # a gauge without a gate still counts, under a limit nothing reaches
POLL = 0.02
# Why flow control refused a request (the refusal counter's ``reason`` label).
QUEUE_FULL, TIMED_OUT, SHED = "queue_full", "timeout", "shed"


class Place:
    """One place taken in a backend's gauge; ``BackendLoad.leave`` gives it back (once)."""

    __slots__ = ("key", "note")

    def __init__(self, key: int, note: int) -> None:
        self.key = key
        self.note = note


Reorder = Callable[[Sequence["Target"]], Sequence["Target"]]


class _Wait:
    """What a waiting request waits with: its targets, its future, its host-wide queue place."""

    __slots__ = ("classed", "future", "names", "queued", "reorder", "since", "targets")

    def __init__(
        self, targets: Sequence[Target], reorder: Reorder | None, future: asyncio.Future[tuple[Target, Place]]
    ) -> None:
        self.targets = targets
        self.names = frozenset(t.backend.name for t in targets)
        self.reorder = reorder
        self.future = future
        self.queued: Place | None = None
        self.classed: list[Place] = []  # its places in each backend's host-wide gauge of its class
        self.since = time.monotonic()


class FlowStats:
    """This worker's flow-control figures per priority, for its statistics document."""

    def __init__(self) -> None:
        self.dispatched = [0] * len(PRIORITIES)
        self.refused: dict[tuple[int, str], int] = {}
        self.wait_counts = [[0] * len(WAIT_BUCKETS) for _ in PRIORITIES]  # per bucket, not cumulative
        self.wait_sum = [0.0] * len(PRIORITIES)

    def waited(self, priority: int, seconds: float) -> None:
        self.dispatched[priority] += 1
        self.wait_sum[priority] += seconds
        i = bisect_left(WAIT_BUCKETS, seconds)
        if i < len(WAIT_BUCKETS):
            self.wait_counts[priority][i] += 1

    def refuse(self, priority: int, reason: str) -> None:
        self.refused[priority, reason] = self.refused.get((priority, reason), 0) + 1

    def as_dict(self, depth: list[int]) -> dict[str, dict[str, object]]:
        return {
            name: {
                "depth": depth[c],
                "dispatched": self.dispatched[c],
                "refused": {r: n for (p, r), n in self.refused.items() if p == c},
                "wait": {"counts": self.wait_counts[c], "sum": self.wait_sum[c]},
            }
            for c, name in enumerate(PRIORITIES)
        }


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
        self.flow: FlowQueue[_Wait] = FlowQueue()
        self.flow_stats = FlowStats()
        self._queued_on: dict[str, int] = {}  # backend -> this worker's waiters that name it
        self._classed: dict[tuple[str, int], int] = {}  # (backend, class) -> this worker's waiters
        self._flows: dict[str, tuple[int, int, int]] = {}
        self._poller: asyncio.Task[None] | None = None
        # Backend -> its engine's KV cache use, only where it is at or above the lowest kv_high_water of
        # the snapshot's backends: empty (one test in ``enter``) while no engine comes near its high water.
        self._kv: dict[str, float] = {}
        self._kv_floor = 0.0
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

    def enter(self, backend: Backend, priority: int = STANDARD, dispatching: bool = False) -> Place | None:
        """A place on ``backend`` for a request of class ``priority``, or None when it is saturated (for
        a sheddable request: when no more than ``reserved_places`` are free), or when requests of its class
        or a higher one wait for it and this is not their dispatch (a newcomer does not overtake them)."""
        name = backend.name
        if not dispatching:
            if self._queued_on and name in self._queued_on and self._waits_here(name, priority):
                return None
            if (
                backend.max_concurrency is not None
                and self.table is not None
                and self._waits_anywhere(name, priority)
            ):
                return None  # requests of the host wait for it: a newcomer does not overtake them
        if self._kv and self._kv_saturated(backend):
            return None
        if self.table is None:
            self._local[name] = self._local.get(name, 0) + 1
            return Place(0, -1)
        limit = self.ceiling(backend)
        if priority == SHEDDABLE and backend.reserved_places:
            limit -= backend.reserved_places  # those places stay for critical and standard requests
            if limit <= 0:
                return None
        return self._take(self._key(name)[0], limit)

    def _kv_saturated(self, backend: Backend) -> bool:
        kv = self._kv.get(backend.name)
        return kv is not None and kv >= backend.kv_high_water and self.in_flight(backend.name) > 0

    def leave(self, backend: Backend, place: Place) -> None:
        if self.table is None:
            self._local[backend.name] -= 1
        else:
            self._give(place)
        if self._queued_on:
            self._pump()

    async def wait(
        self,
        targets: Sequence[Target],
        priority: int,
        tenant: str,
        weight: int = 1,
        reorder: Reorder | None = None,
    ) -> tuple[Target, Place]:
        """A place on one of ``targets`` (all saturated now) when this request's turn comes in the flow
        queue, within the first target's queue bounds; ``GateFull`` (429) when the queue is full, the wait
        runs out, or the request is shed for one of a higher priority."""
        first = targets[0].backend
        future: asyncio.Future[tuple[Target, Place]] = asyncio.get_running_loop().create_future()
        entry = _Wait(targets, reorder, future)
        waiter = Waiter(priority, tenant, weight, entry)
        queue_key = self._key(first.name)[1]
        if self.table is not None:
            entry.queued = self._take(queue_key, first.queue_size)
            room = entry.queued is not None
        else:
            room = len(self.flow) < first.queue_size
        admitted, shed = self.flow.admit(waiter, room)
        if not admitted:
            self.flow_stats.refuse(priority, QUEUE_FULL)
            raise self._refusal(first, "their queue is full")
        if shed is not None:
            self._shed(shed, entry, queue_key)
        queued_on = self._queued_on
        for name in entry.names:
            queued_on[name] = queued_on.get(name, 0) + 1
        classed = self._classed
        for name in entry.names:
            if self.table is not None:
                place = self._take(self._flow_keys(name)[priority], NO_CEILING)
                if place is not None:
                    entry.classed.append(place)
            classed[(name, priority)] = classed.get((name, priority), 0) + 1
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        handed = False
        try:
            done, _ = await asyncio.wait((future,), timeout=first.queue_timeout)
            if not done:
                self.flow_stats.refuse(priority, TIMED_OUT)
                raise self._refusal(first, f"no place freed within {first.queue_timeout:g} s")
            result = future.result()  # raises the shed refusal
            handed = True
            return result
        finally:
            self.flow.remove(waiter)
            for name in entry.names:
                if queued_on[name] > 1:
                    queued_on[name] -= 1
                else:
                    del queued_on[name]
            if entry.queued is not None:
                self._give(entry.queued)
                entry.queued = None
            if entry.classed:
                for place in entry.classed:
                    self._give(place)
                entry.classed.clear()
            for name in entry.names:
                if classed[(name, priority)] > 1:
                    classed[(name, priority)] -= 1
                else:
                    del classed[(name, priority)]
            if not future.done():
                future.cancel()
            elif not handed and not future.cancelled() and future.exception() is None:
                # Dispatched as this request was cancelled (its client left): the place goes back.
                target, place = future.result()
                self.leave(target.backend, place)
            elif not handed and queued_on:
                self._pump()  # the backends it blocked may have places for those behind it

    def _shed(self, victim: Waiter[_Wait], newcomer: _Wait, queue_key: int) -> None:
        """``victim`` leaves the queue with a 429; its host-wide queue place goes to ``newcomer`` when it
        is a place in the same backend's queue."""
        entry = victim.item
        self.flow_stats.refuse(victim.priority, SHED)
        if entry.queued is not None and newcomer.queued is None and entry.queued.key == queue_key:
            newcomer.queued, entry.queued = entry.queued, None
        why = "this request was shed to make room for one of a higher priority"
        entry.future.set_exception(self._refusal(entry.targets[0].backend, why))

    def _pump(self) -> None:
        """Dispatch waiters, in the flow queue's order, while their backends have places. A waiter that
        finds every target saturated blocks those backends for everyone behind it, so that nobody
        overtakes it there (a sheddable request never goes ahead of a standard one waiting for the same
        backends)."""
        flow = self.flow
        if not len(flow):
            return
        blocked: set[str] = set()
        now = time.monotonic()
        for waiter in flow.ordered():
            entry = waiter.item
            if blocked and not blocked.isdisjoint(entry.names):
                continue
            targets = entry.reorder(entry.targets) if entry.reorder is not None else entry.targets
            for target in targets:
                if waiter.priority and self._higher_elsewhere(target.backend.name, waiter.priority):
                    continue  # another worker's waiter of a higher class takes it at its next poll
                place = self.enter(target.backend, waiter.priority, True)
                if place is not None:
                    flow.dispatch(waiter)
                    self.flow_stats.waited(waiter.priority, now - entry.since)
                    entry.future.set_result((target, place))
                    break
            else:
                blocked |= entry.names

    def _flow_keys(self, backend: str) -> tuple[int, int, int]:
        keys = self._flows.get(backend)
        if keys is None:
            keys = self._flows[backend] = flow_keys(backend)
        return keys

    def _higher_elsewhere(self, backend: str, priority: int) -> bool:
        """Whether another worker has a request of a class above ``priority`` waiting for ``backend``."""
        if self.table is None:
            return False
        keys = self._flow_keys(backend)
        classed = self._classed
        return any(self.table.gauge(keys[c]) > classed.get((backend, c), 0) for c in range(priority))

    def _waits_here(self, backend: str, priority: int) -> bool:
        """Whether a request of this worker of class ``priority`` or a higher one waits for ``backend``."""
        classed = self._classed
        return any((backend, c) in classed for c in range(priority + 1))

    def _waits_anywhere(self, backend: str, priority: int) -> bool:
        """Whether a request of the host of class ``priority`` or a higher one waits for ``backend``."""
        assert self.table is not None
        gauge = self.table.gauge
        keys = self._flow_keys(backend)
        return any(gauge(keys[c]) for c in range(priority + 1))

    async def _poll(self) -> None:
        """While anything waits: look for places other workers freed every ``POLL`` seconds."""
        try:
            while len(self.flow):
                await asyncio.sleep(POLL)
                self._pump()
        finally:
            self._poller = None

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
            f"the backends for this model are saturated and {why}; retry later",
            headers={"retry-after": str(retry)},
        )

    # -- the engines' document -----------------------------------------------------------------------------
    def set_kv_floor(self, floor: float) -> None:
        """The lowest ``kv_high_water`` of the snapshot's backends (called when a snapshot is taken)."""
        if floor != self._kv_floor:
            self._kv_floor = floor
            self._kv_hot()

    def _kv_hot(self) -> None:
        floor = self._kv_floor
        self._kv = {
            n: s.kv_cache for n, s in self.engines.items() if s.kv_cache is not None and s.kv_cache >= floor
        }

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
        self._kv_hot()
        self.unhealthy = any(not s.healthy for s in self.engines.values())
        return True
