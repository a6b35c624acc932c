"""The queueing discipline of one proxy worker's waiting requests, sans I/O: who goes next when a place
frees on a saturated backend, and who is shed when the queue is full.

Three priority classes, served in strict order: ``critical``, then ``standard`` (the default), then
``sheddable``. Inside a class, tenants (principals) share by weight with weighted fair queueing: each
waiter gets a virtual finish tag, ``max(class virtual time, tenant's last tag) + 1 / weight``, and the
smallest tag goes first; dispatching a waiter moves the class's virtual time to its tag. A tenant that
was idle starts at the current virtual time, so idleness banks no credit, and one that floods the queue
only pushes its own tags further out.

When the (host-wide) queue is full, a newcomer of a higher class than ``sheddable`` takes the place of
the newest waiting ``sheddable`` request; otherwise the newcomer is refused. No I/O, no clock: the
caller (``gateway.dataplane.backend_load``) owns futures, places and time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "CRITICAL",
    "PRIORITIES",
    "SHEDDABLE",
    "STANDARD",
    "WAIT_BUCKETS",
    "FlowQueue",
    "Waiter",
    "priority_rank",
]

PRIORITIES = ("critical", "standard", "sheddable")  # index = rank; a lower rank goes first
# Seconds a dispatched request waited: the bounds of the per-priority wait histogram.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CRITICAL, STANDARD, SHEDDABLE = 0, 1, 2

T = TypeVar("T")


def priority_rank(name: str | None) -> int | None:
    """The rank of a priority's name; None for None or an unknown name."""
    return PRIORITIES.index(name) if name in PRIORITIES else None


@dataclass(slots=True, eq=False)
class Waiter(Generic[T]):
    """One waiting request: its class, its tenant and weight, and what its caller waits with."""

    priority: int
    tenant: str
    weight: int
    item: T
    finish: float = 0.0  # virtual finish tag, set by FlowQueue.push
    seq: int = 0  # arrival order: ties between tags, and "newest" for shedding
    queued: bool = field(default=False)


class FlowQueue(Generic[T]):
    def __init__(self) -> None:
        self._waiting: dict[int, Waiter[T]] = {}  # seq -> waiter, in arrival order
        self._vtime = [0.0] * len(PRIORITIES)
        self._last: list[dict[str, float]] = [{} for _ in PRIORITIES]  # tenant -> its last finish tag
        self._seq = 0
        self.depth = [0] * len(PRIORITIES)

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, waiter: Waiter[T]) -> None:
        """Queue ``waiter`` with its tag; an idle tenant starts at the class's virtual time."""
        c = waiter.priority
        last = self._last[c]
        start = max(self._vtime[c], last.get(waiter.tenant, 0.0))
        waiter.finish = last[waiter.tenant] = start + 1.0 / max(1, waiter.weight)
        self._seq += 1
        waiter.seq = self._seq
        waiter.queued = True
        self._waiting[waiter.seq] = waiter
        self.depth[c] += 1
        if len(last) > 4 * len(self._waiting) + 64:  # forget tenants whose tags time has passed
            vt = self._vtime[c]
            for tenant in [t for t, f in last.items() if f <= vt]:
                del last[tenant]

    def admit(self, waiter: Waiter[T], room: bool) -> tuple[bool, Waiter[T] | None]:
        """Queue ``waiter`` if there is ``room``, or in place of the newest sheddable waiter when it ranks
        above sheddable: ``(queued, shed)``; ``shed`` is the waiter removed for it, if any."""
        if room:
            self.push(waiter)
            return True, None
        victim = self.victim(waiter.priority)
        if victim is None:
            return False, None
        self.remove(victim)
        self.push(waiter)
        return True, victim

    def victim(self, priority: int) -> Waiter[T] | None:
        """The newest sheddable waiter, when a newcomer of ``priority`` may take its place."""
        if priority >= SHEDDABLE or not self.depth[SHEDDABLE]:
            return None
        for waiter in reversed(self._waiting.values()):
            if waiter.priority == SHEDDABLE:
                return waiter
        return None

    def remove(self, waiter: Waiter[T]) -> bool:
        """Take ``waiter`` out without dispatching it (timed out, shed, gone); False if it was not queued."""
        if self._waiting.pop(waiter.seq, None) is None:
            return False
        waiter.queued = False
        self.depth[waiter.priority] -= 1
        return True

    def ordered(self) -> list[Waiter[T]]:
        """Every waiter in dispatch order: class first, then finish tag, then arrival."""
        return sorted(self._waiting.values(), key=_order)

    def head(self) -> Waiter[T] | None:
        return min(self._waiting.values(), key=_order) if self._waiting else None

    def dispatch(self, waiter: Waiter[T]) -> None:
        """``waiter`` got its place: out of the queue, and its class's virtual time moves to its tag."""
        if not self.remove(waiter):
            return
        c = waiter.priority
        if waiter.finish > self._vtime[c]:
            self._vtime[c] = waiter.finish
        last = self._last[c]
        if last.get(waiter.tenant, 0.0) <= self._vtime[c]:
            last.pop(waiter.tenant, None)  # nothing of it waits ahead of the clock: it starts afresh


def _order(waiter: Waiter[T]) -> tuple[int, float, int]:
    return (waiter.priority, waiter.finish, waiter.seq)
