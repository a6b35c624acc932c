"""Rate-limit shares across hosts: proportional to recent traffic, never below 1/hosts, bounded sum."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.controlplane.fleet.shares import compute_shares, overshoot_bound


def test_even_traffic_splits_the_limit_exactly() -> None:
    shares = compute_shares({"a": {"p:1": 50}, "b": {"p:1": 50}}, ["a", "b"])
    assert shares == {"a": {"p:1": 0.5}, "b": {"p:1": 0.5}}


def test_one_busy_host_gets_it_all_and_the_idle_one_keeps_its_floor() -> None:
    shares = compute_shares({"a": {"p:1": 90}, "b": {}}, ["a", "b", "c"])
    assert shares["a"]["p:1"] == 1.0
    assert shares["b"]["p:1"] == shares["c"]["p:1"] == pytest.approx(1 / 3)


def test_scopes_without_traffic_get_the_floor() -> None:
    assert compute_shares({"a": {"p:1": 0}}, ["a", "b"]) == {"a": {"p:1": 0.5}, "b": {"p:1": 0.5}}
    assert compute_shares({}, []) == {}


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=12))
def test_shares_never_sum_past_the_bound(traffic: list[float]) -> None:
    hosts = [f"h{i}" for i in range(len(traffic))]
    shares = compute_shares({h: {"s": t} for h, t in zip(hosts, traffic, strict=True)}, hosts)
    total = sum(shares[h]["s"] for h in hosts)
    assert 1.0 - 1e-9 <= total <= overshoot_bound(len(hosts)) + 1e-9
    assert all(shares[h]["s"] >= 1 / len(hosts) - 1e-12 for h in hosts)
