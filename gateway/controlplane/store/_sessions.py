"""Admin sessions (``POST /admin/login``): a keyed hash of each session's token, never the token, with the
key it was opened with and its expiry; expired sessions are swept whenever one is created. They live in
the store so that every control plane of a cluster honours them. I/O: the transaction it is handed.
"""

from __future__ import annotations

import time

from gateway.controlplane.store._driver import Transaction

__all__ = ["delete_session", "insert_session", "read_session_key"]


def insert_session(tx: Transaction, token_hash: str, key_id: str, ttl: float, now: float) -> float:
    """Record a session for ``key_id`` opened at ``now``; returns its expiry."""
    tx.execute("DELETE FROM admin_sessions WHERE expires_at <= ?", (now,))
    tx.execute(
        "INSERT INTO admin_sessions (token_hash, key_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
        (token_hash, key_id, now, now + ttl),
    )
    return now + ttl


def read_session_key(tx: Transaction, token_hash: str) -> str | None:
    """The key id of a live session, or None."""
    rows = tx.query(
        "SELECT key_id FROM admin_sessions WHERE token_hash = ? AND expires_at > ?",
        (token_hash, time.time()),
    )
    return str(rows[0][0]) if rows else None


def delete_session(tx: Transaction, token_hash: str) -> None:
    tx.execute("DELETE FROM admin_sessions WHERE token_hash = ?", (token_hash,))
