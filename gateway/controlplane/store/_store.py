"""The control plane's store: configuration, principals and API keys, and the revision counter.

Every write (``apply_config``, ``create_key``, ``revoke_key``) is one transaction that also bumps the
single-row ``config_revision`` counter, so the control worker, which polls ``revision()``, rebuilds the
snapshot exactly when something changed and ``read_state`` returns rows consistent with the revision
read alongside them. All SQL lives here and goes through the small ``Driver`` interface; nothing here
knows which database it talks to.

Declarative apply: backends, provider models, frontend models with their aliases, roles and principals in
the document are the desired state; rows missing from it are removed. Keys in the document are upserted by
name and marked as managed by the file; a file-managed key that disappears from the document is removed.
Keys created with ``create_key`` (the CLI) are kept by apply unless their principal is removed. A revoked
key stays revoked whatever the file says. Principals keep their id across applies (matched by name).
Limits follow the same rule: those of principals, of their models and of file-managed keys are set from
the document (absent meaning unlimited); a CLI key keeps the limits it was created with until a file
adopts it.
"""

from __future__ import annotations

import os
import secrets
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

import orjson

from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.routing_rows import routing_from_rows, routing_rows
from gateway.controlplane.config.specs import (
    LIMIT_FIELDS,
    BackendSpec,
    BudgetSpec,
    ConfigDoc,
    KeySpec,
    LimitsSpec,
    ModelSpec,
    PriceSpec,
    PrincipalSpec,
    ProviderBackend,
    ProviderModelSpec,
    RoleSpec,
)
from gateway.controlplane.config.values import check_limit, check_name
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.credentials import CredentialError, Vault, is_sealed
from gateway.controlplane.store._driver import Driver, Param, Transaction
from gateway.controlplane.store._errors import StoreConflict, StoreError
from gateway.controlplane.store._ownership import KINDS, STORE_OWNER, diff, merge
from gateway.controlplane.store._usage import UsageStore
from gateway.errors import ConfigError
from gateway.keys import generate_secret, hash_secret

__all__ = ["AuditEntry", "BackendCredential", "KeyInfo", "PrincipalInfo", "Store", "StoreState"]

Row = tuple[Any, ...]
MANAGED_BY_FILE = "file"
MANAGED_BY_CLI = "cli"
MANAGED_BY_API = "api"  # created through the admin API, the web UI's included


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What may be shown about a key: never its secret, only a prefix of its hash."""

    id: str
    name: str | None
    principal: str  # principal name
    hash_prefix: str  # first 8 hex chars of the keyed digest, to tell keys apart in listings
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    managed_by: str  # "file" | "cli" | "api"
    limits: LimitsSpec | None = None

    def status(self, now: float | None = None) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (time.time() if now is None else now):
            return "expired"
        return "active"


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


@dataclass(frozen=True, slots=True)
class BackendCredential:
    """What may be shown about a backend's credential: where it came from and a fingerprint."""

    source: str  # "inline" | "env:NAME" | "file:/path"
    fingerprint: str  # first 8 hex of a keyed hash of the credential


def _write_audit(tx: Transaction, entry: AuditEntry) -> None:
    tx.execute(
        "INSERT INTO audit_log (id, ts, actor, action, target, before_state, after_state) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (_new_id(), time.time(), entry.actor, entry.action, entry.target, entry.before, entry.after),
    )


@dataclass(frozen=True, slots=True)
class PrincipalInfo:
    id: str
    name: str
    roles: tuple[str, ...]
    active_keys: int  # keys neither revoked nor expired
    limits: LimitsSpec | None = None
    model_limits: tuple[tuple[str, LimitsSpec], ...] = ()  # ordered by model name
    budget: BudgetSpec | None = None


@dataclass(frozen=True, slots=True)
class StoreState:
    """Raw rows of one read transaction, validated by whoever consumes them (the snapshot builder)."""

    revision: int
    backends: Sequence[Row]  # (name, url, protocol, api_key, api_key_env, connect_t, first_byte_t, read_t)
    provider_models: Sequence[str]
    provider_model_backends: Sequence[Row]  # (provider_model, backend, upstream_model), in order
    models: Sequence[str]
    model_chain: Sequence[Row]  # (model, provider_model), in fallback order
    model_aliases: Sequence[Row]  # (alias, model)
    roles: Sequence[str]
    role_permissions: Sequence[Row]  # (role, permission)
    # Limits are three trailing columns (limit_rpm, limit_tpm, limit_concurrency), NULL meaning unlimited.
    principals: Sequence[Row]  # (id, name, *limits)
    principal_roles: Sequence[Row]  # (principal_id, role)
    principal_model_limits: Sequence[Row]  # (principal_id, model, *limits)
    # (id, name, principal_id, key_hash, created_at, expires_at, revoked_at, managed_by, *limits)
    keys: Sequence[Row]
    prices: Sequence[Row] = ()  # (name, input, output, cached_input) of priced models and provider models
    budgets: Sequence[Row] = ()  # (principal_id, period, tokens, cost) of principals with a budget
    routing: Sequence[Row] = ()  # (kind, name, JSON body): see routing_rows


