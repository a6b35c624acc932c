"""Retention of logged bodies: each row expires ``retention_days`` (its entry's) after it was logged, and
the control worker purges expired rows in small batches, as usage retention does (``usage.retention``):
one batch (``BATCH`` rows, one short transaction) per loop turn while a purge is under way, a check every
``interval`` seconds otherwise, and one audit entry per purge that removed anything. ``purge`` is the
same at once, for ``gateway requests prune``. I/O: the store.
"""

from __future__ import annotations

import logging
import time

from gateway.controlplane.store import Store

__all__ = ["BATCH", "BodyPurger", "purge"]

log = logging.getLogger("gateway.controlplane")

BATCH = 1000
DAY = 86400.0


def purge(store: Store, actor: str, older_than_days: float | None = None, now: float | None = None) -> int:
    """Delete every expired row, and with ``older_than_days`` every row logged longer ago than that,
    batch after batch, with one audit entry; returns the rows deleted."""
    now = time.time() if now is None else now
    total = 0
    while n := store.bodies.prune(now, BATCH):
        total += n
    if older_than_days is not None:
        while n := store.bodies.prune_logged_before(now - older_than_days * DAY, BATCH):
            total += n
    if total:
        detail: dict[str, object] = {"rows": total, "expired_before": now}
        if older_than_days is not None:
            detail["older_than_days"] = older_than_days
        store.audit(actor, "bodies.purge", "request_bodies", detail)
    return total


class BodyPurger:
    """The control worker's body retention: ``step()`` once per loop turn does at most one batch."""

    def __init__(self, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._next_check = 0.0
        self._purging = False
        self._removed = 0

    def step(self) -> None:
        """May raise ``StoreError``; the worker's guard retries later (deleted batches stay deleted)."""
        if not self._purging:
            if time.monotonic() < self._next_check:
                return
            self._next_check = time.monotonic() + self.interval
            self._purging = True
        removed = self.store.bodies.prune(time.time(), BATCH)
        self._removed += removed
        if removed < BATCH:
            if self._removed:
                self.store.audit(
                    "gateway (body log retention)", "bodies.purge", "request_bodies", {"rows": self._removed}
                )
                log.info("purged %d logged bodies past their retention", self._removed)
            self._purging = False
            self._removed = 0
