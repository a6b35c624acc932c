"""Rings of records longer than a slot (``gateway.native.SpanRing``, the body-log rings): records split
across slots and joined again, published whole, drops counted in shared memory, scribbled slots read as
empty records, against a model, and a forked producer racing the consumer on one SysV segment."""

from __future__ import annotations

import os
import struct
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.native import SpanRing, ring_region_size
from tests.unit.test_usage_ring import children, fork, slot_offset, wait_exit

pytestmark = pytest.mark.skipif(not native.HAVE_NATIVE, reason="gateway._gateway_native is not built")

SLOTS, SLOT_BYTES = 8, 128
PAYLOAD = SLOT_BYTES - 8


@pytest.fixture
def ring() -> Iterator[SpanRing]:
    with SpanRing.create_layout(bytearray(ring_region_size(2, SLOTS, SLOT_BYTES)), 2, SLOTS, SLOT_BYTES) as r:
        yield r


def test_records_span_slots_and_come_back_whole(ring: SpanRing) -> None:
    assert ring.max_record == SLOTS * PAYLOAD
    small, exact, spanning, empty = b"a" * 10, b"b" * PAYLOAD, bytes(range(256)) + b"c" * 44, b""
    for rec in (small, exact, spanning, empty):
        assert ring.push(0, rec)
    assert ring.pending(0) == 1 + 1 + 3 + 1
    records, slots = ring.read_records(0)
    assert records == [small, exact, spanning, empty] and slots == 6
    assert ring.read_records(0) == (records, 6)  # not consumed
    assert ring.read_records(0, 2) == ([small, exact], 2)
    assert [len(f) for f in ring.read(0)] == [10, PAYLOAD, PAYLOAD, PAYLOAD, 60, 0]  # the fragments
    ring.advance(0, 2)
    assert ring.read_records(0) == ([spanning, empty], 4)
    assert ring.read_records(1) == ([], 0)
    assert ring.dropped(0) == 0


def test_no_room_and_too_long_are_dropped_and_counted(ring: SpanRing) -> None:
    assert ring.push(0, b"x" * (5 * PAYLOAD))
    assert not ring.push(0, b"y" * (3 * PAYLOAD + 1))  # 4 slots; 3 are free
    assert ring.push(0, b"z" * (3 * PAYLOAD))
    assert not ring.push(0, b"")  # even an empty record needs a slot
    assert not ring.push(1, b"w" * (ring.max_record + 1))  # longer than the whole ring: never fits
    assert ring.push(1, b"v" * ring.max_record)  # the whole ring
    assert (ring.dropped(0), ring.dropped(1)) == (2, 1)
    records, slots = ring.read_records(0)
    assert [r[:1] for r in records] == [b"x", b"z"] and slots == 8
    ring.advance(0, slots)
    assert ring.push(0, b"y" * (3 * PAYLOAD + 1))
    assert ring.dropped(0) == 2  # a count of what was lost, never reset by what gets through later


def test_drops_live_in_the_region() -> None:
    buf = bytearray(ring_region_size(1, SLOTS, SLOT_BYTES))
    with SpanRing.create_layout(buf, 1, SLOTS, SLOT_BYTES) as producer:
        assert not producer.push(0, b"!" * (producer.max_record + 1))
    with SpanRing(buf) as successor:  # a respawned producer, or the consumer: the same count
        assert successor.dropped(0) == 1
        assert not successor.push(0, b"!" * (successor.max_record + 1))
        assert successor.dropped(0) == 2


def test_wraps_around_the_ring() -> None:
    with SpanRing.create_layout(bytearray(ring_region_size(1, 4, 64)), 1, 4, 64) as r:
        got: list[bytes] = []
        sent: list[bytes] = []
        for i in range(500):
            rec = bytes([i % 251]) * (i * 13 % 170)  # 0 to 3 slots of 56 bytes
            while not r.push(0, rec):
                records, slots = r.read_records(0)
                got += records
                r.advance(0, slots)
            sent.append(rec)
        records, slots = r.read_records(0)
        got += records
        assert got == sent


def test_read_stops_at_a_record_that_does_not_fit_the_batch_limit(ring: SpanRing) -> None:
    for i in range(4):
        assert ring.push(0, bytes([i]) * 100)
    assert ring.read_records(0, 3) == ([bytes([i]) * 100 for i in range(3)], 3)
    assert ring.read_records(0, 0) == ([], 0)
    with pytest.raises(ValueError):
        ring.read_records(0, -1)


