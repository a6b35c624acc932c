"""Usage-record rings from ``gateway.native``: geometry and region checks, FIFO semantics against a model,
scribbled regions, and forked producers (racing, and killed mid-stream) on one SysV segment."""

from __future__ import annotations

import os
import signal
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.native import RegionError, UsageRing, ring_region_size

pytestmark = pytest.mark.skipif(not native.HAVE_NATIVE, reason="gateway._gateway_native is not built")

# The region layout (native/usage_ring.c): a 64-byte header, then per ring a 128-byte control block (head
# at +0, tail at +64) followed by its slots, each [uint32 length][uint32 reserved][payload].
HEADER, CONTROL = 64, 128


def control_offset(r: UsageRing, ring: int) -> int:
    return HEADER + ring * (CONTROL + r.slots * r.slot_bytes)


def slot_offset(r: UsageRing, ring: int, counter: int) -> int:
    return control_offset(r, ring) + CONTROL + (counter % r.slots) * r.slot_bytes


def put_u64(buf: Any, offset: int, value: int) -> None:
    struct.pack_into("=Q", buf, offset, value)


@pytest.fixture
def ring() -> Iterator[UsageRing]:
    with UsageRing.create_layout(bytearray(ring_region_size(2, 8, 128)), 2, 8, 128) as r:
        yield r


# ---- geometry and the region -----------------------------------------------------------------------------


def test_region_size() -> None:
    assert ring_region_size(1, 2, 64) == 64 + 128 + 2 * 64
    assert ring_region_size(3, 1024, 512) == 64 + 3 * (128 + 1024 * 512)
    assert ring_region_size(4096, 2**20, 65536) == 64 + 4096 * (128 + 2**36)


