"""The usage pipeline without processes: records encode and decode, the store writes them exactly once,
the control worker's sink drains rings into it and keeps budgets' base spend, and a worker's log keeps
records in order when its ring is full. Store-backed tests run on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.budget import Budget, BudgetSet, period_window, window_key
from gateway.config import Settings
from gateway.controlplane.store import Store, StoreError, open_store
from gateway.controlplane.usage.metrics import Metrics
from gateway.controlplane.usage.otel import OtelExporter
from gateway.controlplane.usage.requests_view import request_doc
from gateway.controlplane.usage.sink import UsageSink
from gateway.dataplane.accounting import Accounting, Exchange
from gateway.dataplane.budgets import BudgetGuard
from gateway.dataplane.limits import Limiter
from gateway.dataplane.tap import ResponseTap
from gateway.dataplane.usage_log import UsageLog
from gateway.errors import BudgetExceeded, RateLimited
from gateway.native import BucketTable, UsageRing, region_size, ring_region_size
from gateway.shm.regions import RING_SLOT_BYTES
from gateway.snapshot import KeyEntry, Principal, Route, Snapshot
from gateway.usage_record import (
    MAX_FIGURE,
    UsageRecord,
    access_line,
    bound_record,
    decode_record,
    encode_record,
    fit_record,
    fit_tag,
    records_from_values,
    to_signed64,
    to_unsigned64,
)

pytestmark = pytest.mark.skipif(not native.HAVE_NATIVE, reason="gateway._gateway_native is not built")

EPOCH = "0123456789abcdef"
NOW = 1_800_000_000.0  # 2027-01-15, inside one day and one month window
DAY = period_window("day", NOW)


def rec(
    i: int, principal: str = "p1", tokens: int = 10, budget_keys: list[int] | None = None, **kw: object
) -> UsageRecord:
    fields: dict[str, object] = {
        "request_id": f"req-{i:06d}",
        "ts": NOW,
        "principal_id": principal,
        "key_id": "k1",
        "model": "chat",
        "backend": "a",
        "status": 200,
        "prompt_tokens": 4,
        "completion_tokens": tokens - 4,
        "cached_tokens": 0,
        "total_tokens": tokens,
        "usage_source": "reported",
        "cost_nanos": tokens * 100,
        "latency_ms": 1.5,
        "ttfb_ms": 1.0,
        "budget_keys": budget_keys,
    }
    fields.update(kw)
    return UsageRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    database = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    with open_store(Settings(data_dir=tmp_path, database=database)) as s:
        yield s


@pytest.fixture
def ring() -> UsageRing:
    return UsageRing.create_layout(bytearray(ring_region_size(2, 64, 1024)), 2, 64, 1024)


@pytest.fixture
def table() -> BucketTable:
    return BucketTable.create_layout(bytearray(region_size(64)), 64)


def budget_doc(tokens: int = 1000, period: str = "day") -> dict[str, object]:
    return {"p1": {"name": "alice", "budget": {"period": period, "tokens": tokens}}, "p2": {"name": "bob"}}


# ---- records -----------------------------------------------------------------------------------------------


def test_record_round_trip() -> None:
    trace = [["a", "m-a", "connect", None, 1.5], ["b", "m-b", 200, 3.25, 10.0]]
    span = ["0af7651916cd43dd8448eb211c80319c", None, "b7ad6b7169203331", "chat", "openai"]
    r = rec(
        1, budget_keys=[2**64 - 5, 3], client_request_id="trace-7", attempts=2, tag="red-team", cut="client"
    )
    r = r._replace(rule="big-prompts", trace=trace, span=span, key_budget_keys=[2**63])
    assert orjson.loads(encode_record(r))[0] == 7
    assert decode_record(encode_record(r)) == r
    assert decode_record(encode_record(r._replace(tag=None))).tag is None
    assert decode_record(encode_record(r._replace(cut=None))).cut is None
    row = r.row()
    assert row[15] == "[18446744073709551611,3]"  # unsigned, as the bucket table names them
    assert row[16:20] == ("trace-7", 2, "red-team", "client") and row[20] == "big-prompts"
    assert orjson.loads(row[21]) == trace and orjson.loads(row[22]) == span
    assert row[23] == "[9223372036854775808]"


def test_older_records_still_decode() -> None:
    r = rec(1, budget_keys=[2**64 - 5], client_request_id="c", attempts=3, tag="t", cut="upstream")
    # Before version 7 a record named one live counter, the principal's, as an integer.
    old = [*r[:15], 2**64 - 5, *r[16:23]]
    v1 = orjson.dumps([1, *old[:16]])  # what a proxy host may still hold in its spool after an upgrade
    assert decode_record(v1) == r._replace(client_request_id=None, attempts=1, tag=None, cut=None)
    assert decode_record(orjson.dumps([2, *old[:17]])) == r._replace(attempts=1, tag=None, cut=None)
    assert decode_record(orjson.dumps([3, *old[:18]])) == r._replace(tag=None, cut=None)
    assert decode_record(orjson.dumps([4, *old[:19]])) == r._replace(cut=None)
    assert decode_record(orjson.dumps([5, *old[:20]])) == r  # no rule, trace nor span
    assert decode_record(orjson.dumps([6, *old])) == r  # no key budgets
    assert decode_record(orjson.dumps([6, *old[:15], None, *old[16:]])) == r._replace(budget_keys=None)
    with pytest.raises(ValueError):
        decode_record(orjson.dumps([3, *old[:19]]))  # a version 3 record has no tag
    with pytest.raises(ValueError):
        decode_record(orjson.dumps([4, *old[:20]]))  # a version 4 record has no cut
    with pytest.raises(ValueError):
        decode_record(orjson.dumps([5, *old[:19]]))  # and a version 5 record has one, if only null
    with pytest.raises(ValueError):
        decode_record(orjson.dumps([6, *old[:20]]))  # a version 6 record has a trace, if only null
    with pytest.raises(ValueError):
        decode_record(orjson.dumps([7, *old]))  # a version 7 record has the key's budgets, if only null
    with pytest.raises(ValueError):
        decode_record(orjson.dumps([7, *old, None]))  # and lists the principal's, not one integer


def longest(tag: str | None, budgets: int = 4) -> UsageRecord:
    """A record whose other fields are as long as they may be: 200-character names, a 128-character
    client request id made of characters JSON escapes, the most budgets a principal and a key may have."""
    return rec(
        1,
        principal="p" * 16,
        request_id="r" * 24,
        ts=1_800_000_000.123456,
        key_id="k" * 16,
        model="m" * 200,
        backend="b" * 200,
        budget_keys=[2**64 - 1] * budgets or None,
        key_budget_keys=[2**64 - 1] * budgets or None,
        client_request_id='"\\' * 64,
        cost_nanos=10**15,
        latency_ms=123456.789,
        ttfb_ms=123456.789,
        attempts=12,
        tag=tag,
    )


def test_a_long_tag_is_cut_to_fit_the_ring_slot() -> None:
    limit = RING_SLOT_BYTES - 8
    # Every field at its longest still fits without a tag (budget keys are never left out: the sink
    # would count the request twice), and a short tag beside all but the budgets.
    assert len(encode_record(longest(None))) <= limit
    short = encode_record(longest("red-team", budgets=1))
    assert len(short) <= limit and fit_tag(short, limit) is short  # what fits is left alone
    for tag in ("t" * 500, "é" * 500, '"' * 500, "\x01" * 500):
        data = encode_record(longest(tag, budgets=1))
        assert len(data) > limit
        fitted = fit_tag(data, limit)
        assert len(fitted) <= limit
        got = decode_record(fitted)
        assert got == longest(got.tag, budgets=1)  # only the tag changed
        assert got.tag and tag.startswith(got.tag)
        assert (
            len(encode_record(longest(tag[: len(got.tag) + 1], budgets=1))) > limit
        )  # and it was cut no further
    no_room = encode_record(longest("t" * 500, budgets=1))
    assert decode_record(fit_tag(no_room, len(no_room) - 500)).tag is None
    untagged = encode_record(longest(None, budgets=1))
    assert fit_tag(untagged, 10) is untagged  # too long without a tag: for the ring to refuse


def test_access_line_has_the_tag_only_when_set() -> None:
    assert "tag" not in orjson.loads(access_line(rec(1)))
    assert orjson.loads(access_line(rec(1, tag="red-team"), "alice"))["tag"] == "red-team"


@pytest.mark.parametrize("tag", [None, "red-team", "t" * 500])
def test_finish_records_the_exchange_tag(tag: str | None) -> None:
    ring = UsageRing.create_layout(bytearray(ring_region_size(1, 4, RING_SLOT_BYTES)), 1, 4, RING_SLOT_BYTES)
    accounting = Accounting(None, None, UsageLog(ring, 0))
    principal = Principal("p1", "alice", True, frozenset())
    ex = accounting.admit(
        KeyEntry("k1", principal, None),
        "m" * 200,
        Route("chat", "chat", "frontend", ()),
        40,
        8,
        512,
        "c" * 128,
    )
    assert isinstance(ex, Exchange) and ex.tag is None
    ex.tag = tag
    accounting.finish(ex, ResponseTap(None, []), 502, "b" * 200, 2)
    (data,) = ring.read(0)
    got = decode_record(data)
    assert (got.model, got.client_request_id, got.status, got.attempts) == ("m" * 200, "c" * 128, 502, 2)
    if tag is None or len(tag) < 100:
        assert got.tag == tag
    else:  # cut to what fits the slot
        assert got.tag and tag.startswith(got.tag) and len(got.tag) < len(tag)


class _Stream:
    """What granian's RSGI protocol gives a stream, minus the network."""

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Stream:
        return self

    async def send_bytes(self, data: bytes) -> None:
        pass


