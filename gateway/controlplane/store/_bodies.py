"""Logged bodies in the store (``request_bodies``): idempotent batch inserts, lookup by request id, and
the retention purge. Rows arrive already redacted (``gateway.controlplane.bodies``); a batch replayed
after a crash inserts nothing twice. All SQL is portable. I/O: the database, through the driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.controlplane.bodies.stored import BODY_COLUMNS, StoredBodies
from gateway.controlplane.store._driver import Driver

__all__ = ["BodyStore"]

_WIDTH = BODY_COLUMNS.count(",") + 1
_INSERT = (
    f"INSERT INTO request_bodies ({BODY_COLUMNS}) VALUES ({', '.join(['?'] * _WIDTH)}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
_CHUNK = 500  # ids per IN (...): well under every driver's parameter limit


class BodyStore:
    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def insert(self, rows: Sequence[StoredBodies]) -> None:
        """Write the rows not stored yet, in one transaction."""
        if not rows:
            return
        with self._driver.transaction(write=True) as tx:
            tx.executemany(_INSERT, [r.row() for r in rows])

    def get(self, request_id: str) -> StoredBodies | None:
        """The bodies logged for the request with this gateway request id, if any."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(f"SELECT {BODY_COLUMNS} FROM request_bodies WHERE request_id = ?", (request_id,))
        return StoredBodies.from_row(tuple(rows[0])) if rows else None

    def count(self) -> int:
        with self._driver.transaction(write=False) as tx:
            return int(tx.query("SELECT COUNT(*) FROM request_bodies")[0][0])

    def prune(self, expired_before: float, batch: int) -> int:
        """Delete up to ``batch`` rows whose retention ended before ``expired_before``, in one short
        transaction; returns how many went."""
        with self._driver.transaction(write=True) as tx:
            rows = tx.query(
                "SELECT request_id FROM request_bodies WHERE expires_at < ? ORDER BY expires_at LIMIT ?",
                (expired_before, batch),
            )
            for i in range(0, len(rows), _CHUNK):
                chunk = [r[0] for r in rows[i : i + _CHUNK]]
                tx.execute(
                    f"DELETE FROM request_bodies WHERE request_id IN ({', '.join(['?'] * len(chunk))})", chunk
                )
            return len(rows)

    def prune_logged_before(self, before: float, batch: int) -> int:
        """Delete up to ``batch`` rows logged before ``before``, whatever their retention (``gateway
        requests prune --older-than``); returns how many went."""
        with self._driver.transaction(write=True) as tx:
            rows = tx.query(
                "SELECT request_id FROM request_bodies WHERE ts < ? ORDER BY ts LIMIT ?", (before, batch)
            )
            for i in range(0, len(rows), _CHUNK):
                chunk = [r[0] for r in rows[i : i + _CHUNK]]
                tx.execute(
                    f"DELETE FROM request_bodies WHERE request_id IN ({', '.join(['?'] * len(chunk))})", chunk
                )
            return len(rows)
