"""Errors the store raises, in the gateway's one error hierarchy. No I/O here."""

from __future__ import annotations

from gateway.errors import ConfigError, GatewayError

__all__ = ["StoreConflict", "StoreError"]


class StoreError(GatewayError):
    """The database failed (locked past the busy timeout, disk full, corrupt file, ...)."""

    status = 500
    code = "store_error"


class StoreConflict(ConfigError, StoreError):
    """A write broke a uniqueness or reference rule: a caller's mistake, not a broken database."""