@pytest.mark.parametrize(
    ("cut", "usage_chunk", "expected"),
    [
        ("client", False, ("estimated", 200, 40, "client")),  # 40 chunks of " tok" relayed, then gone
        ("upstream", False, ("estimated", 200, 40, "upstream")),
        ("client", True, ("reported", 200, 300, "client")),  # the engine's own count had arrived
    ],
)
def test_an_answer_cut_short_is_billed_for_what_was_relayed(
    cut: str, usage_chunk: bool, expected: tuple[str, int, int, str]
) -> None:
    import asyncio

    ring = UsageRing.create_layout(bytearray(ring_region_size(1, 4, RING_SLOT_BYTES)), 1, 4, RING_SLOT_BYTES)
    accounting = Accounting(None, None, UsageLog(ring, 0))
    principal = Principal("p1", "alice", True, frozenset())
    ex = accounting.admit(
        KeyEntry("k1", principal, None), "chat", Route("chat", "chat", "frontend", ()), 40, 300, 512
    )
    assert isinstance(ex, Exchange)
    tap = ResponseTap(_Stream(), [])
    transport = tap.response_stream(200, [])
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'
    usage = (
        b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":290,"total_tokens":300}}\n\n'
    )

    async def relay() -> None:
        for _ in range(40):
            await transport.send_bytes(chunk)
        if usage_chunk:
            await transport.send_bytes(usage)

    asyncio.run(relay())
    tap.backend, tap.attempts = "a", 1
    if cut == "upstream":
        tap.cut = cut
        accounting.finish(ex, tap, 200, None, 0)
    else:  # the client left: the request path knows only that (499), the tap the rest
        accounting.finish(ex, tap, 499, None, 0)
    (data,) = ring.read(0)
    got = decode_record(data)
    source, status, completion_or_total, why = expected
    assert (got.usage_source, got.status, got.cut, got.backend, got.attempts) == (source, status, why, "a", 1)
    if source == "estimated":
        assert got.completion_tokens == completion_or_total and got.prompt_tokens == ex.prompt_estimate
    else:
        assert got.total_tokens == completion_or_total


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"{}",
        b"[2]",
        encode_record(rec(1))[:-2] + b"]",  # one field short
        encode_record(rec(1)._replace(status=True)),  # a bool is not an int
        encode_record(rec(1)._replace(model=None)),  # not nullable
        encode_record(rec(1)._replace(request_id="")),
        encode_record(rec(1)._replace(request_id="x" * 65)),
    ],
)
def test_decode_rejects_what_is_not_a_record(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_record(data)
    try:
        batch = orjson.loads(b"[" + encode_record(rec(1)) + b"," + data + b"]")
    except orjson.JSONDecodeError:
        return
    assert records_from_values(batch) is None  # nor is a batch that holds it: decoded one by one


def test_a_batch_decodes_as_its_records() -> None:
    records = [
        rec(
            i,
            budget_keys=[2**64 - 1 - i] if i % 2 else None,
            key_budget_keys=[i, 2**64 - 1] if i % 3 else None,
            attempts=i % 3,
            tag="t" if i % 2 else None,
            ttfb_ms=None if i % 3 else 1.0,
            cut=("client", "upstream", None)[i % 3],
        )
        for i in range(5)
    ]
    batch = orjson.loads(b"[" + b",".join(encode_record(r) for r in records) + b"]")
    got = records_from_values(batch)
    assert got == records and all(type(r) is UsageRecord for r in got)
    assert records_from_values([]) == []
    older = orjson.loads(orjson.dumps([3, *records[0][:18]]))
    assert records_from_values([*batch, older]) is None  # an older version: one by one
    for version in (4, 5, 8):  # a version 4 record has no cut, 5 no trace; there is no version 8
        assert records_from_values([*batch, [version, *batch[0][1:]]]) is None


def test_signed_conversions_at_the_edges() -> None:
    for value in (0, 1, 2**63 - 1, 2**63, 2**64 - 1):
        signed = to_signed64(value)
        assert signed is not None and -(2**63) <= signed < 2**63
        assert to_unsigned64(signed) == value
    assert to_signed64(None) is None and to_unsigned64(None) is None


# ---- the store ---------------------------------------------------------------------------------------------


def test_insert_writes_each_request_id_once(store: Store) -> None:
    batch = [rec(i) for i in range(5)]
    assert store.usage.insert(batch, lambda r: True) == batch
    replay = [rec(3), rec(4), rec(5)]
    assert store.usage.insert(replay, lambda r: True) == [rec(5)]
    assert store.usage.insert([rec(6), rec(6)], lambda r: True) == [rec(6)]  # a duplicate within a batch
    assert store.usage.insert([rec(7)]) == []  # nothing watched: nothing reported, still written
    assert store.usage.count() == 8
    assert sorted(r.request_id for r in store.usage.records()) == [f"req-{i:06d}" for i in range(8)]


def test_absent_fields_are_stored_as_null_and_read_back_as_none(store: Store) -> None:
    """Nullable fields go in as SQL NULL (for SQLite through the driver's adapter for None) and come back
    as None, beside a record that has them all."""
    empty = rec(1, backend=None, ttfb_ms=None, budget_keys=None, client_request_id=None, tag=None)
    full = rec(2, backend="b", ttfb_ms=2.5, budget_keys=[7], client_request_id="c-2", tag="t")
    full = full._replace(key_budget_keys=[8, 9])
    store.usage.insert([empty, full])
    assert sorted(store.usage.records(), key=lambda r: r.request_id) == [empty, full]


def test_a_large_batch_is_written_whole_and_once(store: Store) -> None:
    # Several statements of many rows, a remainder, duplicates inside one statement and across them, and
    # ids stored by an earlier batch.
    store.usage.insert([rec(i) for i in range(0, 100, 7)])
    batch = [rec(i % 45) for i in range(90)] + [rec(44, tokens=99)]
    new = store.usage.insert(batch, lambda r: True)
    assert sorted({r.request_id for r in new}) == [f"req-{i:06d}" for i in range(45) if i % 7]
    assert store.usage.count() == 45 + len([i for i in range(45, 100, 7)])
    stored = {r.request_id: r for r in store.usage.records()}
    assert stored["req-000044"].total_tokens == 10  # the first of the duplicates is the one kept


def test_awkward_values_are_stored_as_they_are(store: Store) -> None:
    """Text that a COPY stream or a statement must escape, integers where floats are usual, the extremes of
    the integer columns: each comes back as it went in."""
    odd = "tab\there, line\nbreak, back\\slash, quote\" ' comma, é, \\N, \\."
    awkward = rec(1, tag=odd, client_request_id="\\N", model="m\r", latency_ms=3, ttfb_ms=0)
    awkward = awkward._replace(cost_nanos=2**63 - 1, trace=[["a", "m", 200, 1.5, 2.0]], cut=odd)
    store.usage.insert([awkward, rec(2)])
    got = {r.request_id: r for r in store.usage.records()}
    assert got["req-000001"] == awkward
    assert got["req-000001"].latency_ms == 3.0
    assert got["req-000002"] == rec(2)


# The columns of a record's first 15 fields (the others may be NULL), for inserts through the driver.
NAMES = ("request_id", "ts", "principal_id", "key_id", "model", "backend", "status", "prompt_tokens")
NAMES += ("completion_tokens", "cached_tokens", "total_tokens", "usage_source", "cost_nanos")
NAMES += ("latency_ms", "ttfb_ms")


def row(i: int) -> tuple[str | int | float | None, ...]:
    return tuple(rec(i))[:15]  # type: ignore[return-value]


def test_each_insert_writes_only_its_own_rows(store: Store) -> None:
    """Two inserts in one transaction: the second writes its rows only (on PostgreSQL both pass through
    one staging table), so a row deleted in between stays deleted."""
    with store._driver.transaction(write=True) as tx:
        tx.insert_new("usage_records", NAMES, store.usage._key, [row(1), row(2)])
        tx.execute("DELETE FROM usage_records WHERE request_id = ?", ("req-000001",))
        tx.insert_new("usage_records", NAMES, store.usage._key, [row(3)])
    assert sorted(r.request_id for r in store.usage.records()) == ["req-000002", "req-000003"]


def test_an_insert_says_which_rows_were_new(store: Store) -> None:
    """``returning``: the keys of exactly the rows inserted. All of them (SQLite's count of changes); some
    already stored, one repeated within the batch, the table's last rows deleted before the batch (SQLite's
    fallback, by rowid); more than one statement's rows (16)."""
    key = store.usage._key

    def keys(got: list[Any]) -> set[str]:
        return {str(k[0]) for k in got}

    with store._driver.transaction(write=True) as tx:
        got = tx.insert_new("usage_records", NAMES, key, [row(i) for i in range(1, 21)], returning=True)
    assert keys(got) == {f"req-{i:06d}" for i in range(1, 21)} and len(got) == 20
    with store._driver.transaction(write=True) as tx:
        tx.execute("DELETE FROM usage_records WHERE request_id IN (?, ?)", ("req-000019", "req-000020"))
        batch = [row(i) for i in (3, 21, 5, 22, 21, 23, *range(24, 44), 7)]
        got = tx.insert_new("usage_records", NAMES, key, batch, returning=True)
    assert keys(got) == {f"req-{i:06d}" for i in range(21, 44)} and len(got) == 23
    with store._driver.transaction(write=True) as tx:
        assert tx.insert_new("usage_records", NAMES, key, [row(1), row(30)], returning=True) == []
    assert store.usage.count() == 41


def test_an_insert_after_a_rolled_back_one_still_writes(store: Store) -> None:
    """A transaction that staged rows and then failed leaves nothing behind (on PostgreSQL its rollback
    may also undo the staging table's creation), and the inserts after it write as usual."""
    for attempt in range(6):  # enough for the pool to hand out each of its connections
        with pytest.raises(RuntimeError), store._driver.transaction(write=True) as tx:
            tx.insert_new("usage_records", NAMES, store.usage._key, [row(100 + attempt)])
            raise RuntimeError("the batch failed half-way")
        store.usage.insert([rec(attempt)])
    assert sorted(r.request_id for r in store.usage.records()) == [f"req-{i:06d}" for i in range(6)]


def test_budget_keys_of_both_halves_are_stored(store: Store) -> None:
    keys = {"req-000001": [2**64 - 1, 0], "req-000002": None, "req-000003": [5], "req-000004": [2**63]}
    store.usage.insert([rec(int(rid[4:]), budget_keys=key, key_budget_keys=key) for rid, key in keys.items()])
    got = {r.request_id: (r.budget_keys, r.key_budget_keys) for r in store.usage.records()}
    assert got == {rid: (key, key) for rid, key in keys.items()}


def test_spend_groups_by_live_counters(store: Store) -> None:
    day, month = 2**63 + 12345, 7  # the first above the signed range
    store.usage.insert(
        [
            rec(1, budget_keys=[day, month]),
            rec(2, budget_keys=[day, month]),
            rec(3),
            rec(4, principal="p2"),
            rec(6, budget_keys=[month], key_budget_keys=[99], key_id="k2"),
            rec(7, key_budget_keys=[99], key_id="k2"),
        ]
    )
    store.usage.insert([rec(5, ts=DAY[1])])  # the next window
    rows = {r.owner_id: (r.tokens, r.cost_nanos, r.held) for r in store.usage.spend(*DAY)}
    assert rows == {
        "p1": (50, 5000, {day: (20, 2000), month: (30, 3000)}),
        "p2": (10, 1000, {}),
    }
    assert [r.owner_id for r in store.usage.spend(*DAY, ["p2"])] == ["p2"]
    assert store.usage.spend(*DAY, []) == []
    by_key = {(r.owner_id, r.tokens): r.held for r in store.usage.key_spend(*DAY, {"k2": "p1", "k1": "p1"})}
    assert by_key == {("k1", 30): {}, ("k2", 20): {99: (20, 2000)}}  # p2's k1 record is not p1's
    assert store.usage.key_spend(*DAY, {"k2": "p2"}) == []  # the principal narrows the search


def test_summary_groups_and_counts_errors(store: Store) -> None:
    store.usage.insert(
        [
            rec(1),
            rec(2, model="other"),
            rec(3, status=502, total_tokens=0, usage_source="none"),
            rec(4, backend=None),
        ]
    )
    by_model = {r.group: r for r in store.usage.summary(*DAY, "model")}
    assert (by_model["chat"].requests, by_model["chat"].errors) == (3, 1)
    assert by_model["other"].total_tokens == 10
    assert {r.group for r in store.usage.summary(*DAY, "backend")} == {"a", "-"}
    assert [r.group for r in store.usage.summary(*DAY, "principal")] == ["p1"]  # no such principal: its id
    with pytest.raises(ValueError):
        store.usage.summary(*DAY, "colour")


def test_summary_by_time_bucket(store: Store) -> None:
    hour = DAY[0] + 3600 * 5
    store.usage.insert(
        [
            rec(1, ts=hour + 1),
            rec(2, ts=hour + 3599.9),
            rec(3, ts=hour + 3600),
            rec(4, ts=hour + 7300, model="x"),
        ]
    )
    rows = [(r.bucket_start, r.group, r.requests) for r in store.usage.summary(*DAY, "model", 3600)]
    assert rows == [(hour, "chat", 2), (hour + 3600, "chat", 1), (hour + 7200, "x", 1)]


# ---- the sink ----------------------------------------------------------------------------------------------


def push(ring: UsageRing, index: int, *records: UsageRecord) -> None:
    for r in records:
        assert ring.push(index, encode_record(r))


def test_drain_moves_every_ring_into_the_store(store: Store, ring: UsageRing, table: BucketTable) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    push(ring, 0, rec(1), rec(2))
    push(ring, 1, rec(3))
    assert sink.drain() == 3
    assert sink.drain() == 0
    assert (ring.pending(0), ring.pending(1), store.usage.count()) == (0, 0, 3)


def test_drain_pauses_the_collector_only_while_it_runs(
    tmp_path: Path, ring: UsageRing, table: BucketTable
) -> None:
    """The collector is off during a drain and back on after it, also when the store fails; a caller that
    had switched it off keeps it off."""

    class Watching(Metrics):
        seen: list[bool] = []

        def observe(self, records: Iterable[UsageRecord], principal_names: dict[str, str]) -> None:
            self.seen.append(gc.isenabled())
            super().observe(records, principal_names)

    with open_store(Settings(data_dir=tmp_path)) as store:
        sink = UsageSink(store, ring, table, EPOCH)
        sink.metrics = Watching()
        push(ring, 0, rec(1))
        assert gc.isenabled()
        assert sink.drain() == 1
        assert Watching.seen == [False] and gc.isenabled()
        gc.disable()
        try:
            push(ring, 0, rec(2))
            assert sink.drain() == 1
            assert not gc.isenabled()
        finally:
            gc.enable()
        push(ring, 0, rec(3))
    with pytest.raises(StoreError):  # the store is closed now
        sink.drain()
    assert gc.isenabled() and ring.pending(0) == 1


def test_a_replayed_batch_is_written_once(store: Store, ring: UsageRing, table: BucketTable) -> None:
    """A control worker that died after committing but before advancing the tail: its successor reads the
    same records again; nothing is written or counted twice."""
    sink = UsageSink(store, ring, table, EPOCH)
    sink.set_budgets(budget_doc(), now=NOW)
    push(ring, 0, rec(1), rec(2))
    store.usage.insert([decode_record(b) for b in ring.read(0)])  # the crashed predecessor's commit
    successor = UsageSink(store, ring, table, EPOCH)
    successor.set_budgets(budget_doc(), now=NOW)  # recomputes from the store: 20 tokens
    assert successor.drain() == 2
    assert store.usage.count() == 2
    key = window_key(EPOCH, "p1", "day", DAY[0])
    assert table.spend_parts(key) == (0, 0, 20, 2000)


def test_base_holds_what_the_live_counter_does_not(store: Store, ring: UsageRing, table: BucketTable) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    key = window_key(EPOCH, "p1", "day", DAY[0])
    store.usage.insert([rec(1), rec(2, budget_keys=[12345])])  # before this table: all of it is base
    sink.set_budgets(budget_doc(), now=NOW)
    assert table.spend_parts(key) == (0, 0, 20, 2000)
    # A worker that charged the live counter (as the data plane does) and one that had no budget yet.
    table.spend_add(key, 10, 1000)
    push(ring, 0, rec(3, budget_keys=[key]), rec(4), rec(5, principal="p2"), rec(6, ts=DAY[0] - 1))
    sink.drain()
    assert table.spend_parts(key) == (10, 1000, 30, 3000)
    assert table.spend(key) == (40, 4000)
    sink.recompute(NOW)  # from the store alone: the same base
    assert table.spend_parts(key) == (10, 1000, 30, 3000)


def test_a_new_window_starts_from_what_it_holds(store: Store, ring: UsageRing, table: BucketTable) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    sink.set_budgets(budget_doc(), now=NOW)
    store.usage.insert([rec(1)])
    tomorrow = DAY[1] + 10
    sink.tick(tomorrow)
    new_key = window_key(EPOCH, "p1", "day", DAY[1])
    assert table.spend(new_key) == (0, 0)
    push(ring, 0, rec(2, ts=tomorrow))
    sink.drain()
    assert table.spend(new_key) == (10, 1000)


MONTH = period_window("month", NOW)


def windows_doc() -> tuple[dict[str, object], dict[str, object]]:
    """Alice with a day and a month budget; her key k1 with a day budget of its own; bob with none."""
    principals = {
        "p1": {
            "name": "alice",
            "budgets": [
                {"period": "day", "tokens": 1000, "alerts": [0.5]},
                {"period": "month", "tokens": 5000, "alerts": [0.01, 1.0]},
            ],
        },
        "p2": {"name": "bob"},
    }
    keys = {
        "h1": {"id": "k1", "principal": "p1", "name": "ci", "budgets": [{"period": "day", "tokens": 100}]},
        "h2": {"id": "k2", "principal": "p1"},
    }
    return principals, keys


def test_every_window_of_principals_and_keys_has_its_own_base(
    store: Store, ring: UsageRing, table: BucketTable
) -> None:
    day = window_key(EPOCH, "p1", "day", DAY[0])
    month = window_key(EPOCH, "p1", "month", MONTH[0])
    own = window_key(EPOCH, "key:k1", "day", DAY[0])
    store.usage.insert(
        [
            rec(1, ts=MONTH[0] + 1),  # earlier this month: the month's only
            rec(2),  # today, before this table: every window's
            rec(3, key_id="k2"),  # another key of alice's: her windows', not k1's
            rec(4, budget_keys=[day, month], key_budget_keys=[own]),  # held live by all three
            rec(5, budget_keys=[day]),  # charged before the month budget existed: the month's base
        ]
    )
    sink = UsageSink(store, ring, table, EPOCH)
    sink.set_budgets(*windows_doc(), now=NOW)
    assert table.spend_parts(day) == (0, 0, 20, 2000)  # 2, 3
    assert table.spend_parts(month) == (0, 0, 40, 4000)  # 1, 2, 3, 5
    assert table.spend_parts(own) == (0, 0, 20, 2000)  # 2, 5 (k1's records its counter does not hold)
    # Drained records fold into exactly the windows whose live counters do not hold them.
    table.spend_add(day, 10, 1000)
    table.spend_add(month, 10, 1000)
    table.spend_add(own, 10, 1000)
    push(
        ring,
        0,
        rec(6, budget_keys=[day, month], key_budget_keys=[own]),
        rec(7, budget_keys=[day, month], key_id="k2"),
        rec(8, key_budget_keys=[own]),  # an older worker's: only the key's counter
        rec(9, principal="p2", key_id="k9"),
    )
    sink.drain()
    # 8, which only the key's counter holds, joins alice's day and month bases.
    expected = {day: (10, 1000, 30, 3000), month: (10, 1000, 50, 5000), own: (10, 1000, 20, 2000)}
    assert {k: table.spend_parts(k) for k in expected} == expected
    sink.recompute(NOW)  # from the store alone: the same bases
    assert {k: table.spend_parts(k) for k in expected} == expected
    # Another host's table holds none of them live: its bases are the whole stored spend of each window.
    assert sink.bases_for("other", NOW) == {
        str(window_key("other", "p1", "day", DAY[0])): [70, 7000],  # 2 to 8
        str(window_key("other", "p1", "month", MONTH[0])): [80, 8000],  # 1 to 8
        str(window_key("other", "key:k1", "day", DAY[0])): [50, 5000],  # k1's today: 2, 4, 5, 6, 8
    }


def test_alerts_fire_once_per_threshold_and_window_for_principals_and_keys(
    store: Store, ring: UsageRing, table: BucketTable, caplog: pytest.LogCaptureFixture
) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    sink.set_budgets(*windows_doc(), now=NOW)
    own = window_key(EPOCH, "key:k1", "day", DAY[0])
    table.spend_add(window_key(EPOCH, "p1", "day", DAY[0]), 600, 0)
    table.spend_add(window_key(EPOCH, "p1", "month", MONTH[0]), 600, 0)
    table.spend_add(own, 100, 0)  # the key has no thresholds: a gauge, no alert
    with caplog.at_level(logging.WARNING, logger="gateway.controlplane"):
        due = sink.check_alerts(NOW)
        assert [(a.principal, a.key, a.period, a.threshold) for a in due] == [
            ("alice", None, "day", 0.5),
            ("alice", None, "month", 0.01),
        ]
        assert sink.check_alerts(NOW + 1) == []  # once each
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "budget alert: principal alice has used 60% of its day budget",
        "budget alert: principal alice has used 12% of its month budget",
    ]
    lines = sink.alerts.render()
    assert 'gateway_budget_used_ratio{principal="alice",period="day"} 0.600000' in lines
    assert 'gateway_budget_used_ratio{principal="alice",key="ci",period="day"} 1.000000' in lines
    assert 'gateway_budget_alert_threshold{principal="alice",period="month"} 0.01' in lines
    assert 'gateway_budget_alert_threshold{principal="alice",key="ci",period="day"} 0' in lines
    # The key's own threshold, once it has one; its document names the scope and the key.
    principals, keys = windows_doc()
    keys["h1"]["budgets"] = [{"period": "day", "tokens": 100, "alerts": [0.9]}]  # type: ignore[index]
    sink.set_budgets(principals, keys, now=NOW)
    (alert,) = sink.check_alerts(NOW + 2)
    assert alert.document() | {"message": None, "window_start": None, "window_end": None} == {
        "event": "budget_threshold",
        "scope": "key",
        "principal": "alice",
        "key": "ci",
        "key_id": "k1",
        "period": "day",
        "threshold": 0.9,
        "used": 1.0,
        "tokens": 100,
        "tokens_limit": 100,
        "cost": 0.0,
        "cost_limit": None,
        "window_start": None,
        "window_end": None,
        "message": None,
    }
    assert alert.message().startswith(
        "budget alert: key ci (principal alice) has used 100% of its day budget"
    )
    # The next day is a new window: its thresholds may fire again.
    table.spend_add(window_key(EPOCH, "p1", "day", DAY[1]), 900, 0)
    sink.tick(DAY[1] + 1)
    assert [(a.period, a.threshold) for a in sink.check_alerts(DAY[1] + 1)] == [("day", 0.5)]


