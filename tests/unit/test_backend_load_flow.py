"""Flow control as a worker runs it (gateway.dataplane.backend_load over a real bucket table in memory):
dispatch by class on this worker's release, a shed waiter's 429 and its queue place handed on, targets
re-ordered at dispatch when another worker frees places, the KV-cache high water, and the wait's end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import orjson
import pytest

from gateway.dataplane.backend_load import BackendLoad, Place
from gateway.dataplane.flow import CRITICAL, SHEDDABLE, STANDARD
from gateway.errors import GateFull
from gateway.native import BucketTable
from gateway.native._buckets import region_size
from gateway.shm.bucket_keys import backend_keys
from gateway.shm.worker_stats import WorkerStats, region_bytes
from gateway.snapshot import Backend, Target


def backend(
    name: str, queue_size: int = 2, queue_timeout: float = 5.0, gate: int = 1, reserved: int = 0
) -> Backend:
    return Backend(
        name,
        "http://127.0.0.1:1",
        None,
        "openai",
        1.0,
        1.0,
        1.0,
        max_concurrency=gate,
        queue_size=queue_size,
        queue_timeout=queue_timeout,
        reserved_places=reserved,
    )


@pytest.fixture
def load() -> Iterator[BackendLoad]:
    with BucketTable.create_layout(bytearray(region_size(16)), 16) as table:
        yield BackendLoad(table, None, WorkerStats(memoryview(bytearray(region_bytes(1)))))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_release_dispatches_by_class_and_a_shed_waiter_gets_429(load: BackendLoad) -> None:
    async def run() -> None:
        b = backend("b")
        t = Target("pm", b, "m")
        held = load.enter(b)
        assert held is not None and load.enter(b) is None  # the gate: one place
        std = asyncio.ensure_future(load.wait([t], STANDARD, "alice"))
        shed = asyncio.ensure_future(load.wait([t], SHEDDABLE, "bob"))
        await settle()
        assert load.flow.depth == [0, 1, 1]
        # The queue (2) is full: a critical newcomer takes the sheddable waiter's place.
        crit = asyncio.ensure_future(load.wait([t], CRITICAL, "carol"))
        await settle()
        with pytest.raises(GateFull) as refused:
            await shed
        assert refused.value.status == 429 and refused.value.headers == {"retry-after": "5"}
        assert "shed" in refused.value.message
        # Full again, nothing sheddable: a standard newcomer is refused.
        with pytest.raises(GateFull, match="queue is full"):
            await load.wait([t], STANDARD, "dave")
        # This worker's release dispatches the critical waiter first, though it came last.
        load.leave(b, held)
        target, place = await crit
        assert target is t and not std.done()
        load.leave(b, place)
        _, place = await std
        load.leave(b, place)
        assert load.flow.depth == [0, 0, 0] and load.in_flight("b") == 0
        assert load.table is not None and load.table.gauge(backend_keys("b")[1]) == 0  # queue places back
        assert load.flow_stats.dispatched == [1, 1, 0]
        assert load.flow_stats.refused == {(SHEDDABLE, "shed"): 1, (STANDARD, "queue_full"): 1}

    asyncio.run(run())


def test_targets_are_reordered_at_dispatch_when_another_worker_frees_places(load: BackendLoad) -> None:
    async def run() -> None:
        b0, b1 = backend("b0"), backend("b1")
        t0, t1 = Target("pm", b0, "m"), Target("pm", b1, "m")
        p0, p1 = load.enter(b0), load.enter(b1)
        assert p0 is not None and p1 is not None

        def reverse(targets: Sequence[Target]) -> Sequence[Target]:
            return list(reversed(targets))

        waiting = asyncio.ensure_future(load.wait([t0, t1], STANDARD, "alice", reorder=reverse))
        await settle()
        # Another worker's releases: straight into the table, no wake-up here; the poll finds them.
        assert load.table is not None
        load.table.leave(p0.key, None, -1)
        load.table.leave(p1.key, None, -1)
        target, place = await waiting
        assert target is t1  # both open at dispatch: the re-ordered first
        load.leave(b1, place)

    asyncio.run(run())


def test_a_newcomer_does_not_overtake_this_workers_waiters(load: BackendLoad) -> None:
    async def run() -> None:
        b = backend("b")
        t = Target("pm", b, "m")
        held = load.enter(b)
        assert held is not None
        waiting = asyncio.ensure_future(load.wait([t], STANDARD, "alice"))
        await settle()
        # Another worker frees the place: a newcomer here still sees the backend as taken.
        assert load.table is not None
        load.table.leave(held.key, None, -1)
        assert load.enter(b) is None
        _, place = await waiting
        load.leave(b, place)
        assert isinstance(load.enter(b), Place)  # nobody waits: the usual path

    asyncio.run(run())


def test_a_newcomer_of_a_higher_class_overtakes_waiters_of_a_lower_one(load: BackendLoad) -> None:
    async def run() -> None:
        b = backend("b")
        t = Target("pm", b, "m")
        held = load.enter(b, SHEDDABLE)
        assert held is not None
        waiting = asyncio.ensure_future(load.wait([t], SHEDDABLE, "bulk"))
        await settle()
        assert load.table is not None
        load.table.leave(held.key, None, -1)  # another worker frees the place
        assert load.enter(b, SHEDDABLE) is None  # a sheddable newcomer queues behind the sheddable waiter
        place = load.enter(b, STANDARD)  # a standard one goes first: strict priority
        assert place is not None and not waiting.done()
        load.leave(b, place)
        _, place = await waiting
        load.leave(b, place)

    asyncio.run(run())


def test_reserved_places_are_kept_from_sheddable_requests(load: BackendLoad) -> None:
    async def run() -> None:
        b = backend("b", gate=3, reserved=1)
        t = Target("pm", b, "m")
        bulk = [load.enter(b, SHEDDABLE), load.enter(b, SHEDDABLE)]
        assert None not in bulk and load.enter(b, SHEDDABLE) is None  # one of three stays free
        waiting = asyncio.ensure_future(load.wait([t], SHEDDABLE, "bulk"))
        await settle()
        urgent = load.enter(b, STANDARD)  # the reserved place, at once, though a sheddable request waits
        assert urgent is not None and load.in_flight("b") == 3
        assert load.enter(b, CRITICAL) is None  # the gate itself is full
        load.leave(b, urgent)
        await settle()
        assert not waiting.done()  # the freed place is the reserved one: not for the sheddable waiter
        first = bulk.pop()
        assert first is not None
        load.leave(b, first)
        _, place = await waiting  # a place above the reserve: the waiter's
        assert load.in_flight("b") == 2
        for p in (place, *bulk):
            assert p is not None
            load.leave(b, p)
        assert load.in_flight("b") == 0

    asyncio.run(run())


def test_kv_cache_high_water_saturates_a_backend_with_requests_on_it(load: BackendLoad) -> None:
    b = Backend("b", "http://127.0.0.1:1", None, "openai", 1.0, 1.0, 1.0, kv_high_water=0.9)
    load.set_kv_floor(0.9)  # the snapshot's lowest kv_high_water
    for kv in (0.95, 0.5):
        # What the host's scraper publishes, read as a worker reads it.
        assert load.stats is not None
        load.stats.write(
            load.stats.engine_slot, orjson.dumps({"backends": {"b": {"kind": "vllm", "kv_cache": kv}}})
        )
        assert load.refresh_engines()
        if kv == 0.95:
            first = load.enter(b)
            assert first is not None  # nothing in flight: the engine's cache is its own business
            assert load.enter(b) is None  # one in flight and the cache at 0.95 >= 0.9: saturated
    second = load.enter(b)
    assert second is not None
    load.leave(b, first)
    load.leave(b, second)


def test_a_wait_that_runs_out_is_429(load: BackendLoad) -> None:
    async def run() -> None:
        b = backend("b", queue_timeout=0.05)
        held = load.enter(b)
        assert held is not None
        with pytest.raises(GateFull, match=r"no place freed within 0\.05 s") as refused:
            await load.wait([Target("pm", b, "m")], SHEDDABLE, "bob")
        assert refused.value.status == 429 and refused.value.headers["retry-after"] == "1"
        assert load.flow_stats.refused == {(SHEDDABLE, "timeout"): 1} and len(load.flow) == 0
        load.leave(b, held)
        assert load.in_flight("b") == 0

    asyncio.run(run())


def test_classes_and_waiters_count_across_the_workers_of_a_host() -> None:
    """Two workers over one bucket table: a place freed by the worker holding only a sheddable waiter is
    left to the other worker's standard waiter (found by its poll), and while anyone waits for the backend
    a newcomer of the same class on either worker queues instead of taking a place that frees."""

    async def run(one: BackendLoad, two: BackendLoad) -> None:
        b = backend("b", queue_size=8)
        t = Target("pm", b, "m")
        held = one.enter(b)
        assert held is not None and two.enter(b) is None
        shed = asyncio.ensure_future(one.wait([t], SHEDDABLE, "flood"))
        std = asyncio.ensure_future(two.wait([t], STANDARD, "steady"))
        await settle()
        one.leave(b, held)  # worker one's release: its own waiter is of a lower class than worker two's
        await settle()
        assert not shed.done()
        target, place = await asyncio.wait_for(std, 1.0)  # worker two's poll took the place
        assert target is t and not shed.done()
        # A sheddable newcomer on worker two, which holds no waiter now, does not overtake worker one's
        # sheddable waiter.
        two.leave(b, place)
        assert two.enter(b, SHEDDABLE) is None or shed.done()
        _, place = await asyncio.wait_for(shed, 1.0)
        one.leave(b, place)
        assert two.enter(b) is not None  # nobody waits: the gate is open to newcomers again

    with BucketTable.create_layout(bytearray(region_size(16)), 16) as table:
        stats = WorkerStats(memoryview(bytearray(region_bytes(2))))
        asyncio.run(run(BackendLoad(table, None, stats), BackendLoad(table, None, stats)))
