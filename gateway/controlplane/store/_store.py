"""The control plane's store: configuration, principals and API keys, admin sessions, the audit log and the
revision counter, behind one ``Store`` whose every method is one transaction.

Every write (``apply_config``, ``create_key``, ``revoke_key``, ...) is one transaction that also writes
its audit entry and bumps the single-row ``config_revision`` counter, so the control worker, which polls
``revision()``, rebuilds the snapshot exactly when something changed and ``read_state`` returns rows
consistent with the revision read alongside them. ``Store`` opens the transactions; the SQL lives in the
modules beside it, by concept, each working inside the transaction it is handed: ``_apply`` (declarative
apply), ``_keys`` (keys and principals), ``_credentials`` (backend credentials), ``_sessions`` (admin
sessions), ``_audit``, ``_revision``, ``_document`` (the configuration read back), ``_usage`` (usage
records, reached as ``Store.usage``), ``_bodies`` (logged bodies, ``Store.bodies``). All of it goes
through the small ``Driver`` interface; nothing knows which database it talks to. I/O: the database,
through the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

from gateway.controlplane.config.specs import BudgetSpec, ConfigDoc, LimitsSpec
from gateway.controlplane.credentials import Vault
from gateway.controlplane.store._apply import apply_prepared, prepare
from gateway.controlplane.store._audit import AuditEntry, read_audit, write_audit
from gateway.controlplane.store._bodies import BodyStore
from gateway.controlplane.store._columns import MANAGED_BY_CLI, to_json
from gateway.controlplane.store._credentials import (
    BackendCredential,
    read_backend_credentials,
    reseal_credentials,
)
from gateway.controlplane.store._document import StoreState, read_config_doc, read_owners, read_state
from gateway.controlplane.store._driver import Driver
from gateway.controlplane.store._keys import (
    BudgetInfo,
    KeyInfo,
    PrincipalInfo,
    insert_key,
    new_key,
    read_budgets,
    read_key_name,
    read_keys,
    read_principals,
    revoke,
)
from gateway.controlplane.store._ownership import STORE_OWNER
from gateway.controlplane.store._revision import REVISION_CHANNEL, read_revision
from gateway.controlplane.store._sessions import delete_session, insert_session, read_session_key
from gateway.controlplane.store._usage import UsageStore

__all__ = ["Store"]


class Store:
    """The store's operations over any ``Driver``. Methods are synchronous and thread-safe."""

    def __init__(self, driver: Driver, vault: Vault | None = None) -> None:
        self._driver = driver
        self.vault = vault  # None: backend credentials can be neither written nor read
        self.usage = UsageStore(driver)
        self.bodies = BodyStore(driver)

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._driver.close()

    def listen_revisions(self, callback: Callable[[str], None]) -> Callable[[], None] | None:
        """Have ``callback`` called (from another thread) whenever any process commits a new revision, or
        return None where the database cannot tell (SQLite: poll ``revision()``)."""
        listen = getattr(self._driver, "listen", None)
        return None if listen is None else listen(REVISION_CHANNEL, callback)

    def revision(self) -> int:
        with self._driver.transaction(write=False) as tx:
            return read_revision(tx)

    # --- declarative configuration ---------------------------------------------------------------------

    def apply_config(
        self,
        cfg: ConfigDoc,
        *,
        actor: str,
        owner: str = STORE_OWNER,
        hash_key: bytes | None = None,
        environ: Mapping[str, str] | None = None,
        action: str = "config.apply",
        target: str | None = None,
        entry: tuple[str | None, str | None] | None = None,
    ) -> int:
        """Apply ``cfg`` as ``owner`` (see ``_ownership``) in one transaction with its audit entry; returns
        the new revision.

        ``owner`` is ``"file:<path>"`` for a config file, which then owns what it declares, or the store
        (the admin API and UI), which may not change what a file owns. ``actor`` is who did it, written
        to the audit log with the entries added, removed and changed; ``entry`` replaces that diff with
        the before and after of the one entry an API edit changed (JSON, credentials left out).
        ``hash_key`` is needed when a key carries a ``secret``; ``environ`` (default ``os.environ``)
        resolves ``api_key_env``; ``api_key_file`` is read here. Nothing is written when any of that fails.
        """
        prepared = prepare(cfg, owner, hash_key, environ)
        with self._driver.transaction(write=True) as tx:
            return apply_prepared(
                tx, self.vault, prepared, actor=actor, owner=owner, action=action, target=target, entry=entry
            )

    def config_doc(self) -> ConfigDoc:
        """The current configuration as a document: what ``apply_config`` would need to reproduce it, without
        secrets or credentials (see ``_document.read_config_doc``)."""
        with self._driver.transaction(write=False) as tx:
            return read_config_doc(tx, self.vault, credentials=False)

    def owners(self) -> dict[tuple[str, str], str]:
        """``(kind, name) -> "file:<path>"`` of every file-owned entry; the rest is the store's."""
        with self._driver.transaction(write=False) as tx:
            return read_owners(tx)

    def read_state(self, *, include_revoked_keys: bool = False) -> StoreState:
        """Every row, from one read transaction, so that they agree with each other and the revision."""
        with self._driver.transaction(write=False) as tx:
            return read_state(tx, self.vault, include_revoked_keys)

    # --- keys and principals ---------------------------------------------------------------------------

    def create_key(
        self,
        principal: str,
        name: str | None,
        expires_at: float | None,
        hash_key: bytes,
        limits: LimitsSpec | None = None,
        managed_by: str = MANAGED_BY_CLI,
        *,
        actor: str,
        budgets: Sequence[BudgetSpec] = (),
    ) -> tuple[str, str]:
        """A new key for ``principal``, with its own limits and budgets; returns ``(key_id, secret)``.
        Only the secret's hash is stored. ``managed_by`` says where it was made: ``cli`` or ``api`` (the
        admin API and web UI); the audit entry names ``actor``, the key and its principal."""
        key = new_key(name, hash_key, limits, budgets)
        with self._driver.transaction(write=True) as tx:
            insert_key(tx, key, principal, expires_at, managed_by, actor)
        return key.id, key.secret

    def revoke_key(self, key_id_or_name: str, *, actor: str) -> str:
        """Revoke by id, or else by name; returns the key's id. Revoking a revoked key changes nothing
        (and bumps nothing, and audits nothing)."""
        with self._driver.transaction(write=True) as tx:
            return revoke(tx, key_id_or_name, actor)

    def key_name(self, key_id: str) -> str | None:
        with self._driver.transaction(write=False) as tx:
            return read_key_name(tx, key_id)

    def list_keys(self, principal: str | None = None) -> list[KeyInfo]:
        with self._driver.transaction(write=False) as tx:
            return read_keys(tx, principal)

    def principals(self) -> list[PrincipalInfo]:
        now = time.time()
        with self._driver.transaction(write=False) as tx:
            return read_principals(tx, now)

    def budgets(self) -> list[BudgetInfo]:
        """Every principal's and every unrevoked key's budgets, with their owners' names."""
        with self._driver.transaction(write=False) as tx:
            return read_budgets(tx)

    # --- backend credentials ---------------------------------------------------------------------------

    def backend_credentials(self) -> dict[str, BackendCredential]:
        """Where each backend's credential came from, and its fingerprint; never the credential."""
        with self._driver.transaction(write=False) as tx:
            return read_backend_credentials(tx)

    def seal_credentials(self, vault: Vault, *, actor: str, action: str = "secrets.rotate") -> int:
        """Re-seal every backend credential with ``vault``'s current key (opening it with this store's
        vault), in one transaction with its audit entry; also seals rows stored in the clear by versions
        before encryption at rest. Returns how many were re-sealed; bumps the revision when any was, and
        then goes on with ``vault``."""
        with self._driver.transaction(write=True) as tx:
            count = reseal_credentials(tx, self.vault, vault, actor, action)
        if count:
            self.vault = vault
        return count

    # --- the audit log and admin sessions --------------------------------------------------------------

    def audit(self, actor: str, action: str, target: str, detail: object = None) -> None:
        """One audit entry for a write that is not a configuration change (a login, a usage purge)."""
        with self._driver.transaction(write=True) as tx:
            write_audit(
                tx, AuditEntry(actor, action, target, None, None if detail is None else to_json(detail))
            )

    def audit_log(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent audit entries, newest first."""
        with self._driver.transaction(write=False) as tx:
            return read_audit(tx, limit)

    def create_session(self, token_hash: str, key_id: str, ttl: float) -> float:
        """Record a session for ``key_id``; returns its expiry. Expired sessions are swept here too."""
        now = time.time()
        with self._driver.transaction(write=True) as tx:
            return insert_session(tx, token_hash, key_id, ttl, now)

    def session_key(self, token_hash: str) -> str | None:
        """The key id of a live session, or None."""
        with self._driver.transaction(write=False) as tx:
            return read_session_key(tx, token_hash)

    def end_session(self, token_hash: str) -> None:
        with self._driver.transaction(write=True) as tx:
            delete_session(tx, token_hash)
