"""Every shared-memory segment of a host, declared in one place: what each holds, its size, and the calls
that create them all (the supervisor, before it forks), attach to those of a running host (``gateway
status``) and let them go.

======== ============================================================ ======================================
segment  holds                                                        size and layout
======== ============================================================ ======================================
snapshot the published snapshot, two slots behind a seqlock           ``snapshot_slot.region_bytes``
buckets  rate buckets, concurrency gauges, backends' in-flight and    ``gateway.native.region_size``
         queue gauges, budget spend (C atomics)                       (``native/buckets.c``)
usage    one usage-record ring per proxy worker                       ``gateway.native.ring_region_size``
                                                                      (``native/usage_ring.c``)
holdings each proxy worker's notes of the gauge places it holds       ``holdings.region_bytes``
stats    each proxy worker's statistics and heartbeat, the engine     ``worker_stats.region_bytes``
         slot, the host slot
bodies   one body-log ring per proxy worker: records that span        ``gateway.native.ring_region_size``
         slots (``SpanRing``); made whether or not any entry logs     with ``BODY_SLOT_BYTES`` slots
         yet (pages nobody writes take no memory)
prefix   which backend was sent which prompt blocks, for              ``gateway.native.prefix_region_size``
         ``cache_aware`` pools (``PrefixIndex``); untouched pages     (``native/prefix_index.c``)
         without such a pool
======== ============================================================ ======================================

Forked workers inherit the mappings and wrap the buffers in the classes that read them (``BucketTable``,
``UsageRing``, ``SpanRing``, ``SnapshotReader``, ``WorkerStats``, ``Holdings``); nothing attaches by id
but ``gateway status``. A segment is marked for removal as soon as it is created (``segment.py``), so
closing is all there is to do: the kernel frees it when its last process lets go. I/O: shmget/shmat/shmctl
through ``Segment``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gateway.native import (
    BucketTable,
    PrefixIndex,
    SpanRing,
    UsageRing,
    prefix_region_size,
    region_size,
    ring_region_size,
)
from gateway.shm import holdings, snapshot_slot, worker_stats
from gateway.shm.segment import Segment

__all__ = ["BODY_SLOT_BYTES", "RING_SLOT_BYTES", "SEGMENTS", "RegionSizes", "SharedRegions"]

RING_SLOT_BYTES: Final = 1024  # a usage record is a few hundred bytes; names are at most 200 characters
# Body logs span slots: 4 KiB each keeps a short chat in one or two.
BODY_SLOT_BYTES: Final = 4096
SEGMENTS: Final = ("snapshot", "buckets", "usage", "holdings", "stats", "bodies", "prefix")


@dataclass(frozen=True, slots=True)
class RegionSizes:
    """What the segments' sizes follow (from ``Settings``)."""

    workers: int  # proxy workers: each has a usage ring, a holdings slice and a statistics slot
    snapshot_bytes: int  # the largest snapshot document (a slot)
    bucket_capacity: int  # slots of the bucket table, a power of two
    ring_slots: int  # records each usage ring holds, a power of two
    body_slots: int = 2048  # slots of each body-log ring, a power of two
    prefix_entries: int = 1 << 16  # (block, backend) pairs of the prefix index, a power of two

    def segment_bytes(self) -> dict[str, int]:
        """Each segment's size in bytes, by name."""
        workers = max(1, self.workers)
        return {
            "snapshot": snapshot_slot.region_bytes(self.snapshot_bytes),
            "buckets": region_size(self.bucket_capacity),
            "usage": ring_region_size(workers, self.ring_slots, RING_SLOT_BYTES),
            "holdings": holdings.region_bytes(workers),
            "stats": worker_stats.region_bytes(workers),
            "bodies": ring_region_size(workers, self.body_slots, BODY_SLOT_BYTES),
            "prefix": prefix_region_size(self.prefix_entries),
        }


class SharedRegions:
    """The host's segments, by name, and the epoch that names their lifetime (budget keys include it: spend
    counted live by an earlier bucket table, before a restart, or by another host is then never mistaken
    for this one's). What the supervisor hands every forked worker."""

    __slots__ = ("_segments", "epoch")

    def __init__(self, segments: Mapping[str, Segment], epoch: str) -> None:
        self._segments = dict(segments)
        self.epoch = epoch

    @classmethod
    def create(cls, sizes: RegionSizes) -> SharedRegions:
        """Create every segment, zeroed, with the bucket table and the usage rings laid out."""
        segments: dict[str, Segment] = {}
        try:
            for name, size in sizes.segment_bytes().items():
                segments[name] = Segment.create(size)
            BucketTable.create_layout(segments["buckets"].buf, sizes.bucket_capacity).close()
            workers = max(1, sizes.workers)
            UsageRing.create_layout(segments["usage"].buf, workers, sizes.ring_slots, RING_SLOT_BYTES).close()
            SpanRing.create_layout(segments["bodies"].buf, workers, sizes.body_slots, BODY_SLOT_BYTES).close()
            secret = secrets.randbits(64)
            PrefixIndex.create_layout(segments["prefix"].buf, sizes.prefix_entries, secret).close()
        except BaseException:
            for segment in segments.values():
                segment.close()
            raise
        return cls(segments, secrets.token_hex(8))

    @classmethod
    def attach(cls, ids: Mapping[str, int], epoch: str = "") -> SharedRegions:
        """The segments named in ``ids`` (as ``ids()`` gave them) of a running host; only those."""
        segments: dict[str, Segment] = {}
        try:
            for name, shm_id in ids.items():
                if name not in SEGMENTS:
                    raise ValueError(f"no shared segment is called {name!r}")
                segments[name] = Segment.attach(int(shm_id))
        except BaseException:
            for segment in segments.values():
                segment.close()
            raise
        return cls(segments, epoch)

    def ids(self) -> dict[str, int]:
        """The segments' ids by name, for the supervisor's state file."""
        return {name: segment.id for name, segment in self._segments.items()}

    def _segment(self, name: str) -> Segment:
        segment = self._segments.get(name)
        if segment is None:
            raise LookupError(f"the {name} segment is not attached")
        return segment

    @property
    def snapshot(self) -> memoryview:
        return self._segment("snapshot").buf

    @property
    def buckets(self) -> memoryview:
        return self._segment("buckets").buf

    @property
    def usage(self) -> memoryview:
        return self._segment("usage").buf

    @property
    def holdings(self) -> memoryview:
        return self._segment("holdings").buf

    @property
    def stats(self) -> memoryview:
        return self._segment("stats").buf

    @property
    def bodies(self) -> memoryview | None:
        """The body-log rings; None where they are not attached (``gateway status`` attaches two)."""
        segment = self._segments.get("bodies")
        return None if segment is None else segment.buf

    @property
    def prefix(self) -> memoryview | None:
        """The prefix index; None where it is not attached."""
        segment = self._segments.get("prefix")
        return None if segment is None else segment.buf

    def usage_attached(self) -> int:
        """How many processes map the usage rings now: a control worker left behind by a dead supervisor
        drains until the proxy workers, who write the rings, have all gone."""
        return self._segment("usage").attached()

    def close(self) -> None:
        """Detach every segment from this process. Wrappers of a buffer (``BucketTable``, ``UsageRing``...)
        must be closed first."""
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()
