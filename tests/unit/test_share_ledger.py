"""The share bound across a cluster's history: whatever the order of reports, traffic moves, restarts of
either side, hosts joining and leaving, the shares the live hosts may be enforcing for a scope never sum
past (2H - 1)/H (H: the live hosts holding a grant). A host may be enforcing either of its last two grants
(its workers read a new one within a tenth of a second; reports are at least a second apart).

A wait is a stretch in which no host reports: the control plane is down or cut off. A host that does not
report while others do is cut off on its own; past two TTLs of that (in the fleet's heard time, which
counts a silence of everyone as ``SILENCE``) it is taken for gone, which the architecture documents as the
one case outside the bound besides the brand-new host's below."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.controlplane.fleet.reports import SILENCE, TTL, Fleet
from gateway.controlplane.fleet.shares import Grant, overshoot_bound

SCOPES = ["p:1", "k:2", "never-seen"]


@dataclass
class Host:
    name: str
    grants: list[Grant] = field(default_factory=list)  # every grant it was answered, last one enforced
    hosts: int = 0
    answered_at: float = 0.0
    heard_at: float = 0.0  # the model's heard time of its last answer

    def may_enforce(self, scope: str, now: float) -> float:
        if self.grants and now - self.answered_at > TTL:  # no answer for a TTL: its default only
            return self.grants[-1].default
        return max((g.of(scope) for g in self.grants[-2:]), default=0.0)

    def report(self, fleet: Fleet, traffic: dict[str, int], clock: Clock) -> None:
        held: dict[str, Any] = {}
        if self.grants:
            last = self.grants[-1]
            held = {"shares": last.shares, "default_share": last.default, "hosts": self.hosts}
        answer = fleet.record({"host": self.name, "role": "proxy", "traffic": traffic, "held": held})
        self.grants.append(Grant(answer["shares"], answer["default_share"]))
        self.hosts = answer["hosts"]
        self.answered_at = clock.now
        self.heard_at = clock.reported()


class Clock:
    """Real time, and the model's own heard time: every stretch without any report counts at most
    ``SILENCE``."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._last_report = self.now
        self._heard = self.now

    def __call__(self) -> float:
        return self.now

    def heard(self) -> float:
        return self._heard + min(self.now - self._last_report, SILENCE)

    def reported(self) -> float:
        self._heard, self._last_report = self.heard(), self.now
        return self._heard


def check_bound(alive: dict[str, Host], clock: Clock) -> None:
    now = clock.now
    cut_off_since = clock.heard() - 2 * TTL
    holding = [h for h in alive.values() if h.grants and h.heard_at >= cut_off_since]
    if not holding:
        return
    bound = overshoot_bound(len(holding))
    for scope in SCOPES:
        total = sum(h.may_enforce(scope, now) for h in holding)
        assert total <= bound + 1e-9, (scope, total, bound, {h.name: h.grants[-2:] for h in holding})


traffic = st.dictionaries(st.sampled_from(SCOPES[:2]), st.integers(0, 200), max_size=2)
action = st.one_of(
    st.tuples(st.just("report"), st.integers(0, 7), traffic),
    st.tuples(st.just("wait"), st.floats(0.5, 2 * TTL)),
    st.tuples(st.just("join"), st.integers(0, 7)),
    st.tuples(st.just("leave"), st.integers(0, 7)),
    st.tuples(st.just("restart-control")),
    st.tuples(st.just("restart-proxy"), st.integers(0, 7)),
)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 5), st.lists(action, max_size=60))
def test_the_bound_holds_in_every_sequence(start: int, actions: list[tuple[Any, ...]]) -> None:
    clock = Clock()
    fleet = Fleet(clock)
    alive = {f"h{i}": Host(f"h{i}") for i in range(start)}
    made = start
    restarted = heard_since_start = False
    for act in actions:
        kind = act[0]
        names = sorted(alive)
        if kind == "report" and names:
            clock.now += 0.01
            host = alive[names[act[1] % len(names)]]
            if restarted and not host.grants and not heard_since_start:
                # Left out, and documented: a brand-new host that is the very first to report to a control
                # plane that restarted is taken for the first host of a new cluster.
                continue
            host.report(fleet, act[2], clock)
            heard_since_start = True
        elif kind == "wait":
            clock.now += act[1]
        elif kind == "join":
            alive[f"h{made}"] = Host(f"h{made}")
            made += 1
        elif kind == "leave" and names:
            del alive[names[act[1] % len(names)]]
        elif kind == "restart-control":
            fleet = Fleet(clock)
            restarted, heard_since_start = True, False
        elif kind == "restart-proxy" and names:
            pass  # it keeps its grant on disk and claims it in its next report: nothing else changes
        check_bound(alive, clock)


