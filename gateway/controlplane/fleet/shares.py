"""Shares of a rate limit across the proxy hosts of a cluster. Pure; no I/O (the clock is passed in).

Every host enforces each limit exactly, locally, on its share of it: limit * share. Once per report
window the control plane works out each host's *target*: its fraction of the scope's recent traffic, but
never below 1/H (H proxy hosts), so that a host that was idle still admits its floor rather than refusing
everything while the scope is far under its limit (``compute_shares``). With fractions f_h summing to 1,
targets sum to 1 + Σ_{f_h < 1/H} (1/H - f_h) ≤ (2H - 1)/H: under twice the limit, and exactly the limit
when traffic is spread evenly.

Targets alone do not make the bound hold, because hosts report at different moments: a host keeps the
share it was given until its next report, so when traffic moves, the host it left still holds its large
share while the host it went to asks for one. ``ShareLedger`` therefore grants each reporting host
``min(target, B - Σ others' held)`` per scope, where B = (2H - 1)/H and a host's *held* share is the
larger of its last two grants (its workers may still enforce the previous one until they read the new
one, well within a report interval). So the held shares of the hosts the ledger counts never sum past B:
a host whose traffic grew gets its larger share once the others have reported twice and given theirs
back: within two report intervals. A scope no host has a share for is held at a default of at most 1/H.

A host that stops reporting is forgotten after the fleet's TTL, its default counted for one TTL more
(``linger``); a proxy host that has had no answer for a TTL falls back to its default on its own. So a
host the ledger does not count holds at most its floor, which is the room the bound leaves above the
counted hosts'. Times here are the fleet's *heard time* (``Fleet``): a stretch in which no host reported
at all is the control plane's own outage and counts only a little, so hosts are not forgotten, nor their
shares handed to the first host back, because the control plane could not hear them.

Restarts: a proxy host keeps its last grant on disk and enforces it through a control-plane outage and
its own restarts; with each report it says what it holds, so a control plane that restarted (and knows
no grants) takes the claim as held. Once it has seen a claim, and for ``warmup`` seconds after its start
(two TTLs, by which every host that is not cut off has reported, and one that is has been counted as long
as a running control plane counts it), it grants no host more than it claims to hold, and a host that
claims nothing no share at all (one request per limit), so the hosts it has not heard from yet keep room
for what they hold.

Left open, both documented: a brand-new host that is the very first to report to a restarted control
plane is taken for the first host of a new cluster; and a host cut off from the control plane on its own,
while the others are heard, for more than two TTLs is taken for gone, though it may still serve on its
last default share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Grant", "ShareLedger", "compute_shares", "overshoot_bound"]

_EPS = 1e-12


def compute_shares(
    traffic: Mapping[str, Mapping[str, float]], hosts: list[str]
) -> dict[str, dict[str, float]]:
    """``traffic[host][scope]`` = the scope's traffic on that host in the last window; returns the target
    ``shares[host][scope]`` for every scope any host saw. Scopes a host has no entry for get 1/H there."""
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


def overshoot_bound(hosts: int) -> float:
    """The most a scope's shares can sum to across ``hosts`` hosts: (2H - 1)/H."""
    return (2 * hosts - 1) / hosts if hosts > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Grant:
    """What a host enforces: ``shares[scope]``, and ``default`` for every scope not named."""

    shares: dict[str, float] = field(default_factory=dict)
    default: float = 1.0

    def of(self, scope: str) -> float:
        return self.shares.get(scope, self.default)

    @classmethod
    def from_claim(cls, claim: Any) -> Grant | None:
        """A host's report of what it holds (``{"shares": {...}, "default_share": x}``), or None."""
        if not isinstance(claim, Mapping) or "default_share" not in claim:
            return None
        try:
            shares = {str(k): float(v) for k, v in (claim.get("shares") or {}).items()}
            return cls(shares, float(claim["default_share"]))
        except (TypeError, ValueError, AttributeError):
            return None


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


class ShareLedger:
    def __init__(self, now: float, warmup: float, linger: float) -> None:
        self._held: dict[str, _Held] = {}
        # Hosts that stopped reporting, until when their default still counts: a host cut off from the
        # control plane falls back to its default share after a TTL without an answer, and may still be
        # serving on it.
        self._lingering: dict[str, tuple[float, float]] = {}
        self._linger = linger
        self._warm_until = now + warmup
        self._claims_seen = False  # some host claimed a grant: this control plane restarted on a cluster

    def held(self, host: str, scope: str) -> float:
        """What ``host`` may be enforcing for ``scope`` now (0 for a host never granted anything)."""
        entry = self._held.get(host)
        return 0.0 if entry is None else entry.of(scope)

    def forget(self, host: str, now: float) -> None:
        """A host that stopped reporting: what it held is free again, but for its default, which counts
        for another ``linger`` seconds."""
        entry = self._held.pop(host, None)
        if entry is not None:
            self._lingering[host] = (now + self._linger, entry.current.default)

    def grant(
        self,
        host: str,
        hosts: list[str],
        targets: Mapping[str, float],
        now: float,
        claim: Grant | None = None,
        claimed_hosts: int = 0,
    ) -> Grant:
        """The grant for ``host`` (one of ``hosts``, the proxy hosts counted now) given its ``targets``
        (``compute_shares``'s row for it), and what it claims to hold; recorded as held."""
        count = len(hosts)
        bound = overshoot_bound(count)
        floor = 1.0 / count
        if host not in self._held and claim is not None:
            self._held[host] = _Held(claim)  # a grant from before this ledger existed, still enforced
            self._claims_seen = True
        mine = self._held.get(host)
        # A control plane that restarted on a running cluster knows only the grants claimed so far: until
        # every host has reported (a TTL), none gets more than it holds, and a host claiming nothing none.
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
                default_room = min(default_room, room)  # left to the default, which must then fit here
                continue
            shares[scope] = share
        default = max(0.0, min(floor, default_room))
        if warming:
            default = min(default, mine.current.default if mine is not None else 0.0)
        granted = Grant(shares, default)
        self._held[host] = _Held(granted, mine.current if mine is not None else None)
        return granted
