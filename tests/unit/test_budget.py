"""Budget periods and their windows, money formatting, prices, budgets and their window keys."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

import gateway.budget
from gateway.budget import (
    KEY_OWNER,
    MAX_BUDGETS,
    NANOS,
    Budget,
    BudgetSet,
    Price,
    budgets_from_doc,
    check_period,
    exceeded_message,
    format_money,
    period_window,
    window_key,
)
from gateway.usage_record import MAX_FIGURE, UsageRecord, encode_record

GENERIC = 'must be "day", "month", or a fixed window such as "6h" or "7d"'
TOO_SHORT = "a fixed window must be at least 60 seconds long"


def _ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


# --- periods -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("period", ["day", "month", "60s", "1m", "90s", "6h", "7d", "30d", "1440m"])
def test_check_period_accepts(period: str) -> None:
    assert check_period(period) is None


@pytest.mark.parametrize(
    ("period", "problem"),
    [
        ("week", GENERIC),
        ("0h", GENERIC),
        ("06h", GENERIC),
        ("6H", GENERIC),
        ("Day", GENERIC),
        ("", GENERIC),
        ("1x", GENERIC),
        ("-6h", GENERIC),
        ("6 h", GENERIC),
        (5, GENERIC),
        (None, GENERIC),
        (["day"], GENERIC),
        ("30s", TOO_SHORT),
        ("59s", TOO_SHORT),
    ],
)
def test_check_period_rejects(period: object, problem: str) -> None:
    assert check_period(period) == problem


def test_check_period_rejects_a_trailing_newline() -> None:
    assert check_period("6h\n") == GENERIC


# --- calendar windows ----------------------------------------------------------------------------------


def test_day_window() -> None:
    assert _ts(2025, 1, 1) == 1735689600.0  # the timestamps below do not depend on _ts alone
    assert period_window("day", 1735689600 + 12 * 3600 + 0.5) == (1735689600.0, 1735776000.0)
    # The last instant of a day belongs to it; its end belongs to the next day.
    assert period_window("day", 1735689599.999) == (1735603200.0, 1735689600.0)
    assert period_window("day", 1735689600.0) == (1735689600.0, 1735776000.0)
    assert period_window("day", 0.0) == (0.0, 86400.0)


def test_month_window_rolls_december_into_january() -> None:
    assert period_window("month", _ts(2024, 12, 31, 23, 59, 59)) == (1733011200.0, 1735689600.0)
    assert period_window("month", _ts(2024, 12, 1)) == (_ts(2024, 12, 1), _ts(2025, 1, 1))
    # Exactly on the boundary: the new month (and the new year).
    assert period_window("month", 1735689600.0) == (1735689600.0, _ts(2025, 2, 1))


def test_month_window_in_february_of_leap_and_common_years() -> None:
    start, end = period_window("month", _ts(2024, 2, 29, 12))
    assert (start, end) == (1706745600.0, 1709251200.0)
    assert end - start == 29 * 86400
    start, end = period_window("month", _ts(2023, 2, 28, 23, 59, 59))
    assert (start, end) == (1675209600.0, 1677628800.0)
    assert end - start == 28 * 86400
    # 2024-03-01T00:00:00Z opens March, not the end of February.
    assert period_window("month", 1709251200.0) == (1709251200.0, _ts(2024, 4, 1))
    assert period_window("month", 1709251199.5) == (1706745600.0, 1709251200.0)


def test_month_window_types_are_floats() -> None:
    start, end = period_window("month", 1735689600)
    assert type(start) is float and type(end) is float


# --- fixed windows -------------------------------------------------------------------------------------


def test_six_hour_windows_are_aligned_to_the_epoch() -> None:
    # 2025-01-01T07:00:05Z lies in 06:00-12:00.
    assert period_window("6h", 1735689600 + 7 * 3600 + 5) == (1735711200.0, 1735732800.0)
    assert period_window("6h", 1735711200.0) == (1735711200.0, 1735732800.0)
    assert period_window("6h", 1735711199.9) == (1735689600.0, 1735711200.0)


def test_seven_day_windows_start_on_thursdays() -> None:
    # 2025-01-01 is a Wednesday: its window runs from Thursday 2024-12-26 to Thursday 2025-01-02.
    start, end = period_window("7d", _ts(2025, 1, 1, 10))
    assert (start, end) == (1735171200.0, 1735776000.0)
    assert datetime.fromtimestamp(start, tz=UTC).strftime("%A %Y-%m-%d %H:%M:%S") == (
        "Thursday 2024-12-26 00:00:00"
    )
    assert start % (7 * 86400) == 0
    assert period_window("7d", end) == (end, end + 7 * 86400)


def test_ninety_second_windows() -> None:
    assert period_window("90s", 1000.0) == (990.0, 1080.0)
    assert period_window("90s", 1079.999) == (990.0, 1080.0)
    assert period_window("90s", 1080.0) == (1080.0, 1170.0)
    assert period_window("90s", 0.0) == (0.0, 90.0)


def test_minute_and_day_units() -> None:
    assert period_window("15m", 1000.0) == (900.0, 1800.0)
    assert period_window("2d", 3 * 86400 + 1.0) == (2 * 86400.0, 4 * 86400.0)


def test_unknown_period_raises() -> None:
    with pytest.raises(ValueError, match="unknown budget period 'week'"):
        period_window("week", 0.0)


# --- money ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "0.000000"),
        (1, "0.000000"),
        (499, "0.000000"),
        (500, "0.000001"),  # half a micro-unit rounds up
        (1_499, "0.000001"),
        (1_500, "0.000002"),
        (2_500, "0.000003"),  # half up, not half to even
        (999_999_499, "0.999999"),
        (999_999_500, "1.000000"),
        (NANOS, "1.000000"),
        (12_345_678_901, "12.345679"),
        (-500, "-0.000001"),
        (-1_500_000_000, "-1.500000"),
        (-12_345_678_901, "-12.345679"),
        (2**63 - 1, "9223372036.854776"),
        (10**30, "1000000000000000000000.000000"),
    ],
)
def test_format_money(nanos: int, text: str) -> None:
    assert format_money(nanos) == text


# --- prices --------------------------------------------------------------------------------------------


def test_price_from_doc_is_per_token_in_nanos() -> None:
    assert Price.from_doc([0.15, 0.6, 0.075]) == Price(150.0, 600.0, 75.0)
    assert Price.from_doc([0, 0, 0]) == Price(0.0, 0.0, 0.0)
    assert Price.from_doc([3, 15, 0.3]) == Price(3000.0, 15000.0, 300.0)


@pytest.mark.parametrize(
    "doc",
    [
        None,
        {},
        "0.15",
        (0.15, 0.6, 0.075),  # only the JSON array form
        {"input": 0.15, "output": 0.6, "cached_input": 0.075},
        [],
        [0.15, 0.6],
        [0.15, 0.6, 0.075, 1.0],
        [-0.01, 0.6, 0.075],
        [0.15, -1, 0.075],
        [0.15, 0.6, -0.075],
        [math.nan, 0.6, 0.075],
        [0.15, math.inf, 0.075],
        [0.15, 0.6, -math.inf],
    ],
)
def test_price_from_doc_rejects(doc: object) -> None:
    assert Price.from_doc(doc) is None


@pytest.mark.parametrize("doc", [["x", 0.6, 0.075], [None, 0.6, 0.075], [0.15, {}, 0.075]])
def test_price_from_doc_rejects_non_numbers(doc: object) -> None:
    assert Price.from_doc(doc) is None


def test_cheap_price_still_charges_a_short_prompt() -> None:
    price = Price.from_doc([0.15, 0.6, 0.075])
    assert price is not None
    assert price.cost(10, 0, 0) == 1500
    assert price.cost(0, 10, 0) == 6000
    assert price.cost(0, 0, 0) == 0


def test_a_cost_no_record_could_hold_is_capped() -> None:
    """An upstream may report counts up to the usage parser's bound (2^53): at 1,000 a million tokens that
    costs past 2^64 nano-units, which the proxy could not encode into the usage record (it was lost)."""
    price = Price.from_doc([1000, 1000, 1000])
    assert price is not None
    assert price.cost(2**53, 2**53, 0) == MAX_FIGURE
    assert price.cost(1_000_000, 0, 0) == 1000 * 10**9  # ordinary figures are untouched
    figures = (2**53, 2**53, 0, 2**54, "reported", price.cost(2**53, 2**53, 0))
    encode_record(UsageRecord("r", 0.0, "p", "k", "m", "b", 200, *figures, 1.0, 1.0, None))


def test_cost_prices_cached_prompt_tokens_apart() -> None:
    price = Price(150.0, 600.0, 75.0)
    # 600 uncached at 150, 400 cached at 75, 200 completion at 600.
    assert price.cost(1000, 200, 400) == 240_000
    assert price.cost(1000, 200, 0) == 270_000
    assert price.cost(1000, 200, 1000) == 195_000


def test_cost_clamps_cached_tokens_to_the_prompt() -> None:
    price = Price(150.0, 600.0, 75.0)
    assert price.cost(10, 0, 50) == 750  # all 10 prompt tokens cached, none charged twice or below zero
    assert price.cost(10, 5, 11) == price.cost(10, 5, 10) == 3750
    assert price.cost(0, 5, 7) == 3000


def test_cost_rounds_to_whole_nanos() -> None:
    price = Price.from_doc([0.0004, 0.0012, 0.0])  # 0.4 and 1.2 nano-units per token
    assert price is not None
    assert price.cost(1, 0, 0) == 0
    assert price.cost(2, 0, 0) == 1
    assert price.cost(0, 1, 0) == 1
    assert price.cost(0, 3, 0) == 4
    assert price.cost(4, 3, 4) == 4  # the cached tokens are free here
    assert type(price.cost(7, 7, 1)) is int


def test_cost_of_a_large_request_is_exact_to_the_nano() -> None:
    price = Price.from_doc([2.5, 10, 1.25])
    assert price is not None
    # 900k uncached at 2500, 100k cached at 1250, 50k completion at 10000.
    assert price.cost(1_000_000, 50_000, 100_000) == 2_250_000_000 + 125_000_000 + 500_000_000
    assert format_money(price.cost(1_000_000, 50_000, 100_000)) == "2.875000"


# --- budgets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"period": "month", "tokens": 1000}, Budget("p1", "month", 1000, None)),
        ({"period": "day", "cost": 12.5}, Budget("p1", "day", None, 12_500_000_000)),
        ({"period": "7d", "tokens": 5, "cost": 50}, Budget("p1", "7d", 5, 50 * NANOS)),
        ({"period": "6h", "cost": 0.15}, Budget("p1", "6h", None, 150_000_000)),
        ({"period": "day", "cost": 1e-9}, Budget("p1", "day", None, 1)),
        ({"period": "day", "cost": 1.0000000004}, Budget("p1", "day", None, 1_000_000_000)),
        ({"period": "day", "cost": 1.0000000006}, Budget("p1", "day", None, 1_000_000_001)),
        # A bad limit is dropped; the other one still makes a budget.
        ({"period": "day", "tokens": 0, "cost": 2}, Budget("p1", "day", None, 2 * NANOS)),
        ({"period": "day", "tokens": 7, "cost": -2}, Budget("p1", "day", 7, None)),
    ],
)
def test_budget_from_doc(doc: dict[str, object], expected: Budget) -> None:
    assert Budget.from_doc("p1", doc) == expected


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        "month",
        {},
        {"period": "month"},
        {"period": "month", "tokens": None, "cost": None},
        {"tokens": 1000},  # no period
        {"period": "week", "tokens": 1000},
        {"period": "30s", "cost": 1.0},
        {"period": "day", "tokens": 0},
        {"period": "day", "tokens": -1},
        {"period": "day", "tokens": True},
        {"period": "day", "tokens": 10.0},
        {"period": "day", "tokens": "10"},
        {"period": "day", "cost": 0},
        {"period": "day", "cost": -1.5},
        {"period": "day", "cost": math.nan},
        {"period": "day", "cost": "5"},
    ],
)
def test_budget_from_doc_without_a_usable_limit_is_none(doc: object) -> None:
    assert Budget.from_doc("p1", doc) is None


def test_exceeded_on_tokens_is_at_or_above_the_limit() -> None:
    budget = Budget("p1", "day", 100, None)
    assert not budget.exceeded(99, 10**18)
    assert budget.exceeded(100, 0)
    assert budget.exceeded(101, 0)


def test_exceeded_on_cost_is_at_or_above_the_limit() -> None:
    budget = Budget("p1", "day", None, 5000)
    assert not budget.exceeded(10**12, 4999)
    assert budget.exceeded(0, 5000)
    assert budget.exceeded(0, 5001)


def test_exceeded_with_both_limits_is_either() -> None:
    budget = Budget("p1", "day", 100, 5000)
    assert not budget.exceeded(99, 4999)
    assert budget.exceeded(100, 0)
    assert budget.exceeded(0, 5000)
    assert budget.exceeded(100, 5000)


def test_budget_window() -> None:
    budget = Budget("p1", "month", 1, None)
    assert budget.window(_ts(2024, 12, 31, 23, 59, 59)) == (1733011200.0, 1735689600.0)
    assert Budget("p1", "90s", 1, None).window(1000.0) == (990.0, 1080.0)


# --- window keys ---------------------------------------------------------------------------------------

T0 = 1735711200.0  # the start of a 6h window (2025-01-01T06:00:00Z)


def test_key_at_is_stable_within_a_window_and_changes_in_the_next() -> None:
    budget = Budget("p1", "6h", 10, None)
    key = budget.key_at("e1", T0)
    assert key == window_key("e1", "p1", "6h", T0)
    assert budget.key_at("e1", T0 + 1) == key
    assert budget.key_at("e1", T0 + 6 * 3600 - 0.001) == key
    following = budget.key_at("e1", T0 + 6 * 3600)
    assert following == window_key("e1", "p1", "6h", T0 + 6 * 3600)
    assert following != key
    # Back in the earlier window (a clock step backwards): its key again, not the cached one.
    assert budget.key_at("e1", T0 + 60) == key


def test_key_at_computes_the_key_once_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, str, float]] = []
    real = gateway.budget.window_key

    def counting(epoch: str, principal_id: str, period: str, start: float) -> int:
        calls.append((epoch, principal_id, period, start))
        return real(epoch, principal_id, period, start)

    monkeypatch.setattr(gateway.budget, "window_key", counting)
    budget = Budget("p1", "month", None, 1)
    for now in (_ts(2024, 12, 1), _ts(2024, 12, 15, 3), _ts(2024, 12, 31, 23, 59, 59)):
        budget.key_at("e1", now)
    assert calls == [("e1", "p1", "month", 1733011200.0)]
    budget.key_at("e1", _ts(2025, 1, 1))
    budget.key_at("e1", _ts(2025, 1, 20))
    assert calls == [("e1", "p1", "month", 1733011200.0), ("e1", "p1", "month", 1735689600.0)]


def test_keys_differ_by_epoch_principal_and_period() -> None:
    key = Budget("p1", "6h", 10, None).key_at("e1", T0)
    others = [
        Budget("p1", "6h", 10, None).key_at("e2", T0),
        Budget("p2", "6h", 10, None).key_at("e1", T0),
        # The same window (6h from the same start) under another period name is another counter.
        Budget("p1", "360m", 10, None).key_at("e1", T0),
        Budget("p1", "day", 10, None).key_at("e1", T0),
    ]
    assert len({key, *others}) == 5
    # Limits are not part of the key: changing a budget's limits keeps the window's spend.
    assert Budget("p1", "6h", 99, 5).key_at("e1", T0) == key


def test_window_key_is_a_nonzero_64_bit_int() -> None:
    keys = {
        window_key(epoch, pid, period, start)
        for epoch in ("e1", "e2")
        for pid in ("p1", "p2", "p1:x")
        for period in ("day", "month", "6h")
        for start in (0.0, 86400.0, T0)
    }
    assert len(keys) == 2 * 3 * 3 * 3
    assert all(isinstance(k, int) and 0 < k < 2**64 for k in keys)
    # The start is keyed to the second: a fractional start names the same window.
    assert window_key("e1", "p1", "6h", T0 + 0.25) == window_key("e1", "p1", "6h", T0)


# --- several budgets: a principal's and a key's ---------------------------------------------------------


def test_budgets_from_doc_reads_the_list_and_the_older_single_form() -> None:
    doc = {"budgets": [{"period": "day", "cost": 20, "alerts": [1.0, 0.8]}, {"period": "month", "tokens": 9}]}
    assert budgets_from_doc("p1", doc) == (
        Budget("p1", "day", None, 20 * NANOS, (0.8, 1.0)),
        Budget("p1", "month", 9, None),
    )
    # A document written before there could be several: its one budget.
    assert budgets_from_doc("p1", {"budget": {"period": "day", "tokens": 5}}) == (
        Budget("p1", "day", 5, None),
    )
    assert budgets_from_doc("p1", {}) == ()
    # Unreadable entries, a second of the same period and those past MAX_BUDGETS are left out.
    messy = [{"period": "week", "tokens": 1}, {"period": "day", "tokens": 1}, {"period": "day", "tokens": 2}]
    assert budgets_from_doc("p1", {"budgets": messy}) == (Budget("p1", "day", 1, None),)
    many = [{"period": f"{h}h", "tokens": 1} for h in range(1, 7)]
    assert len(budgets_from_doc("p1", {"budgets": many})) == MAX_BUDGETS
    # Thresholds outside (0, 1] are dropped.
    (odd,) = budgets_from_doc(
        "p1", {"budgets": [{"period": "day", "tokens": 1, "alerts": [0, 2, 0.5, True]}]}
    )
    assert odd.alerts == (0.5,)


def test_a_key_s_budget_has_its_own_counter_and_says_whose_it_is() -> None:
    mine = Budget(KEY_OWNER + "k1", "6h", 10, None)
    assert mine.key_id == "k1" and Budget("p1", "6h", 10, None).key_id is None
    # Never the counter of a principal whose id is the key's.
    assert mine.key_at("e1", T0) != Budget("k1", "6h", 10, None).key_at("e1", T0)
    assert "this API key has used 10 of 10 tokens in its 6h budget period" in exceeded_message(
        mine, 10, 0, T0
    )
    assert exceeded_message(Budget("p1", "day", None, 5 * NANOS), 0, 6 * NANOS, T0) == (
        "Budget exceeded: this principal has used 6.000000 of 5.000000 (cost) in its day budget period, "
        "which resets at 2025-01-02T00:00:00Z."
    )


def test_budget_used_is_the_larger_share() -> None:
    assert Budget("p1", "day", 100, 1000).used(50, 900) == 0.9
    assert Budget("p1", "day", 100, None).used(150, 10**9) == 1.5


def test_budget_set_caches_every_window_until_the_first_rolls_over(monkeypatch: pytest.MonkeyPatch) -> None:
    day, hour = Budget("p1", "day", 10, None), Budget("p1", "1h", 5, None)
    own = Budget(KEY_OWNER + "k1", "6h", 3, None)
    budgets = BudgetSet((day, hour), (own,))
    windows = budgets.windows_at("e1", T0)
    assert windows == (
        (day, day.key_at("e1", T0)),
        (hour, hour.key_at("e1", T0)),
        (own, own.key_at("e1", T0)),
    )
    live = budgets.live_keys("e1", T0)
    assert live == ((windows[0][1], windows[1][1]), (windows[2][1],))
    # The same objects while every window holds: nothing is built per request.
    calls: list[object] = []
    monkeypatch.setattr(gateway.budget, "window_key", lambda *a: calls.append(a) or 1)
    assert budgets.windows_at("e1", T0 + 3599) is windows
    assert budgets.live_keys("e1", T0 + 3599) is live
    assert calls == []
    # The hour rolls over: only its key is computed again.
    rolled = budgets.windows_at("e1", T0 + 3600)
    assert rolled[1] == (hour, 1) and rolled[0] == windows[0] and rolled[2] == windows[2]
    assert calls == [("e1", "p1", "1h", T0 + 3600)]
    assert budgets.live_keys("e1", T0 + 3600) == ((windows[0][1], 1), (windows[2][1],))
    # Another table's epoch names other counters.
    monkeypatch.undo()
    assert BudgetSet((day,), ()).live_keys("e2", T0) == (
        (window_key("e2", "p1", "day", T0 - 6 * 3600),),
        None,
    )