def test_a_request_is_checked_and_charged_in_every_window() -> None:
    table = BucketTable.create_layout(bytearray(region_size(64)), 64)
    day, month = Budget("p1", "day", 100, None), Budget("p1", "month", 150, None)
    own = Budget("key:k1", "day", None, 5000)
    budgets = BudgetSet((day, month), (own,))
    guard = BudgetGuard(table, "e")
    guard.check(budgets, NOW)
    keys = guard.charge(budgets, NOW, 60, 2000)
    assert keys == ((day.key_at("e", NOW), month.key_at("e", NOW)), (own.key_at("e", NOW),))
    assert [table.spend(k) for k in (*keys[0], *keys[1])] == [(60, 2000)] * 3
    guard.charge(budgets, NOW, 40, 2000)
    with pytest.raises(BudgetExceeded, match="this principal has used 100 of 100 tokens in its day budget"):
        guard.check(budgets, NOW)
    # The next day, the month still holds what was spent, and the key's cost budget is the one that refuses.
    tomorrow = DAY[1] + 1
    guard.charge(budgets, tomorrow, 10, 1000)
    with pytest.raises(
        BudgetExceeded, match=r"this API key has used 0.000001 of 0.000001 \(cost\) in its day"
    ):
        guard.check(BudgetSet((day, month), (Budget("key:k1", "day", None, 1000),)), tomorrow)
    guard.charge(budgets, tomorrow, 40, 0)
    with pytest.raises(BudgetExceeded, match="150 of 150 tokens in its month budget period"):
        guard.check(budgets, tomorrow)


