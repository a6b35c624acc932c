"""The admin API under ``/admin/`` on the control worker's admin port.

Authentication is an API key of a principal whose roles grant admin permissions, either on every request
(the automation path: ``Authorization: Bearer <key>``) or once, to open a session (``POST /admin/login``
with ``{"key": ...}`` sets an HttpOnly, SameSite=Strict cookie valid for 8 hours, ``Secure`` when the port
serves TLS; ``POST /admin/logout`` ends it). Keys are checked against the snapshot the control worker
last built, so the key path costs no query and keeps working while the store is down; sessions live in
the store (only a keyed hash of their token), so every control plane of a cluster honours them, and a
session ends with its key. Each route needs one permission:

=====================  ======================================  ===============
route                  what                                    permission
=====================  ======================================  ===============
POST /admin/login      open a session with an admin key        (none)
POST /admin/logout     end the session                         (any admin key)
GET /admin/whoami      the caller's principal and permissions  (any admin key)
GET /admin/principals  principals, roles, limits, budgets      ``config:read``
GET /admin/keys        keys (never secrets); ``?principal=``    ``config:read``
POST /admin/keys       create a key; the secret is shown once  ``key:create``
DELETE /admin/keys/ID  revoke a key by id or name              ``key:revoke``
GET /admin/config      the configuration as TOML               ``config:read``
PUT /admin/config      apply a TOML configuration              ``config:write``
GET /admin/usage       usage per principal/model/key/backend,  ``usage:read``
                       and per minute/hour/day (``?bucket=``),
                       as JSON or CSV (``?format=csv``)
GET /admin/budgets     spend against each budget               ``usage:read``
GET /admin/requests    in flight per worker, and the last      ``usage:read``
                       finished ones with their route traces
GET /admin/requests/ID  one request by its x-request-id        ``usage:read``
GET /admin/audit       the audit log, newest first             ``config:read``
GET /admin/fleet       hosts, workers, backends (reports)      ``config:read``
GET /admin/openapi.json  this API as OpenAPI 3.1               (none)
=====================  ======================================  ===============

``config:write`` implies ``config:read``. A write that comes with the session cookie must also send the
session's CSRF token (``csrf_token`` in the login and whoami answers) in ``x-csrf-token``: SameSite keeps
other sites' requests from carrying the cookie, but not a sibling host's of the same site. Bearer callers
carry no ambient credential and are exempt, and so is logout, which can only end the session.

Writes go to the store in one transaction together with their audit entry (who: the principal and the
key's name; what, when, and the entries changed); when the store is down they fail closed with 503.
Logins and logouts are audited too. Entries a config file owns (``owner`` in the entity listings) are
read-only here: changing or removing one answers 409 naming the file (see ``store._ownership``).
Backend credentials are write-only: listings show where each came from and a fingerprint, never it.
Principal and key listings fall back to the last snapshot when the store is down (``x-gateway-source:
snapshot``). Errors use the OpenAI envelope. I/O: the store.
"""

from __future__ import annotations

import csv
import hmac
import io
import secrets
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import parse_qs

import orjson

from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.specs import LimitsSpec
from gateway.controlplane.config.values import check_limit, parse_timestamp
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.dry_run import SnapshotCache, dry_run
from gateway.controlplane.store import (
    MANAGED_BY_API,
    STORE_OWNER,
    OwnershipConflict,
    Store,
    StoreError,
    describe_owner,
)
from gateway.controlplane.usage.requests_view import FlightRecorder, request_doc
from gateway.controlplane.usage.spend import budget_report, usage_groups
from gateway.controlplane.usage.time_range import since_arg
from gateway.errors import BadRequest, ConfigError, Forbidden, NotFound, ServiceUnavailable, Unauthorized
from gateway.keys import hash_secret
from gateway.routing.load import Load

__all__ = ["OPEN_ROUTE_BODY", "ROUTES", "AdminApi", "AdminContext", "Admission", "openapi_document"]

_JSON = [("content-type", "application/json")]
_BUCKETS = {"minute": 60, "hour": 3600, "day": 86400}
SESSION_COOKIE = "gw_admin_session"
SESSION_TTL = 8 * 3600.0
Reply = tuple[int, list[tuple[str, str]], bytes]
MAX_BODY = 8 * 1024 * 1024  # an admin write: a whole configuration at most
OPEN_ROUTE_BODY = 16 * 1024  # what an unauthenticated request (POST /admin/login) may send: one key


