"""The admin API's principals and keys: listings with limits and budgets (never a secret; from the last
snapshot, with ``x-gateway-source: snapshot``, while the store is down), a new key with its own limits and
budgets (its secret answered once), revoking one. Writes are audited with the caller's principal and key.
I/O: the store, through the context.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.controlplane.api.calls import JSON, AdminContext, Call, Reply, actor, json_object, ok, one, write
from gateway.controlplane.config.parser import parse_budgets
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.specs import BudgetSpec, LimitsSpec
from gateway.controlplane.config.values import check_limit, parse_timestamp
from gateway.controlplane.store import MANAGED_BY_API, STORE_OWNER, StoreError
from gateway.errors import BadRequest, ServiceUnavailable

__all__ = ["create_key", "list_keys", "principals", "revoke_key"]


def principals(call: Call) -> Reply:
    store = call.ctx.store
    try:
        rows = store.principals()
        owners = store.owners()
    except StoreError:
        return _from_snapshot(call.ctx, "principals")
    return ok(
        [
            {
                "id": p.id,
                "name": p.name,
                "roles": list(p.roles),
                "active_keys": p.active_keys,
                "limits": _limits(p.limits),
                "model_limits": {m: _limits(spec) for m, spec in p.model_limits},
                # "budget": the first, as this listing showed the one budget a principal could have.
                "budget": _budget(p.budgets[0]) if p.budgets else None,
                "budgets": [_budget(b) for b in p.budgets],
                "owner": owners.get(("principals", p.name), STORE_OWNER),
            }
            for p in rows
        ]
    )


def list_keys(call: Call) -> Reply:
    principal = one(call.query, "principal")
    try:
        keys = call.ctx.store.list_keys(principal)
    except StoreError:
        return _from_snapshot(call.ctx, "keys")
    return ok(
        [
            {
                "id": k.id,
                "name": k.name,
                "principal": k.principal,
                "hash_prefix": k.hash_prefix,
                "status": k.status(),
                "created_at": k.created_at,
                "expires_at": k.expires_at,
                "revoked_at": k.revoked_at,
                "managed_by": k.managed_by,
                "limits": _limits(k.limits),
                "budgets": [_budget(b) for b in k.budgets],
            }
            for k in keys
        ]
    )


def create_key(call: Call) -> Reply:
    ctx = call.ctx
    doc = json_object(call.body)
    principal = doc.get("principal")
    if not isinstance(principal, str):
        raise BadRequest("principal is required", param="principal")
    name = doc.get("name")
    if name is not None and not isinstance(name, str):
        raise BadRequest("name must be a string", param="name")
    expires_at = None
    if doc.get("expires_at") is not None:
        try:
            expires_at = parse_timestamp(doc["expires_at"])
        except ValueError as exc:
            raise BadRequest(f"expires_at {exc}", param="expires_at") from None
    limits = _limits_arg(doc.get("limits"))
    budgets = _budgets_arg(doc)
    by = actor(ctx, call.who)
    key_id, secret = write(
        lambda: ctx.store.create_key(
            principal,
            name,
            expires_at,
            ctx.hash_key,
            limits,
            managed_by=MANAGED_BY_API,
            actor=by,
            budgets=budgets,
        )
    )
    return (
        201,
        JSON,
        orjson.dumps({"id": key_id, "name": name, "principal": principal, "secret": secret}),
    )


def revoke_key(call: Call) -> Reply:
    ctx = call.ctx
    by = actor(ctx, call.who)
    key_id = write(lambda: ctx.store.revoke_key(call.params["key"], actor=by))
    return ok({"id": key_id, "revoked": True})


def _from_snapshot(ctx: AdminContext, what: str) -> Reply:
    doc = ctx.current_doc()
    if doc is None:
        raise ServiceUnavailable("the store is unavailable and no snapshot was built yet")
    if what == "principals":
        body: Any = [
            {"id": pid, "name": p["name"], "permissions": p.get("permissions", []), "models": p["models"]}
            for pid, p in sorted(doc["principals"].items(), key=lambda item: item[1]["name"])
        ]
    else:
        body = [
            {"id": k["id"], "principal": doc["principals"][k["principal"]]["name"], "status": "active"}
            for k in doc["keys"].values()
            if k["principal"] in doc["principals"]
        ]
    return 200, [*JSON, ("x-gateway-source", "snapshot")], orjson.dumps(body)


def _limits(spec: LimitsSpec | None) -> dict[str, int] | None:
    if spec is None:
        return None
    values = {
        "requests_per_minute": spec.requests_per_minute,
        "tokens_per_minute": spec.tokens_per_minute,
        "concurrent_requests": spec.concurrent_requests,
    }
    return {k: v for k, v in values.items() if v is not None}


def _budget(spec: BudgetSpec) -> dict[str, Any]:
    return {"period": spec.period, "tokens": spec.tokens, "cost": spec.cost, "alerts": list(spec.alerts)}


def _budgets_arg(doc: dict[str, Any]) -> tuple[BudgetSpec, ...]:
    """``budget`` (one) and ``budgets`` (several) as a config file's key takes them, checked alike."""
    p = Problems()
    budgets = parse_budgets(p, "key", {k: doc[k] for k in ("budget", "budgets") if k in doc})
    if p.lines:
        param = (p.first_place or "budgets").removeprefix("key.")
        raise BadRequest("; ".join(line.removeprefix("key.") for line in p.lines), param=param)
    return budgets


def _limits_arg(value: Any) -> LimitsSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("limits must be an object", param="limits")
    fields = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")
    unknown = set(value) - set(fields)
    if unknown:
        raise BadRequest(f"unknown limits: {', '.join(sorted(unknown))}", param="limits")
    for name in fields:
        if name in value and (problem := check_limit(value[name])):
            raise BadRequest(f"limits.{name} {problem}", param=f"limits.{name}")
    spec = LimitsSpec(*(value.get(name) for name in fields))
    return None if spec.is_empty() else spec
