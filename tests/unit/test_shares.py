"""Rate-limit shares across hosts: proportional to recent traffic, never below 1/hosts, bounded sum."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.controlplane.fleet.shares import overshoot_bound
from gateway.controlplane.fleet.traffic import RecentTraffic


def targets(windows: dict[str, dict[str, float]], hosts: list[str]) -> dict[str, dict[str, float]]:
    """Each host's targets after one window of traffic, every host counted; scopes a host has no traffic
    in are left out (their target is the floor)."""
    traffic = RecentTraffic()
    for host in hosts:
        traffic.count(host, True)
        traffic.record(host, windows.get(host, {}))
    return {host: traffic.targets(host, 1.0 / len(hosts)) for host in hosts}


def test_even_traffic_splits_the_limit_exactly() -> None:
    assert targets({"a": {"p:1": 50}, "b": {"p:1": 50}}, ["a", "b"]) == {"a": {"p:1": 0.5}, "b": {"p:1": 0.5}}


def test_one_busy_host_gets_it_all_and_the_idle_one_keeps_its_floor() -> None:
    shares = targets({"a": {"p:1": 90}, "b": {}}, ["a", "b", "c"])
    assert shares == {"a": {"p:1": 1.0}, "b": {}, "c": {}}


def test_a_host_below_its_floor_is_raised_to_it() -> None:
    shares = targets({"a": {"p:1": 99}, "b": {"p:1": 1}}, ["a", "b"])
    assert shares["a"]["p:1"] == pytest.approx(0.99)
    assert shares["b"]["p:1"] == 0.5


def test_the_average_halves_each_window_and_a_quiet_scope_is_dropped() -> None:
    traffic = RecentTraffic()
    traffic.count("a", True)
    traffic.record("a", {"p:1": 8})
    assert traffic.recent("a") == {"p:1": 4.0}
    traffic.record("a", {})
    assert traffic.recent("a") == {"p:1": 2.0}
    for _ in range(8):
        traffic.record("a", {})
    assert traffic.recent("a") == {}
    assert "p:1" not in traffic.busy


def test_a_host_that_stops_counting_takes_its_traffic_out_of_the_totals() -> None:
    traffic = RecentTraffic()
    for host, count in (("a", 30), ("b", 10)):
        traffic.count(host, True)
        traffic.record(host, {"p:1": count})
    assert traffic.targets("a", 0.5)["p:1"] == 0.75
    traffic.count("b", False)  # it reports as a control host now
    assert traffic.targets("a", 1.0)["p:1"] == 1.0
    traffic.count("b", True)
    assert traffic.targets("a", 0.5)["p:1"] == 0.75
    traffic.forget("a")
    assert traffic.targets("b", 1.0)["p:1"] == 1.0
    traffic.forget("b")
    assert "p:1" not in traffic.busy


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=12))
def test_shares_never_sum_past_the_bound(traffic: list[int]) -> None:
    hosts = [f"h{i}" for i in range(len(traffic))]
    shares = targets({h: {"s": t} for h, t in zip(hosts, traffic, strict=True)}, hosts)
    floor = 1 / len(hosts)
    total = sum(shares[h].get("s", floor) for h in hosts)
    assert 1.0 - 1e-9 <= total <= overshoot_bound(len(hosts)) + 1e-9
    assert all(shares[h].get("s", floor) >= floor - 1e-12 for h in hosts)