def test_limits_and_budgets_are_taken_together_and_settled_together() -> None:
    """With rate limits and budgets, admission is one C call and settling another: a request over budget
    takes nothing from any limit, and the settled spend reaches every window as the places come back."""
    table = BucketTable.create_layout(bytearray(region_size(64)), 64)
    limits = {"rpm": 1000, "concurrency": 1}
    doc = {
        "schema": 1,
        "revision": 1,
        "backends": {"e": {"url": "http://127.0.0.1:1"}},
        "routes": {"m": {"canonical": "m", "kind": "frontend", "targets": [["p", "e", "p"]]}},
        "principals": {"p1": {"name": "alice", "allow_all": True, "models": [], "limits": limits,
                              "budgets": [{"period": "day", "tokens": 10},
                                          {"period": "month", "tokens": 100}]}},
        "keys": {"ab" * 32: {"id": "k1", "principal": "p1", "expires_at": None}},
    }  # fmt: skip
    snap = Snapshot.from_doc(doc, 1)
    key, route = next(iter(snap.keys.values())), snap.routes["m"]
    accounting = Accounting(Limiter(table), BudgetGuard(table, "e"), None)
    assert key.budgets is not None
    day_key, month_key = (k for _, k in key.budgets.windows_at("e", time.time()))
    ex = accounting.admit(key, "m", route, 40, 8, 512)
    assert isinstance(ex, Exchange) and ex.ticket is not None
    with pytest.raises(RateLimited):  # the one concurrent place is held
        accounting.admit(key, "m", route, 40, 8, 512)
    tap = ResponseTap(_Recorder(lambda: 0), ex.headers, partial(accounting.settle, ex))
    tap.response_bytes(200, [], _ANSWER)  # 7 tokens
    assert ex.settled is not None and ex.settled.principal_keys == (day_key, month_key)
    assert table.spend(day_key) == table.spend(month_key) == (7, 0)
    ex = accounting.admit(key, "m", route, 40, 8, 512)  # the place came back with the settling
    assert isinstance(ex, Exchange)
    accounting.finish(ex, ResponseTap(_Recorder(lambda: 0), ex.headers), 200, "e")  # settles: 3 more
    assert isinstance(ex.settled, tuple) and table.spend(day_key) == (7 + ex.settled.total, 0)
    rpm = snap.principals["p1"].limits
    assert rpm is not None
    taken = [table.peek(bucket, rate * 60, limit).remaining for _, limit, bucket, rate in rpm.rates]
    with pytest.raises(BudgetExceeded, match=r"this principal has used \d+ of 10 tokens in its day budget"):
        accounting.admit(key, "m", route, 40, 8, 512)
    assert [table.peek(bucket, rate * 60, limit).remaining for _, limit, bucket, rate in rpm.rates] == taken
    assert table.gauge(rpm.concurrency_key) == 0


