"""The configuration as the store holds it, read back: every row of one read transaction for the snapshot
builder (``StoreState``), the same rows as a ``ConfigDoc`` (what ``gateway export`` and the admin API
show, and what an apply merges into), and which config file owns which entry. I/O: the transaction it is
handed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.controlplane.config.routing_rows import routing_from_rows
from gateway.controlplane.config.specs import (
    BackendSpec,
    ConfigDoc,
    KeySpec,
    ModelSpec,
    PrincipalSpec,
    ProviderBackend,
    ProviderModelSpec,
    RoleSpec,
)
from gateway.controlplane.credentials import Vault
from gateway.controlplane.store._columns import (
    BUDGET_COLUMNS,
    KEY_COLUMNS,
    LIMIT_COLUMNS,
    MANAGED_BY_FILE,
    PRICE_COLUMNS,
    Row,
    budgets_by_owner,
    limits_from,
    model_limits_by_principal,
    price_from,
)
from gateway.controlplane.store._credentials import CREDENTIAL_UNREADABLE, open_credential
from gateway.controlplane.store._driver import Transaction
from gateway.controlplane.store._revision import read_revision
from gateway.errors import CredentialError

__all__ = ["StoreState", "read_config_doc", "read_owners", "read_state"]


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
    # (owner id, period, tokens, cost, alerts as JSON) of every principal's and every key's budget, by owner
    # and in declaration order.
    budgets: Sequence[Row] = ()
    key_budgets: Sequence[Row] = ()
    routing: Sequence[Row] = ()  # (kind, name, JSON body): see routing_rows


def read_state(tx: Transaction, vault: Vault | None, include_revoked_keys: bool = False) -> StoreState:
    """The rows, with each backend's credential opened: the snapshot carries it to the proxies. One
    that does not open (a lost secrets key) becomes ``CREDENTIAL_UNREADABLE``, which the snapshot
    builder skips like any bad row."""
    key_sql = f"SELECT {KEY_COLUMNS} FROM api_keys"
    if not include_revoked_keys:
        key_sql += " WHERE revoked_at IS NULL"
    revision = read_revision(tx)
    backends = []
    for row in tx.query(
        "SELECT name, url, protocol, api_key, api_key_env, connect_timeout, first_byte_timeout, "
        "read_timeout FROM backends ORDER BY name"
    ):
        api_key = row[3]
        if isinstance(api_key, str):
            try:
                api_key = open_credential(vault, row[0], api_key)
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
        role_permissions=tx.query("SELECT role, permission FROM role_permissions ORDER BY role, permission"),
        principals=tx.query(f"SELECT id, name, {LIMIT_COLUMNS} FROM principals ORDER BY name"),
        principal_roles=tx.query("SELECT principal_id, role FROM principal_roles ORDER BY role"),
        principal_model_limits=tx.query(
            f"SELECT principal_id, model, {LIMIT_COLUMNS} FROM principal_model_limits "
            "ORDER BY principal_id, model"
        ),
        keys=tx.query(key_sql),
        prices=tx.query(
            f"SELECT name, {PRICE_COLUMNS} FROM models WHERE price_input IS NOT NULL "
            f"UNION ALL SELECT name, {PRICE_COLUMNS} FROM provider_models "
            "WHERE price_input IS NOT NULL ORDER BY 1"
        ),
        budgets=tx.query(
            f"SELECT principal_id, {BUDGET_COLUMNS} FROM principal_budgets ORDER BY principal_id, seq"
        ),
        key_budgets=tx.query(f"SELECT key_id, {BUDGET_COLUMNS} FROM key_budgets ORDER BY key_id, seq"),
        routing=tx.query("SELECT kind, name, body FROM routing_entries ORDER BY kind, name"),
    )


def read_config_doc(tx: Transaction, vault: Vault | None, *, credentials: bool) -> ConfigDoc:
    """The current configuration as a document: what an apply would need to reproduce it.

    Keys come without secrets, and only those the file manages (CLI keys survive an apply anyway).
    Backends come without credentials, which are write-only (``backend_credentials`` says where each came
    from): a backend whose key came from ``api_key_env`` or ``api_key_file`` keeps that name. With
    ``credentials``, each backend's credential is opened instead (for the apply that merges into it,
    never shown); one that does not open is ``CREDENTIAL_UNREADABLE``."""
    st = read_state(tx, vault)
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
    model_limits = model_limits_by_principal(st.principal_model_limits)
    prices = {row[0]: price_from(row[1:4]) for row in st.prices}
    budgets = budgets_by_owner(st.budgets)
    key_budgets = budgets_by_owner(st.key_budgets)
    routing = routing_from_rows(st.routing)
    return ConfigDoc(
        backends=tuple(
            BackendSpec(
                name,
                url,
                protocol,
                _stored_credential(api_key) if credentials else None,
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
                routing.model_priority.get(n),
            )
            for n in st.models
        ),
        roles=tuple(RoleSpec(n, tuple(perms.get(n, ()))) for n in st.roles),
        principals=tuple(
            PrincipalSpec(
                row[1],
                tuple(roles_of.get(row[0], ())),
                limits_from(row[2:5]),
                model_limits.get(row[0], ()),
                budgets.get(row[0], ()),
                routing.principals.get(row[1], {}).get("priority"),
                routing.principals.get(row[1], {}).get("weight"),
            )
            for row in st.principals
        ),
        keys=tuple(
            KeySpec(
                k[1],
                principal_names[k[2]],
                None,
                None if k[5] is None else float(k[5]),
                limits_from(k[8:11]),
                tuple(routing.keys.get(k[1], {}).get("allow_ips", ())),
                _key_models(routing.keys.get(k[1], {})),
                key_budgets.get(k[0], ()),
                routing.keys.get(k[1], {}).get("priority"),
            )
            for k in sorted(st.keys, key=lambda k: str(k[1]))
            if k[7] == MANAGED_BY_FILE and k[1] is not None and k[2] in principal_names
        ),
        pools=routing.pools,
        fallback=routing.fallback,
        prompt_classes=routing.classes,
        body_logs=routing.body_logs,
    )


def read_owners(tx: Transaction) -> dict[tuple[str, str], str]:
    """``(kind, name) -> "file:<path>"`` of every file-owned entry; the rest is the store's."""
    return {(r[0], r[1]): str(r[2]) for r in tx.query("SELECT kind, name, owner FROM config_owners")}


def _stored_credential(value: object) -> Any:
    """A stored credential for the merge: opened, or ``CREDENTIAL_UNREADABLE``, which an apply that does
    not give the backend a new one keeps as it is stored (a lost key must not cost every other write)."""
    return value if isinstance(value, str) or value is CREDENTIAL_UNREADABLE else None


def _key_models(rule: dict[str, Any]) -> tuple[str, ...] | None:
    models = rule.get("models")
    return None if models is None else tuple(models)
