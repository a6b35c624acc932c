"""GCRA buckets, concurrency gauges and plain atomics from ``gateway.native``: semantics at explicit times,
argument and region checks, and exactness when forked processes race on one SysV segment."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from gateway import native
from gateway.native import (
    ADMITTED,
    LIMIT_CONCURRENCY,
    LIMIT_REQUESTS,
    LIMIT_TOKENS,
    OVER_BUDGET,
    REFUSED,
    AdmissionPlan,
    AtomicWords,
    BucketTable,
    BucketTableFull,
    BudgetWindows,
    Peek,
    RegionError,
    TakeOutcome,
    bucket_key,
    region_size,
)

pytestmark = pytest.mark.skipif(not native.HAVE_NATIVE, reason="gateway._gateway_native is not built")

S = 1_000_000_000  # ns per second
T0 = 1_000 * S  # an arbitrary "now" on the monotonic clock
KEY = native.bucket_key("key:42", "rpm")


@pytest.fixture
def table() -> Iterator[BucketTable]:
    with BucketTable.create_layout(bytearray(region_size(16)), 16) as t:
        yield t


# ---- the region -------------------------------------------------------------------------------------------


def test_region_size() -> None:
    assert region_size(1) == 128
    assert region_size(1024) == 64 * 1025
    for bad in (0, 3, -1, 2**25, 2**64):
        with pytest.raises(ValueError):
            region_size(bad)


def test_attach_needs_an_initialised_region() -> None:
    buf = bytearray(region_size(8))
    with pytest.raises(RegionError):
        BucketTable(buf)
    BucketTable.create_layout(buf, 8).close()
    with BucketTable(buf) as t:
        assert t.capacity == 8
    with pytest.raises(RegionError):  # shorter than its header says
        BucketTable(memoryview(buf)[: region_size(4)])
    with pytest.raises(RegionError):  # misaligned
        BucketTable(memoryview(buf)[1:])
    with pytest.raises(RegionError):
        BucketTable.create_layout(bytearray(region_size(8) - 1), 8)
    with pytest.raises(ValueError):
        BucketTable.create_layout(bytearray(region_size(8)), 6)


def test_create_layout_resets_state() -> None:
    buf = bytearray(region_size(4))
    with BucketTable.create_layout(buf, 4) as t:
        assert t.take_at(KEY, 1.0, 1, 1, T0).admitted
        assert not t.take_at(KEY, 1.0, 1, 1, T0).admitted
    with BucketTable.create_layout(buf, 4) as t:
        assert t.take_at(KEY, 1.0, 1, 1, T0).admitted


def test_close_releases_the_buffer() -> None:
    buf = bytearray(region_size(2))
    t = BucketTable.create_layout(buf, 2)
    with pytest.raises(BufferError):
        buf.extend(b"x")  # pinned while attached
    t.close()
    t.close()
    buf.extend(b"x")
    with pytest.raises(RegionError):
        t.take(KEY, 1.0, 1)
    with pytest.raises(RegionError):
        t.acquire(KEY, 1)


# ---- GCRA -------------------------------------------------------------------------------------------------


def test_burst_then_one_per_interval(table: BucketTable) -> None:
    got = [table.take_at(KEY, 1.0, 10, 1, T0) for _ in range(11)]
    assert got[:10] == [TakeOutcome(True, 0.0, r) for r in range(9, -1, -1)]
    assert got[10] == TakeOutcome(False, 1.0, 0)
    assert table.take_at(KEY, 1.0, 10, 1, T0 + S // 2) == TakeOutcome(False, 0.5, 0)
    assert table.take_at(KEY, 1.0, 10, 1, T0 + S) == TakeOutcome(True, 0.0, 0)
    assert table.take_at(KEY, 1.0, 10, 1, T0 + S) == TakeOutcome(False, 1.0, 0)


def test_take_several_units(table: BucketTable) -> None:
    assert table.take_at(KEY, 1.0, 10, 4, T0) == TakeOutcome(True, 0.0, 6)
    assert table.take_at(KEY, 1.0, 10, 7, T0) == TakeOutcome(False, 1.0, 6)  # one unit short: one interval
    assert table.take_at(KEY, 1.0, 10, 6, T0) == TakeOutcome(True, 0.0, 0)


def test_more_than_burst_is_never_admitted(table: BucketTable) -> None:
    assert table.take_at(KEY, 1.0, 10, 11, T0) == TakeOutcome(False, math.inf, 10)
    assert table.take_at(KEY, 1.0, 10, 11, T0 + 3600 * S).retry_after_s == math.inf
    assert table.take_at(KEY, 1.0, 10, 10, T0) == TakeOutcome(True, 0.0, 0)  # the refusal consumed nothing


def test_zero_units_checks_for_debt(table: BucketTable) -> None:
    assert table.take_at(KEY, 1.0, 10, 0, T0) == TakeOutcome(True, 0.0, 10)
    table.settle_at(KEY, 1.0, 12, T0)
    assert table.take_at(KEY, 1.0, 10, 0, T0) == TakeOutcome(False, 2.0, 0)


def test_fractional_interval(table: BucketTable) -> None:
    for _ in range(3):
        assert table.take_at(KEY, 3.0, 3, 1, T0).admitted
    refused = table.take_at(KEY, 3.0, 3, 1, T0)
    assert not refused.admitted
    assert refused.retry_after_s == pytest.approx(1 / 3, abs=1e-9)
    assert table.take_at(KEY, 3.0, 3, 1, T0 + 333_333_333).admitted


def test_refill_over_time(table: BucketTable) -> None:
    table.take_at(KEY, 2.0, 10, 10, T0)
    assert table.peek_at(KEY, 2.0, 10, T0 + 3 * S // 2) == Peek(3, 3.5)
    assert table.peek_at(KEY, 2.0, 10, T0 + 10 * S) == Peek(10, 0.0)


def test_settle_allows_debt(table: BucketTable) -> None:
    table.settle_at(KEY, 1.0, 50, T0)
    assert table.peek_at(KEY, 1.0, 10, T0) == Peek(0, 50.0)
    assert table.take_at(KEY, 1.0, 10, 1, T0) == TakeOutcome(False, 41.0, 0)
    table.settle_at(KEY, 1.0, 50, T0)  # debt keeps growing
    assert table.peek_at(KEY, 1.0, 10, T0) == Peek(0, 100.0)


def test_refund_stops_at_a_full_bucket(table: BucketTable) -> None:
    table.take_at(KEY, 1.0, 10, 10, T0)
    table.settle_at(KEY, 1.0, -5, T0)
    assert table.peek_at(KEY, 1.0, 10, T0) == Peek(5, 5.0)
    table.settle_at(KEY, 1.0, -100, T0)
    assert table.peek_at(KEY, 1.0, 10, T0) == Peek(10, 0.0)
    table.settle_at(KEY, 1.0, -100, T0)  # refunding a full bucket adds nothing
    assert table.take_at(KEY, 1.0, 10, 10, T0).admitted
    assert not table.take_at(KEY, 1.0, 10, 1, T0).admitted


def test_limit_change_keeps_consumption(table: BucketTable) -> None:
    table.take_at(KEY, 1.0, 10, 5, T0)
    assert table.peek_at(KEY, 1.0, 20, T0) == Peek(15, 5.0)
    assert table.take_at(KEY, 1.0, 20, 15, T0) == TakeOutcome(True, 0.0, 0)
    assert table.take_at(KEY, 1.0, 10, 1, T0) == TakeOutcome(False, 11.0, 0)


def test_peek_neither_changes_nor_claims() -> None:
    with BucketTable.create_layout(bytearray(region_size(1)), 1) as t:
        for k in range(1, 20):
            assert t.peek_at(k, 1.0, 7, T0) == Peek(7, 0.0)
            t.settle_at(k, 1.0, -3, T0)  # a refund to an unknown key does not claim either
            assert t.gauge(k) == 0
            assert t.release(k) == 0
        assert t.take_at(KEY, 1.0, 7, 2, T0).admitted
        assert t.peek_at(KEY, 1.0, 7, T0) == t.peek_at(KEY, 1.0, 7, T0) == Peek(5, 2.0)
        with pytest.raises(BucketTableFull):
            t.take_at(KEY + 1, 1.0, 7, 1, T0)


def test_full_table(table: BucketTable) -> None:
    keys = [native.bucket_key(f"k{i}", "rpm") for i in range(17)]
    for k in keys[:16]:
        assert table.take_at(k, 1.0, 1, 1, T0).admitted
    with pytest.raises(BucketTableFull):
        table.take_at(keys[16], 1.0, 1, 1, T0)
    with pytest.raises(BucketTableFull):
        table.acquire(keys[16], 1)
    assert not table.take_at(keys[3], 1.0, 1, 1, T0).admitted  # existing keys keep their own state
    assert table.take_at(keys[3], 1.0, 1, 1, T0 + S).admitted


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.take_at(KEY, 0.0, 1, 1, T0),
        lambda t: t.take_at(KEY, -1.0, 1, 1, T0),
        lambda t: t.take_at(KEY, math.nan, 1, 1, T0),
        lambda t: t.take_at(KEY, math.inf, 1, 1, T0),
        lambda t: t.take_at(KEY, 1.0, -1, 1, T0),
        lambda t: t.take_at(KEY, 1.0, 1, -1, T0),
        lambda t: t.take_at(KEY, 1.0, 1, 1, -1),
        lambda t: t.take_at(0, 1.0, 1, 1, T0),
        lambda t: t.take(2**64, 1.0, 1),
        lambda t: t.take(-5, 1.0, 1),
        lambda t: t.settle(KEY, 0.0, 1),
        lambda t: t.settle(KEY, 1.0, -(2**63)),
        lambda t: t.settle(KEY, 1.0, 2**63),
        lambda t: t.peek(KEY, 1.0, -1),
        lambda t: t.peek_at(KEY, 1.0, 1, -1),
        lambda t: t.acquire(0, 1),
        lambda t: t.release(0),
    ],
)
def test_invalid_arguments(table: BucketTable, call: Callable[[BucketTable], object]) -> None:
    with pytest.raises(ValueError):
        call(table)


def test_extreme_limits_saturate_without_error(table: BucketTable) -> None:
    assert table.take_at(KEY, 1e-300, 2**62, 1, T0).admitted  # spans saturate at 2**61 ns
    table.settle_at(KEY, 1e-300, 2**62, T0)
    assert not table.take_at(KEY, 1e-300, 1, 1, T0).admitted
    big = native.bucket_key("big", "tpm")
    assert table.take_at(big, 1e300, 10**6, 10**6, T0) == TakeOutcome(True, 0.0, 0)  # 1 ns per unit at most
    assert table.take_at(big, 1e300, 10**6, 10**6, T0 + 10**6) == TakeOutcome(True, 0.0, 0)


def test_real_clock(table: BucketTable) -> None:
    assert table.take(KEY, 0.001, 1) == TakeOutcome(True, 0.0, 0)
    refused = table.take(KEY, 0.001, 1)
    assert not refused.admitted
    assert 999.0 < refused.retry_after_s <= 1000.0
    remaining, reset_after = table.peek(KEY, 0.001, 1)
    assert remaining == 0
    assert 999.0 < reset_after <= 1000.0
    table.settle(KEY, 0.001, -1)
    assert table.peek(KEY, 0.001, 1) == Peek(1, 0.0)
    # take() reads the clock time.monotonic_ns() reads: a TAT set 11 s ahead on one is 11 s on the other.
    other = native.bucket_key("clock", "rpm")
    table.take_at(other, 1.0, 1, 1, time.monotonic_ns() + 10 * S)
    refused = table.take(other, 1.0, 1)
    assert not refused.admitted
    assert 10.5 < refused.retry_after_s <= 11.0


# ---- concurrency gauges ------------------------------------------------------------------------------------


def test_acquire_release(table: BucketTable) -> None:
    assert [table.acquire(KEY, 2) for _ in range(3)] == [True, True, False]
    assert table.gauge(KEY) == 2
    assert table.release(KEY) == 1
    assert table.acquire(KEY, 2)
    assert not table.acquire(KEY, 1)  # a lowered limit applies at once
    assert [table.release(KEY) for _ in range(4)] == [1, 0, 0, 0]
    assert table.gauge(KEY) == 0
    assert not table.acquire(KEY, 0)
    assert not table.acquire(KEY, -1)


def test_gauge_and_bucket_share_a_slot_independently(table: BucketTable) -> None:
    assert table.acquire(KEY, 5)
    assert table.take_at(KEY, 1.0, 3, 3, T0).admitted
    assert table.gauge(KEY) == 1
    assert table.peek_at(KEY, 1.0, 3, T0) == Peek(0, 3.0)


# ---- noted places and admission plans ----------------------------------------------------------------------

RPM, TPM, CONC = (native.bucket_key("p:1", kind) for kind in ("rpm", "tpm", "concurrency"))
KEY_CONC = native.bucket_key("k:1", "concurrency")


@pytest.fixture
def notes() -> Iterator[AtomicWords]:
    with AtomicWords(bytearray(8 * 16)) as words:
        yield words


def test_enter_notes_the_place_and_leave_clears_it(table: BucketTable, notes: AtomicWords) -> None:
    assert table.enter(KEY, 1, notes, 32)
    assert notes.load(32) == KEY and table.gauge(KEY) == 1
    assert not table.enter(KEY, 1, notes, 64)  # full: nothing taken, nothing left noted
    assert notes.load(64) == 0 and table.gauge(KEY) == 1
    assert table.leave(KEY, notes, 32) == 0
    assert notes.load(32) == 0
    assert table.enter(KEY, 1, None, -1)  # unnoted
    assert table.leave(KEY, notes, -1) == 0
    assert table.enter(KEY, 1, notes, 8 * 16)  # a block outside the region is not written
    assert [notes.load(8 * i) for i in range(16)] == [0] * 16


def test_admit_takes_every_limit_and_reports_the_tightest(table: BucketTable, notes: AtomicWords) -> None:
    plan = AdmissionPlan(
        [
            (LIMIT_REQUESTS, RPM, 10, 10 / 60),
            (LIMIT_TOKENS, TPM, 1000, 1000 / 60),
            (LIMIT_CONCURRENCY, CONC, 2, 0.0),
            (LIMIT_CONCURRENCY, KEY_CONC, 5, 0.0),
        ]
    )
    assert plan.gauges == 2
    rc, out = table.admit(plan, 300, notes, 0)
    assert rc == ADMITTED and list(out) == [-1, 0, 0, 9, 1, 700]
    assert (notes.load(0), notes.load(8)) == (CONC, KEY_CONC)
    assert (table.gauge(CONC), table.gauge(KEY_CONC)) == (1, 1)
    # Settling to the real use gives back what was reserved beyond it; the places and notes are freed.
    table.finish(plan, 300, 100, notes, 0)
    assert (table.gauge(CONC), table.gauge(KEY_CONC), notes.load(0), notes.load(8)) == (0, 0, 0, 0)
    assert table.peek(TPM, 1000 / 60, 1000).remaining in (900, 901)


def test_a_refusal_gives_back_what_was_taken(table: BucketTable, notes: AtomicWords) -> None:
    plan = AdmissionPlan(
        [
            (LIMIT_REQUESTS, RPM, 10, 10 / 60),
            (LIMIT_CONCURRENCY, CONC, 1, 0.0),
            (LIMIT_TOKENS, TPM, 100, 100 / 60),
        ]
    )
    assert table.take(TPM, 100 / 60, 100, 100).admitted  # the tokens bucket is empty
    rc, out = table.admit(plan, 50, notes, 0)
    assert rc == REFUSED and out[0] == 2 and 29 * S < out[1] <= 30 * S
    assert table.gauge(CONC) == 0 and notes.load(0) == 0
    assert table.peek(RPM, 10 / 60, 10).remaining == 10  # the request taken from rpm was refunded
    table.settle(TPM, 100 / 60, -100)
    assert table.admit(plan, 50, notes, 0)[0] == ADMITTED
    _, out = table.admit(plan, 50, notes, 32)  # the only place is held
    assert (out[0], out[1]) == (1, S)
    assert notes.load(32) == 0 and table.gauge(CONC) == 1
    assert table.peek(RPM, 10 / 60, 10).remaining == 9


def test_tokens_above_the_burst_take_the_whole_bucket(table: BucketTable) -> None:
    plan = AdmissionPlan([(LIMIT_TOKENS, TPM, 100, 100 / 60)])
    _, out = table.admit(plan, 5000, None, -1)
    assert (out[0], out[4], out[5]) == (-1, 0, 0)
    table.finish(plan, 5000, -1, None, -1)  # usage unknown: the reservation stands
    assert table.peek(TPM, 100 / 60, 100).remaining == 0
    table.finish(plan, 5000, 40, None, -1)  # 40 used of the 100 taken: 60 come back
    assert table.peek(TPM, 100 / 60, 100).remaining == 60


def test_an_empty_plan_admits(table: BucketTable) -> None:
    plan = AdmissionPlan([])
    rc, out = table.admit(plan, 10, None, -1)
    assert rc == ADMITTED and list(out) == [-1, 0, -1, 0, -1, 0]
    assert table.finish(plan, 10, 10, None, -1) == 0


def test_budget_windows_are_checked_first_and_charged_with_the_settling(
    table: BucketTable, notes: AtomicWords
) -> None:
    plan = AdmissionPlan([(LIMIT_REQUESTS, RPM, 10, 10 / 60), (LIMIT_CONCURRENCY, CONC, 1, 0.0)])
    day, month = bucket_key("w", "day"), bucket_key("w", "month")
    windows = BudgetWindows([(day, 100, None), (month, None, 5_000)], ("the day's", "the month's"))
    assert windows.keys == (day, month) and windows.n == 2
    rc, _ = table.admit(plan, 10, notes, 0, windows)
    assert rc == ADMITTED and table.gauge(CONC) == 1
    # Settling gives the place back and adds the spend to every window, in the same call.
    assert table.finish(plan, 10, 10, notes, 0, windows, 60, 2_000) == 2
    assert table.gauge(CONC) == 0
    assert table.spend(day) == (60, 2_000) and table.spend(month) == (60, 2_000)
    table.admit(plan, 10, notes, 0, windows)
    assert table.finish(plan, 10, 10, notes, 0, windows, 40, 3_000) == 2  # the day's 100 tokens reached
    # Over budget: the window's index and its spend; nothing is taken from any limit.
    rpm_before = table.peek(RPM, 10 / 60, 10).remaining
    rc, out = table.admit(plan, 10, notes, 0, windows)
    assert (rc, out[0], out[1], out[2]) == (OVER_BUDGET, 0, 100, 5_000)
    assert table.gauge(CONC) == 0 and notes.load(0) == 0
    assert table.peek(RPM, 10 / 60, 10).remaining == rpm_before
    # The base (set by the control worker) counts: the month's cost limit alone now refuses.
    table.spend_set_base(day, -100, 0)
    rc, out = table.admit(AdmissionPlan([]), 0, None, -1, windows)
    assert (rc, out[0], out[2]) == (OVER_BUDGET, 1, 5_000)
    # No spend: no window is charged (nor claimed).
    quiet = bucket_key("w", "quiet")
    assert table.finish(AdmissionPlan([]), 0, -1, None, -1, BudgetWindows([(quiet, 1, 1)]), 0, 0) == 1
    assert table.spend_parts(quiet) == (0, 0, 0, 0)


def test_a_full_table_charges_the_windows_before_the_one_it_refused() -> None:
    small = BucketTable.create_layout(bytearray(region_size(2)), 2)
    keys = [bucket_key("w", str(i)) for i in range(3)]
    assert (
        small.finish(AdmissionPlan([]), 0, -1, None, -1, BudgetWindows([(k, 10, None) for k in keys]), 1, 0)
        == 2
    )
    assert [small.spend(k) for k in keys[:2]] == [(1, 0), (1, 0)]


def test_invalid_plans_are_refused(table: BucketTable) -> None:
    with pytest.raises(ValueError):
        table.admit(AdmissionPlan([(LIMIT_REQUESTS, RPM, 10, 0.0)]), 1, None, -1)
    with pytest.raises(ValueError):
        table.admit(AdmissionPlan([(7, RPM, 10, 1.0)]), 1, None, -1)
    with pytest.raises(ValueError):
        table.admit(AdmissionPlan([(LIMIT_REQUESTS, RPM, 10, 1.0)]), -1, None, -1)
    with pytest.raises(ValueError):
        AdmissionPlan([(LIMIT_REQUESTS, RPM, 10, 1.0)] * 65)
    with pytest.raises(ValueError):
        table.admit(AdmissionPlan([]), 1, None, -1, BudgetWindows([(0, 1, 1)]))  # key 0 names nothing
    with pytest.raises(ValueError):
        BudgetWindows([(1, 1, 1)] * 65)


# ---- keys and plain atomics --------------------------------------------------------------------------------


def test_bucket_key() -> None:
    key = native.bucket_key("key:1", "rpm")
    assert key == native.bucket_key("key:1", "rpm")
    assert 0 < key < 2**64
    others = {
        native.bucket_key("key:1", "tpm"),
        native.bucket_key("key:2", "rpm"),
        native.bucket_key("key:1r", "pm"),
    }
    assert key not in others
    assert len(others) == 3


def test_atomic_words() -> None:
    buf = bytearray(64)
    with AtomicWords(buf) as words:
        words.store(8, 2**64 - 1)
        assert words.load(8) == 2**64 - 1
        assert words.fetch_add(8, 1) == -1  # previous value, read as signed
        assert words.load(8) == 0
        assert words.fetch_add(16, -3) == 0
        assert words.load(16) == 2**64 - 3
        assert not words.compare_exchange(24, 1, 5)
        assert words.load(24) == 0
        assert words.compare_exchange(24, 0, 5)
        assert words.load(24) == 5
        assert int.from_bytes(buf[24:32], "little") == 5
        with pytest.raises(ValueError):
            words.load(4)
        for offset in (-8, 64, 2**40):
            with pytest.raises(IndexError):
                words.load(offset)
    with pytest.raises(RegionError):
        words.load(0)
    with pytest.raises(RegionError):
        AtomicWords(memoryview(buf)[4:])


# ---- many processes, one segment ------------------------------------------------------------------------

CHILDREN = 4
ATTEMPTS = 100
READY, GO, COUNT, INFLIGHT, PEAK = 0, 8, 16, 24, 32


@contextmanager
def race(
    child: Callable[[BucketTable, AtomicWords], int],
) -> Iterator[tuple[BucketTable, AtomicWords, list[int]]]:
    """Fork CHILDREN processes that attach to a fresh SysV segment and run ``child`` at the same moment;
    yield the parent's views and the children's exit codes, then detach and remove the segment."""
    sysv_ipc = pytest.importorskip("sysv_ipc")
    capacity = 64
    table_size = region_size(capacity)
    seg = sysv_ipc.SharedMemory(None, sysv_ipc.IPC_CREX, size=table_size + 4096, init_character=b"\0")
    try:
        view = memoryview(seg)
        BucketTable.create_layout(view[:table_size], capacity).close()
        pids = []
        for _ in range(CHILDREN):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, which must never return into pytest
                code = 70
                try:
                    with BucketTable(view[:table_size]) as t, AtomicWords(view[table_size:]) as w:
                        w.fetch_add(READY, 1)
                        deadline = time.monotonic() + 20
                        while w.load(GO) == 0 and time.monotonic() < deadline:
                            pass
                        code = child(t, w)
                finally:
                    os._exit(code)
            pids.append(pid)
        with BucketTable(view[:table_size]) as table, AtomicWords(view[table_size:]) as words:
            deadline = time.monotonic() + 20
            while words.load(READY) < len(pids) and time.monotonic() < deadline:
                time.sleep(0.001)
            words.store(GO, 1)
            codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
            yield table, words, codes
        view.release()
        seg.detach()
    finally:
        seg.remove()


def test_processes_admit_exactly_the_burst() -> None:
    def child(t: BucketTable, w: AtomicWords) -> int:
        admitted = sum(t.take(KEY, 1e-6, 100).admitted for _ in range(ATTEMPTS))
        w.fetch_add(COUNT, admitted)
        return 0

    with race(child) as (table, words, codes):
        assert codes == [0] * CHILDREN
        assert words.load(COUNT) == 100
        assert table.peek(KEY, 1e-6, 100).remaining == 0


def test_processes_lose_no_update_under_contention() -> None:
    # Each child runs for several scheduler time slices (tens of ms), so that processes on different cores
    # meet inside the CAS loop many times; a plain load-then-store there over-admits by thousands.
    def child(t: BucketTable, w: AtomicWords) -> int:
        admitted = sum(t.take(KEY, 1e-3, 100_000).admitted for _ in range(50_000))
        w.fetch_add(COUNT, admitted)
        return 0

    with race(child) as (table, words, codes):
        assert codes == [0] * CHILDREN
        assert words.load(COUNT) == 100_000
        assert table.peek(KEY, 1e-3, 100_000).remaining == 0


def test_processes_acquire_exactly_the_limit() -> None:
    def child(t: BucketTable, w: AtomicWords) -> int:
        w.fetch_add(COUNT, sum(t.acquire(KEY, 7) for _ in range(ATTEMPTS)))
        return 0

    with race(child) as (table, words, codes):
        assert codes == [0] * CHILDREN
        assert words.load(COUNT) == 7
        assert table.gauge(KEY) == 7


def test_processes_never_exceed_the_limit_while_churning() -> None:
    def child(t: BucketTable, w: AtomicWords) -> int:
        for _ in range(20_000):
            if t.acquire(KEY, 3):
                w.fetch_add(COUNT, 1)
                inside = w.fetch_add(INFLIGHT, 1) + 1
                peak = w.load(PEAK)
                while inside > peak and not w.compare_exchange(PEAK, peak, inside):
                    peak = w.load(PEAK)
                w.fetch_add(INFLIGHT, -1)
                t.release(KEY)
        return 0

    with race(child) as (table, words, codes):
        assert codes == [0] * CHILDREN
        assert 1 <= words.load(PEAK) <= 3
        assert words.load(COUNT) >= 20_000  # every process gets in at least now and then
        assert table.gauge(KEY) == 0
