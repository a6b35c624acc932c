"""The audit log: one entry per configuration write (and per login, logout and usage purge), written in
the write's own transaction so that neither exists without the other, and read newest first. I/O: the
transaction it is handed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.controlplane.store._columns import new_id
from gateway.controlplane.store._driver import Transaction

__all__ = ["AuditEntry", "read_audit", "write_audit"]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One configuration write, as the audit log keeps it; ``ts`` and ``id`` are set when written."""

    actor: str
    action: str
    target: str
    before: str | None = None
    after: str | None = None
    ts: float = 0.0
    id: str = ""


def write_audit(tx: Transaction, entry: AuditEntry) -> None:
    tx.execute(
        "INSERT INTO audit_log (id, ts, actor, action, target, before_state, after_state) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (new_id(), time.time(), entry.actor, entry.action, entry.target, entry.before, entry.after),
    )


def read_audit(tx: Transaction, limit: int) -> list[AuditEntry]:
    """The most recent ``limit`` entries, newest first."""
    rows = tx.query(
        "SELECT actor, action, target, before_state, after_state, ts, id FROM audit_log "
        "ORDER BY ts DESC, id LIMIT ?",
        (limit,),
    )
    return [AuditEntry(r[0], r[1], r[2], r[3], r[4], float(r[5]), r[6]) for r in rows]
