"""API keys and principals as the CLI and the admin API see them: a new key (only its keyed hash is
stored) with its limits and budgets, revoking one, the listings of keys and principals, which never show
a secret, and every budget with its owner (``read_budgets``). What a config file declares about keys is
applied by ``_apply``. I/O: the transaction it is handed (``new_key`` does none).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.controlplane.config.parser import parse_budgets
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.specs import LIMIT_FIELDS, BudgetSpec, LimitsSpec
from gateway.controlplane.config.values import check_limit, check_name
from gateway.controlplane.store._audit import AuditEntry, write_audit
from gateway.controlplane.store._columns import (
    BUDGET_COLUMNS,
    KEY_COLUMNS,
    LIMIT_COLUMNS,
    budget_from,
    budget_params,
    budgets_by_owner,
    limit_params,
    limits_from,
    model_limits_by_principal,
    new_id,
    to_json,
)
from gateway.controlplane.store._driver import Transaction
from gateway.controlplane.store._revision import bump_revision
from gateway.errors import ConfigError, StoreConflict
from gateway.keys import generate_secret, hash_secret

__all__ = [
    "BudgetInfo",
    "KeyInfo",
    "NewKey",
    "PrincipalInfo",
    "check_hash_free",
    "insert_key",
    "insert_key_budgets",
    "new_key",
    "read_budgets",
    "read_key_name",
    "read_keys",
    "read_principals",
    "revoke",
]


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
    budgets: tuple[BudgetSpec, ...] = ()  # its own, on top of its principal's

    def status(self, now: float | None = None) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (time.time() if now is None else now):
            return "expired"
        return "active"


@dataclass(frozen=True, slots=True)
class PrincipalInfo:
    id: str
    name: str
    roles: tuple[str, ...]
    active_keys: int  # keys neither revoked nor expired
    limits: LimitsSpec | None = None
    model_limits: tuple[tuple[str, LimitsSpec], ...] = ()  # ordered by model name
    budgets: tuple[BudgetSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class BudgetInfo:
    """One budget and whose it is: a principal's (``key_id`` None) or one key's."""

    principal_id: str
    principal: str  # its name (a key's: its principal's)
    key_id: str | None
    key: str | None  # the key's name, or its id when it has none; None for a principal's budget
    spec: BudgetSpec


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key made, checked and hashed before its transaction: ``secret`` is shown once and never stored."""

    id: str
    name: str | None
    secret: str
    key_hash: str
    limits: LimitsSpec | None
    budgets: tuple[BudgetSpec, ...] = ()


def new_key(
    name: str | None, hash_key: bytes, limits: LimitsSpec | None, budgets: Sequence[BudgetSpec] = ()
) -> NewKey:
    """A new key's id and secret, its name, limits and budgets checked (``ConfigError``); no I/O."""
    if name is not None and (problem := check_name(name)):
        raise ConfigError(f"key name {problem}")
    for field, value in zip(LIMIT_FIELDS, limit_params(limits), strict=True):
        if value is not None and (problem := check_limit(value)):
            raise ConfigError(f"key limit {field} {problem}")
    if limits is not None and limits.is_empty():
        limits = None
    # The file's own checks, on the budgets' table form: the same rules wherever a key gets them.
    p = Problems()
    checked = parse_budgets(p, "key", {"budgets": [spec.as_dict() for spec in budgets]})
    if p.lines:
        raise ConfigError("; ".join(p.lines), param=p.first_place)
    secret = generate_secret()
    return NewKey(new_id(), name, secret, hash_secret(secret, hash_key).hex(), limits, checked)


def insert_key(
    tx: Transaction, key: NewKey, principal: str, expires_at: float | None, managed_by: str, actor: str
) -> None:
    """Store ``key`` for ``principal`` with its audit entry, and bump the revision."""
    rows = tx.query("SELECT id FROM principals WHERE name = ?", (principal,))
    if not rows:
        raise ConfigError(f"no principal named {principal!r}")
    name, limits = key.name, key.limits
    if name is not None and tx.query("SELECT 1 FROM api_keys WHERE name = ?", (name,)):
        raise StoreConflict(f"a key named {name!r} already exists")
    tx.execute(
        f"INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
        (
            key.id,
            name,
            rows[0][0],
            key.key_hash,
            time.time(),
            expires_at,
            managed_by,
            *limit_params(limits),
        ),
    )
    detail: dict[str, object] = {
        "id": key.id,
        "name": name,
        "principal": principal,
        "expires_at": expires_at,
    }
    detail["limits"] = None if limits is None else dict(zip(LIMIT_FIELDS, limit_params(limits), strict=True))
    if key.budgets:
        insert_key_budgets(tx, [(key.id, key.budgets)])
        detail["budgets"] = [spec.as_dict() for spec in key.budgets]
    write_audit(tx, AuditEntry(actor, "key.create", f"keys/{name or key.id}", None, to_json(detail)))
    bump_revision(tx)