_LIMIT_COLUMNS = "limit_rpm, limit_tpm, limit_concurrency"
_PRICE_COLUMNS = "price_input, price_output, price_cached_input"
_BUDGET_COLUMNS = "budget_period, budget_tokens, budget_cost"
_KEY_COLUMNS = (
    f"id, name, principal_id, key_hash, created_at, expires_at, revoked_at, managed_by, {_LIMIT_COLUMNS}"
)


def _new_id() -> str:
    return secrets.token_hex(8)


def _limit_params(spec: LimitsSpec | None) -> tuple[Param, Param, Param]:
    if spec is None:
        return None, None, None
    return spec.requests_per_minute, spec.tokens_per_minute, spec.concurrent_requests


def _limits_from(values: Sequence[Any]) -> LimitsSpec | None:
    """The inverse of ``_limit_params`` for the three limit columns of a row."""
    for value in values:
        if value is not None and not isinstance(value, int):  # only a hand-edited row can hold one
            raise StoreError(f"unreadable limit {value!r} in the store")
    spec = LimitsSpec(*values)
    return None if spec.is_empty() else spec


def _price_params(spec: PriceSpec | None) -> tuple[Param, Param, Param]:
    if spec is None:
        return None, None, None
    return spec.input, spec.output, spec.cached_input


def _price_from(values: Sequence[Any]) -> PriceSpec | None:
    if values[0] is None or values[1] is None:
        return None
    return PriceSpec(float(values[0]), float(values[1]), None if values[2] is None else float(values[2]))


def _budget_params(spec: BudgetSpec | None) -> tuple[Param, Param, Param]:
    if spec is None or (spec.tokens is None and spec.cost is None):  # a budget of nothing is no budget
        return None, None, None
    return spec.period, spec.tokens, spec.cost


def _budget_from(values: Sequence[Any]) -> BudgetSpec | None:
    """The inverse of ``_budget_params`` for the three budget columns of a row."""
    period, tokens, cost = values
    if period is None or (tokens is None and cost is None):
        return None
    if (
        not isinstance(period, str)
        or (tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)))
        or (cost is not None and (not isinstance(cost, int | float) or isinstance(cost, bool)))
    ):  # only a hand-edited row can hold one
        raise StoreError(f"unreadable budget {tuple(values)!r} in the store")
    return BudgetSpec(period, tokens, None if cost is None else float(cost))


REVISION_CHANNEL = "gateway_config"


class _Unreadable:
    def __repr__(self) -> str:
        return "<credential that does not open>"


CREDENTIAL_UNREADABLE: Any = _Unreadable()


def _bump_revision(tx: Transaction) -> int:
    tx.execute("UPDATE config_revision SET revision = revision + 1 WHERE id = 1")
    revision = int(tx.query("SELECT revision FROM config_revision WHERE id = 1")[0][0])
    tx.notify(REVISION_CHANNEL, str(revision))  # delivered at commit, to every control plane listening
    return revision


def _check_hash_free(tx: Transaction, key_hash: str, key_id: str | None, what: str) -> None:
    rows = tx.query("SELECT id FROM api_keys WHERE key_hash = ?", (key_hash,))
    if rows and rows[0][0] != key_id:
        raise StoreConflict(f"{what}: the same secret is already used by key {rows[0][0]}")