def test_a_window_the_table_cannot_hold_is_left_out_of_the_record() -> None:
    table = BucketTable.create_layout(bytearray(region_size(2)), 2)
    day, month = Budget("p1", "day", 100, None), Budget("p1", "month", 150, None)
    budgets = BudgetSet((day, month), ())
    table.acquire(12345, 1)  # one of the two slots taken by another key: the month's window finds none
    keys = BudgetGuard(table, "e").charge(budgets, NOW, 7, 0, "req-1")
    assert keys == ((day.key_at("e", NOW),), None)  # the record names only the counter that holds it
    assert table.spend(day.key_at("e", NOW)) == (7, 0)


def test_an_unreadable_record_is_set_aside_alone(store: Store, ring: UsageRing, table: BucketTable) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    push(ring, 0, rec(1))
    assert ring.push(0, b'[1, "torn"')
    push(ring, 0, rec(2))
    assert sink.drain() == 3
    assert (store.usage.count(), ring.pending(0)) == (2, 0)
    [aside] = store.usage.rejected()
    assert (aside.record, aside.source, aside.reason) == (
        '[1, "torn"',
        "ring",
        "undecodable: not a usage record",
    )
    assert sink.metrics.rejected == {"undecodable": 1}


def test_a_wrongly_typed_record_is_set_aside_alone(store: Store, ring: UsageRing, table: BucketTable) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    push(ring, 0, rec(1))
    assert ring.push(0, encode_record(rec(2)._replace(status=True)))  # JSON, but not a record
    assert ring.push(0, orjson.dumps([1, *rec(3)[:16]]))  # an older version, from a spool
    push(ring, 0, rec(4))
    assert sink.drain() == 4
    assert (store.usage.count(), ring.pending(0)) == (3, 0)
    [aside] = store.usage.rejected()
    assert aside.reason == "invalid: usage record field status has the wrong type"
    assert orjson.loads(aside.record) == orjson.loads(encode_record(rec(2)._replace(status=True)))