def insert_key_budgets(tx: Transaction, budgets: Sequence[tuple[str, Sequence[BudgetSpec]]]) -> None:
    """Store each key's budgets (``(key id, budgets)``), in their order."""
    tx.executemany(
        f"INSERT INTO key_budgets (key_id, seq, {BUDGET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        [(kid, seq, *budget_params(spec)) for kid, specs in budgets for seq, spec in enumerate(specs)],
    )


def revoke(tx: Transaction, key_id_or_name: str, actor: str) -> str:
    """Revoke by id, or else by name; returns the key's id. Revoking a revoked key changes nothing
    (and bumps nothing, and audits nothing)."""
    sql = (
        "SELECT k.id, k.revoked_at, k.name, p.name FROM api_keys k "
        "LEFT JOIN principals p ON p.id = k.principal_id WHERE k."
    )
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
    write_audit(tx, AuditEntry(actor, "key.revoke", f"keys/{rows[0][2] or key_id}", None, to_json(detail)))
    bump_revision(tx)
    return key_id


def check_hash_free(tx: Transaction, key_hash: str, key_id: str | None, what: str) -> None:
    """Refuse a secret another key already has (``key_id``: the key that may keep it)."""
    rows = tx.query("SELECT id FROM api_keys WHERE key_hash = ?", (key_hash,))
    if rows and rows[0][0] != key_id:
        raise StoreConflict(f"{what}: the same secret is already used by key {rows[0][0]}")


def read_key_name(tx: Transaction, key_id: str) -> str | None:
    rows = tx.query("SELECT name FROM api_keys WHERE id = ?", (key_id,))
    return None if not rows or rows[0][0] is None else str(rows[0][0])


def read_keys(tx: Transaction, principal: str | None) -> list[KeyInfo]:
    sql = (
        "SELECT k.id, k.name, p.name, k.key_hash, k.created_at, k.expires_at, k.revoked_at, "
        "k.managed_by, k.limit_rpm, k.limit_tpm, k.limit_concurrency "
        "FROM api_keys k JOIN principals p ON p.id = k.principal_id"
    )
    if principal is None:
        rows = tx.query(sql + " ORDER BY p.name, k.created_at, k.id")
    else:
        if not tx.query("SELECT 1 FROM principals WHERE name = ?", (principal,)):
            raise ConfigError(f"no principal named {principal!r}")
        rows = tx.query(sql + " WHERE p.name = ? ORDER BY k.created_at, k.id", (principal,))
    budgets = budgets_by_owner(
        tx.query(f"SELECT key_id, {BUDGET_COLUMNS} FROM key_budgets ORDER BY key_id, seq")
    )
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
            limits=limits_from(r[8:11]),
            budgets=budgets.get(r[0], ()),
        )
        for r in rows
    ]


def read_principals(tx: Transaction, now: float) -> list[PrincipalInfo]:
    """Every principal with its roles, its keys active at ``now``, its limits and budgets."""
    principals = tx.query(f"SELECT id, name, {LIMIT_COLUMNS} FROM principals ORDER BY name")
    budgets = budgets_by_owner(
        tx.query(f"SELECT principal_id, {BUDGET_COLUMNS} FROM principal_budgets ORDER BY principal_id, seq")
    )
    roles = tx.query("SELECT principal_id, role FROM principal_roles ORDER BY role")
    model_limits = tx.query(
        f"SELECT principal_id, model, {LIMIT_COLUMNS} FROM principal_model_limits ORDER BY model"
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
    models_of = model_limits_by_principal(model_limits)
    return [
        PrincipalInfo(
            row[0],
            row[1],
            tuple(by_principal.get(row[0], ())),
            active.get(row[0], 0),
            limits_from(row[2:5]),
            models_of.get(row[0], ()),
            budgets.get(row[0], ()),
        )
        for row in principals
    ]


def read_budgets(tx: Transaction) -> list[BudgetInfo]:
    """Every budget: each principal's (by name), then each unrevoked key's (by principal, then key)."""
    out = [
        BudgetInfo(pid, name, None, None, spec)
        for pid, name, *values in tx.query(
            f"SELECT p.id, p.name, {_prefixed('b')} FROM principal_budgets b "
            "JOIN principals p ON p.id = b.principal_id ORDER BY p.name, b.seq"
        )
        if (spec := budget_from(values)) is not None
    ]
    out += [
        BudgetInfo(pid, name, kid, key_name or kid, spec)
        for pid, name, kid, key_name, *values in tx.query(
            f"SELECT p.id, p.name, k.id, k.name, {_prefixed('b')} FROM key_budgets b "
            "JOIN api_keys k ON k.id = b.key_id JOIN principals p ON p.id = k.principal_id "
            "WHERE k.revoked_at IS NULL ORDER BY p.name, k.created_at, k.id, b.seq"
        )
        if (spec := budget_from(values)) is not None
    ]
    return out


def _prefixed(table: str) -> str:
    return ", ".join(f"{table}.{column.strip()}" for column in BUDGET_COLUMNS.split(","))