@pytest.mark.parametrize(
    "geometry",
    [
        (0, 8, 64),
        (4097, 8, 64),
        (-1, 8, 64),
        (2**64, 8, 64),
        (1, 0, 64),
        (1, 1, 64),
        (1, 3, 64),
        (1, 6, 64),
        (1, 2**21, 64),
        (1, -8, 64),
        (1, 2**64, 64),
        (1, 8, 0),
        (1, 8, 32),
        (1, 8, 65),
        (1, 8, 100),
        (1, 8, 65536 + 64),
        (1, 8, 2**17),
        (1, 8, -64),
    ],
)
def test_invalid_geometry(geometry: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        ring_region_size(*geometry)
    with pytest.raises(ValueError):
        UsageRing.create_layout(bytearray(4096), *geometry)


def test_attach_needs_an_initialised_region() -> None:
    size = ring_region_size(2, 4, 64)
    buf = bytearray(size + 64)
    with pytest.raises(RegionError):  # zeros: no magic
        UsageRing(buf)
    UsageRing.create_layout(buf, 2, 4, 64).close()
    with UsageRing(buf) as r:
        assert (r.rings, r.slots, r.slot_bytes, r.max_record) == (2, 4, 64, 56)
    with pytest.raises(RegionError):  # shorter than its header says
        UsageRing(memoryview(buf)[: size - 1])
    with pytest.raises(RegionError):  # misaligned
        UsageRing(memoryview(buf)[1:])
    with pytest.raises(RegionError):
        UsageRing(memoryview(buf)[:32])
    with pytest.raises(RegionError):
        UsageRing.create_layout(bytearray(size - 1), 2, 4, 64)
    with pytest.raises(RegionError):
        UsageRing.create_layout(memoryview(bytearray(size + 8))[1 : size + 1], 2, 4, 64)
    buf[0] ^= 1  # a scribbled magic
    with pytest.raises(RegionError):
        UsageRing(buf)


def test_create_layout_resets_state() -> None:
    buf = bytearray(ring_region_size(1, 4, 64))
    with UsageRing.create_layout(buf, 1, 4, 64) as r:
        assert r.push(0, b"old")
        assert r.counters(0) == (1, 0)
    with UsageRing.create_layout(buf, 1, 4, 64) as r:
        assert r.counters(0) == (0, 0)
        assert r.read(0) == []


def test_close_releases_the_buffer() -> None:
    buf = bytearray(ring_region_size(1, 2, 64))
    r = UsageRing.create_layout(buf, 1, 2, 64)
    with pytest.raises(BufferError):
        buf.extend(b"x")  # pinned while attached
    r.close()
    r.close()
    buf.extend(b"x")
    for call in (
        lambda: r.push(0, b"x"),
        lambda: r.read(0),
        lambda: r.advance(0, 0),
        lambda: r.counters(0),
        lambda: r.pending(0),
    ):
        with pytest.raises(RegionError):
            call()


def test_region_checked_on_every_call() -> None:
    buf = bytearray(ring_region_size(2, 8, 128))
    with UsageRing.create_layout(buf, 2, 8, 128) as r:
        assert r.push(0, b"a")
        put_u64(buf, 8, 4096)  # rings: the region would be far larger than the buffer
        with pytest.raises(RegionError):
            r.push(0, b"b")
        with pytest.raises(RegionError):
            r.read(0)
        put_u64(buf, 8, 2)
        put_u64(buf, 16, 7)  # slots: not a power of two
        with pytest.raises(RegionError):
            r.advance(0, 1)
        put_u64(buf, 16, 8)
        assert r.read(0) == [b"a"]


# ---- one ring --------------------------------------------------------------------------------------------


def test_fifo_full_and_read_does_not_advance(ring: UsageRing) -> None:
    records = [f"record {i}".encode() for i in range(8)]
    assert all(ring.push(0, rec) for rec in records)
    assert not ring.push(0, b"one too many")
    assert ring.counters(0) == (8, 0)
    assert ring.pending(0) == 8
    assert ring.read(0) == records
    assert ring.read(0) == records  # not consumed
    assert ring.read(0, 3) == records[:3]
    assert ring.read(0, 0) == []
    ring.advance(0, 3)
    assert ring.read(0) == records[3:]
    assert ring.counters(0) == (8, 3)
    assert ring.push(0, b"x") and ring.push(0, b"y") and ring.push(0, b"z")
    assert not ring.push(0, b"full again")
    assert ring.read(0) == [*records[3:], b"x", b"y", b"z"]
    ring.advance(0, 8)
    assert ring.read(0) == []
    assert ring.pending(0) == 0
    ring.advance(0, 0)


def test_advance_beyond_pending_raises(ring: UsageRing) -> None:
    with pytest.raises(ValueError):
        ring.advance(0, 1)
    ring.push(0, b"a")
    ring.push(0, b"b")
    with pytest.raises(ValueError, match="2 records are pending"):
        ring.advance(0, 3)
    with pytest.raises(ValueError):
        ring.advance(0, -1)
    assert ring.counters(0) == (2, 0)
    ring.advance(0, 2)
    with pytest.raises(ValueError):
        ring.advance(0, 1)


def test_wrap_around_over_many_cycles() -> None:
    with UsageRing.create_layout(bytearray(ring_region_size(1, 8, 64)), 1, 8, 64) as r:
        sent = got = full = 0
        cycle = 0
        while got < 10_000:
            cycle += 1
            while sent < 10_000 and sent - got < 1 + cycle % 11:  # at times one more than the ring holds
                if not r.push(0, str(sent).encode()):
                    full += 1
                    break
                sent += 1
            batch = r.read(0, 1 + cycle % 5)
            assert batch == [str(i).encode() for i in range(got, got + len(batch))]
            r.advance(0, len(batch))
            got += len(batch)
            assert r.counters(0) == (sent, got)
        assert sent == got == 10_000
        assert full > 0


def test_record_lengths(ring: UsageRing) -> None:
    assert ring.max_record == 120
    longest = bytes(range(120))
    assert ring.push(0, longest)
    assert ring.push(0, b"")
    assert ring.push(0, b"\0")
    with pytest.raises(ValueError, match="longer than 120"):
        ring.push(0, longest + b"!")
    with pytest.raises(ValueError):
        ring.push(0, b"x" * 100_000)
    assert ring.read(0) == [longest, b"", b"\0"]
    assert ring.counters(0) == (3, 0)


def test_push_takes_any_buffer(ring: UsageRing) -> None:
    assert ring.push(0, bytearray(b"from a bytearray"))
    assert ring.push(0, memoryview(b"__from a memoryview__")[2:-2])
    with pytest.raises(TypeError):
        ring.push(0, "text")  # type: ignore[arg-type]
    assert ring.read(0) == [b"from a bytearray", b"from a memoryview"]


def test_ring_index_out_of_range(ring: UsageRing) -> None:
    for bad in (2, 3, -1, 2**64, 2**70):
        with pytest.raises(ValueError, match="ring"):
            ring.push(bad, b"x")
        with pytest.raises(ValueError, match="ring"):
            ring.read(bad)
        with pytest.raises(ValueError, match="ring"):
            ring.advance(bad, 0)
        with pytest.raises(ValueError, match="ring"):
            ring.counters(bad)
        with pytest.raises(ValueError, match="ring"):
            ring.pending(bad)
    with pytest.raises(ValueError):
        ring.read(0, -1)


def test_rings_are_independent(ring: UsageRing) -> None:
    for i in range(8):
        assert ring.push(0, b"zero %d" % i)
    assert not ring.push(0, b"full")
    assert ring.push(1, b"one")  # ring 0 being full does not affect ring 1
    assert ring.read(1) == [b"one"]
    ring.advance(1, 1)
    assert ring.counters(0) == (8, 0)
    assert ring.counters(1) == (1, 1)
    assert ring.read(0, 1) == [b"zero 0"]
    with pytest.raises(ValueError):
        ring.advance(1, 1)


def test_read_returns_fewer_when_the_buffer_is_full() -> None:
    # 32 maximal records of 65528 bytes need 2 MiB; one read copies at most 1 MiB of them.
    with UsageRing.create_layout(bytearray(ring_region_size(1, 32, 65536)), 1, 32, 65536) as r:
        records = [bytes([i]) * r.max_record for i in range(32)]
        assert all(r.push(0, rec) for rec in records)
        first = r.read(0, 32)
        assert 0 < len(first) < 32
        assert first == records[: len(first)]
        r.advance(0, len(first))
        rest: list[bytes] = []
        while r.pending(0):
            batch = r.read(0)
            rest += batch
            r.advance(0, len(batch))
        assert first + rest == records


# ---- scribbled regions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [2**32 - 1, 2**31, 121, 1_000_000])
def test_corrupted_length_reads_as_empty(length: int) -> None:
    buf = bytearray(ring_region_size(2, 8, 128))
    with UsageRing.create_layout(buf, 2, 8, 128) as r:
        assert r.push(1, b"first")
        assert r.push(1, b"second")
        struct.pack_into("=I", buf, slot_offset(r, 1, 0), length)
        assert r.read(1) == [b"", b"second"]
        struct.pack_into("=I", buf, slot_offset(r, 1, 0), 120)  # the largest valid length: 120 bytes back
        assert r.read(1) == [b"first" + bytes(115), b"second"]
        r.advance(1, 2)
        assert r.pending(1) == 0


def test_scribbled_counters_stay_inside_the_region() -> None:
    buf = bytearray(ring_region_size(2, 8, 128))
    with UsageRing.create_layout(buf, 2, 8, 128) as r:
        assert r.push(0, b"a")
        put_u64(buf, control_offset(r, 0) + 64, 5)  # tail beyond head: pending clamps to the ring's size
        assert r.pending(0) == 8
        assert len(r.read(0)) == 8
        assert not r.push(0, b"b")  # reads as full rather than overwriting unconsumed slots
        put_u64(buf, control_offset(r, 0), 2**64 - 3)  # a head near the wrap of the counter
        put_u64(buf, control_offset(r, 0) + 64, 2**64 - 3)
        assert r.pending(0) == 0
        for i in range(6):
            assert r.push(0, b"%d" % i)  # head wraps past 2**64
        assert r.counters(0) == (3, 2**64 - 3)
        assert r.read(0) == [b"%d" % i for i in range(6)]
        r.advance(0, 6)
        assert r.counters(0) == (3, 3)
        assert r.read(1) == []


def test_half_written_record_is_invisible() -> None:
    # What a producer killed inside push leaves behind: a slot filled but the head not published.
    buf = bytearray(ring_region_size(1, 4, 64))
    with UsageRing.create_layout(buf, 1, 4, 64) as r:
        assert r.push(0, b"whole")
        offset = slot_offset(r, 0, 1)
        struct.pack_into("=II", buf, offset, 40, 0)
        buf[offset + 8 : offset + 20] = b"half-writ..."
        assert r.read(0) == [b"whole"]
        assert r.pending(0) == 1
        assert r.push(0, b"next")  # the successor overwrites the slot
        assert r.read(0) == [b"whole", b"next"]


# ---- against a model -------------------------------------------------------------------------------------

MODEL_RINGS, MODEL_SLOTS, MODEL_SLOT_BYTES = 2, 4, 64
ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, MODEL_RINGS - 1), st.binary(max_size=60)),
        st.tuples(st.just("read"), st.integers(0, MODEL_RINGS - 1), st.integers(0, 6)),
        st.tuples(st.just("advance"), st.integers(0, MODEL_RINGS - 1), st.integers(0, 5)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_matches_a_deque_model(program: list[tuple[str, int, Any]]) -> None:
    size = ring_region_size(MODEL_RINGS, MODEL_SLOTS, MODEL_SLOT_BYTES)
    with UsageRing.create_layout(bytearray(size), MODEL_RINGS, MODEL_SLOTS, MODEL_SLOT_BYTES) as r:
        model: list[deque[bytes]] = [deque() for _ in range(MODEL_RINGS)]
        heads = [0] * MODEL_RINGS
        tails = [0] * MODEL_RINGS
        for op, i, arg in program:
            if op == "push":
                if len(arg) > r.max_record:
                    with pytest.raises(ValueError):
                        r.push(i, arg)
                elif len(model[i]) == MODEL_SLOTS:
                    assert not r.push(i, arg)
                else:
                    assert r.push(i, arg)
                    model[i].append(arg)
                    heads[i] += 1
            elif op == "read":
                assert r.read(i, arg) == list(model[i])[:arg]
            elif arg > len(model[i]):
                with pytest.raises(ValueError):
                    r.advance(i, arg)
            else:
                r.advance(i, arg)
                for _ in range(arg):
                    model[i].popleft()
                tails[i] += arg
            for j in range(MODEL_RINGS):
                assert r.counters(j) == (heads[j], tails[j])
                assert r.pending(j) == len(model[j])


# ---- processes on one SysV segment ----------------------------------------------------------------------


def record(ring: int, i: int, generation: int = 0) -> bytes:
    """Record number ``i`` of a producer: its identity, then 0 to 299 bytes that depend on it."""
    return struct.pack("=HHI", ring, generation, i) + bytes([(i * 7 + ring) % 251]) * (i % 300)


@contextmanager
def shared_ring(rings: int, slots: int, slot_bytes: int) -> Iterator[tuple[Any, UsageRing]]:
    """A fresh SysV segment (``gateway.shm.segment.Segment``) laid out as rings; the parent's view."""
    pytest.importorskip("sysv_ipc")
    from gateway.shm.segment import Segment

    seg = Segment.create(ring_region_size(rings, slots, slot_bytes))
    try:
        with UsageRing.create_layout(seg.buf, rings, slots, slot_bytes) as r:
            yield seg, r
    finally:
        seg.close()


def fork(child: Callable[[], int]) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, which must never return into pytest
        code = 70
        try:
            code = child()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return pid


@contextmanager
def children() -> Iterator[list[int]]:
    """Collects forked pids; any still running at the end (a failed test) is killed and reaped."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def wait_exit(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def producer(seg: Any, ring: int, start: int, count: int, generation: int = 0) -> Callable[[], int]:
    def run() -> int:
        with UsageRing(seg.buf) as r:
            for i in range(start, start + count):
                rec = record(ring, i, generation)
                while not r.push(ring, rec):
                    os.sched_yield()
        return 0

    return run


def drain(r: UsageRing, ring: int, received: list[bytes], until: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(received) < until:
        assert time.monotonic() < deadline, f"ring {ring}: {len(received)} of {until} records received"
        batch = r.read(ring, 64)
        if not batch:
            os.sched_yield()
            continue
        received += batch
        r.advance(ring, len(batch))


def test_producers_race_one_consumer() -> None:
    producers, per_producer = 3, 20_000
    with shared_ring(producers, 256, 384) as (seg, r), children() as pids:
        for ring in range(producers):
            pids.append(fork(producer(seg, ring, 0, per_producer)))
        received = [0] * producers
        deadline = time.monotonic() + 120
        rounds = 0
        while sum(received) < producers * per_producer:
            assert time.monotonic() < deadline, f"received {received}"
            rounds += 1
            idle = True
            for ring in range(producers):
                batch = r.read(ring, 1 + rounds % 97)
                if not batch:
                    continue
                idle = False
                assert r.read(ring, len(batch)) == batch  # read again: nothing was consumed
                for rec in batch:
                    assert rec == record(ring, received[ring]), (ring, received[ring], rec[:8])
                    received[ring] += 1
                r.advance(ring, len(batch))
            if idle:
                os.sched_yield()
        assert [wait_exit(pid) for pid in pids] == [0] * producers
        pids.clear()
        assert received == [per_producer] * producers
        for ring in range(producers):
            assert r.counters(ring) == (per_producer, per_producer)
            assert r.read(ring) == []


def test_killed_producer_is_continued_by_its_successor() -> None:
    with shared_ring(2, 64, 128) as (seg, r), children() as pids:
        read_fd, write_fd = os.pipe()

        def doomed() -> int:
            os.close(read_fd)
            with UsageRing(seg.buf) as ring:
                pushed = sum(ring.push(0, b"gen0 %d" % i) for i in range(100))  # 64 fit
                os.write(write_fd, struct.pack("=Q", pushed))
                time.sleep(60)
            return 0

        pids.append(fork(doomed))
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            (pushed,) = struct.unpack("=Q", pipe.read(8))
        os.kill(pids[0], signal.SIGKILL)
        assert wait_exit(pids.pop()) == -signal.SIGKILL
        assert pushed == 64
        assert r.counters(0) == (64, 0)
        assert r.read(0, 30) == [b"gen0 %d" % i for i in range(30)]
        r.advance(0, 30)

        def successor() -> int:
            with UsageRing(seg.buf) as ring:
                for i in range(200):
                    while not ring.push(0, b"gen1 %d" % i):
                        os.sched_yield()
            return 0

        pids.append(fork(successor))
        received: list[bytes] = []
        drain(r, 0, received, 34 + 200)
        assert wait_exit(pids.pop()) == 0
        assert received == [b"gen0 %d" % i for i in range(30, 64)] + [b"gen1 %d" % i for i in range(200)]
        assert r.counters(0) == (264, 264)
        assert r.counters(1) == (0, 0)


def test_producer_killed_mid_stream_leaves_whole_records() -> None:
    # The kill lands at an arbitrary point of a pushing loop; whatever was published is whole and in order,
    # and a successor continues right after it.
    with shared_ring(1, 32, 512) as (seg, r), children() as pids:
        pids.append(fork(producer(seg, 0, 0, 10**9)))
        received: list[bytes] = []
        drain(r, 0, received, 3_000)
        os.kill(pids[0], signal.SIGKILL)
        assert wait_exit(pids.pop()) == -signal.SIGKILL
        head = r.counters(0)[0]
        drain(r, 0, received, head)
        assert received == [record(0, i) for i in range(head)]

        def successor() -> int:
            with UsageRing(seg.buf) as ring:
                start = ring.counters(0)[0]
                return producer(seg, 0, start, 1_000, generation=1)()

        pids.append(fork(successor))
        drain(r, 0, received, head + 1_000)
        assert wait_exit(pids.pop()) == 0
        assert received[head:] == [record(0, i, 1) for i in range(head, head + 1_000)]
        assert r.counters(0) == (head + 1_000, head + 1_000)