def test_figures_no_column_holds_are_clamped_and_flagged(
    store: Store, ring: UsageRing, table: BucketTable, caplog: pytest.LogCaptureFixture
) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    sink.set_budgets(budget_doc(tokens=10**18), now=NOW)  # a base to fold into: the watched insert path
    huge = rec(1, prompt_tokens=2**63 + 5, total_tokens=2**64 - 1, cost_nanos=-3, status=2**40)
    for i in range(3):  # a flood of them, logged once per field
        push(ring, 0, huge._replace(request_id=f"req-huge-{i}"))
    push(ring, 0, rec(2))
    with caplog.at_level(logging.ERROR, logger="gateway.controlplane"):
        assert sink.drain() == 4
    assert ring.pending(0) == 0
    stored = {r.request_id: r for r in store.usage.records()}
    assert stored["req-000002"] == rec(2)
    got = stored["req-huge-0"]
    assert (got.prompt_tokens, got.total_tokens, got.cost_nanos, got.status) == (
        MAX_FIGURE,
        MAX_FIGURE,
        0,
        2**31 - 1,
    )
    fields = ("prompt_tokens", "total_tokens", "cost_nanos", "status")
    assert sorted(store.usage.clamped()) == [(f"req-huge-{i}", NOW, fields) for i in range(3)]
    assert sink.metrics.clamped == dict.fromkeys(fields, 3)
    assert len([m for m in caplog.messages if "clamped" in m]) == len(fields)
    assert 'gateway_usage_records_clamped_total{field="cost_nanos"} 3' in sink.metrics.render({})
    assert sink.bases[0].tokens == 3 * MAX_FIGURE + 10  # folded as stored: the sums stay in 64 bits
    spent = store.usage.spend(DAY[0], DAY[1])
    assert [(s.owner_id, s.tokens, s.cost_nanos) for s in spent] == [("p1", 3 * MAX_FIGURE + 10, 1000)]


def test_a_record_the_store_refuses_is_set_aside_and_the_batch_goes_on(
    store: Store, ring: UsageRing, table: BucketTable
) -> None:
    sink = UsageSink(store, ring, table, EPOCH)
    # A string no database encodes (a lone surrogate), and an end time in no window: neither comes out of
    # JSON, but a record made in Python may carry them.
    sink.write([rec(1), rec(2, model="bad\udc80"), rec(3, ts=float("inf")), rec(4)])
    assert sorted(r.request_id for r in store.usage.records()) == ["req-000001", "req-000004"]
    reasons = sorted(r.reason.split(":", 1)[0] for r in store.usage.rejected())
    assert reasons == ["invalid", "refused"]
    assert sink.metrics.rejected == {"invalid": 1, "refused": 1}
    # The same again (a batch replayed after a crash): stored once, set aside once.
    sink.write([rec(1), rec(2, model="bad\udc80"), rec(3, ts=float("inf")), rec(4)])
    assert (store.usage.count(), len(store.usage.rejected())) == (2, 2)
    assert 'gateway_usage_records_rejected_total{reason="refused"} 2' in sink.metrics.render({})


