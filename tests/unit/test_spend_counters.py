"""Spend counters (``usage_spend``) against the records they stand for, on SQLite and on PostgreSQL: over
random batches, retried batches and purges, every budget window's counters equal the sums over the
stored records of that window (in all and per live counter), and what ``spend``/``key_spend`` answer is
what summing the records answers; a purge leaves a current window's counters as they were and drops
the windows that ended; a budget taken away and given back is counted afresh."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.budget import KEY_OWNER, period_window
from gateway.config import Settings
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.specs import BudgetSpec
from gateway.controlplane.store import Store, open_store
from gateway.usage_record import UsageRecord

HASH_KEY = bytes(range(32))
DAY = 86400.0
# Twenty days either side of a month's end (2027-01-31T00:00Z), in quarter days: windows of every period
# roll over within the records, the month's among them.
T0 = 1_801_353_600.0 - 3 * DAY
COUNTERS = [1, 2, 3, 2**63 + 5]  # live counter keys a record may name, one past the signed range
PERIODS = {"alice": ("day", "month", "6h"), "bob": ("month",), "carol": ()}
KEY_PERIODS = ("day", "1d")  # the same windows under two periods


def _doc(periods: dict[str, tuple[str, ...]]) -> object:
    return parse_config(
        {
            "principals": [
                {"name": name, "budgets": [{"period": p, "tokens": 10**9} for p in ps]}
                for name, ps in periods.items()
            ],
        },
        "test",
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    database = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    with open_store(Settings(data_dir=tmp_path, database=database)) as s:
        s.apply_config(_doc(PERIODS), hash_key=HASH_KEY, environ={}, actor="test")  # type: ignore[arg-type]
        yield s


def _ids(store: Store) -> tuple[dict[str, str], str]:
    """Principal ids by name, and a budgeted key of alice's (made once per store)."""
    ids = {p.name: p.id for p in store.principals()}
    keys = store.list_keys("alice")
    if keys:
        return ids, keys[0].id
    key_id, _ = store.create_key(
        "alice",
        "alice-key",
        None,
        HASH_KEY,
        actor="test",
        budgets=[BudgetSpec(p, 10**9) for p in KEY_PERIODS],
    )
    return ids, key_id


def _record(
    i: int, ts: float, principal: str, key: str, tokens: int, held: list[int], own: list[int]
) -> UsageRecord:
    return UsageRecord(
        request_id=f"req-{i:04d}",
        ts=ts,
        principal_id=principal,
        key_id=key,
        model="chat",
        backend="a",
        status=200,
        prompt_tokens=tokens,
        completion_tokens=0,
        cached_tokens=0,
        total_tokens=tokens,
        usage_source="reported",
        cost_nanos=tokens * 7,
        latency_ms=1.0,
        ttfb_ms=1.0,
        budget_keys=held or None,
        key_budget_keys=own or None,
    )


def _counters(store: Store) -> dict[tuple[str, str, float], dict[int, tuple[int, int]]]:
    with store._driver.transaction(write=False) as tx:
        rows = tx.query("SELECT owner, period, window_start, held, tokens, cost_nanos FROM usage_spend")
    out: dict[tuple[str, str, float], dict[int, tuple[int, int]]] = {}
    for owner, period, start, held, tokens, cost in rows:
        out.setdefault((str(owner), str(period), float(start)), {})[int(held) % 2**64] = (
            int(tokens),
            int(cost),
        )
    return out


def _summed(records: list[UsageRecord], owner: str, period: str, start: float) -> dict[int, tuple[int, int]]:
    """A window's sums over the stored records: in all (0) and per live counter named."""
    end = period_window(period, start)[1]
    out: dict[int, tuple[int, int]] = {}
    for r in records:
        mine = r.principal_id == owner or KEY_OWNER + r.key_id == owner
        if not mine or not start <= r.ts < end or (r.total_tokens == 0 and r.cost_nanos == 0):
            continue
        named = r.budget_keys if r.principal_id == owner else r.key_budget_keys
        for held in {0, *(named or ())}:
            t, c = out.get(held, (0, 0))
            out[held] = (t + r.total_tokens, c + r.cost_nanos)
    return out