class AdminContext(Protocol):
    """What the admin API needs from the control worker."""

    store: Store
    hash_key: bytes

    def current_doc(self) -> dict[str, Any] | None: ...

    def fleet_view(self) -> list[dict[str, Any]]: ...

    def routing_load(self) -> Load: ...

    def recent_requests(self) -> FlightRecorder: ...

    def live_requests(self) -> list[dict[str, Any]]: ...

    def principal_names(self) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class Caller:
    principal_id: str
    principal: str
    key_id: str
    permissions: frozenset[str]
    session: str | None = None  # the session token's hash, when the caller came with a session cookie

    def holds(self, permission: str) -> bool:
        return permission in self.permissions or (
            permission == "config:read" and "config:write" in self.permissions
        )


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str  # segments; "{name}" captures one
    permission: str | None  # None: any admin key; "" : no authentication at all
    handler: str
    summary: str
    kind: str = ""  # for the per-entity routes: which section of the configuration


@dataclass(frozen=True, slots=True)
class Admission:
    """A request whose route and caller were checked from its head: what its body may then be."""

    route: Route
    params: dict[str, str]
    caller: Caller | None  # None on the open routes (login)
    body_limit: int


ROUTES: tuple[Route, ...] = (
    Route("POST", "/admin/login", "", "login", "Open a session with an admin key (sets a cookie)"),
    Route("POST", "/admin/logout", None, "logout", "End the session"),
    Route("GET", "/admin/whoami", None, "whoami", "The calling principal and its permissions"),
    Route("GET", "/admin/principals", "config:read", "principals", "Principals with roles, limits, budgets"),
    Route("GET", "/admin/keys", "config:read", "list_keys", "API keys (never their secrets)"),
    Route("POST", "/admin/keys", "key:create", "create_key", "Create a key; its secret is returned once"),
    Route("DELETE", "/admin/keys/{key}", "key:revoke", "revoke_key", "Revoke a key by id or name"),
    Route("GET", "/admin/config", "config:read", "get_config", "The configuration as TOML"),
    Route("PUT", "/admin/config", "config:write", "put_config", "Apply a TOML configuration"),
    Route(
        "GET", "/admin/usage", "usage:read", "usage", "Usage totals by principal, model, key, backend or tag"
    ),
    Route("GET", "/admin/budgets", "usage:read", "budgets", "Spend against every budget, current period"),
    Route(
        "GET",
        "/admin/requests",
        "usage:read",
        "requests",
        "Requests in flight on every worker, and the last finished ones with their route traces",
    ),
    Route(
        "GET",
        "/admin/requests/{id}",
        "usage:read",
        "request_one",
        "One finished request by the x-request-id its client got: usage, rule and route trace",
    ),
    Route("GET", "/admin/audit", "config:read", "audit", "The audit log of configuration writes"),
    Route("GET", "/admin/fleet", "config:read", "fleet", "Hosts, workers and backends, from recent reports"),
    Route(
        "POST",
        "/admin/routing/dry-run",
        "config:read",
        "routing_dry_run",
        "Where a request would go (rule, targets) on the current snapshot, sending nothing",
    ),
    Route("GET", "/admin/openapi.json", "", "openapi", "This API as an OpenAPI document"),
    *(
        route
        for kind, what in (
            ("backends", "backend"),
            ("provider_models", "provider model"),
            ("models", "frontend model"),
            ("pools", "model pool"),
            ("roles", "role"),
            ("principals", "principal"),
        )
        for route in (
            Route(
                "GET", f"/admin/{kind}", "config:read", "entity_list", f"Every {what}, as configured", kind
            ),
            Route("GET", f"/admin/{kind}/{{name}}", "config:read", "entity_get", f"One {what}", kind),
            Route(
                "PUT",
                f"/admin/{kind}/{{name}}",
                "config:write",
                "entity_put",
                f"Create or replace a {what}",
                kind,
            ),
            Route(
                "DELETE", f"/admin/{kind}/{{name}}", "config:write", "entity_delete", f"Remove a {what}", kind
            ),
        )
    ),
)


