"""The usage records the control worker could not store as they came, as one document for the admin API
(``GET /admin/usage/rejected``) and the CLI (``gateway usage rejected``): those set aside
(``usage_rejected``: the record as received, why, when, from where) and those stored with figures clamped
into their columns' bounds (which fields). See ``usage.sink``. I/O: the store.
"""

from __future__ import annotations

from typing import Any

from gateway.controlplane.store import Store

__all__ = ["rejected_report"]


def rejected_report(store: Store, limit: int) -> dict[str, Any]:
    """Up to ``limit`` of each, newest first. Raises StoreError."""
    return {
        "rejected": [r.doc() for r in store.usage.rejected(limit=limit)],
        "clamped": [
            {"request_id": rid, "ts": ts, "fields": list(fields)}
            for rid, ts, fields in store.usage.clamped(limit=limit)
        ],
    }
