"""Usage retention: which usage records may be purged, and purging them in small batches.

Records older than ``--usage-retention-days`` go, except those inside the current window of any budget
(a principal's or a key's): budgets keep their windows' spend in counters (``_spend``), but open a
window from the records and read the records for a window not kept, so a record a budget still counts is
kept until its window has passed, and a purge never changes what a budget has left. The cutoff is
therefore the earlier of "now less the retention" and the start of the oldest current budget window.
Summaries (``gateway usage``, ``GET /admin/usage``) that reach back before ``purged_before`` say so.

``Purger`` runs in the control worker's loop: one batch (``BATCH`` rows, one short transaction) per
loop turn while a purge is under way, so the loop (and the admin port it serves) never waits long, and a
check for work every ``usage_purge_interval`` seconds otherwise. On PostgreSQL a batch first drops whole
the day partitions that end by the cutoff (``_partitions``), and ``Purger`` makes them days ahead. Each
purge that removed anything is one audit entry. I/O: the store.
"""

from __future__ import annotations

import logging
import time

from gateway.budget import period_window
from gateway.controlplane.store import Store

__all__ = ["BATCH", "PARTITIONS_AHEAD", "Purger", "purge", "retention_cutoff"]

# Days of usage partitions made ahead of today (PostgreSQL), and seconds between the checks: a control
# host down for two days still finds its records' partitions there when it comes back.
PARTITIONS_AHEAD = 2
PARTITIONS_INTERVAL = 3600.0

log = logging.getLogger("gateway.controlplane")

BATCH = 1000
DAY = 86400.0


def retention_cutoff(store: Store, days: float, now: float) -> tuple[float, float | None]:
    """``(cutoff, budget window start)``: records that ended before ``cutoff`` may go; the second value
    is the budget window that pulled the cutoff earlier than ``days`` asked, or None."""
    wanted = now - days * DAY
    starts = [period_window(b.spec.period, now)[0] for b in store.budgets()]
    oldest = min(starts, default=wanted)
    return (oldest, oldest) if oldest < wanted else (wanted, None)


def purge(store: Store, days: float, actor: str, now: float | None = None) -> tuple[int, float, float | None]:
    """Purge everything older than ``days`` (within the budget guard), batch after batch, with one audit
    entry; for ``gateway usage prune``. Returns ``(rows, cutoff, limiting budget window start)``."""
    cutoff, held = retention_cutoff(store, days, time.time() if now is None else now)
    total = 0
    while n := store.usage.prune(cutoff, BATCH):
        total += n
    if total:
        store.audit(actor, "usage.purge", "usage_records", {"rows": total, "before": cutoff})
    return total, cutoff, held


class Purger:
    """The control worker's retention: ``step()`` once per loop turn does at most one batch."""

    def __init__(self, store: Store, days: float, interval: float) -> None:
        self.store = store
        self.days = days
        self.interval = interval
        self._next_check = 0.0
        self._cutoff: float | None = None  # set while a purge is under way
        self._next_partitions = 0.0
        self._removed = 0

    def step(self) -> None:
        """May raise ``StoreError``; the worker's guard retries later, and the purge resumes where it was
        (what was deleted is committed batch by batch). Also makes the usage table's day partitions ahead
        (PostgreSQL), at start and every hour: the records of a day find their partition there."""
        if time.monotonic() >= self._next_partitions:
            self.store.usage.make_partitions(time.time(), PARTITIONS_AHEAD)
            self._next_partitions = time.monotonic() + PARTITIONS_INTERVAL
        if self.days <= 0:
            return
        if self._cutoff is None:
            if time.monotonic() < self._next_check:
                return
            self._next_check = time.monotonic() + self.interval
            self._cutoff = retention_cutoff(self.store, self.days, time.time())[0]
        removed = self.store.usage.prune(self._cutoff, BATCH)
        self._removed += removed
        if removed < BATCH:
            if self._removed:
                detail = {"rows": self._removed, "before": self._cutoff}
                self.store.audit(
                    f"gateway (retention {self.days:g} days)", "usage.purge", "usage_records", detail
                )
                log.info("purged %d usage records older than %g days", self._removed, self.days)
            self._cutoff = None
            self._removed = 0
