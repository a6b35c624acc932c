"""The rate-limit scopes' recent traffic across the proxy hosts, and each host's target share of them.
Pure; no I/O.

A host's report carries, per scope, the requests its workers admitted in the last window. ``RecentTraffic``
keeps an exponential average of them per host and scope (half from the last window), so that one quiet
window does not throw a busy host back to its floor at once, and, per scope, the total over the hosts it
counts (the proxy hosts). A host's *target* share of a scope is its fraction of that total, never below
the floor 1/H; with fractions summing to 1 the targets sum to at most (2H - 1)/H (``fleet.shares``).

The totals are integers in units of 2**-60 of a request: an average kept is at least ``KEPT`` (2**-7 or
more), so all its bits lie above 2**-60 and the sums are exact, updated by the reporting host's scopes
alone however many hosts there are, and never drifting.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from gateway.controlplane.fleet.holdings import SHARE, UNITS
from gateway.errors import BadRequest

__all__ = ["KEPT", "MAX_COUNT", "RecentTraffic", "traffic_window"]

KEPT = 0.01  # an average below this is dropped: the host has as good as left the scope
MAX_COUNT = 2**53  # past this a request count is no count: a float no longer holds every integer


def traffic_window(raw: Any) -> dict[str, float]:
    """A report's ``traffic``: ``{scope: requests admitted in the last window}``. Raises BadRequest."""
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise BadRequest("a report's traffic is an object of scope: requests")
    window: dict[str, float] = {}
    for scope, count in raw.items():
        if isinstance(count, bool) or not isinstance(count, int | float) or not 0 <= count <= MAX_COUNT:
            raise BadRequest(f"the traffic of scope {scope!r} is not a count of requests: {count!r}")
        window[str(scope)] = float(count)
    return window


class RecentTraffic:
    def __init__(self) -> None:
        self._recent: dict[str, dict[str, float]] = {}  # host: scope: average requests per window
        self._counted: set[str] = set()
        self._totals: dict[str, int] = {}  # scope: the counted hosts' averages summed, in units

    @property
    def busy(self) -> Container[str]:
        """The scopes some counted host has recent traffic in."""
        return self._totals

    def recent(self, host: str) -> Mapping[str, float]:
        return self._recent.get(host, {})

    def count(self, host: str, counted: bool) -> None:
        """Whether ``host``'s traffic counts in the totals (it is a proxy host now)."""
        if counted == (host in self._counted):
            return
        sign = 1 if counted else -1
        if counted:
            self._counted.add(host)
        else:
            self._counted.discard(host)
        for scope, value in self._recent.get(host, {}).items():
            self._shift(scope, sign * int(value * UNITS))

    def record(self, host: str, window: Mapping[str, float]) -> None:
        """Fold one report window into ``host``'s averages."""
        recent = self._recent.setdefault(host, {})
        counted = host in self._counted
        for scope in [*recent, *(s for s in window if s not in recent)]:
            old = recent.get(scope, 0.0)
            value = 0.5 * old + 0.5 * window.get(scope, 0.0)
            if value < KEPT:
                recent.pop(scope, None)
                value = 0.0
            else:
                recent[scope] = value
            if counted and value != old:
                self._shift(scope, int(value * UNITS) - int(old * UNITS))

    def forget(self, host: str) -> None:
        self.count(host, False)
        self._recent.pop(host, None)

    def targets(self, host: str, floor: float) -> dict[str, float]:
        """``host``'s target share of each scope it has recent traffic in (of a counted host)."""
        totals = self._totals
        return {
            scope: max(floor, value / (totals[scope] * SHARE))
            for scope, value in self._recent.get(host, {}).items()
        }

    def _shift(self, scope: str, amount: int) -> None:
        total = self._totals.get(scope, 0) + amount
        if total:
            self._totals[scope] = total
        else:
            self._totals.pop(scope, None)