_record_args = st.tuples(
    st.integers(0, 60),  # request id: a small pool, so that batches repeat records
    st.integers(0, 6 * 4 * 2),  # quarter days from T0
    st.integers(0, 5),  # seconds into the quarter day
    st.sampled_from(["alice", "bob", "carol"]),
    st.booleans(),  # alice's budgeted key (else one without budgets)
    st.integers(0, 50),
    st.lists(st.sampled_from(COUNTERS), max_size=3),
    st.lists(st.sampled_from(COUNTERS), max_size=2),
)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.lists(_record_args, min_size=1, max_size=12)),
        st.tuples(st.just("retry"), st.integers(0, 20)),
        st.tuples(st.just("purge"), st.integers(0, 6 * 4 * 2), st.integers(1, 8)),
    ),
    min_size=1,
    max_size=10,
)


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=_steps)
def test_counters_equal_the_sums_over_the_stored_records(
    store: Store, steps: list[tuple[object, ...]]
) -> None:
    with store._driver.transaction(write=True) as tx:  # each example starts from no usage at all
        for table in ("usage_records", "usage_spend"):
            tx.execute(f"DELETE FROM {table}")
        tx.execute("UPDATE usage_retention SET purged_before = 0, purged_rows = 0")
    # On PostgreSQL, day partitions over the records' days: purges then drop some whole.
    store.usage.make_partitions(T0, ahead=12)
    ids, key = _ids(store)
    owners = {
        **{ids[name]: periods for name, periods in PERIODS.items()},
        KEY_OWNER + key: KEY_PERIODS,
    }
    batches: list[list[UsageRecord]] = []
    ts_of: dict[int, float] = {}
    ever: dict[tuple[str, str, float], int] = {}  # tokens a window counted since it opened
    for step in steps:
        stored = {r.request_id for r in store.usage.records(limit=10**6)}
        if step[0] == "purge":
            _, quarter, size = step
            cutoff = T0 + float(quarter) * DAY / 4  # type: ignore[operator]
            before = _counters(store)
            store.usage.prune(cutoff, size)  # type: ignore[arg-type]
            purged = store.usage.purged_before()
            after = _counters(store)
            for at, rows in before.items():
                if period_window(at[1], at[2])[1] <= purged:
                    assert at not in after  # ended: dropped with its records
                else:
                    assert after[at] == rows  # current: the purge changed nothing
            continue
        if step[0] == "retry":
            if not batches:
                continue
            batch = batches[int(step[1]) % len(batches)]  # type: ignore[call-overload]
        else:
            batch = [
                _record(
                    i,
                    ts_of.setdefault(i, T0 + q * DAY / 4 + s),  # a request has one end time
                    ids[name],
                    key if own_key and name == "alice" else "k-plain",  # a key has one principal
                    tokens,
                    held,
                    own,
                )
                for i, q, s, name, own_key, tokens, held, own in step[1]  # type: ignore[attr-defined]
            ]
            batches.append(batch)
        opened = _counters(store)
        store.usage.insert(batch)
        records = store.usage.records(limit=10**6)
        first: dict[str, UsageRecord] = {}
        for r in batch:
            first.setdefault(r.request_id, r)
        for r in first.values():
            if r.request_id in stored:
                continue  # already stored: the retry must not count it again
            for owner in (r.principal_id, KEY_OWNER + r.key_id):
                for period in owners.get(owner, ()):
                    at = (owner, period, period_window(period, r.ts)[0])
                    if at in opened:
                        ever[at] += r.total_tokens
                    else:  # a window opens from the records stored in it, this batch's among them
                        ever[at] = _summed(records, *at).get(0, (0, 0))[0]
        purged = store.usage.purged_before()
        counters = _counters(store)
        windows = {
            (owner, period, period_window(period, r.ts)[0])
            for r in records
            for owner, periods in owners.items()
            for period in periods
        } | set(counters)
        for at in windows:
            owner, period, start = at
            summed = _summed(records, owner, period, start)
            if start > purged:  # a window no purge reached (one at ``purged`` may have lost records)
                assert counters.get(at, {}) == summed or (not summed and counters[at][0] == (0, 0))
            elif at in counters:  # a purge cut into it: the records it counted, purged ones included
                assert counters[at][0][0] == ever.get(at, 0)
            else:  # not opened: it ended before what was purged, or nothing was ever spent in it
                assert period_window(period, start)[1] <= purged or ever.get(at, 0) == 0
        # What budgets read is what summing the stored records says, for windows no purge reached.
        for at in windows:
            owner, period, start = at
            end = period_window(period, start)[1]
            if start <= purged:
                continue
            if owner.startswith(KEY_OWNER):
                got = store.usage.key_spend(start, end, {owner[len(KEY_OWNER) :]: ids["alice"]})
            else:
                got = store.usage.spend(start, end, [owner])
            want = _summed(records, owner, period, start)
            total = want.pop(0, (0, 0))
            spent = [(g.tokens, g.cost_nanos, {k: v for k, v in g.held.items() if v != (0, 0)}) for g in got]
            assert [s for s in spent if s != (0, 0, {})] == ([(*total, want)] if total != (0, 0) else [])


def test_a_budget_taken_away_and_given_back_is_counted_afresh(store: Store) -> None:
    ids, _ = _ids(store)
    bob = ids["bob"]
    start, end = period_window("month", T0)
    store.usage.insert([_record(1, T0, bob, "k-plain", 10, [1], [])])
    store.apply_config(_doc({**PERIODS, "bob": ()}), hash_key=HASH_KEY, environ={}, actor="test")  # type: ignore[arg-type]
    store.usage.insert([_record(2, T0 + 1, bob, "k-plain", 5, [], [])])  # no budget: not counted
    assert not [at for at in _counters(store) if at[0] == bob]
    store.apply_config(_doc(PERIODS), hash_key=HASH_KEY, environ={}, actor="test")  # type: ignore[arg-type]
    store.usage.insert([_record(3, T0 + 2, bob, "k-plain", 1, [1], [])])  # opens the window from all three
    assert _counters(store)[(bob, "month", start)] == {0: (16, 112), 1: (11, 77)}
    assert [(g.tokens, g.held) for g in store.usage.spend(start, end, [bob])] == [(16, {1: (11, 77)})]


def test_counters_saturate_rather_than_overflow(store: Store) -> None:
    ids, _ = _ids(store)
    huge = 2**50  # its cost (seven times as much) near a record's bound (MAX_FIGURE, 2**53)
    batch = [_record(i, T0, ids["bob"], "k-plain", huge, [], []) for i in range(2048)]
    for n in itertools.count():
        store.usage.insert(batch[n * 512 : (n + 1) * 512])  # each batch's delta fits; their sum does not
        if (n + 1) * 512 >= len(batch):
            break
    start = period_window("month", T0)[0]
    assert _counters(store)[(ids["bob"], "month", start)][0] == (2048 * huge, 2**63 - 1)
    assert store.usage.count() == 2048
