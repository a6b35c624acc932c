"""The configuration's revision: a single-row counter that every configuration write bumps in its own
transaction, so that whoever polls it rebuilds exactly when something changed, and the channel on which
PostgreSQL announces each new one to every control plane listening (``NOTIFY``). I/O: the transaction
it is handed.
"""

from __future__ import annotations

from gateway.controlplane.store._driver import Transaction

__all__ = ["REVISION_CHANNEL", "bump_revision", "read_revision"]

REVISION_CHANNEL = "gateway_config"


def read_revision(tx: Transaction) -> int:
    return int(tx.query("SELECT revision FROM config_revision WHERE id = 1")[0][0])


def bump_revision(tx: Transaction) -> int:
    tx.execute("UPDATE config_revision SET revision = revision + 1 WHERE id = 1")
    revision = read_revision(tx)
    tx.notify(REVISION_CHANNEL, str(revision))  # delivered at commit, to every control plane listening
    return revision
