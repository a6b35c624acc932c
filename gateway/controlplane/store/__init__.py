"""The control plane's store: open it from ``Settings``, then read and write through ``Store``.

``open_store`` picks the driver from ``Settings.database_url`` (SQLite today; PostgreSQL is a later
addition behind the same ``Driver`` interface), creates the data directory and applies pending
migrations. It does file and database I/O; the rest is in the private modules re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from gateway.config import Settings
from gateway.controlplane.store._driver import Driver, SqliteDriver, Transaction
from gateway.controlplane.store._errors import StoreConflict, StoreError
from gateway.controlplane.store._migrate import apply_migrations, available_migrations
from gateway.controlplane.store._store import KeyInfo, PrincipalInfo, Store, StoreState
from gateway.errors import ConfigError

__all__ = [
    "Driver",
    "KeyInfo",
    "PrincipalInfo",
    "SqliteDriver",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreState",
    "Transaction",
    "apply_migrations",
    "available_migrations",
    "open_store",
    "sqlite_path_from_url",
]

_SQLITE_PREFIX = "sqlite:///"


def sqlite_path_from_url(url: str) -> Path:
    """``sqlite:///relative/or//absolute/path`` -> the path; anything else is a ``ConfigError``."""
    if url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            "PostgreSQL is not supported yet by this build; unset GATEWAY_DATABASE / --database to use "
            "the SQLite store under the data directory"
        )
    if not url.startswith(_SQLITE_PREFIX) or len(url) == len(_SQLITE_PREFIX):
        raise ConfigError(f"unsupported database URL {url!r}: expected sqlite:///PATH")
    return Path(url[len(_SQLITE_PREFIX) :])


def open_store(settings: Settings) -> Store:
    """Open (creating if needed) and migrate the store ``settings`` names."""
    path = sqlite_path_from_url(settings.database_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver = SqliteDriver(path)
    try:
        apply_migrations(driver)
    except BaseException:
        driver.close()
        raise
    return Store(driver)
