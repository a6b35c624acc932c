"""The admin API's configuration: the whole document as TOML (``GET`` / ``PUT /admin/config``), one entry at
a time (``/admin/{backends,provider_models,models,pools,roles,principals}/NAME``), and the audit log.

An entry is edited on the tables of the configuration's TOML form (what ``gateway export`` writes and what
the file format documents), then the whole is validated by the same parser as a file and applied in one
transaction with its audit entry. So every rule a file obeys holds here too (a backend still named by a
provider model cannot be removed, a principal must name existing roles, ...). Listings add read-only
fields (who owns the entry; where a backend's credential came from and its fingerprint), which a PUT may
send back and which are dropped before parsing. Entries a config file owns are read-only here (409,
naming the file). I/O: the store, through the context.
"""

from __future__ import annotations

import tomllib
from typing import Any

import orjson

from gateway.controlplane.api.calls import (
    JSON,
    AdminCaller,
    AdminContext,
    Call,
    Reply,
    actor,
    json_object,
    ok,
    one,
    write,
)
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.store import STORE_OWNER, OwnershipConflict, StoreError, describe_owner
from gateway.errors import BadRequest, NotFound, ServiceUnavailable

__all__ = [
    "audit",
    "entity_delete",
    "entity_get",
    "entity_list",
    "entity_put",
    "get_config",
    "put_config",
]

_READ_ONLY_FIELDS = ("owner", "api_key_source", "api_key_fingerprint")


def get_config(call: Call) -> Reply:
    try:
        text = dump_config(call.ctx.store.config_doc(), "exported by the admin API")
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
    return 200, [("content-type", "application/toml")], text.encode()


def put_config(call: Call) -> Reply:
    ctx = call.ctx
    try:
        data = tomllib.loads(call.body.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadRequest(f"body is not TOML: {exc}") from None
    cfg = parse_config(data, "body")
    by = actor(ctx, call.who)
    store = ctx.store
    return ok({"revision": write(lambda: store.apply_config(cfg, actor=by, hash_key=ctx.hash_key))})


def audit(call: Call) -> Reply:
    raw = one(call.query, "limit") or "100"
    if not raw.isdigit() or not 0 < int(raw) <= 10_000:
        raise BadRequest("limit must be an integer in 1..10000", param="limit")
    try:
        entries = call.ctx.store.audit_log(int(raw))
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
    return ok(
        [
            {"id": e.id, "ts": e.ts, "actor": e.actor, "action": e.action, "target": e.target,
             "before": e.before, "after": e.after}
            for e in entries
        ]
    )  # fmt: skip


# -- one entry at a time ---------------------------------------------------------------------------------


def entity_list(call: Call) -> Reply:
    return ok(_shown(call.ctx, call.params["kind"]))


def entity_get(call: Call) -> Reply:
    params = call.params
    for item in _shown(call.ctx, params["kind"]):
        if item.get("name") == params["name"]:
            return ok(item)
    raise NotFound(f"no {params['kind']} entry named {params['name']!r}")


def entity_put(call: Call) -> Reply:
    params = call.params
    item = json_object(call.body)
    for shown in _READ_ONLY_FIELDS:
        item.pop(shown, None)
    if item.get("name", params["name"]) != params["name"]:
        raise BadRequest("the body's name differs from the one in the path", param="name")
    item["name"] = params["name"]
    return _edit(call.ctx, call.who, params["kind"], params["name"], item)


def entity_delete(call: Call) -> Reply:
    return _edit(call.ctx, call.who, call.params["kind"], call.params["name"], None)


def _config_tables(ctx: AdminContext) -> dict[str, Any]:
    try:
        return tomllib.loads(dump_config(ctx.store.config_doc()))
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None


def _shown(ctx: AdminContext, kind: str) -> list[dict[str, Any]]:
    store = ctx.store
    try:
        items: list[dict[str, Any]] = _config_tables(ctx).get(kind, [])
        owners = store.owners()
        credentials = store.backend_credentials() if kind == "backends" else {}
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
    for item in items:
        item["owner"] = owners.get((kind, item["name"]), STORE_OWNER)
        credential = credentials.get(item["name"])
        if credential is not None:
            item["api_key_source"] = credential.source
            item["api_key_fingerprint"] = credential.fingerprint
    return items


def _edit(ctx: AdminContext, caller: AdminCaller, kind: str, name: str, item: dict[str, Any] | None) -> Reply:
    by = actor(ctx, caller)

    def apply() -> tuple[int, int]:
        store = ctx.store
        owner = store.owners().get((kind, name), STORE_OWNER)
        if owner != STORE_OWNER:  # the store refuses it too; this names the one entry asked about
            raise OwnershipConflict(
                f"{kind}/{name} is owned by {describe_owner(owner)}: edit that file and reload it "
                "(SIGHUP or `gateway apply`); entries made here are the store's and survive reloads"
            )
        tables = _config_tables(ctx)
        section = tables.setdefault(kind, [])
        before = next((i for i in section if i.get("name") == name), None)
        if item is None and before is None:
            raise NotFound(f"no {kind} entry named {name!r}")
        kept = [i for i in section if i.get("name") != name]
        tables[kind] = kept if item is None else [*kept, item]
        cfg = parse_config(tables, kind)
        revision = store.apply_config(
            cfg,
            actor=by,
            hash_key=ctx.hash_key,
            action=f"{kind}.{'delete' if item is None else 'put'}",
            target=f"{kind}/{name}",
            entry=(_redacted(before), _redacted(item)),
        )
        return revision, 201 if before is None else 200

    revision, status = write(apply)
    return status, JSON, orjson.dumps({"revision": revision})


def _redacted(item: dict[str, Any] | None) -> str | None:
    """An entry as the audit log keeps it: a credential sent in it is recorded as given, not its value."""
    if item is None:
        return None
    shown = {k: v for k, v in item.items() if k not in _READ_ONLY_FIELDS}
    if "api_key" in shown:
        shown["api_key"] = "(given; write-only)"
    return orjson.dumps(shown).decode()