def _match(route: Route, method: str, path: str) -> dict[str, str] | None:
    if route.method != method:
        return None
    want, got = route.path.split("/"), path.rstrip("/").split("/")
    if len(want) != len(got):
        return None
    params: dict[str, str] = {}
    for w, g in zip(want, got, strict=True):
        if w.startswith("{"):
            if not g:
                return None
            params[w[1:-1]] = g
        elif w != g:
            return None
    return params


class AdminApi:
    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx
        self._snapshots = SnapshotCache()

    def handle(
        self, method: str, path: str, query: str, headers: Any, body: bytes, *, secure: bool = False
    ) -> Reply:
        """Answer one request; ``secure``: it came over TLS, so the session cookie gets ``Secure``."""
        return self.answer(self.admit(method, path, headers), query, body, secure=secure)

    def admit(self, method: str, path: str, headers: Any) -> Admission:
        """Find the route and check the caller, from the head alone: the body is read only after this,
        and no further than the admission's ``body_limit``. Raises NotFound, Unauthorized, Forbidden."""
        allowed: list[str] = []
        for route in ROUTES:
            params = _match(route, method, path)
            if params is None:
                if _match(route, route.method, path) is not None:
                    allowed.append(route.method)
                continue
            caller = None if route.permission == "" else self.authenticate(headers)
            if caller is not None and route.permission and not caller.holds(route.permission):
                raise Forbidden(f"{route.method} {route.path} needs the permission {route.permission}")
            if (
                caller is not None
                and caller.session is not None
                and method != "GET"
                and route.handler != "logout"
            ):
                self.check_csrf(caller.session, headers.get("x-csrf-token"))
            if route.kind:
                params["kind"] = route.kind
            # Nobody is authenticated yet on an open route (login): its body is one key, so a stranger
            # never gets more than a few KiB read.
            return Admission(route, params, caller, OPEN_ROUTE_BODY if caller is None else MAX_BODY)
        if allowed:
            raise NotFound(f"{method} is not supported on {path} (use {', '.join(sorted(allowed))})")
        raise NotFound(f"no admin route {path}")

    def answer(self, admission: Admission, query: str, body: bytes, *, secure: bool = False) -> Reply:
        """Run an admitted request's handler on its body."""
        handler: Callable[..., Reply] = getattr(self, admission.route.handler)
        status, out, data = handler(admission.caller, admission.params, parse_qs(query), body)
        if secure:
            out = [(k, f"{v}; Secure" if k == "set-cookie" else v) for k, v in out]
        return status, out, data

    def authenticate(self, headers: Any) -> Caller:
        authorization = headers.get("authorization")
        if authorization and authorization.startswith(("Bearer ", "bearer ")):
            return self.caller_of_key(authorization[7:].strip())
        token = _cookie(headers.get("cookie"), SESSION_COOKIE)
        if token is None:
            raise Unauthorized("Missing admin key: send `Authorization: Bearer <key>`, or log in")
        try:
            key_id = self.ctx.store.session_key(self._token_hash(token))
        except StoreError as exc:
            raise ServiceUnavailable(f"sessions are unavailable while the store is: {exc.message}") from None
        if key_id is None:
            raise Unauthorized("the session expired or ended; log in again")
        doc = self._doc()
        entry = next((k for k in doc["keys"].values() if str(k["id"]) == key_id), None)
        if entry is None:
            raise Unauthorized("the session's key was revoked")
        return replace(self._caller(doc, entry), session=self._token_hash(token))

    def caller_of_key(self, secret: str) -> Caller:
        doc = self._doc()
        entry = doc["keys"].get(hash_secret(secret, self.ctx.hash_key).hex())
        if entry is None:
            raise Unauthorized("Incorrect API key provided")
        return self._caller(doc, entry)

    def _doc(self) -> dict[str, Any]:
        doc = self.ctx.current_doc()
        if doc is None:
            raise ServiceUnavailable("the control plane has not built a snapshot yet")
        return doc

    def _token_hash(self, token: str) -> str:
        return hash_secret("session:" + token, self.ctx.hash_key).hex()

    def csrf_token(self, session: str) -> str:
        """The session's CSRF token: derived from the session (its token's hash), so nothing more is stored
        and every control plane of the cluster computes the same one."""
        return hash_secret("csrf:" + session, self.ctx.hash_key).hex()

    def check_csrf(self, session: str, sent: str | None) -> None:
        if not sent or not hmac.compare_digest(sent.encode(), self.csrf_token(session).encode()):
            raise Forbidden("a write with the session cookie needs the session's x-csrf-token header")

    def _caller(self, doc: dict[str, Any], entry: dict[str, Any]) -> Caller:
        if entry.get("expires_at") is not None and entry["expires_at"] <= time.time():
            raise Unauthorized("This API key has expired")
        principal = doc["principals"].get(entry["principal"])
        if principal is None:
            raise Unauthorized("Incorrect API key provided")
        perms = frozenset(principal.get("permissions", ()))
        if not perms:
            raise Forbidden("this key's principal holds no admin permission")
        return Caller(entry["principal"], principal["name"], str(entry["id"]), perms)

    def _actor(self, caller: Caller) -> str:
        """Who a write is audited as: the principal and the name of the key it came with (the key's id
        when it has no name). The name is read at write time: writes need the store anyway."""
        try:
            name = self.ctx.store.key_name(caller.key_id)
        except StoreError:
            name = None
        return f"{caller.principal} (key {name or caller.key_id})"

    # -- handlers: (caller, path params, query, body) -> reply ----------------------------------------
    def login(self, _caller: None, _params: dict[str, str], _query: Any, body: bytes) -> Reply:
        secret = _json_object(body).get("key")
        if not isinstance(secret, str) or not secret:
            raise BadRequest("key is required", param="key")
        caller = self.caller_of_key(secret)
        token = secrets.token_urlsafe(32)
        expires = _write(
            lambda: self.ctx.store.create_session(self._token_hash(token), caller.key_id, SESSION_TTL)
        )
        _write(lambda: self.ctx.store.audit(self._actor(caller), "session.open", "admin-ui"))
        cookie = (
            f"{SESSION_COOKIE}={token}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={int(SESSION_TTL)}"
        )
        body_out = {
            "principal": caller.principal,
            "permissions": sorted(caller.permissions),
            "expires_at": expires,
            "csrf_token": self.csrf_token(self._token_hash(token)),
        }
        return 200, [*_JSON, ("set-cookie", cookie)], orjson.dumps(body_out)

    def logout(self, caller: Caller, *_: Any) -> Reply:
        session = caller.session
        if session is not None:
            _write(lambda: self.ctx.store.end_session(session))
            _write(lambda: self.ctx.store.audit(self._actor(caller), "session.close", "admin-ui"))
        cookie = f"{SESSION_COOKIE}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0"
        return 200, [*_JSON, ("set-cookie", cookie)], orjson.dumps({"logged_out": session is not None})

    def whoami(self, caller: Caller, *_: Any) -> Reply:
        me = {"principal": caller.principal, "key": caller.key_id, "permissions": sorted(caller.permissions)}
        if caller.session is not None:
            me["csrf_token"] = self.csrf_token(caller.session)
        return _ok(me)

    def principals(self, *_: Any) -> Reply:
        try:
            rows = self.ctx.store.principals()
            owners = self.ctx.store.owners()
        except StoreError:
            return self._from_snapshot("principals")
        return _ok(
            [
                {
                    "id": p.id,
                    "name": p.name,
                    "roles": list(p.roles),
                    "active_keys": p.active_keys,
                    "limits": _limits(p.limits),
                    "model_limits": {m: _limits(spec) for m, spec in p.model_limits},
                    "budget": None
                    if p.budget is None
                    else {"period": p.budget.period, "tokens": p.budget.tokens, "cost": p.budget.cost},
                    "owner": owners.get(("principals", p.name), STORE_OWNER),
                }
                for p in rows
            ]
        )

    def list_keys(
        self, _caller: Caller, _params: dict[str, str], query: dict[str, list[str]], _body: bytes
    ) -> Reply:
        principal = _one(query, "principal")
        try:
            keys = self.ctx.store.list_keys(principal)
        except StoreError:
            return self._from_snapshot("keys")
        return _ok(
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
                }
                for k in keys
            ]
        )

    def create_key(self, caller: Caller, _params: dict[str, str], _query: Any, body: bytes) -> Reply:
        doc = _json_object(body)
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
        actor = self._actor(caller)
        key_id, secret = _write(
            lambda: self.ctx.store.create_key(
                principal,
                name,
                expires_at,
                self.ctx.hash_key,
                limits,
                managed_by=MANAGED_BY_API,
                actor=actor,
            )
        )
        return (
            201,
            _JSON,
            orjson.dumps({"id": key_id, "name": name, "principal": principal, "secret": secret}),
        )

    def revoke_key(self, caller: Caller, params: dict[str, str], *_: Any) -> Reply:
        actor = self._actor(caller)
        key_id = _write(lambda: self.ctx.store.revoke_key(params["key"], actor=actor))
        return _ok({"id": key_id, "revoked": True})

    def get_config(self, *_: Any) -> Reply:
        try:
            text = dump_config(self.ctx.store.config_doc(), "exported by the admin API")
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
        return 200, [("content-type", "application/toml")], text.encode()

    def put_config(self, caller: Caller, _params: dict[str, str], _query: Any, body: bytes) -> Reply:
        try:
            data = tomllib.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise BadRequest(f"body is not TOML: {exc}") from None
        cfg = parse_config(data, "body")
        actor = self._actor(caller)
        store = self.ctx.store
        return _ok(
            {"revision": _write(lambda: store.apply_config(cfg, actor=actor, hash_key=self.ctx.hash_key))}
        )

    def usage(
        self, _caller: Caller, _params: dict[str, str], query: dict[str, list[str]], _body: bytes
    ) -> Reply:
        now = time.time()
        try:
            start = since_arg(_one(query, "since") or "24h", now)
            until = _one(query, "until")
            end = since_arg(until, now) if until else now + 1
        except ConfigError as exc:
            raise BadRequest(exc.message, param="since") from None
        by = _one(query, "by") or "principal"
        if by not in ("principal", "model", "key", "backend", "tag"):
            raise BadRequest("by must be principal, model, key, backend or tag", param="by")
        bucket_name = _one(query, "bucket")
        bucket = _BUCKETS.get(bucket_name) if bucket_name else None
        if bucket_name and bucket is None:
            raise BadRequest("bucket must be minute, hour or day", param="bucket")
        form = _one(query, "format") or "json"
        if form not in ("json", "csv"):
            raise BadRequest("format must be json or csv", param="format")
        try:
            rows = self.ctx.store.usage.summary(start, end, by, bucket)
            purged_before = self.ctx.store.usage.purged_before()
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
        groups = usage_groups(rows)
        if form == "csv":
            disposition = f'attachment; filename="usage-by-{by}.csv"'
            headers = [("content-type", "text/csv; charset=utf-8"), ("content-disposition", disposition)]
            return 200, headers, _usage_csv(by, groups).encode()
        answer = {"since": start, "until": end, "by": by, "bucket": bucket_name, "groups": groups}
        if start < purged_before:  # usage retention purged records of this range: say what is whole
            answer["complete_since"] = purged_before
        return _ok(answer)

    def budgets(self, *_: Any) -> Reply:
        try:
            return _ok(budget_report(self.ctx.store, time.time()))
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None

    def requests(
        self, _caller: Caller, _params: dict[str, str], query: dict[str, list[str]], _body: bytes
    ) -> Reply:
        raw = _one(query, "limit") or "50"
        if not raw.isdigit() or not 0 < int(raw) <= 1000:
            raise BadRequest("limit must be an integer in 1..1000", param="limit")
        status = _one(query, "status")
        if status is not None and status != "error" and not (status.isdigit() and len(status) == 3):
            raise BadRequest("status must be an HTTP status or 'error'", param="status")
        failover = _one(query, "failover") in ("1", "true")
        recorder = self.ctx.recent_requests()
        names = self.ctx.principal_names()
        recent = recorder.latest(int(raw), model=_one(query, "model"), status=status, failover=failover)
        live = self.ctx.live_requests()
        for item in live:
            item["principal"] = names.get(str(item.get("principal_id")))
        return _ok(
            {
                "live": live,
                "recent": [request_doc(r, names) for r in recent],
                "recorder_size": recorder.records.maxlen,
            }
        )

    def request_one(self, _caller: Caller, params: dict[str, str], _query: Any, _body: bytes) -> Reply:
        wanted = params["id"]
        found = self.ctx.recent_requests().find(wanted)
        if not found:
            try:
                found = self.ctx.store.usage.find(wanted)
            except StoreError as exc:
                raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
        if not found:
            raise NotFound(f"no finished request with id {wanted!r} (in flight, or not recorded)")
        names = self.ctx.principal_names()
        doc = request_doc(found[0], names)
        doc["same_id"] = [r.request_id for r in found[1:]]  # a client that reused its x-request-id
        return _ok(doc)

    def audit(
        self, _caller: Caller, _params: dict[str, str], query: dict[str, list[str]], _body: bytes
    ) -> Reply:
        raw = _one(query, "limit") or "100"
        if not raw.isdigit() or not 0 < int(raw) <= 10_000:
            raise BadRequest("limit must be an integer in 1..10000", param="limit")
        try:
            entries = self.ctx.store.audit_log(int(raw))
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
        return _ok(
            [
                {"id": e.id, "ts": e.ts, "actor": e.actor, "action": e.action, "target": e.target,
                 "before": e.before, "after": e.after}
                for e in entries
            ]
        )  # fmt: skip

    # -- one entity of the configuration at a time ---------------------------------------------------
    # The configuration is read as the tables of its TOML form (what `gateway export` writes and what the
    # file format documents), edited, validated whole by the same parser as a file, and applied in one
    # transaction with its audit entry. So every rule a file obeys holds here too (a backend still named
    # by a provider model cannot be removed, a principal must name existing roles, ...).
    # Listings add read-only fields (who owns the entry; where a backend's credential came from and its
    # fingerprint), which a PUT may send back and which are dropped before parsing.
    def _config_tables(self) -> dict[str, Any]:
        try:
            return tomllib.loads(dump_config(self.ctx.store.config_doc()))
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None

    def _shown(self, kind: str) -> list[dict[str, Any]]:
        store = self.ctx.store
        try:
            items: list[dict[str, Any]] = self._config_tables().get(kind, [])
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

    def entity_list(self, _caller: Caller, params: dict[str, str], *_: Any) -> Reply:
        return _ok(self._shown(params["kind"]))

    def entity_get(self, _caller: Caller, params: dict[str, str], *_: Any) -> Reply:
        for item in self._shown(params["kind"]):
            if item.get("name") == params["name"]:
                return _ok(item)
        raise NotFound(f"no {params['kind']} entry named {params['name']!r}")

    def entity_put(self, caller: Caller, params: dict[str, str], _query: Any, body: bytes) -> Reply:
        item = _json_object(body)
        for shown in _READ_ONLY_FIELDS:
            item.pop(shown, None)
        if item.get("name", params["name"]) != params["name"]:
            raise BadRequest("the body's name differs from the one in the path", param="name")
        item["name"] = params["name"]
        return self._edit(caller, params["kind"], params["name"], item)

    def entity_delete(self, caller: Caller, params: dict[str, str], *_: Any) -> Reply:
        return self._edit(caller, params["kind"], params["name"], None)

    def _edit(self, caller: Caller, kind: str, name: str, item: dict[str, Any] | None) -> Reply:
        actor = self._actor(caller)

        def apply() -> tuple[int, int]:
            store = self.ctx.store
            owner = store.owners().get((kind, name), STORE_OWNER)
            if owner != STORE_OWNER:  # the store refuses it too; this names the one entry asked about
                raise OwnershipConflict(
                    f"{kind}/{name} is owned by {describe_owner(owner)}: edit that file and reload it "
                    "(SIGHUP or `gateway apply`); entries made here are the store's and survive reloads"
                )
            tables = self._config_tables()
            section = tables.setdefault(kind, [])
            before = next((i for i in section if i.get("name") == name), None)
            if item is None and before is None:
                raise NotFound(f"no {kind} entry named {name!r}")
            kept = [i for i in section if i.get("name") != name]
            tables[kind] = kept if item is None else [*kept, item]
            cfg = parse_config(tables, kind)
            revision = store.apply_config(
                cfg,
                actor=actor,
                hash_key=self.ctx.hash_key,
                action=f"{kind}.{'delete' if item is None else 'put'}",
                target=f"{kind}/{name}",
                entry=(_redacted(before), _redacted(item)),
            )
            return revision, 201 if before is None else 200

        revision, status = _write(apply)
        return status, _JSON, orjson.dumps({"revision": revision})

    def fleet(self, *_: Any) -> Reply:
        return _ok({"hosts": self.ctx.fleet_view()})

    def routing_dry_run(self, _caller: Caller, _params: Any, _query: Any, body: bytes) -> Reply:
        doc = self.ctx.current_doc()
        if doc is None:
            raise ServiceUnavailable("no snapshot was built yet")
        try:
            request = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        return _ok(dry_run(self._snapshots.get(doc), request, self.ctx.routing_load()))

    def openapi(self, *_: Any) -> Reply:
        return _ok(openapi_document())

    def _from_snapshot(self, what: str) -> Reply:
        doc = self.ctx.current_doc()
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
        return 200, [*_JSON, ("x-gateway-source", "snapshot")], orjson.dumps(body)