def test_budget_keys_no_counter_can_have_are_dropped_and_flagged_never_fatal(
    store: Store, ring: UsageRing, table: BucketTable
) -> None:
    """The decoder checks a budget key list only as a list. Entries no live counter can have (a list, a
    string, an object, a float, a boolean, zero) once raised out of the spend counters and stopped the
    drain at that record for good; now they are dropped from the list, the field is flagged, and the
    record is stored and counted in the bases of the windows no counter it names holds."""
    sink = UsageSink(store, ring, table, EPOCH)
    sink.set_budgets(*windows_doc(), now=NOW)
    day = window_key(EPOCH, "p1", "day", DAY[0])
    month = window_key(EPOCH, "p1", "month", MONTH[0])
    own = window_key(EPOCH, "key:k1", "day", DAY[0])
    odd: list[list[object]] = [[[day]], ["x"], [{"k": day}], [1.5], [True], [0]]
    for i, keys in enumerate(odd):
        push(ring, 0, rec(i, budget_keys=keys, key_budget_keys=keys))  # type: ignore[arg-type]
    push(ring, 0, rec(10, budget_keys=[day, "x"], key_budget_keys=[own, [own]]))  # type: ignore[list-item]
    assert sink.drain() == 7 and ring.pending(0) == 0
    stored = {r.request_id: r for r in store.usage.records()}
    assert len(stored) == 7 and not store.usage.rejected()
    assert all(
        (stored[f"req-{i:06d}"].budget_keys, stored[f"req-{i:06d}"].key_budget_keys) == (None, None)
        for i in range(6)
    )
    assert (stored["req-000010"].budget_keys, stored["req-000010"].key_budget_keys) == ([day], [own])
    assert [f for _, _, f in store.usage.clamped()] == [("budget_keys", "key_budget_keys")] * 7
    assert table.spend_parts(day) == (0, 0, 60, 6000)  # the six no live counter held
    assert table.spend_parts(own) == (0, 0, 60, 6000)
    assert table.spend_parts(month) == (0, 0, 70, 7000)  # none named the month's counter
    spent = {s.owner_id: s.tokens for s in store.usage.spend(*DAY)}
    assert spent == {"p1": 70}


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=8,
)
_LISTS = st.none() | st.lists(_JSON, max_size=7)  # 5 span ids, 7 places of a sampled attempt


def test_no_list_a_record_carries_stops_the_drain_or_what_reads_the_record(
    store: Store, ring: UsageRing, table: BucketTable
) -> None:
    """The record's lists (its budget keys, route trace and span ids) with any JSON in them, on a principal
    and a key with budgets: each record is stored or set aside exactly once, and the admin view and the
    OpenTelemetry export of it do not raise (derandomised; 100 examples a store)."""
    sink = UsageSink(store, ring, table, EPOCH, recent=4)
    sink.set_budgets(*windows_doc(), now=NOW)
    exporter = OtelExporter("http://127.0.0.1:9/v1/traces", "gateway", queue_limit=16)
    made = iter(range(10**6))

    def kept() -> int:
        return store.usage.count() + len(store.usage.rejected(limit=10**6))

    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(_LISTS, _LISTS, _LISTS, _LISTS)
    def check(budget_keys: Any, key_budget_keys: Any, trace: Any, span: Any) -> None:
        r = rec(next(made), budget_keys=budget_keys, key_budget_keys=key_budget_keys, trace=trace, span=span)
        data = encode_record(r)
        assume(len(data) <= ring.max_record)
        before = kept()
        assert ring.push(0, data)
        assert sink.drain() == 1 and ring.pending(0) == 0
        assert kept() == before + 1
        for seen in sink.recent.latest(1):
            request_doc(seen)
            exporter.encode([seen])

    check()


def test_a_nul_in_a_record_s_text_is_stored_or_set_aside_never_retried(
    request: pytest.FixtureRequest, store: Store, ring: UsageRing, table: BucketTable
) -> None:
    """PostgreSQL's text holds no NUL (SQLite's does): the batch is refused as a whole, then written record by
    record, and only the one with the NUL is set aside; the ring is consumed either way."""
    sink = UsageSink(store, ring, table, EPOCH)
    push(ring, 0, rec(1))
    push(ring, 0, rec(2, model="chat\x00"))
    push(ring, 0, rec(3))
    assert sink.drain() == 3 and ring.pending(0) == 0
    stored = sorted(r.request_id for r in store.usage.records())
    if request.node.callspec.params["store"] == "postgres":
        assert stored == ["req-000001", "req-000003"]
        [aside] = store.usage.rejected()
        assert aside.reason.startswith("refused: store refused a value")
        assert orjson.loads(aside.record.replace("\\u0000", "")) == orjson.loads(
            encode_record(rec(2, model="chat"))
        )
    else:
        assert stored == ["req-000001", "req-000002", "req-000003"] and not store.usage.rejected()
    assert sink.drain() == 0


def test_bound_record_leaves_a_record_in_bounds_as_it_is() -> None:
    r = rec(1)
    assert bound_record(r) == (r, ()) and bound_record(r)[0] is r
    nan = float("nan")
    got, fields = bound_record(rec(1, latency_ms=nan, ttfb_ms=-1.0, attempts=-2, cached_tokens=2**70))
    assert (got.latency_ms, got.ttfb_ms, got.attempts, got.cached_tokens) == (0.0, 0.0, 0, MAX_FIGURE)
    assert fields == ("cached_tokens", "attempts", "latency_ms", "ttfb_ms")
    assert bound_record(rec(1, latency_ms=float("inf")))[0].latency_ms == MAX_FIGURE
    with pytest.raises(ValueError, match="ts is not a finite number"):
        bound_record(rec(1, ts=nan))


def test_metrics_count_a_batch_as_its_records_one_by_one() -> None:
    names = {"p1": "alice", "p2": "alice"}  # and p3 has none
    records = [
        rec(
            i,
            principal=f"p{i % 3 + 1}",
            model="chat" if i % 2 or i > 30 else "code",
            tokens=i % 4 * 5,
            cached_tokens=i % 5,
            cost_nanos=i % 6 * 1000,
            backend=None if i % 7 == 0 else "a",
            status=(200, 502, 429)[i % 3],
            latency_ms=0.7 * 1.9**i,
            ttfb_ms=None if i % 4 else i * 3.3,
            attempts=i % 4,
        )
        for i in range(40)
    ]
    records += [rec(40, model="zero", cached_tokens=3), rec(41, model="zero", cached_tokens=-3)]
    for batch in (records, records[:1], records[31:], [r for r in records if r.principal_id == "p1"]):
        one, many = Metrics(), Metrics()
        for r in batch:
            one.observe([r], names)
        many.observe(batch, names)
        assert many.render({}) == one.render({})
        for model, h in one.latency.items():  # the same float sums: added in the same order
            assert (many.latency[model].total, many.latency[model].counts) == (h.total, h.counts)
    assert 'gateway_tokens_total{model="zero",principal="alice",kind="cached"} 0' in many.render({})


