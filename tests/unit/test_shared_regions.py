"""The host's shared segments as ``gateway.shm.regions`` creates them: their sizes and layouts, attaching by
id (``gateway status``), the attach count a dead supervisor's control worker drains by, and closing."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sysv_ipc

from gateway.native import BucketTable, UsageRing, region_size
from gateway.shm.holdings import HOLD_WORDS
from gateway.shm.regions import RING_SLOT_BYTES, SEGMENTS, RegionSizes, SharedRegions
from gateway.shm.snapshot_slot import HEADER_BYTES, SnapshotPublisher, SnapshotReader
from gateway.shm.worker_stats import SLOT_BYTES, WorkerStats

SIZES = RegionSizes(workers=3, snapshot_bytes=8192, bucket_capacity=16, ring_slots=8)


@pytest.fixture
def shared() -> Iterator[SharedRegions]:
    regions = SharedRegions.create(SIZES)
    yield regions
    regions.close()


def test_every_segment_has_the_size_declared(shared: SharedRegions) -> None:
    sizes = SIZES.segment_bytes()
    assert tuple(sizes) == SEGMENTS
    assert sizes["snapshot"] == HEADER_BYTES + 2 * 8192
    assert sizes["buckets"] == region_size(16)
    assert sizes["holdings"] == 3 * HOLD_WORDS * 8
    assert sizes["stats"] == (3 + 2) * SLOT_BYTES  # a slot per worker, the engine slot, the host slot
    for name in SEGMENTS:
        assert len(getattr(shared, name)) == sizes[name], name


def test_the_native_layouts_are_initialised(shared: SharedRegions) -> None:
    with BucketTable(shared.buckets) as table:
        assert table.capacity == 16
    with UsageRing(shared.usage) as rings:
        assert (rings.rings, rings.slots, rings.slot_bytes) == (3, 8, RING_SLOT_BYTES)
    assert WorkerStats(shared.stats).slots == 5
    assert not any(shared.holdings)  # zeroed: no place noted


def test_no_workers_still_means_one_of_each() -> None:
    sizes = RegionSizes(workers=0, snapshot_bytes=4096, bucket_capacity=1, ring_slots=2).segment_bytes()
    assert sizes["holdings"] == HOLD_WORDS * 8
    assert sizes["stats"] == 3 * SLOT_BYTES


def test_each_creation_has_its_own_epoch(shared: SharedRegions) -> None:
    other = SharedRegions.create(SIZES)
    try:
        assert len(shared.epoch) == 16 and int(shared.epoch, 16) >= 0
        assert other.epoch != shared.epoch
        assert set(other.ids().values()).isdisjoint(shared.ids().values())
    finally:
        other.close()


def test_attach_by_id_sees_the_same_memory_and_only_what_it_named(shared: SharedRegions) -> None:
    SnapshotPublisher(shared.snapshot).publish(b'{"doc": 1}', revision=4)
    ids = shared.ids()
    seen = SharedRegions.attach({"snapshot": ids["snapshot"], "stats": ids["stats"]}, epoch="e")
    try:
        assert SnapshotReader(seen.snapshot).read() == (1, b'{"doc": 1}')
        assert seen.ids() == {"snapshot": ids["snapshot"], "stats": ids["stats"]}
        assert seen.epoch == "e"
        with pytest.raises(LookupError, match="the buckets segment is not attached"):
            _ = seen.buckets
    finally:
        seen.close()
    with pytest.raises(ValueError, match="no shared segment is called 'rings'"):
        SharedRegions.attach({"rings": ids["usage"]})


def test_usage_attached_counts_the_processes_that_map_the_rings(shared: SharedRegions) -> None:
    assert shared.usage_attached() == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child maps what it inherited until the parent lets it go
        os.read(read, 1)
        os._exit(0)
    try:
        assert shared.usage_attached() == 2
    finally:
        os.write(write, b"x")
        os.waitpid(pid, 0)
        os.close(read)
        os.close(write)
    assert shared.usage_attached() == 1


def test_closed_segments_are_gone(shared: SharedRegions) -> None:
    ids = shared.ids()
    shared.close()
    with pytest.raises(LookupError):
        _ = shared.snapshot
    # Marked for removal at creation: once the last process lets go, the kernel frees them.
    for name, shm_id in ids.items():
        with pytest.raises((sysv_ipc.Error, ValueError)):  # sysv_ipc says EINVAL as a ValueError
            SharedRegions.attach({name: shm_id})
    shared.close()  # again: nothing left to do


def test_a_bad_size_is_refused_before_anything_is_created() -> None:
    with pytest.raises(ValueError, match="not a power of two"):
        SharedRegions.create(RegionSizes(workers=1, snapshot_bytes=4096, bucket_capacity=6, ring_slots=8))