_READ_ONLY_FIELDS = ("owner", "api_key_source", "api_key_fingerprint")


def _redacted(item: dict[str, Any] | None) -> str | None:
    """An entry as the audit log keeps it: a credential sent in it is recorded as given, not its value."""
    if item is None:
        return None
    shown = {k: v for k, v in item.items() if k not in _READ_ONLY_FIELDS}
    if "api_key" in shown:
        shown["api_key"] = "(given; write-only)"
    return orjson.dumps(shown).decode()


def _cookie(header: str | None, name: str) -> str | None:
    for part in (header or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value
    return None


_CSV_FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost")


def _usage_csv(by: str, groups: list[dict[str, Any]]) -> str:
    """One row per group (and bucket), the bucket as a UTC ISO 8601 time. A name that a spreadsheet would
    read as a formula (``=``, ``+``, ``-``, ``@``) gets a leading ``'``: names come from callers' configs."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["bucket_start", by, *_CSV_FIELDS])
    for g in groups:
        start = g.get("bucket_start")
        when = "" if start is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        name = "'" + g["group"] if g["group"][:1] in ("=", "+", "-", "@") else g["group"]
        writer.writerow([when, name, *(g[f] for f in _CSV_FIELDS)])
    return out.getvalue()


def _ok(body: Any) -> Reply:
    return 200, _JSON, orjson.dumps(body)


def _write(operation: Callable[[], Any]) -> Any:
    """Run a store write; a store that is down fails the request closed with 503."""
    try:
        return operation()
    except ConfigError:
        raise  # the caller's mistake (unknown principal, duplicate name...): its own 400
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable, nothing was written: {exc.message}") from None


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    return doc


def _limits(spec: LimitsSpec | None) -> dict[str, int] | None:
    if spec is None:
        return None
    values = {
        "requests_per_minute": spec.requests_per_minute,
        "tokens_per_minute": spec.tokens_per_minute,
        "concurrent_requests": spec.concurrent_requests,
    }
    return {k: v for k, v in values.items() if v is not None}


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


def openapi_document() -> dict[str, Any]:
    """The admin API as OpenAPI 3.1, generated from ``ROUTES`` so the two cannot drift."""
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.handler,
            "responses": {
                "200": {"description": "OK"},
                "401": {"description": "no or unknown key"},
                "403": {"description": "the key's principal lacks the permission"},
                "503": {"description": "the store is unavailable (writes)"},
            },
        }
        if (r.kind and r.method in ("PUT", "DELETE")) or r.handler == "put_config":
            op["responses"]["409"] = {"description": "the entry is owned by a config file (owned_by_file)"}
        if r.permission:
            op["x-permission"] = r.permission
            op["security"] = [{"adminKey": []}]
        elif r.permission is None:
            op["security"] = [{"adminKey": []}]
        params = [seg[1:-1] for seg in r.path.split("/") if seg.startswith("{")]
        if params:
            op["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
            ]
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "gateway admin API", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": {"adminKey": {"type": "http", "scheme": "bearer"}}},
    }