@pytest.mark.parametrize(
    "scribble",
    [
        (1, 7, None),  # the second fragment's marker says 7 slots are left
        (0, 5, None),  # the first says the record spans 5 slots, more than are pending
        (0, None, PAYLOAD - 1),  # a fragment before the last is not full
        (1, None, PAYLOAD + 9),  # a length past the slot
    ],
)
def test_scribbled_slots_read_as_empty_records(scribble: tuple[int, int | None, int | None]) -> None:
    buf = bytearray(ring_region_size(1, SLOTS, SLOT_BYTES))
    with SpanRing.create_layout(buf, 1, SLOTS, SLOT_BYTES) as r:
        assert r.push(0, b"s" * (2 * PAYLOAD))  # slots 0 and 1
        assert r.push(0, b"after")  # slot 2
        which, marker, length = scribble
        offset = slot_offset(r, 0, which)
        old_length, old_marker = struct.unpack_from("=II", buf, offset)
        struct.pack_into("=II", buf, offset, old_length if length is None else length,
                         old_marker if marker is None else marker)  # fmt: skip
        records, slots = r.read_records(0)
        # The scribbled record is not returned; the slot that does not read becomes an empty record, and
        # reading finds the next record again.
        assert slots == 3 and records[0] == b"" and records[-1] == b"after"
        assert b"s" * (2 * PAYLOAD) not in records and all(len(rec) <= PAYLOAD for rec in records)


# ---- against a model -------------------------------------------------------------------------------------

span_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 1), st.binary(max_size=SLOTS * PAYLOAD + 20)),
        st.tuples(st.just("read"), st.integers(0, 1), st.integers(0, 5)),
        st.tuples(st.just("consume"), st.integers(0, 1), st.integers(0, 4)),
    ),
    max_size=60,
)


def _slots(rec: bytes) -> int:
    return max(1, -(-len(rec) // PAYLOAD))


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(span_ops)
def test_matches_a_model(program: list[tuple[str, int, Any]]) -> None:
    size = ring_region_size(2, SLOTS, SLOT_BYTES)
    with SpanRing.create_layout(bytearray(size), 2, SLOTS, SLOT_BYTES) as r:
        model: list[deque[bytes]] = [deque(), deque()]
        dropped = [0, 0]
        for op, i, arg in program:
            used = sum(_slots(rec) for rec in model[i])
            if op == "push":
                fits = used + _slots(arg) <= SLOTS
                assert r.push(i, arg) == fits
                if fits:
                    model[i].append(arg)
                else:
                    dropped[i] += 1
            elif op == "read":
                expected = list(model[i])[:arg]
                assert r.read_records(i, arg) == (expected, sum(_slots(rec) for rec in expected))
            else:
                records, slots = r.read_records(i, arg)
                r.advance(i, slots)
                for _ in records:
                    model[i].popleft()
            for j in (0, 1):
                assert r.pending(j) == sum(_slots(rec) for rec in model[j])
                assert r.dropped(j) == dropped[j]


# ---- a forked producer ----------------------------------------------------------------------------------


def test_a_forked_producer_races_the_consumer() -> None:
    pytest.importorskip("sysv_ipc")
    from gateway.shm.segment import Segment

    count = 3000
    seg = Segment.create(ring_region_size(1, 64, 256))
    try:
        with SpanRing.create_layout(seg.buf, 1, 64, 256) as r, children() as pids:

            def produce() -> int:
                with SpanRing(seg.buf) as mine:
                    for n in range(count):
                        rec = struct.pack("=I", n) + bytes([n % 251]) * (n * 37 % 2000)
                        while not mine.push(0, rec):
                            os.sched_yield()
                return 0

            pids.append(fork(produce))
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(got) < count:
                assert time.monotonic() < deadline, f"{len(got)} of {count} records received"
                records, slots = r.read_records(0, 16)
                if not slots:
                    os.sched_yield()
                    continue
                got += records
                r.advance(0, slots)
            assert wait_exit(pids[0]) == 0
            for n, rec in enumerate(got):
                assert rec == struct.pack("=I", n) + bytes([n % 251]) * (n * 37 % 2000)
    finally:
        seg.close()
