"""The control worker's end of body logging: drain the proxy workers' body rings into the store.

Like the usage drain: a batch is read from every ring without consuming it, redacted (``rules``) and
written in one transaction (a request id already stored is skipped), and only then are the rings
advanced, so a control worker that dies in between stores the batch once when it comes back. A store that
fails leaves the bodies in the rings, which then fill, and the workers drop and count what does not fit.
Runs on the control worker's store thread, beside the usage drain. I/O: the store; the shared rings.
"""

from __future__ import annotations

from gateway.controlplane.bodies.rules import BodyRules
from gateway.controlplane.bodies.stored import StoredBodies
from gateway.controlplane.store import Store
from gateway.native import SpanRing

__all__ = ["BATCH_PER_RING", "BodySink", "read_bodies"]

BATCH_PER_RING = 64  # frames per ring and drain: bodies are large, and the loop must stay responsive


def read_bodies(ring: SpanRing, rules: BodyRules) -> tuple[list[StoredBodies], list[tuple[int, int]]]:
    """One batch from every ring, redacted: the rows to store and, per ring, the slots to advance."""
    rows: list[StoredBodies] = []
    taken: list[tuple[int, int]] = []
    for index in range(ring.rings):
        frames, slots = ring.read_records(index, BATCH_PER_RING)
        if not slots:
            continue
        taken.append((index, slots))
        for frame in frames:
            row = rules.prepare(frame)
            if row is not None:
                rows.append(row)
    return rows, taken


class BodySink:
    def __init__(self, store: Store, ring: SpanRing, rules: BodyRules) -> None:
        self.store = store
        self.ring = ring
        self.rules = rules
        self.stored = 0

    def drain(self) -> int:
        """Move one batch from every ring into the store; returns the frames' slots consumed. Raises
        StoreError (the rings are then left as they were)."""
        rows, taken = read_bodies(self.ring, self.rules)
        if not taken:
            return 0
        self.write(rows)
        for index, slots in taken:
            self.ring.advance(index, slots)
        return sum(slots for _, slots in taken)

    def write(self, rows: list[StoredBodies]) -> None:
        """Store redacted rows (from the rings, or from a proxy-role host). Raises StoreError."""
        self.store.bodies.insert(rows)
        self.stored += len(rows)

    def dropped(self) -> int:
        """Bodies the host's workers had no room for in their rings, since the host started."""
        return sum(self.ring.dropped(i) for i in range(self.ring.rings))

    def metrics_lines(self) -> list[str]:
        rules = self.rules
        return [
            "# HELP gateway_body_logs_stored_total Logged request bodies stored, redacted.",
            "# TYPE gateway_body_logs_stored_total counter",
            f"gateway_body_logs_stored_total {self.stored}",
            "# HELP gateway_body_logs_dropped_total Logged request bodies dropped before they were stored: "
            "no room in a worker's ring (ring_full, counted since the host started), an entry this control "
            "worker does not know (entry_unknown), a frame that did not read (unreadable).",
            "# TYPE gateway_body_logs_dropped_total counter",
            f'gateway_body_logs_dropped_total{{reason="ring_full"}} {self.dropped()}',
            f'gateway_body_logs_dropped_total{{reason="entry_unknown"}} {rules.unknown_entry}',
            f'gateway_body_logs_dropped_total{{reason="unreadable"}} {rules.unreadable}',
        ]
