"""Shares of a rate limit across the proxy hosts of a cluster. Pure; no I/O (the clock is passed in).

Every host enforces each limit exactly, locally, on its share of it: limit * share. Once per report
window the control plane works out each host's *target*: its fraction of the scope's recent traffic, but
never below 1/H (H proxy hosts), so that a host that was idle still admits its floor rather than refusing
everything while the scope is far under its limit (``fleet.traffic``). With fractions f_h summing to 1,
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

Cost: one grant costs the scopes the reporting host has traffic in or holds, plus the scopes where what
the other hosts hold leaves it less room than its default (or, while its default is squeezed, more),
never the number of hosts. What the others hold is kept summed per scope (``fleet.holdings``), and a
grant names only the scopes whose share differs from its default: a host enforces ``shares.get(scope,
default)``, so naming a scope at its default would change nothing but the size of every later grant.

Rooms are worked out in integers (``fleet.holdings``) and rounded down to a share, so a grant never takes
more than the room the sums show. One tolerance: a scope whose room falls short of the host's default by
no more than the sums' rounding (``slack``: a unit per host and a little for the floats, 4e-15 of the
limit at 2,000 hosts) is left to the default. A scope at the bound exactly (one busy host holding all the
room it has, the usual case) shows that little shortfall, because 1/H has no exact binary form and each
default is rounded up; without the tolerance every such scope would be visited on every other host's
report. So the held shares of a scope may sum past B by that much: far less than the floats' own error
on a sum of a thousand shares, and than the 1e-12 the ledger takes for equal.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Mapping

from gateway.controlplane.fleet.holdings import Grant, Held, HeldSums, share_of, units

__all__ = ["Grant", "ShareLedger", "overshoot_bound"]

_EPS = 1e-12


def slack(hosts: int) -> int:
    """Units a room may fall short of a host's default by before the host is told so: the rounding up of
    each host's term (a unit each) and of the floats the bound and the floor are (2**8 units each)."""
    return 2 * hosts + 1024


def overshoot_bound(hosts: int) -> float:
    """The most a scope's shares can sum to across ``hosts`` hosts: (2H - 1)/H."""
    return (2 * hosts - 1) / hosts if hosts > 0 else 1.0


class ShareLedger:
    def __init__(self, now: float, warmup: float, linger: float) -> None:
        self._held: dict[str, Held] = {}
        # The proxy hosts now: what they hold counts for the others, summed in ``_sums``.
        self._counted: set[str] = set()
        self._sums = HeldSums()
        # Hosts that stopped reporting, until when their default still counts: a host cut off from the
        # control plane falls back to its default share after a TTL without an answer, and may still be
        # serving on it. ``_lingering_due`` orders them by that time (a heap; an entry whose host came back
        # or lingers again since is passed over), ``_lingering_sum`` sums their defaults in units.
        self._lingering: dict[str, tuple[float, float]] = {}
        self._lingering_due: list[tuple[float, str]] = []
        self._lingering_sum = 0
        self._linger = linger
        self._warm_until = now + warmup
        self._claims_seen = False  # some host claimed a grant: this control plane restarted on a cluster

    def held(self, host: str, scope: str) -> float:
        """What ``host`` may be enforcing for ``scope`` now (0 for a host never granted anything)."""
        entry = self._held.get(host)
        return 0.0 if entry is None else entry.of(scope)

    def count(self, host: str, counted: bool) -> None:
        """Whether ``host`` is one of the proxy hosts now, whose holding the others must leave room for."""
        if counted == (host in self._counted):
            return
        entry = self._held.get(host)
        if counted:
            self._counted.add(host)
            self._sums.replace(None, entry)
        else:
            self._counted.discard(host)
            self._sums.replace(entry, None)

    def forget(self, host: str, now: float) -> None:
        """A host that stopped reporting: what it held is free again, but for its default, which counts
        for another ``linger`` seconds."""
        self.count(host, False)
        entry = self._held.pop(host, None)
        if entry is not None:
            until = now + self._linger
            self._lingering[host] = (until, entry.current.default)
            self._lingering_sum += units(entry.current.default)
            heapq.heappush(self._lingering_due, (until, host))

    def grant(
        self,
        host: str,
        hosts: int,
        targets: Mapping[str, float],
        busy: Container[str],
        now: float,
        claim: Grant | None = None,
    ) -> Grant:
        """The grant for ``host``, one of the ``hosts`` proxy hosts counted now, given its ``targets`` (of
        the scopes it has traffic in; any other scope's is the floor 1/H), the scopes some host has traffic
        in (``busy``: their shares are the host's to enforce even at the floor), and what it claims to
        hold; recorded as held."""
        self.count(host, True)
        bound = overshoot_bound(hosts)
        floor = 1.0 / hosts
        if host not in self._held and claim is not None:
            self._held[host] = Held(claim)  # a grant from before this ledger existed, still enforced
            self._sums.replace(None, self._held[host])
            self._claims_seen = True
        mine = self._held.get(host)
        # A control plane that restarted on a running cluster knows only the grants claimed so far: until
        # every host has reported (a TTL), none gets more than it holds, and a host claiming nothing none.
        warming = self._claims_seen and now < self._warm_until
        self._stop_lingering(host)
        while self._lingering_due and self._lingering_due[0][0] <= now:
            until, gone = heapq.heappop(self._lingering_due)
            if self._lingering.get(gone, (None,))[0] == until:
                self._stop_lingering(gone)
        # In units: what the others hold of a scope is their defaults plus the scope's excess, less this
        # host's own terms; ``room`` is what the bound leaves in a scope nobody names.
        own_base = 0 if mine is None else units(mine.default())
        room = units(bound) - self._lingering_sum - (self._sums.defaults - own_base)
        cap = floor if not warming else min(floor, mine.current.default if mine is not None else 0.0)
        plain = max(0.0, min(cap, share_of(room)))  # the share of a scope nobody names
        scopes = dict.fromkeys(targets)
        if mine is not None:
            scopes.update(dict.fromkeys(mine.scopes()))
        # The only other scopes whose share is not ``plain``: where the others hold so much more than their
        # defaults that the room left is below it, or, while the room left by the defaults is below the cap,
        # so much less that there is more (the first is what the bound is about; both are rare).
        if plain > 0:
            scopes.update(dict.fromkeys(self._sums.above(max(0, room - units(cap)) + slack(hosts))))
        if plain < cap:
            scopes.update(dict.fromkeys(self._sums.below(min(0, room) - slack(hosts))))
        shares: dict[str, float] = {}
        default_room = room
        for scope in scopes:
            excess = self._sums.excess(scope)
            if mine is not None:
                excess -= units(mine.of(scope)) - own_base
            left = room - excess
            share = min(targets.get(scope, floor), share_of(left))
            if warming:
                share = min(share, mine.current.of(scope) if mine is not None else 0.0)
            share = max(0.0, share)
            if scope not in busy and abs(share - floor) < _EPS:
                default_room = min(default_room, left)  # left to the default, which must then fit here
                continue
            shares[scope] = share
        default = max(0.0, min(floor, share_of(default_room)))
        if warming:
            default = min(default, mine.current.default if mine is not None else 0.0)
        granted = Grant({scope: share for scope, share in shares.items() if share != default}, default)
        held = Held(granted, mine.current if mine is not None else None)
        self._sums.replace(mine, held)
        self._held[host] = held
        return granted

    def _stop_lingering(self, host: str) -> None:
        entry = self._lingering.pop(host, None)
        if entry is not None:
            self._lingering_sum -= units(entry[1])
