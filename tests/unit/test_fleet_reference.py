"""The incremental fleet against the straightforward one it replaced: over random sequences of reports
(traffic moving, hosts changing role), silences, hosts joining, leaving and losing their saved grant,
fleet views and control-plane restarts, every answer grants each scope the same share (within 1e-9)
and the same default, and counts the same hosts.

The reference below is the fleet as it was before its report cost stopped growing with the number of
hosts: every report recomputes every host's targets from every host's traffic (``compute_shares``) and
sums every other host's held shares per scope (``ReferenceLedger.grant``), O(hosts x scopes). Its grants
name every scope any host has traffic in or holds; the incremental ones name only the scopes whose share
is not the default, so the two are compared by what a host enforces: ``shares.get(scope, default)``."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.controlplane.fleet.reports import SILENCE, TTL, Fleet
from gateway.controlplane.fleet.shares import Grant, overshoot_bound
from gateway.errors import BadRequest

_EPS = 1e-12


def compute_shares(
    traffic: Mapping[str, Mapping[str, float]], hosts: list[str]
) -> dict[str, dict[str, float]]:
    if not hosts:
        return {}
    floor = 1.0 / len(hosts)
    scopes = {scope for host in hosts for scope in traffic.get(host, {})}
    shares: dict[str, dict[str, float]] = {host: {} for host in hosts}
    for scope in scopes:
        total = sum(traffic.get(host, {}).get(scope, 0.0) for host in hosts)
        for host in hosts:
            fraction = traffic.get(host, {}).get(scope, 0.0) / total if total > 0 else floor
            shares[host][scope] = max(floor, fraction)
    return shares


@dataclass(slots=True)
class _Held:
    current: Grant
    previous: Grant | None = None

    def of(self, scope: str) -> float:
        now = self.current.of(scope)
        return now if self.previous is None else max(now, self.previous.of(scope))

    def scopes(self) -> Iterable[str]:
        yield from self.current.shares
        if self.previous is not None:
            yield from self.previous.shares


class ReferenceLedger:
    def __init__(self, now: float, warmup: float, linger: float) -> None:
        self._held: dict[str, _Held] = {}
        self._lingering: dict[str, tuple[float, float]] = {}
        self._linger = linger
        self._warm_until = now + warmup
        self._claims_seen = False

    def forget(self, host: str, now: float) -> None:
        entry = self._held.pop(host, None)
        if entry is not None:
            self._lingering[host] = (now + self._linger, entry.current.default)

    def grant(
        self, host: str, hosts: list[str], targets: Mapping[str, float], now: float, claim: Grant | None
    ) -> Grant:
        count = len(hosts)
        bound = overshoot_bound(count)
        floor = 1.0 / count
        if host not in self._held and claim is not None:
            self._held[host] = _Held(claim)
            self._claims_seen = True
        mine = self._held.get(host)
        warming = self._claims_seen and now < self._warm_until
        others = [self._held[h] for h in hosts if h != host and h in self._held]
        self._lingering.pop(host, None)
        for gone in [h for h, (until, _) in self._lingering.items() if until <= now]:
            del self._lingering[gone]
        others += [_Held(Grant({}, default)) for _, default in self._lingering.values()]
        scopes = set(targets)
        for entry in [*others, *([mine] if mine is not None else [])]:
            scopes.update(entry.scopes())
        shares: dict[str, float] = {}
        default_room = bound - sum(
            o.current.default if o.previous is None else max(o.current.default, o.previous.default)
            for o in others
        )
        for scope in sorted(scopes):
            room = bound - sum(o.of(scope) for o in others)
            share = min(targets.get(scope, floor), room)
            if warming:
                share = min(share, mine.current.of(scope) if mine is not None else 0.0)
            share = max(0.0, share)
            if scope not in targets and abs(share - floor) < _EPS:
                default_room = min(default_room, room)
                continue
            shares[scope] = share
        default = max(0.0, min(floor, default_room))
        if warming:
            default = min(default, mine.current.default if mine is not None else 0.0)
        granted = Grant(shares, default)
        self._held[host] = _Held(granted, mine.current if mine is not None else None)
        return granted


class ReferenceFleet:
    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self._reports: dict[str, tuple[float, dict[str, Any]]] = {}
        self._recent: dict[str, dict[str, float]] = {}
        self._last_report: float = clock()
        self._heard: float = self._last_report
        self.ledger = ReferenceLedger(self._heard, warmup=2 * TTL, linger=TTL)

    def heard_time(self, now: float) -> float:
        return self._heard + min(now - self._last_report, SILENCE)

    def record(self, report: dict[str, Any]) -> dict[str, Any]:
        host = str(report.get("host") or "unknown")
        real: float = self._clock()
        now = self._heard = self.heard_time(real)
        self._last_report = real
        self._reports[host] = (now, report)
        window = report.get("traffic") or {}
        recent = self._recent.setdefault(host, {})
        for scope in set(recent) | set(window):
            value = 0.5 * recent.get(scope, 0.0) + 0.5 * float(window.get(scope, 0))
            if value < 0.01:
                recent.pop(scope, None)
            else:
                recent[scope] = value
        self._expire(now)
        proxies = sorted(h for h, (_, r) in self._reports.items() if r.get("role") == "proxy")
        if host not in proxies:
            return {"shares": {}, "default_share": 1.0, "hosts": len(proxies)}
        targets = compute_shares({h: self._recent.get(h, {}) for h in proxies}, proxies)[host]
        held = report.get("held") or {}
        granted = self.ledger.grant(host, proxies, targets, now, claim=Grant.from_claim(held))
        return {"shares": granted.shares, "default_share": granted.default, "hosts": len(proxies)}

    def _expire(self, now: float) -> None:
        for host in [h for h, (at, _) in self._reports.items() if now - at > TTL]:
            del self._reports[host]
            self._recent.pop(host, None)
            self.ledger.forget(host, now)

    def view(self) -> list[str]:
        self._expire(self.heard_time(self._clock()))
        return sorted(self._reports)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Host:
    """One proxy host, as each control plane sees it: what it holds from each."""

    name: str
    held: dict[str, dict[str, Any]] = field(default_factory=lambda: {"ref": {}, "new": {}})

    def report(self, fleets: dict[str, Any], traffic: dict[str, int], role: str = "proxy") -> None:
        answers = {}
        for world, fleet in fleets.items():
            report = {"host": self.name, "role": role, "traffic": traffic, "held": self.held[world]}
            answer = answers[world] = fleet.record(report)
            if role == "proxy":
                self.held[world] = {"shares": answer["shares"], "default_share": answer["default_share"]}
        same(answers["ref"], answers["new"], [*SCOPES, "never-seen"])


def same(ref: dict[str, Any], new: dict[str, Any], scopes: Iterable[str]) -> None:
    assert ref["hosts"] == new["hosts"]
    assert new["default_share"] == pytest.approx(ref["default_share"], abs=1e-9), (ref, new)
    want, got = Grant(ref["shares"], ref["default_share"]), Grant(new["shares"], new["default_share"])
    for scope in {*scopes, *ref["shares"], *new["shares"]}:
        assert got.of(scope) == pytest.approx(want.of(scope), abs=1e-9), (scope, ref, new)


SCOPES = ["p:1", "k:1", "k:2", "p:2", "k:3"]
traffic = st.dictionaries(st.sampled_from(SCOPES), st.integers(0, 300), max_size=4)
action = st.one_of(
    st.tuples(st.just("report"), st.integers(0, 9), traffic),
    st.tuples(st.just("report-as-control"), st.integers(0, 9)),
    st.tuples(st.just("wait"), st.floats(0.5, 2 * TTL)),
    st.tuples(st.just("join"), st.integers(0, 9)),
    st.tuples(st.just("leave"), st.integers(0, 9)),
    st.tuples(st.just("lose-grant"), st.integers(0, 9)),
    st.tuples(st.just("view")),
    st.tuples(st.just("restart-control")),
)


def play(start: int, actions: list[tuple[Any, ...]]) -> None:
    clock = Clock()
    fleets: dict[str, Any] = {"ref": ReferenceFleet(clock), "new": Fleet(clock)}
    alive = {f"h{i}": Host(f"h{i}") for i in range(start)}
    made = start
    for act in actions:
        kind = act[0]
        names = sorted(alive)
        if kind in ("report", "report-as-control") and names:
            clock.now += 0.01
            host = alive[names[act[1] % len(names)]]
            if kind == "report":
                host.report(fleets, act[2])
            else:
                host.report(fleets, {"p:1": 5}, role="control")
        elif kind == "wait":
            clock.now += act[1]
        elif kind == "join":
            alive[f"h{made}"] = Host(f"h{made}")
            made += 1
        elif kind == "leave" and names:
            del alive[names[act[1] % len(names)]]
        elif kind == "lose-grant" and names:
            alive[names[act[1] % len(names)]].held = {"ref": {}, "new": {}}
        elif kind == "view":
            ref_view = fleets["ref"].view()
            assert sorted(r["host"] for r in fleets["new"].view()) == ref_view
        elif kind == "restart-control":
            fleets = {"ref": ReferenceFleet(clock), "new": Fleet(clock)}


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 6), st.lists(action, max_size=80))
def test_the_incremental_fleet_grants_what_the_reference_grants(start: int, actions: list[Any]) -> None:
    play(start, actions)


@pytest.mark.parametrize("seed", range(3))
def test_many_hosts_and_scopes_in_long_runs(seed: int) -> None:
    """Longer than the property test's sequences: up to 40 hosts, 30 scopes, traffic moving between them,
    hosts joining and losing their grants, silences and a control-plane restart, 2,000 reports."""
    rng = random.Random(seed)
    clock = Clock()
    fleets: dict[str, Any] = {"ref": ReferenceFleet(clock), "new": Fleet(clock)}
    scopes = [f"s{i}" for i in range(30)]
    hosts = [Host(f"h{i}") for i in range(40)]
    for step in range(2000):
        clock.now += rng.choice([0.01, 0.1, 0.5])
        host = rng.choice(hosts[: 10 + step // 60])
        busy = rng.sample(scopes, rng.randint(0, 5))
        host.report(fleets, {s: rng.randint(0, 50) * (1 + (step // 300) % 3) for s in busy})
        if step % 500 == 499:
            clock.now += rng.choice([2 * TTL, SILENCE + 5])
        if step == 1000:
            fleets = {"ref": ReferenceFleet(clock), "new": Fleet(clock)}
        if rng.random() < 0.01:
            hosts[rng.randrange(len(hosts))].held = {"ref": {}, "new": {}}


def test_a_report_whose_traffic_is_not_counts_is_refused_and_changes_nothing() -> None:
    clock = Clock()
    fleet = Fleet(clock)
    fleet.record({"host": "a", "role": "proxy", "traffic": {"p:1": 10}})
    for bad in [{"p:1": -1}, {"p:1": "10"}, {"p:1": float("nan")}, {"p:1": True}, ["p:1"], {"p:1": 2.0**60}]:
        with pytest.raises(BadRequest):
            fleet.record({"host": "b", "role": "proxy", "traffic": bad})
    assert [r["host"] for r in fleet.view()] == ["a"]
    assert fleet.record({"host": "a", "role": "proxy", "traffic": {"p:1": 10}})["hosts"] == 1


def test_a_claim_that_no_control_plane_grants_is_no_claim() -> None:
    assert Grant.from_claim({"shares": {"p:1": 0.5}, "default_share": 0.25}) == Grant({"p:1": 0.5}, 0.25)
    for bad in [{"p:1": 1.5}, {"p:1": -0.1}, {"p:1": float("nan")}, {"p:1": float("inf")}]:
        assert Grant.from_claim({"shares": bad, "default_share": 0.25}) is None
    assert Grant.from_claim({"shares": {}, "default_share": 2.0}) is None
