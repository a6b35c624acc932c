"""Declarative apply: a ``ConfigDoc`` made the store's configuration, as one owner's part of it.

Backends, provider models, frontend models with their aliases, roles and principals in the document are
the desired state; rows missing from it are removed. Keys in the document are upserted by name and
marked as managed by the file; a file-managed key that disappears from the document is removed. Keys
created with ``create_key`` (the CLI) are kept by apply unless their principal is removed. A revoked key
stays revoked whatever the file says. Principals keep their id across applies (matched by name). Limits
and budgets follow the same rule: those of principals, of their models and of file-managed keys are set
from the document (absent meaning unlimited); a CLI key keeps the limits and budgets it was created with
until a file adopts it. Each owner (a config file, or the store for the admin API and UI) applies its own
entries only (``_ownership``).

``prepare`` does what can fail before the transaction (credentials named by ``api_key_env`` or
``api_key_file``, key secrets hashed); ``apply_prepared`` writes inside it, with the audit entry and the
revision bump. I/O: the environment and ``api_key_file`` files (``prepare``); the transaction it is
handed.
"""

from __future__ import annotations

import os
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.routing_rows import routing_rows
from gateway.controlplane.config.specs import BackendSpec, ConfigDoc, KeySpec, PrincipalSpec
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.credentials import Vault
from gateway.controlplane.store._audit import AuditEntry, write_audit
from gateway.controlplane.store._columns import (
    BUDGET_COLUMNS,
    KEY_COLUMNS,
    LIMIT_COLUMNS,
    MANAGED_BY_FILE,
    budget_params,
    limit_params,
    new_id,
    price_params,
    to_json,
)
from gateway.controlplane.store._credentials import seal_backends
from gateway.controlplane.store._document import read_config_doc, read_owners
from gateway.controlplane.store._driver import Param, Transaction
from gateway.controlplane.store._keys import check_hash_free, insert_key_budgets
from gateway.controlplane.store._ownership import KINDS, STORE_OWNER, diff, merge
from gateway.controlplane.store._revision import bump_revision
from gateway.controlplane.store._spend import drop_unbudgeted
from gateway.errors import ConfigError
from gateway.keys import hash_secret

