"""What proxy hosts hold of the rate limits: a grant, the two grants a host may be enforcing, and what all
the hosts counted now hold of each scope, summed. Pure; no I/O.

A host holds, of each scope, the larger of its last two grants' shares (``Held.of``), and a grant that
does not name a scope gives it the grant's default. So the sum over hosts of what they hold of a scope is
``defaults + excess[scope]``: ``defaults``, the sum of every host's larger default, is the same for every
scope, and ``excess[scope]`` sums, over the hosts whose grants name the scope, how far what they hold of it
sits above (or below) their default. Both change only by the terms of the one host whose holding changed,
so keeping them costs the scopes its grants name, and ``HeldSums`` answers what all hosts but one hold of
a scope in constant time, whatever the number of hosts.

Sums are integers in units of 2**-60 of a limit, each share rounded *up* to a unit: they do not drift
however many grants come and go (a host's terms leave exactly as they came), and being rounded up they
never show more room than the shares leave; a room becomes a share rounded *down* (``share_of``).

The scopes are also kept ranked by excess (a sorted list), so that those whose excess lies past a
threshold (the few where some host must be told less, or more, than its default) are found without
visiting the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

__all__ = ["SHARE", "UNITS", "Grant", "Held", "HeldSums", "share_of", "units"]

UNITS = 2.0**60
SHARE = 2.0**-60  # one unit, as a share: int * SHARE is the int correctly rounded, then scaled exactly


def share_of(amount: int) -> float:
    """The largest share no more than ``amount`` units: what a room in units lets a host have. Rounded
    down, so that the grant, once rounded up to units again, still fits the room."""
    nearest = float(amount)
    if nearest > amount:  # float and int compare exactly
        nearest = math.nextafter(nearest, -math.inf)
    return nearest * SHARE


def units(share: float) -> int:
    """``share`` in units, rounded up: the scaling by a power of two is exact, so ``ceil`` is the one
    rounding (none for a share of 2**-8 or more, whose bits all lie above 2**-60)."""
    return math.ceil(share * UNITS)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a host enforces: ``shares[scope]``, and ``default`` for every scope not named."""

    shares: dict[str, float] = field(default_factory=dict)
    default: float = 1.0

    def of(self, scope: str) -> float:
        return self.shares.get(scope, self.default)

    @classmethod
    def from_claim(cls, claim: Any) -> Grant | None:
        """A host's report of what it holds (``{"shares": {...}, "default_share": x}``), or None when
        there is none or it is not one: every share a control plane grants is a number from 0 to 1."""
        if not isinstance(claim, Mapping) or "default_share" not in claim:
            return None
        try:
            shares = {str(k): float(v) for k, v in (claim.get("shares") or {}).items()}
            default = float(claim["default_share"])
        except (TypeError, ValueError, AttributeError):
            return None
        if not all(0.0 <= v <= 1.0 for v in (default, *shares.values())):  # NaN fails too
            return None
        return cls(shares, default)


@dataclass(slots=True)
class Held:
    """A host's last two grants: its workers may still enforce the previous one until they read the new."""

    current: Grant
    previous: Grant | None = None

    def of(self, scope: str) -> float:
        now = self.current.of(scope)
        return now if self.previous is None else max(now, self.previous.of(scope))

    def default(self) -> float:
        now = self.current.default
        return now if self.previous is None else max(now, self.previous.default)

    def scopes(self) -> set[str]:
        """The scopes either grant names."""
        named = set(self.current.shares)
        if self.previous is not None:
            named.update(self.previous.shares)
        return named


class HeldSums:
    """What the hosts put in hold of each scope, summed: ``defaults + excess(scope)`` in units."""

    def __init__(self) -> None:
        self.defaults = 0
        self._excess: dict[str, int] = {}
        self._ranked = SortedList()  # (excess, scope) for every scope whose excess is not 0

    def excess(self, scope: str) -> int:
        return self._excess.get(scope, 0)

    def replace(self, old: Held | None, new: Held | None) -> None:
        """One host's holding changed from ``old`` to ``new`` (None: it did not count, or no longer does)."""
        change: dict[str, int] = {}
        if old is not None:
            base = units(old.default())
            self.defaults -= base
            for scope in old.scopes():
                change[scope] = base - units(old.of(scope))
        if new is not None:
            base = units(new.default())
            self.defaults += base
            for scope in new.scopes():
                change[scope] = change.get(scope, 0) + units(new.of(scope)) - base
        for scope, amount in change.items():
            if amount:
                self._shift(scope, amount)

    def above(self, threshold: int) -> Iterator[str]:
        """The scopes whose excess is more than ``threshold``."""
        for _, scope in self._ranked.irange((threshold + 1,)):
            yield scope

    def below(self, threshold: int) -> Iterator[str]:
        """The scopes whose excess is less than ``threshold``."""
        for _, scope in self._ranked.irange(None, (threshold,), inclusive=(True, False)):
            yield scope

    def _shift(self, scope: str, amount: int) -> None:
        old = self._excess.get(scope, 0)
        new = old + amount
        if old:
            self._ranked.remove((old, scope))
        if new:
            self._excess[scope] = new
            self._ranked.add((new, scope))
        else:
            del self._excess[scope]