# ---- the worker's log --------------------------------------------------------------------------------------


def test_log_keeps_order_through_a_full_ring() -> None:
    small = UsageRing.create_layout(bytearray(ring_region_size(1, 4, 64)), 1, 4, 64)
    log = UsageLog(small, 0)
    for i in range(10):
        log.push(bytes([i]))
    assert (small.pending(0), len(log.backlog)) == (4, 6)
    got = small.read(0)
    small.advance(0, 4)
    assert log.flush() == 2
    got += small.read(0)
    small.advance(0, 4)
    assert log.flush() == 0
    got += small.read(0)
    assert got == [bytes([i]) for i in range(10)]


def test_request_ids_are_unique_per_log() -> None:
    a = UsageLog(UsageRing.create_layout(bytearray(ring_region_size(1, 4, 64)), 1, 4, 64), 0)
    b = UsageLog(UsageRing.create_layout(bytearray(ring_region_size(1, 4, 64)), 1, 4, 64), 0)
    ids = [a.request_id() for _ in range(1000)] + [b.request_id() for _ in range(1000)]
    assert len(set(ids)) == 2000
    assert all(len(i) == 24 for i in ids)


class _Recorder:
    """An RSGI protocol stand-in that notes, at each send, what the budget's spend was by then."""

    def __init__(self, spent: Callable[[], int]) -> None:
        self.spent = spent
        self.seen: list[tuple[str, int]] = []

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.seen.append(("whole", self.spent()))

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Recorder:
        return self

    async def send_bytes(self, data: bytes) -> None:
        self.seen.append((data.decode()[:12], self.spent()))


def _budgeted() -> tuple[Accounting, KeyEntry, Callable[[], int]]:
    table = BucketTable.create_layout(bytearray(region_size(64)), 64)
    budget = Budget.from_doc("p1", {"period": "day", "tokens": 10**6})
    assert budget is not None
    principal = Principal("p1", "alice", True, frozenset(), budgets=(budget,))
    accounting = Accounting(None, BudgetGuard(table, "e"), None)
    return (
        accounting,
        KeyEntry("k1", principal, None, budgets=BudgetSet((budget,), ())),
        lambda: table.spend(budget.key_at("e", time.time()))[0],
    )


_ANSWER = b'{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}'


def _tapped(
    accounting: Accounting, key: KeyEntry, spent: Callable[[], int]
) -> tuple[Exchange, _Recorder, ResponseTap]:
    """An admitted request and its tap, settling as the request path's does: as the answer ends."""
    ex = accounting.admit(key, "m", Route("m", "m", "frontend", ()), 40, 8, 512)
    assert isinstance(ex, Exchange)
    proto = _Recorder(spent)
    tap = ResponseTap(proto, ex.headers, partial(accounting.settle, ex))
    return ex, proto, tap


def test_a_whole_answer_is_settled_before_the_client_gets_it() -> None:
    accounting, key, spent = _budgeted()
    ex, proto, tap = _tapped(accounting, key, spent)
    tap.response_bytes(200, [], _ANSWER)
    assert proto.seen == [("whole", 7)]  # the next request would already meet this spend
    accounting.finish(ex, tap, 200, "b")  # settles once
    assert spent() == 7


def test_a_request_that_ends_without_an_answer_leaves_no_reference_cycle() -> None:
    """An upstream failure or a client gone: the tap's callback never runs, and neither it nor the
    exchange is left for the cyclic collector (proxy workers run it rarely: ``YOUNG_OBJECTS``)."""
    accounting, key, spent = _budgeted()
    gc.collect()
    gc.disable()
    try:
        for status in (502, 499):
            ex, _, tap = _tapped(accounting, key, spent)
            accounting.finish(ex, tap, status, None, 1)
            assert ex.settled is not None and tap.on_end is not None  # settled by finish, not by the tap
            del ex, tap
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_stream_is_settled_before_its_last_piece_goes_out() -> None:
    accounting, key, spent = _budgeted()
    _, proto, tap = _tapped(accounting, key, spent)
    transport = tap.response_stream(200, [])

    async def relay() -> None:
        await transport.send_bytes(b"data: {}\n\n")
        await transport.send_last(b"data: " + _ANSWER + b"\n\ndata: [DONE]\n\n")

    asyncio.run(relay())
    assert proto.seen == [("data: {}\n\n", 0), ('data: {"usag', 7)]


def test_a_full_bucket_table_loses_no_answer_and_no_record() -> None:
    table = BucketTable.create_layout(bytearray(region_size(1)), 1)
    table.acquire(12345, 1)  # the only slot, taken by another key: the budget's window cannot get one
    ring = UsageRing.create_layout(bytearray(ring_region_size(1, 4, RING_SLOT_BYTES)), 1, 4, RING_SLOT_BYTES)
    budget = Budget.from_doc("p1", {"period": "day", "tokens": 10**6})
    assert budget is not None
    accounting = Accounting(None, BudgetGuard(table, "e"), UsageLog(ring, 0))
    principal = Principal("p1", "alice", True, frozenset(), budgets=(budget,))
    key = KeyEntry("k1", principal, None, budgets=BudgetSet((budget,), ()))
    ex, proto, tap = _tapped(accounting, key, lambda: 0)
    tap.response_bytes(200, [], _ANSWER)
    assert proto.seen == [("whole", 0)]  # the answer went out
    accounting.finish(ex, tap, 200, "b")
    (data,) = ring.read(0)
    record = decode_record(data)
    assert (record.total_tokens, record.budget_keys) == (7, None)  # the store carries the spend instead


def test_a_long_route_trace_keeps_its_first_and_last_attempts() -> None:
    """Many failovers over long backend names: the middle attempts are left out (and counted) so the
    record fits its ring slot; the first attempt (where routing sent it) and the last (who answered) stay."""
    limit = RING_SLOT_BYTES - 8
    trace = [["b" * 40 + f"{i:02d}", "m" * 20, 503, 1.25, 2.5] for i in range(12)]
    record = rec(1, attempts=12, tag="t" * 300)._replace(rule="r" * 50, trace=trace)
    data = encode_record(record)
    assert len(data) > limit
    got = decode_record(fit_record(data, limit))
    assert len(encode_record(got)) <= limit
    assert got.trace is not None and got.trace[0] == trace[0] and got.trace[-1] == trace[-1]
    omitted = got.trace[-2]
    assert type(omitted) is int and omitted == len(trace) - len(got.trace) + 1
    assert got._replace(trace=None, tag=None) == record._replace(trace=None, tag=None)
    short = encode_record(record._replace(trace=trace[:2], tag=None))
    assert fit_record(short, limit) is short
    # Nothing else left to cut: the trace goes whole, the record still goes.
    two = encode_record(longest(None)._replace(trace=[["b" * 200, "m" * 200, 503, 1.0, 2.0]] * 2))
    assert decode_record(fit_record(two, limit)).trace is None