class Store:
    """The store's operations over any ``Driver``. Methods are synchronous and thread-safe."""

    def __init__(self, driver: Driver, vault: Vault | None = None) -> None:
        self._driver = driver
        self.vault = vault  # None: backend credentials can be neither written nor read
        self.usage = UsageStore(driver)

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
        return None if listen is None else listen(REVISION_CHANNEL, callback)  # type: ignore[no-any-return]

    def revision(self) -> int:
        with self._driver.transaction(write=False) as tx:
            return int(tx.query("SELECT revision FROM config_revision WHERE id = 1")[0][0])

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
        unresolved: dict[str, ConfigError] = {}
        resolved: list[BackendSpec] = []
        for i, b in enumerate(cfg.backends):
            try:
                resolved.append(self._resolve_credential(i, b, environ))
            except ConfigError as exc:
                if owner != STORE_OWNER:
                    raise
                unresolved[b.name] = exc  # unless the store holds the credential this reference gave
                resolved.append(b)
        cfg = replace(cfg, backends=tuple(resolved))
        key_hashes: dict[str, str] = {}
        for k in cfg.keys:
            if k.secret is not None:
                if hash_key is None:
                    raise ConfigError("a hash key is needed to import keys with a secret")
                key_hashes[k.name] = hash_secret(k.secret, hash_key).hex()

        with self._driver.transaction(write=True) as tx:
            current = self._config_doc_in(tx, credentials=True)
            owners_before = {
                (r[0], r[1]): str(r[2]) for r in tx.query("SELECT kind, name, owner FROM config_owners")
            }
            if owner == STORE_OWNER:
                # Credentials are write-only: an entry sent back as the API shows it (no credential, or
                # the same variable or file as stored, which this process may not see) keeps the stored one.
                stored = {b.name: b for b in current.backends}
                kept: list[BackendSpec] = []
                for b in cfg.backends:
                    old = stored.get(b.name)
                    same_source = old is not None and (b.api_key_env, b.api_key_file) in (
                        (None, None),
                        (old.api_key_env, old.api_key_file),
                    )
                    if old is not None and b.name in unresolved and same_source:
                        b = replace(b, api_key=old.api_key)
                    elif b.name in unresolved:
                        raise unresolved[b.name]
                    elif old is not None and b.api_key is None and b.api_key_env is None and same_source:
                        b = _with_credential(b, old)
                    kept.append(b)
                cfg = replace(cfg, backends=tuple(kept))
            merged, owners_after = merge(current, owners_before, cfg, owner)
            # The result must hold together as a file would: a file may not remove a role that a
            # store-owned principal still names, say. A result of the document's entries alone was
            # checked when it was parsed (and the check costs as much as the rest of a large apply).
            if _mixed(cfg, merged):
                _validate(merged, "the configuration" if owner == STORE_OWNER else owner[5:])
            sealed = self._seal_backends(tx, merged.backends)
            cfg = merged
            # Link tables are rebuilt wholesale; entities are upserted so that unchanged rows keep their
            # identity, then whatever the document no longer names is deleted.
            for table in (
                "principal_model_limits",
                "principal_roles",
                "role_permissions",
                "model_aliases",
                "model_chain",
                "provider_model_backends",
            ):
                tx.execute(f"DELETE FROM {table}")
            self._apply_backends(tx, cfg.backends, sealed)
            self._replace_names(tx, "provider_models", [m.name for m in cfg.provider_models])
            tx.executemany(
                "UPDATE provider_models SET price_input = ?, price_output = ?, price_cached_input = ? "
                "WHERE name = ?",
                [(*_price_params(m.price), m.name) for m in cfg.provider_models],
            )
            tx.executemany(
                "INSERT INTO provider_model_backends (provider_model, seq, backend, upstream_model) "
                "VALUES (?, ?, ?, ?)",
                [
                    (m.name, i, e.backend, e.model)
                    for m in cfg.provider_models
                    for i, e in enumerate(m.backends)
                ],
            )
            self._replace_names(tx, "models", [m.name for m in cfg.models])
            tx.executemany(
                "UPDATE models SET price_input = ?, price_output = ?, price_cached_input = ? WHERE name = ?",
                [(*_price_params(m.price), m.name) for m in cfg.models],
            )
            tx.executemany(
                "INSERT INTO model_chain (model, seq, provider_model) VALUES (?, ?, ?)",
                [(m.name, i, pm) for m in cfg.models for i, pm in enumerate(m.chain)],
            )
            tx.executemany(
                "INSERT INTO model_aliases (alias, model) VALUES (?, ?)",
                [(a, m.name) for m in cfg.models for a in m.aliases],
            )
            self._replace_names(tx, "roles", [r.name for r in cfg.roles])
            tx.executemany(
                "INSERT INTO role_permissions (role, permission) VALUES (?, ?)",
                [(r.name, p) for r in cfg.roles for p in r.permissions],
            )
            principal_ids = self._apply_principals(tx, cfg.principals)
            tx.executemany(
                "INSERT INTO principal_roles (principal_id, role) VALUES (?, ?)",
                [(principal_ids[p.name], r) for p in cfg.principals for r in p.roles],
            )
            tx.executemany(
                f"INSERT INTO principal_model_limits (principal_id, model, {_LIMIT_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (principal_ids[p.name], model, *_limit_params(spec))
                    for p in cfg.principals
                    for model, spec in p.model_limits
                ],
            )
            self._apply_keys(tx, cfg.keys, principal_ids, key_hashes)
            tx.execute("DELETE FROM routing_entries")
            tx.executemany(
                "INSERT INTO routing_entries (kind, name, body) VALUES (?, ?, ?)", routing_rows(cfg)
            )
            tx.execute("DELETE FROM config_owners")
            tx.executemany(
                "INSERT INTO config_owners (kind, name, owner) VALUES (?, ?, ?)",
                [(kind, name, by) for (kind, name), by in sorted(owners_after.items())],
            )
            if entry is None:
                # Against the state as stored (ordered, secrets left out), not the document as sent.
                after = self._config_doc_in(tx, credentials=True)
                changes = diff(current, after, owners_before, owners_after)
                before_text: str | None = None
                after_text: str | None = _json(changes)
            else:
                before_text, after_text = entry
            where = target or ("config" if owner == STORE_OWNER else owner)
            _write_audit(tx, AuditEntry(actor, action, where, before_text, after_text))
            return _bump_revision(tx)

    def _resolve_credential(self, i: int, b: BackendSpec, environ: Mapping[str, str] | None) -> BackendSpec:
        """``b`` with ``api_key`` set to the credential its ``api_key_env`` or ``api_key_file`` names."""
        if b.api_key_env is not None:
            value = (os.environ if environ is None else environ).get(b.api_key_env)
            if not value:
                raise ConfigError(
                    f"backends[{i}].api_key_env: environment variable {b.api_key_env} is not set"
                )
            return replace(b, api_key=value)
        if b.api_key_file is not None:
            try:
                value = open(b.api_key_file, encoding="utf-8").read().strip()  # noqa: SIM115
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"backends[{i}].api_key_file: cannot read {b.api_key_file}: {exc}"
                ) from None
            if not value:
                raise ConfigError(f"backends[{i}].api_key_file: {b.api_key_file} is empty")
            return replace(b, api_key=value)
        return b

    def _seal_backends(
        self, tx: Transaction, backends: Sequence[BackendSpec]
    ) -> dict[str, tuple[Param, Param]]:
        """Each backend's ``(sealed credential, fingerprint)``; an unchanged credential keeps its sealed
        value, so that an apply that changes nothing rewrites nothing."""
        stored = {
            r[0]: (r[1], r[2]) for r in tx.query("SELECT name, api_key, api_key_fingerprint FROM backends")
        }
        out: dict[str, tuple[Param, Param]] = {}
        for b in backends:
            if b.api_key is None:
                out[b.name] = (None, None)
                continue
            if self.vault is None:
                raise CredentialError(
                    "backend credentials need the secrets key, which this store was opened without"
                )
            old = stored.get(b.name)
            if b.api_key is CREDENTIAL_UNREADABLE and old is not None:
                out[b.name] = (old[0], old[1])  # kept sealed as it is: see _credential
            elif old is not None and isinstance(old[0], str) and self._opens_to(b.name, old[0], b.api_key):
                out[b.name] = (old[0], old[1])
            else:
                out[b.name] = (self.vault.seal(b.api_key, b.name), self.vault.fingerprint(b.api_key))
        return out

    def _opens_to(self, name: str, sealed: str, plaintext: str) -> bool:
        try:
            return self._open(name, sealed) == plaintext
        except CredentialError:
            return False

    def _open(self, name: str, sealed: str) -> str:
        if self.vault is None:
            raise CredentialError(f"backend {name!r}: its credential needs the secrets key")
        try:
            return self.vault.open(sealed, name)
        except CredentialError as exc:
            raise CredentialError(f"backend {name!r}: {exc.message}") from None

    @staticmethod
    def _replace_names(tx: Transaction, table: str, names: Sequence[str]) -> None:
        existing = {row[0] for row in tx.query(f"SELECT name FROM {table}")}
        wanted = set(names)
        tx.executemany(f"DELETE FROM {table} WHERE name = ?", [(n,) for n in existing - wanted])
        tx.executemany(f"INSERT INTO {table} (name) VALUES (?)", [(n,) for n in names if n not in existing])

    @staticmethod
    def _apply_backends(
        tx: Transaction, backends: Sequence[BackendSpec], sealed: dict[str, tuple[Param, Param]]
    ) -> None:
        existing = {row[0] for row in tx.query("SELECT name FROM backends")}
        tx.executemany(
            "DELETE FROM backends WHERE name = ?", [(n,) for n in existing - {b.name for b in backends}]
        )
        tx.executemany(
            "INSERT INTO backends (name, url, protocol, api_key, api_key_fingerprint, api_key_env, "
            "api_key_file, connect_timeout, first_byte_timeout, read_timeout) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET url = excluded.url, protocol = excluded.protocol, "
            "api_key = excluded.api_key, api_key_env = excluded.api_key_env, "
            "api_key_file = excluded.api_key_file, api_key_fingerprint = excluded.api_key_fingerprint, "
            "connect_timeout = excluded.connect_timeout, first_byte_timeout = excluded.first_byte_timeout, "
            "read_timeout = excluded.read_timeout",
            [
                (
                    b.name,
                    b.url,
                    b.protocol,
                    *sealed[b.name],
                    b.api_key_env,
                    b.api_key_file,
                    b.connect_timeout,
                    b.first_byte_timeout,
                    b.read_timeout,
                )
                for b in backends
            ],
        )

    @staticmethod
    def _apply_principals(tx: Transaction, principals: Sequence[PrincipalSpec]) -> dict[str, str]:
        existing: dict[str, str] = {row[1]: row[0] for row in tx.query("SELECT id, name FROM principals")}
        wanted = {p.name for p in principals}
        gone = [(pid,) for name, pid in existing.items() if name not in wanted]
        # Explicit rather than relying on ON DELETE CASCADE, which SQLite only honours when enabled.
        tx.executemany("DELETE FROM api_keys WHERE principal_id = ?", gone)
        tx.executemany("DELETE FROM principals WHERE id = ?", gone)
        ids = {name: pid for name, pid in existing.items() if name in wanted}
        new = [(_new_id(), p.name) for p in principals if p.name not in existing]
        tx.executemany("INSERT INTO principals (id, name) VALUES (?, ?)", new)
        ids.update((name, pid) for pid, name in new)
        tx.executemany(
            "UPDATE principals SET limit_rpm = ?, limit_tpm = ?, limit_concurrency = ?, budget_period = ?, "
            "budget_tokens = ?, budget_cost = ? WHERE id = ?",
            [(*_limit_params(p.limits), *_budget_params(p.budget), ids[p.name]) for p in principals],
        )
        return ids

    @staticmethod
    def _apply_keys(
        tx: Transaction, keys: Sequence[KeySpec], principal_ids: dict[str, str], hashes: dict[str, str]
    ) -> None:
        existing: dict[str, tuple[str, str]] = {
            row[1]: (row[0], row[2])
            for row in tx.query("SELECT id, name, managed_by FROM api_keys WHERE name IS NOT NULL")
        }
        wanted = {k.name for k in keys}
        tx.executemany(
            "DELETE FROM api_keys WHERE id = ?",
            [(kid,) for name, (kid, by) in existing.items() if by == MANAGED_BY_FILE and name not in wanted],
        )
        now = time.time()
        for i, k in enumerate(keys):
            key_hash = hashes.get(k.name)
            found = existing.get(k.name)
            if found is None:
                if key_hash is None:
                    raise ConfigError(
                        f"keys[{i}]: no key named {k.name!r} exists yet; give its secret to import it, "
                        "or create it with `gateway keys create`"
                    )
                _check_hash_free(tx, key_hash, None, f"keys[{i}]")
                tx.execute(
                    f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
                    (
                        _new_id(),
                        k.name,
                        principal_ids[k.principal],
                        key_hash,
                        now,
                        k.expires_at,
                        MANAGED_BY_FILE,
                        *_limit_params(k.limits),
                    ),
                )
                continue
            key_id = found[0]
            sets = "principal_id = ?, expires_at = ?, managed_by = ?, limit_rpm = ?, limit_tpm = ?, "
            sets += "limit_concurrency = ?"
            params: list[Param] = [
                principal_ids[k.principal],
                k.expires_at,
                MANAGED_BY_FILE,
                *_limit_params(k.limits),
            ]
            if key_hash is not None:
                _check_hash_free(tx, key_hash, key_id, f"keys[{i}]")
                sets += ", key_hash = ?"
                params.append(key_hash)
            tx.execute(f"UPDATE api_keys SET {sets} WHERE id = ?", (*params, key_id))

    # --- keys ------------------------------------------------------------------------------------------

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
    ) -> tuple[str, str]:
        """A new key for ``principal``; returns ``(key_id, secret)``. Only the secret's hash is stored.
        ``managed_by`` says where it was made: ``cli`` or ``api`` (the admin API and web UI); the audit
        entry names ``actor``, the key and its principal."""
        if name is not None and (problem := check_name(name)):
            raise ConfigError(f"key name {problem}")
        for field, value in zip(LIMIT_FIELDS, _limit_params(limits), strict=True):
            if value is not None and (problem := check_limit(value)):
                raise ConfigError(f"key limit {field} {problem}")
        if limits is not None and limits.is_empty():
            limits = None
        secret = generate_secret()
        key_hash = hash_secret(secret, hash_key).hex()
        key_id = _new_id()
        with self._driver.transaction(write=True) as tx:
            rows = tx.query("SELECT id FROM principals WHERE name = ?", (principal,))
            if not rows:
                raise ConfigError(f"no principal named {principal!r}")
            if name is not None and tx.query("SELECT 1 FROM api_keys WHERE name = ?", (name,)):
                raise StoreConflict(f"a key named {name!r} already exists")
            tx.execute(
                f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
                (
                    key_id,
                    name,
                    rows[0][0],
                    key_hash,
                    time.time(),
                    expires_at,
                    managed_by,
                    *_limit_params(limits),
                ),
            )
            detail: dict[str, object] = {
                "id": key_id,
                "name": name,
                "principal": principal,
                "expires_at": expires_at,
            }
            detail["limits"] = (
                None if limits is None else dict(zip(LIMIT_FIELDS, _limit_params(limits), strict=True))
            )
            _write_audit(tx, AuditEntry(actor, "key.create", f"keys/{name or key_id}", None, _json(detail)))
            _bump_revision(tx)
        return key_id, secret

    def revoke_key(self, key_id_or_name: str, *, actor: str) -> str:
        """Revoke by id, or else by name; returns the key's id. Revoking a revoked key changes nothing
        (and bumps nothing, and audits nothing)."""
        sql = (
            "SELECT k.id, k.revoked_at, k.name, p.name FROM api_keys k "
            "LEFT JOIN principals p ON p.id = k.principal_id WHERE k."
        )
        with self._driver.transaction(write=True) as tx:
            rows = tx.query(sql + "id = ?", (key_id_or_name,))
            if not rows:
                rows = tx.query(sql + "name = ?", (key_id_or_name,))
            if not rows:
                raise ConfigError(f"no key with id or name {key_id_or_name!r}")
            key_id = str(rows[0][0])
            if rows[0][1] is not None:
                return key_id
            tx.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (time.time(), key_id))
            detail = {"id": key_id, "name": rows[0][2], "principal": rows[0][3]}
            _write_audit(
                tx, AuditEntry(actor, "key.revoke", f"keys/{rows[0][2] or key_id}", None, _json(detail))
            )
            _bump_revision(tx)
        return key_id

    def key_name(self, key_id: str) -> str | None:
        with self._driver.transaction(write=False) as tx:
            rows = tx.query("SELECT name FROM api_keys WHERE id = ?", (key_id,))
        return None if not rows or rows[0][0] is None else str(rows[0][0])

    # --- ownership and credentials -----------------------------------------------------------------------

    def owners(self) -> dict[tuple[str, str], str]:
        """``(kind, name) -> "file:<path>"`` of every file-owned entry; the rest is the store's."""
        with self._driver.transaction(write=False) as tx:
            return {(r[0], r[1]): str(r[2]) for r in tx.query("SELECT kind, name, owner FROM config_owners")}

    def backend_credentials(self) -> dict[str, BackendCredential]:
        """Where each backend's credential came from, and its fingerprint; never the credential."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                "SELECT name, api_key_env, api_key_file, api_key_fingerprint FROM backends "
                "WHERE api_key IS NOT NULL"
            )
        return {
            r[0]: BackendCredential(
                f"env:{r[1]}" if r[1] else f"file:{r[2]}" if r[2] else "inline", str(r[3] or "")
            )
            for r in rows
        }

    def seal_credentials(self, vault: Vault, *, actor: str, action: str = "secrets.rotate") -> int:
        """Re-seal every backend credential with ``vault``'s current key (opening it with this store's
        vault), in one transaction with its audit entry; also seals rows stored in the clear by versions
        before encryption at rest. Returns how many were re-sealed; bumps the revision when any was."""
        with self._driver.transaction(write=True) as tx:
            rows = tx.query("SELECT name, api_key FROM backends WHERE api_key IS NOT NULL ORDER BY name")
            updates: list[tuple[Param, ...]] = []
            for name, value in rows:
                if not isinstance(value, str) or (action != "secrets.rotate" and is_sealed(value)):
                    continue
                if action == "secrets.rotate" and vault.sealed_with_current(value):
                    continue
                plain = self._open(name, value) if is_sealed(value) else value
                updates.append((vault.seal(plain, name), vault.fingerprint(plain), name))
            if not updates:
                return 0
            tx.executemany("UPDATE backends SET api_key = ?, api_key_fingerprint = ? WHERE name = ?", updates)
            detail = {"key_id": vault.current_id, "backends": [str(u[2]) for u in updates]}
            _write_audit(tx, AuditEntry(actor, action, "backends", None, _json(detail)))
            _bump_revision(tx)
        self.vault = vault
        return len(updates)

    def audit(self, actor: str, action: str, target: str, detail: object = None) -> None:
        """One audit entry for a write that is not a configuration change (a login, a usage purge)."""
        with self._driver.transaction(write=True) as tx:
            _write_audit(
                tx, AuditEntry(actor, action, target, None, None if detail is None else _json(detail))
            )

    # --- admin sessions ---------------------------------------------------------------------------------

    def create_session(self, token_hash: str, key_id: str, ttl: float) -> float:
        """Record a session for ``key_id``; returns its expiry. Expired sessions are swept here too."""
        now = time.time()
        with self._driver.transaction(write=True) as tx:
            tx.execute("DELETE FROM admin_sessions WHERE expires_at <= ?", (now,))
            tx.execute(
                "INSERT INTO admin_sessions (token_hash, key_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
                (token_hash, key_id, now, now + ttl),
            )
        return now + ttl

    def session_key(self, token_hash: str) -> str | None:
        """The key id of a live session, or None."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                "SELECT key_id FROM admin_sessions WHERE token_hash = ? AND expires_at > ?",
                (token_hash, time.time()),
            )
        return str(rows[0][0]) if rows else None

    def end_session(self, token_hash: str) -> None:
        with self._driver.transaction(write=True) as tx:
            tx.execute("DELETE FROM admin_sessions WHERE token_hash = ?", (token_hash,))

    def audit_log(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent audit entries, newest first."""
        with self._driver.transaction(write=False) as tx:
            rows = tx.query(
                "SELECT actor, action, target, before_state, after_state, ts, id FROM audit_log "
                "ORDER BY ts DESC, id LIMIT ?",
                (limit,),
            )
        return [AuditEntry(r[0], r[1], r[2], r[3], r[4], float(r[5]), r[6]) for r in rows]

    def list_keys(self, principal: str | None = None) -> list[KeyInfo]:
        sql = (
            "SELECT k.id, k.name, p.name, k.key_hash, k.created_at, k.expires_at, k.revoked_at, "
            "k.managed_by, k.limit_rpm, k.limit_tpm, k.limit_concurrency "
            "FROM api_keys k JOIN principals p ON p.id = k.principal_id"
        )
        with self._driver.transaction(write=False) as tx:
            if principal is None:
                rows = tx.query(sql + " ORDER BY p.name, k.created_at, k.id")
            else:
                if not tx.query("SELECT 1 FROM principals WHERE name = ?", (principal,)):
                    raise ConfigError(f"no principal named {principal!r}")
                rows = tx.query(sql + " WHERE p.name = ? ORDER BY k.created_at, k.id", (principal,))
        return [
            KeyInfo(
                id=r[0],
                name=r[1],
                principal=r[2],
                hash_prefix=str(r[3])[:8],
                created_at=float(r[4]),
                expires_at=None if r[5] is None else float(r[5]),
                revoked_at=None if r[6] is None else float(r[6]),
                managed_by=r[7],
                limits=_limits_from(r[8:11]),
            )
            for r in rows
        ]

    def principals(self) -> list[PrincipalInfo]:
        now = time.time()
        with self._driver.transaction(write=False) as tx:
            principals = tx.query(
                f"SELECT id, name, {_LIMIT_COLUMNS}, {_BUDGET_COLUMNS} FROM principals ORDER BY name"
            )
            roles = tx.query("SELECT principal_id, role FROM principal_roles ORDER BY role")
            model_limits = tx.query(
                f"SELECT principal_id, model, {_LIMIT_COLUMNS} FROM principal_model_limits ORDER BY model"
            )
            counts = tx.query(
                "SELECT principal_id, COUNT(*) FROM api_keys WHERE revoked_at IS NULL "
                "AND (expires_at IS NULL OR expires_at > ?) GROUP BY principal_id",
                (now,),
            )
        by_principal: dict[str, list[str]] = {}
        for pid, role in roles:
            by_principal.setdefault(pid, []).append(role)
        active = {pid: int(n) for pid, n in counts}
        models_of = _model_limits_by_principal(model_limits)
        return [
            PrincipalInfo(
                row[0],
                row[1],
                tuple(by_principal.get(row[0], ())),
                active.get(row[0], 0),
                _limits_from(row[2:5]),
                models_of.get(row[0], ()),
                _budget_from(row[5:8]),
            )
            for row in principals
        ]

    # --- reading everything ----------------------------------------------------------------------------

    def read_state(self, *, include_revoked_keys: bool = False) -> StoreState:
        """Every row, from one read transaction, so that they agree with each other and the revision."""
        with self._driver.transaction(write=False) as tx:
            return self._state_in(tx, include_revoked_keys)

    def _state_in(self, tx: Transaction, include_revoked_keys: bool = False) -> StoreState:
        """The rows, with each backend's credential opened: the snapshot carries it to the proxies. One
        that does not open (a lost secrets key) becomes ``CREDENTIAL_UNREADABLE``, which the snapshot
        builder skips like any bad row."""
        key_sql = f"SELECT {_KEY_COLUMNS} FROM api_keys"
        if not include_revoked_keys:
            key_sql += " WHERE revoked_at IS NULL"
        revision = int(tx.query("SELECT revision FROM config_revision WHERE id = 1")[0][0])
        backends = []
        for row in tx.query(
            "SELECT name, url, protocol, api_key, api_key_env, connect_timeout, first_byte_timeout, "
            "read_timeout FROM backends ORDER BY name"
        ):
            api_key = row[3]
            if isinstance(api_key, str):
                try:
                    api_key = self._open(row[0], api_key)
                except CredentialError:
                    api_key = CREDENTIAL_UNREADABLE
            backends.append((*row[:3], api_key, *row[4:]))
        return StoreState(
            revision=revision,
            backends=backends,
            provider_models=[r[0] for r in tx.query("SELECT name FROM provider_models ORDER BY name")],
            provider_model_backends=tx.query(
                "SELECT provider_model, backend, upstream_model FROM provider_model_backends "
                "ORDER BY provider_model, seq"
            ),
            models=[r[0] for r in tx.query("SELECT name FROM models ORDER BY name")],
            model_chain=tx.query("SELECT model, provider_model FROM model_chain ORDER BY model, seq"),
            model_aliases=tx.query("SELECT alias, model FROM model_aliases ORDER BY model, alias"),
            roles=[r[0] for r in tx.query("SELECT name FROM roles ORDER BY name")],
            role_permissions=tx.query(
                "SELECT role, permission FROM role_permissions ORDER BY role, permission"
            ),
            principals=tx.query(f"SELECT id, name, {_LIMIT_COLUMNS} FROM principals ORDER BY name"),
            principal_roles=tx.query("SELECT principal_id, role FROM principal_roles ORDER BY role"),
            principal_model_limits=tx.query(
                f"SELECT principal_id, model, {_LIMIT_COLUMNS} FROM principal_model_limits "
                "ORDER BY principal_id, model"
            ),
            keys=tx.query(key_sql),
            prices=tx.query(
                f"SELECT name, {_PRICE_COLUMNS} FROM models WHERE price_input IS NOT NULL "
                f"UNION ALL SELECT name, {_PRICE_COLUMNS} FROM provider_models "
                "WHERE price_input IS NOT NULL ORDER BY 1"
            ),
            budgets=tx.query(
                f"SELECT id, {_BUDGET_COLUMNS} FROM principals WHERE budget_period IS NOT NULL ORDER BY id"
            ),
            routing=tx.query("SELECT kind, name, body FROM routing_entries ORDER BY kind, name"),
        )

    def config_doc(self) -> ConfigDoc:
        """The current configuration as a document: what ``apply_config`` would need to reproduce it.

        Keys come without secrets, and only those the file manages (CLI keys survive an apply anyway).
        Backends come without credentials, which are write-only (``backend_credentials`` says where each
        came from): a backend whose key came from ``api_key_env`` or ``api_key_file`` keeps that name.
        """
        with self._driver.transaction(write=False) as tx:
            return self._config_doc_in(tx, credentials=False)

    def _config_doc_in(self, tx: Transaction, *, credentials: bool) -> ConfigDoc:
        """``config_doc`` within ``tx``; ``credentials``: with each backend's credential opened (for the
        apply that merges into it, never shown); one that does not open is ``CREDENTIAL_UNREADABLE``."""
        st = self._state_in(tx)
        files = {r[0]: r[1] for r in tx.query("SELECT name, api_key_file FROM backends")}
        pm_backends: dict[str, list[ProviderBackend]] = {}
        for pm, backend, upstream in st.provider_model_backends:
            pm_backends.setdefault(pm, []).append(ProviderBackend(backend, upstream))
        chains: dict[str, list[str]] = {}
        for model, pm in st.model_chain:
            chains.setdefault(model, []).append(pm)
        aliases: dict[str, list[str]] = {}
        for alias, model in st.model_aliases:
            aliases.setdefault(model, []).append(alias)
        perms: dict[str, list[str]] = {}
        for role, perm in st.role_permissions:
            perms.setdefault(role, []).append(perm)
        roles_of: dict[str, list[str]] = {}
        for pid, role in st.principal_roles:
            roles_of.setdefault(pid, []).append(role)
        principal_names = {row[0]: row[1] for row in st.principals}
        model_limits = _model_limits_by_principal(st.principal_model_limits)
        prices = {row[0]: _price_from(row[1:4]) for row in st.prices}
        budgets = {row[0]: _budget_from(row[1:4]) for row in st.budgets}
        routing = routing_from_rows(st.routing)
        return ConfigDoc(
            backends=tuple(
                BackendSpec(
                    name,
                    url,
                    protocol,
                    _credential(name, api_key) if credentials else None,
                    env_name,
                    float(ct),
                    float(fb),
                    float(rt),
                    **routing.backends.get(name, {}),
                    api_key_file=files.get(name),
                )
                for name, url, protocol, api_key, env_name, ct, fb, rt in st.backends
            ),
            provider_models=tuple(
                ProviderModelSpec(n, tuple(pm_backends.get(n, ())), prices.get(n), routing.windows.get(n))
                for n in st.provider_models
            ),
            models=tuple(
                ModelSpec(
                    n,
                    tuple(chains.get(n, ())),
                    tuple(aliases.get(n, ())),
                    prices.get(n),
                    routing.rules.get(n, ()),
                    n in routing.context_failover,
                )
                for n in st.models
            ),
            roles=tuple(RoleSpec(n, tuple(perms.get(n, ()))) for n in st.roles),
            principals=tuple(
                PrincipalSpec(
                    row[1],
                    tuple(roles_of.get(row[0], ())),
                    _limits_from(row[2:5]),
                    model_limits.get(row[0], ()),
                    _with_alerts(budgets.get(row[0]), routing.alerts.get(row[1], ())),
                )
                for row in st.principals
            ),
            keys=tuple(
                KeySpec(
                    k[1],
                    principal_names[k[2]],
                    None,
                    None if k[5] is None else float(k[5]),
                    _limits_from(k[8:11]),
                    tuple(routing.keys.get(k[1], {}).get("allow_ips", ())),
                    _key_models(routing.keys.get(k[1], {})),
                )
                for k in sorted(st.keys, key=lambda k: str(k[1]))
                if k[7] == MANAGED_BY_FILE and k[1] is not None and k[2] in principal_names
            ),
            pools=routing.pools,
            fallback=routing.fallback,
            prompt_classes=routing.classes,
        )


def _credential(name: str, value: object) -> Any:
    """A stored credential for the merge: opened, or ``CREDENTIAL_UNREADABLE``, which an apply that does
    not give the backend a new one keeps as it is stored (a lost key must not cost every other write)."""
    return value if isinstance(value, str) or value is CREDENTIAL_UNREADABLE else None


def _with_credential(b: BackendSpec, stored: BackendSpec) -> BackendSpec:
    return replace(
        b, api_key=stored.api_key, api_key_env=stored.api_key_env, api_key_file=stored.api_key_file
    )


def _mixed(doc: ConfigDoc, merged: ConfigDoc) -> bool:
    """Whether ``merged`` holds entries ``doc`` does not (other owners')."""
    return merged.fallback != doc.fallback or any(
        len(getattr(merged, kind)) != len(getattr(doc, kind)) for kind in KINDS
    )


def _validate(doc: ConfigDoc, where: str) -> None:
    """Check ``doc`` as the file parser would (references, duplicates), credentials and secrets left out
    (they were checked when given, and an opened credential beside its variable's name is no error)."""
    public = replace(
        doc,
        backends=tuple(replace(b, api_key=None) for b in doc.backends),
        keys=tuple(replace(k, secret=None) for k in doc.keys),
    )
    parse_config(tomllib.loads(dump_config(public)), where)


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _with_alerts(budget: BudgetSpec | None, alerts: tuple[float, ...]) -> BudgetSpec | None:
    return replace(budget, alerts=alerts) if budget is not None and alerts else budget


def _key_models(rule: dict[str, Any]) -> tuple[str, ...] | None:
    models = rule.get("models")
    return None if models is None else tuple(models)


def _model_limits_by_principal(rows: Sequence[Row]) -> dict[str, tuple[tuple[str, LimitsSpec], ...]]:
    """``(principal_id, model, *limits)`` rows -> each principal's ``(model, limits)`` in model order."""
    out: dict[str, list[tuple[str, LimitsSpec]]] = {}
    for row in sorted(rows, key=lambda r: str(r[1])):
        spec = _limits_from(row[2:5])
        if spec is not None:
            out.setdefault(row[0], []).append((row[1], spec))
    return {pid: tuple(entries) for pid, entries in out.items()}
