"""Applying a config file to the store, as ``gateway apply FILE`` does and as ``gateway serve --config FILE``
does at start and on SIGHUP.

The file owns what it declares (see ``gateway.controlplane.store._ownership``): its owner is the file by
absolute path, so ``gateway apply FILE`` and ``serve --config FILE`` name the same owner however the path
was written. When the database cannot be reached at start, the supervisor leaves ``CONFIG_PENDING`` in the
run directory and the control worker applies the file once the store answers.
I/O: reads the file, the hash key under the data directory, and the store.
"""

from __future__ import annotations

from pathlib import Path

from gateway.config import Settings
from gateway.controlplane.config.parser import load_config
from gateway.controlplane.store import open_store, store_hash_key

__all__ = ["CONFIG_PENDING", "apply_file", "file_owner"]

CONFIG_PENDING = "config-pending"  # in the run directory: the supervisor could not apply --config


def file_owner(path: str | Path) -> str:
    """The owner a config file's entries get: the file, by absolute path (so ``gateway apply FILE`` and
    ``serve --config FILE`` name the same owner however the path was written)."""
    return f"file:{Path(path).absolute()}"


def apply_file(settings: Settings, path: str | Path, actor: str | None = None) -> int:
    """Validate ``path`` and apply it as the owner of what it declares; returns the new revision.
    ``actor`` defaults to the file itself (a start-up or SIGHUP reload)."""
    cfg = load_config(path)
    hash_key = store_hash_key(settings) if any(k.secret is not None for k in cfg.keys) else None
    owner = file_owner(path)
    with open_store(settings) as store:
        return store.apply_config(cfg, actor=actor or owner, owner=owner, hash_key=hash_key)