__all__ = ["Prepared", "apply_prepared", "prepare"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A document ready to apply: credentials resolved, key secrets hashed."""

    cfg: ConfigDoc
    # Store-owned backends whose api_key_env or api_key_file did not resolve here: kept only if the store
    # already holds the credential that reference gave (the variable may live on another control plane).
    unresolved: dict[str, ConfigError]
    key_hashes: dict[str, str]  # key name -> hex keyed hash of its secret


def prepare(
    cfg: ConfigDoc, owner: str, hash_key: bytes | None, environ: Mapping[str, str] | None
) -> Prepared:
    """Resolve ``cfg``'s credential references and hash its keys' secrets; raises ``ConfigError``."""
    unresolved: dict[str, ConfigError] = {}
    resolved: list[BackendSpec] = []
    for i, b in enumerate(cfg.backends):
        try:
            resolved.append(_resolve_credential(i, b, environ))
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
    return Prepared(cfg, unresolved, key_hashes)


def apply_prepared(
    tx: Transaction,
    vault: Vault | None,
    prepared: Prepared,
    *,
    actor: str,
    owner: str,
    action: str,
    target: str | None,
    entry: tuple[str | None, str | None] | None,
) -> int:
    """Write ``prepared`` as ``owner`` with its audit entry; returns the new revision."""
    cfg, unresolved, key_hashes = prepared.cfg, prepared.unresolved, prepared.key_hashes
    current = read_config_doc(tx, vault, credentials=True)
    owners_before = read_owners(tx)
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
    sealed = seal_backends(tx, vault, merged.backends)
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
    _apply_backends(tx, cfg.backends, sealed)
    _replace_names(tx, "provider_models", [m.name for m in cfg.provider_models])
    tx.executemany(
        "UPDATE provider_models SET price_input = ?, price_output = ?, price_cached_input = ? WHERE name = ?",
        [(*price_params(m.price), m.name) for m in cfg.provider_models],
    )
    tx.executemany(
        "INSERT INTO provider_model_backends (provider_model, seq, backend, upstream_model) "
        "VALUES (?, ?, ?, ?)",
        [(m.name, i, e.backend, e.model) for m in cfg.provider_models for i, e in enumerate(m.backends)],
    )
    _replace_names(tx, "models", [m.name for m in cfg.models])
    tx.executemany(
        "UPDATE models SET price_input = ?, price_output = ?, price_cached_input = ? WHERE name = ?",
        [(*price_params(m.price), m.name) for m in cfg.models],
    )
    tx.executemany(
        "INSERT INTO model_chain (model, seq, provider_model) VALUES (?, ?, ?)",
        [(m.name, i, pm) for m in cfg.models for i, pm in enumerate(m.chain)],
    )
    tx.executemany(
        "INSERT INTO model_aliases (alias, model) VALUES (?, ?)",
        [(a, m.name) for m in cfg.models for a in m.aliases],
    )
    _replace_names(tx, "roles", [r.name for r in cfg.roles])
    tx.executemany(
        "INSERT INTO role_permissions (role, permission) VALUES (?, ?)",
        [(r.name, p) for r in cfg.roles for p in r.permissions],
    )
    principal_ids = _apply_principals(tx, cfg.principals)
    tx.executemany(
        "INSERT INTO principal_roles (principal_id, role) VALUES (?, ?)",
        [(principal_ids[p.name], r) for p in cfg.principals for r in p.roles],
    )
    tx.executemany(
        f"INSERT INTO principal_model_limits (principal_id, model, {LIMIT_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
        [
            (principal_ids[p.name], model, *limit_params(spec))
            for p in cfg.principals
            for model, spec in p.model_limits
        ],
    )
    _apply_keys(tx, cfg.keys, principal_ids, key_hashes)
    # A budget taken away stops being counted: its windows go, so that one given back is opened afresh.
    drop_unbudgeted(tx)
    tx.execute("DELETE FROM routing_entries")
    tx.executemany("INSERT INTO routing_entries (kind, name, body) VALUES (?, ?, ?)", routing_rows(cfg))
    tx.execute("DELETE FROM config_owners")
    tx.executemany(
        "INSERT INTO config_owners (kind, name, owner) VALUES (?, ?, ?)",
        [(kind, name, by) for (kind, name), by in sorted(owners_after.items())],
    )
    if entry is None:
        # Against the state as stored (ordered, secrets left out), not the document as sent.
        after = read_config_doc(tx, vault, credentials=True)
        changes = diff(current, after, owners_before, owners_after)
        before_text: str | None = None
        after_text: str | None = to_json(changes)
    else:
        before_text, after_text = entry
    where = target or ("config" if owner == STORE_OWNER else owner)
    write_audit(tx, AuditEntry(actor, action, where, before_text, after_text))
    return bump_revision(tx)


def _resolve_credential(i: int, b: BackendSpec, environ: Mapping[str, str] | None) -> BackendSpec:
    """``b`` with ``api_key`` set to the credential its ``api_key_env`` or ``api_key_file`` names."""
    if b.api_key_env is not None:
        value = (os.environ if environ is None else environ).get(b.api_key_env)
        if not value:
            raise ConfigError(f"backends[{i}].api_key_env: environment variable {b.api_key_env} is not set")
        return replace(b, api_key=value)
    if b.api_key_file is not None:
        try:
            value = open(b.api_key_file, encoding="utf-8").read().strip()  # noqa: SIM115
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"backends[{i}].api_key_file: cannot read {b.api_key_file}: {exc}") from None
        if not value:
            raise ConfigError(f"backends[{i}].api_key_file: {b.api_key_file} is empty")
        return replace(b, api_key=value)
    return b


def _replace_names(tx: Transaction, table: str, names: Sequence[str]) -> None:
    existing = {row[0] for row in tx.query(f"SELECT name FROM {table}")}
    wanted = set(names)
    tx.executemany(f"DELETE FROM {table} WHERE name = ?", [(n,) for n in existing - wanted])
    tx.executemany(f"INSERT INTO {table} (name) VALUES (?)", [(n,) for n in names if n not in existing])


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


def _apply_principals(tx: Transaction, principals: Sequence[PrincipalSpec]) -> dict[str, str]:
    existing: dict[str, str] = {row[1]: row[0] for row in tx.query("SELECT id, name FROM principals")}
    wanted = {p.name for p in principals}
    gone = [(pid,) for name, pid in existing.items() if name not in wanted]
    # Budgets are rebuilt wholesale, like the link tables: the document holds every principal.
    tx.execute("DELETE FROM principal_budgets")
    # Explicit rather than relying on ON DELETE CASCADE, which SQLite only honours when enabled.
    tx.executemany(
        "DELETE FROM key_budgets WHERE key_id IN (SELECT id FROM api_keys WHERE principal_id = ?)", gone
    )
    tx.executemany("DELETE FROM api_keys WHERE principal_id = ?", gone)
    tx.executemany("DELETE FROM principals WHERE id = ?", gone)
    ids = {name: pid for name, pid in existing.items() if name in wanted}
    new = [(new_id(), p.name) for p in principals if p.name not in existing]
    tx.executemany("INSERT INTO principals (id, name) VALUES (?, ?)", new)
    ids.update((name, pid) for pid, name in new)
    tx.executemany(
        "UPDATE principals SET limit_rpm = ?, limit_tpm = ?, limit_concurrency = ? WHERE id = ?",
        [(*limit_params(p.limits), ids[p.name]) for p in principals],
    )
    tx.executemany(
        f"INSERT INTO principal_budgets (principal_id, seq, {BUDGET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        [(ids[p.name], seq, *budget_params(b)) for p in principals for seq, b in enumerate(p.budgets)],
    )
    return ids


def _apply_keys(
    tx: Transaction, keys: Sequence[KeySpec], principal_ids: dict[str, str], hashes: dict[str, str]
) -> None:
    existing: dict[str, tuple[str, str]] = {
        row[1]: (row[0], row[2])
        for row in tx.query("SELECT id, name, managed_by FROM api_keys WHERE name IS NOT NULL")
    }
    wanted = {k.name for k in keys}
    gone = [(kid,) for name, (kid, by) in existing.items() if by == MANAGED_BY_FILE and name not in wanted]
    tx.executemany("DELETE FROM key_budgets WHERE key_id = ?", gone)
    tx.executemany("DELETE FROM api_keys WHERE id = ?", gone)
    now = time.time()
    ids: list[str] = []  # of the document's keys: their budgets are the document's
    for i, k in enumerate(keys):
        key_hash = hashes.get(k.name)
        found = existing.get(k.name)
        if found is None:
            if key_hash is None:
                raise ConfigError(
                    f"keys[{i}]: no key named {k.name!r} exists yet; give its secret to import it, "
                    "or create it with `gateway keys create`"
                )
            check_hash_free(tx, key_hash, None, f"keys[{i}]")
            ids.append(new_id())
            tx.execute(
                f"INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
                (
                    ids[-1],
                    k.name,
                    principal_ids[k.principal],
                    key_hash,
                    now,
                    k.expires_at,
                    MANAGED_BY_FILE,
                    *limit_params(k.limits),
                ),
            )
            continue
        key_id = found[0]
        ids.append(key_id)
        sets = "principal_id = ?, expires_at = ?, managed_by = ?, limit_rpm = ?, limit_tpm = ?, "
        sets += "limit_concurrency = ?"
        params: list[Param] = [
            principal_ids[k.principal],
            k.expires_at,
            MANAGED_BY_FILE,
            *limit_params(k.limits),
        ]
        if key_hash is not None:
            check_hash_free(tx, key_hash, key_id, f"keys[{i}]")
            sets += ", key_hash = ?"
            params.append(key_hash)
        tx.execute(f"UPDATE api_keys SET {sets} WHERE id = ?", (*params, key_id))
    tx.executemany("DELETE FROM key_budgets WHERE key_id = ?", [(kid,) for kid in ids])
    insert_key_budgets(tx, [(kid, k.budgets) for kid, k in zip(ids, keys, strict=True)])


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
