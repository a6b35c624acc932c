"""The control plane's store: open it from ``Settings``, then read and write through ``Store``.

``open_store`` picks the driver from ``Settings.database_url`` (``sqlite:///PATH``, the default under the
data directory, or ``postgresql://…``), creates the data directory and applies pending migrations; both
drivers run the same migrations and the same SQL. It also loads the secrets key that seals backend
credentials (``gateway.controlplane.credentials``) and seals any stored in the clear by older versions.
``unavailable_store`` stands in for a database that cannot be reached yet: every operation raises
``StoreError``, which callers already treat as an outage. It does file and database I/O; the rest is in
the private modules re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.config import Settings, load_hash_key
from gateway.controlplane.credentials import Vault, load_vault
from gateway.controlplane.store._audit import AuditEntry
from gateway.controlplane.store._columns import MANAGED_BY_API, MANAGED_BY_CLI, MANAGED_BY_FILE
from gateway.controlplane.store._credentials import BackendCredential
from gateway.controlplane.store._document import StoreState
from gateway.controlplane.store._driver import Driver, SqliteDriver, Transaction
from gateway.controlplane.store._keys import BudgetInfo, KeyInfo, PrincipalInfo
from gateway.controlplane.store._migrate import apply_migrations, available_migrations
from gateway.controlplane.store._ownership import STORE_OWNER, describe_owner
from gateway.controlplane.store._store import Store
from gateway.errors import ConfigError, OwnershipConflict, StoreConflict, StoreDataError, StoreError

__all__ = [
    "MANAGED_BY_API",
    "MANAGED_BY_CLI",
    "MANAGED_BY_FILE",
    "STORE_OWNER",
    "AuditEntry",
    "BackendCredential",
    "BudgetInfo",
    "Driver",
    "KeyInfo",
    "OwnershipConflict",
    "PrincipalInfo",
    "SqliteDriver",
    "Store",
    "StoreConflict",
    "StoreDataError",
    "StoreError",
    "StoreState",
    "Transaction",
    "apply_migrations",
    "available_migrations",
    "describe_owner",
    "is_postgres_url",
    "open_store",
    "sqlite_path_from_url",
    "store_hash_key",
    "store_vault",
    "unavailable_store",
]

_SQLITE_PREFIX = "sqlite:///"


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path_from_url(url: str) -> Path:
    """``sqlite:///relative/or//absolute/path`` -> the path; anything else is a ``ConfigError``."""
    if not url.startswith(_SQLITE_PREFIX) or len(url) == len(_SQLITE_PREFIX):
        raise ConfigError(f"unsupported database URL {url!r}: expected sqlite:///PATH or postgresql://...")
    return Path(url[len(_SQLITE_PREFIX) :])


def store_hash_key(settings: Settings) -> bytes:
    """The key API keys are hashed with (``gateway.config.load_hash_key``), its problems as a
    ``ConfigError``."""
    try:
        return load_hash_key(settings.data_dir)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot load the API key hash key: {exc}") from exc


def store_vault(settings: Settings) -> Vault:
    """The vault that seals this host's backend credentials (see ``credentials.load_vault``)."""
    return load_vault(settings.data_dir, store_hash_key(settings))


class _Unavailable:
    """A driver for a database not reached yet: every transaction fails as an outage would."""

    dialect = "postgresql"  # only a server can be out of reach

    def __init__(self, reason: str) -> None:
        self.reason = reason

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Transaction]:
        raise StoreError(self.reason)
        yield  # pragma: no cover  (makes this a generator)

    def close(self) -> None:
        pass


def unavailable_store(reason: str) -> Store:
    return Store(_Unavailable(reason))


def open_store(settings: Settings, vault: Vault | None = None) -> Store:
    """Open (creating if needed) and migrate the store ``settings`` names, with ``vault`` (default: the
    host's, ``store_vault``) sealing backend credentials."""
    vault = store_vault(settings) if vault is None else vault
    url = settings.database_url
    driver: Driver
    if is_postgres_url(url):
        from gateway.controlplane.store._postgres import PostgresDriver

        driver = PostgresDriver(url, max_size=settings.postgres_pool_size)
    else:
        path = sqlite_path_from_url(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        driver = SqliteDriver(path)
    store = Store(driver, vault)
    try:
        apply_migrations(driver)
        store.seal_credentials(vault, actor="gateway (upgrade)", action="secrets.seal")
    except BaseException:
        driver.close()
        raise
    return store