def test_traffic_moving_between_hosts_never_lifts_the_sum() -> None:
    """The case of issue 25: all traffic on one of three hosts, then all on another. The new busy host's
    share grows only as the old one gives its share back."""
    clock = Clock()
    fleet = Fleet(clock)
    hosts = {n: Host(n) for n in ("a", "b", "c")}
    for _ in range(6):
        for name, host in hosts.items():
            clock.now += 1
            host.report(fleet, {"p:1": 100 if name == "a" else 0}, clock)
            check_bound(hosts, clock)
    assert hosts["a"].grants[-1].of("p:1") > 0.9
    for _ in range(8):
        for name, host in hosts.items():
            clock.now += 1
            host.report(fleet, {"p:1": 100 if name == "b" else 0}, clock)
            check_bound(hosts, clock)
    assert hosts["b"].grants[-1].of("p:1") > 0.9
    assert hosts["a"].grants[-1].of("p:1") < 0.4


def test_a_restarted_control_plane_does_not_hand_the_first_reporter_everything() -> None:
    clock = Clock()
    fleet = Fleet(clock)
    hosts = {n: Host(n) for n in ("a", "b", "c")}
    for _ in range(3):  # the first reporter alone got 1/1, then the others joined; it settles at 1/3
        for host in hosts.values():
            clock.now += 1
            host.report(fleet, {}, clock)
    assert all(abs(h.grants[-1].default - 1 / 3) < 1e-9 for h in hosts.values())
    fleet = Fleet(clock)  # restarted: knows nothing
    clock.now += 1
    hosts["a"].report(fleet, {"p:1": 100}, clock)
    assert hosts["a"].grants[-1].of("p:1") <= 1 / 3 + 1e-9
    check_bound(hosts, clock)
    for host in hosts.values():  # within the warm-up nobody gets more than it holds
        clock.now += 1
        host.report(fleet, {"p:1": 100} if host.name == "a" else {}, clock)
        check_bound(hosts, clock)
    assert hosts["a"].grants[-1].of("p:1") <= 1 / 3 + 1e-9
    for _ in range(int(2 * TTL) // 3 + 3):  # reporting every second until the warm-up (two TTLs) is over
        for host in hosts.values():
            clock.now += 1
            host.report(fleet, {"p:1": 100} if host.name == "a" else {}, clock)
            check_bound(hosts, clock)
    assert hosts["a"].grants[-1].of("p:1") > 0.9


def _run(start: int, actions: list[tuple[Any, ...]]) -> None:
    test_the_bound_holds_in_every_sequence.hypothesis.inner_test(start, actions)  # type: ignore[attr-defined]


def test_a_silent_control_plane_does_not_hand_the_first_host_back_everything() -> None:
    """Found by the property test: the hosts heard nothing for a minute (the control plane was cut off),
    then one reported first and was given the share of a host that held the whole limit."""
    _run(2, [("report", 1, {}), ("report", 0, {}), ("wait", 60.0), ("report", 0, {}), ("wait", 31.0),
             ("report", 0, {})])  # fmt: skip


def test_a_warm_up_that_nobody_reported_in_is_not_over() -> None:
    """Found by the property test: a control plane restarted and heard nothing for its first TTL, then
    granted the first claimant the whole limit while the other host still held it."""
    _run(2, [("report", 1, {}), ("report", 0, {}), ("restart-control",), ("wait", 30.0), ("report", 0, {})])


def test_a_scope_held_at_the_bound_costs_the_other_hosts_nothing() -> None:
    """300 hosts, each the only one with traffic in its own scope, which it holds whole: every other host
    has exactly its default left there, so no grant names another host's scope (the rounding of 1/H must
    not make each of them look a hair too full), and the held shares stay within the bound."""
    clock = Clock()
    fleet = Fleet(clock)
    hosts = {f"h{i}": Host(f"h{i}") for i in range(300)}
    for _ in range(4):
        for name, host in hosts.items():
            clock.now += 10 / len(hosts)
            host.report(fleet, {f"own:{name}": 50}, clock)
    for name, host in hosts.items():
        assert set(host.grants[-1].shares) <= {f"own:{name}"}, host.grants[-1].shares
        assert host.grants[-1].of(f"own:{name}") > 0.99
        assert host.grants[-1].default == 1 / 300
    for name in ("own:h0", "own:h150", "own:h299"):
        total = sum(h.may_enforce(name, clock.now) for h in hosts.values())
        assert total <= overshoot_bound(300) + 1e-12
