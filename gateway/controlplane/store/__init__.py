"""The control plane's store: open it from ``Settings``, then read and write through ``Store``.

``open_store`` picks the driver from ``Settings.database_url`` (``sqlite:///PATH``, the default under the
data directory, or ``postgresql://…``), creates the data directory and applies pending migrations; both
drivers run the same migrations and the same SQL. It does file and database I/O; the rest is in the
private modules re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from gateway.config import Settings
from gateway.controlplane.store._driver import Driver, SqliteDriver, Transaction
from gateway.controlplane.store._errors import StoreConflict, StoreError
from gateway.controlplane.store._migrate import apply_migrations, available_migrations
from gateway.controlplane.store._store import (
    MANAGED_BY_API,
    MANAGED_BY_CLI,
    MANAGED_BY_FILE,
    AuditEntry,
    KeyInfo,
    PrincipalInfo,
    Store,
    StoreState,
)
from gateway.errors import ConfigError

__all__ = [
    "MANAGED_BY_API",
    "MANAGED_BY_CLI",
    "MANAGED_BY_FILE",
    "AuditEntry",
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
    "is_postgres_url",
    "open_store",
    "sqlite_path_from_url",
]

_SQLITE_PREFIX = "sqlite:///"


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path_from_url(url: str) -> Path:
    """``sqlite:///relative/or//absolute/path`` -> the path; anything else is a ``ConfigError``."""
    if not url.startswith(_SQLITE_PREFIX) or len(url) == len(_SQLITE_PREFIX):
        raise ConfigError(f"unsupported database URL {url!r}: expected sqlite:///PATH or postgresql://...")
    return Path(url[len(_SQLITE_PREFIX) :])


def open_store(settings: Settings) -> Store:
    """Open (creating if needed) and migrate the store ``settings`` names."""
    url = settings.database_url
    driver: Driver
    if is_postgres_url(url):
        from gateway.controlplane.store._postgres import PostgresDriver

        driver = PostgresDriver(url)
    else:
        path = sqlite_path_from_url(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        driver = SqliteDriver(path)
    try:
        apply_migrations(driver)
    except BaseException:
        driver.close()
        raise
    return Store(driver)
