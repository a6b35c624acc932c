"""The statistics slots' heartbeat: a stamp belongs to the process that wrote it, and leaves the
document beside it intact."""

from __future__ import annotations

import orjson

from gateway.shm.worker_stats import WorkerStats, region_bytes


def test_a_heartbeat_is_read_back_only_for_its_own_pid() -> None:
    stats = WorkerStats(memoryview(bytearray(region_bytes(2))))
    assert stats.last_beat(0, 101) is None  # never stamped
    stats.beat(0, 101, 12.5)
    assert stats.last_beat(0, 101) == 12.5
    assert stats.last_beat(0, 102) is None  # a respawned worker is judged on its own stamps only
    assert stats.last_beat(1, 101) is None
    assert stats.last_beat(99, 101) is None  # no such slot


def test_heartbeats_and_documents_do_not_overwrite_each_other() -> None:
    stats = WorkerStats(memoryview(bytearray(region_bytes(1))))
    stats.beat(0, 7, 1.0)
    assert stats.write(0, orjson.dumps({"pid": 7, "requests": 3}))
    stats.beat(0, 7, 2.0)
    assert stats.documents() == [(0, {"pid": 7, "requests": 3})]
    assert stats.last_beat(0, 7) == 2.0
