"""The admin API under ``/admin/`` on the control worker's admin port: its routes, each with who may call
it and the handler that answers it, and the admission of a request against them.

Authentication is an API key of a principal whose roles grant admin permissions, either on every request
(the automation path: ``Authorization: Bearer <key>``) or once, to open a session (``POST /admin/login``
with ``{"key": ...}`` sets an HttpOnly, SameSite=Strict cookie valid for 8 hours, ``Secure`` when the port
serves TLS; ``POST /admin/logout`` ends it). Keys are checked against the snapshot the control worker
last built, so the key path costs no query and keeps working while the store is down; sessions live in
the store (only a keyed hash of their token), so every control plane of a cluster honours them, and a
session ends with its key. Each route needs one permission (``ROUTES`` declares each route with its
``Access`` and its handler):

=====================  ======================================  ===============
route                  what                                    permission
=====================  ======================================  ===============
POST /admin/login      open a session with an admin key        (none)
POST /admin/logout     end the session                         (any admin key)
GET /admin/whoami      the caller's principal and permissions  (any admin key)
GET /admin/principals  principals, roles, limits, budgets      ``config:read``
GET /admin/keys        keys (never secrets), limits, budgets;  ``config:read``
                       ``?principal=``
POST /admin/keys       create a key (its limits and budgets);  ``key:create``
                       the secret is shown once
DELETE /admin/keys/ID  revoke a key by id or name              ``key:revoke``
GET /admin/config      the configuration as TOML               ``config:read``
PUT /admin/config      apply a TOML configuration              ``config:write``
GET /admin/usage       usage per principal/model/key/backend,  ``usage:read``
                       and per minute/hour/day (``?bucket=``),
                       as JSON or CSV (``?format=csv``)
GET /admin/usage/rejected  usage records set aside or stored    ``usage:read``
                       clamped (``?limit=``)
GET /admin/budgets     spend in every window of every          ``usage:read``
                       principal's and key's budgets
GET /admin/requests    in flight per worker, and the last      ``usage:read``
                       finished ones with their route traces
GET /admin/requests/ID  one request by its x-request-id        ``usage:read``
                       (with its logged bodies, redacted, for  (``bodies:read``)
                       a caller that also holds bodies:read)
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
snapshot``). Errors use the OpenAI envelope. The handlers live by concept beside this module:
``sessions`` (login, logout, whoami, and authentication), ``keys``, ``configuration`` (the document, its
entries and the audit log), ``reports`` (usage, budgets, requests, the fleet) and ``dry_run``.
I/O: the store, through the handlers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from gateway.controlplane.api import configuration, keys, reports, sessions
from gateway.controlplane.api.calls import Access, AdminCaller, AdminContext, Call, Handler, Reply, ok
from gateway.controlplane.api.dry_run import SnapshotCache, routing_dry_run
from gateway.errors import Forbidden, NotFound
from gateway.snapshot import Snapshot

__all__ = ["OPEN_ROUTE_BODY", "ROUTES", "AdminApi", "AdminRoute", "Admission", "openapi_document"]

MAX_BODY = 8 * 1024 * 1024  # an admin write: a whole configuration at most
OPEN_ROUTE_BODY = 16 * 1024  # what an unauthenticated request (POST /admin/login) may send: one key


@dataclass(frozen=True, slots=True)
class AdminRoute:
    method: str
    path: str  # segments; "{name}" captures one
    access: Access
    handler: Handler  # its name is the route's operationId in the OpenAPI document
    summary: str
    kind: str = ""  # for the per-entity routes: which section of the configuration
    # A write that comes with the session cookie must send the session's CSRF token; logout need not, as
    # it can only end the session.
    csrf: bool = True
    # The last "{name}" takes the rest of the path, "/" and all: a client's x-request-id may hold "/", and
    # granian hands the path percent-decoded, so the "%2F" an admin client sends for it arrives as "/".
    # Such a route has no other parameter.
    rest: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    """A request whose route and caller were checked from its head: what its body may then be."""

    route: AdminRoute
    params: dict[str, str]
    caller: AdminCaller | None  # None on the open routes (login)
    body_limit: int


def openapi(_call: Call) -> Reply:
    return ok(openapi_document())


ROUTES: tuple[AdminRoute, ...] = (
    AdminRoute(
        "POST",
        "/admin/login",
        Access.OPEN,
        sessions.login,
        "Open a session with an admin key (sets a cookie)",
    ),
    AdminRoute("POST", "/admin/logout", Access.ANY_ADMIN, sessions.logout, "End the session", csrf=False),
    AdminRoute(
        "GET", "/admin/whoami", Access.ANY_ADMIN, sessions.whoami, "The calling principal and its permissions"
    ),
    AdminRoute(
        "GET",
        "/admin/principals",
        Access.CONFIG_READ,
        keys.principals,
        "Principals with roles, limits, budgets",
    ),
    AdminRoute("GET", "/admin/keys", Access.CONFIG_READ, keys.list_keys, "API keys (never their secrets)"),
    AdminRoute(
        "POST",
        "/admin/keys",
        Access.KEY_CREATE,
        keys.create_key,
        "Create a key with its own limits and budgets; its secret is returned once",
    ),
    AdminRoute(
        "DELETE", "/admin/keys/{key}", Access.KEY_REVOKE, keys.revoke_key, "Revoke a key by id or name"
    ),
    AdminRoute(
        "GET", "/admin/config", Access.CONFIG_READ, configuration.get_config, "The configuration as TOML"
    ),
    AdminRoute(
        "PUT", "/admin/config", Access.CONFIG_WRITE, configuration.put_config, "Apply a TOML configuration"
    ),
    AdminRoute(
        "GET",
        "/admin/usage",
        Access.USAGE_READ,
        reports.usage,
        "Usage totals by principal, model, key, backend or tag",
    ),
    AdminRoute(
        "GET",
        "/admin/usage/rejected",
        Access.USAGE_READ,
        reports.rejected,
        "Usage records the control worker set aside (could not store) or stored with figures clamped",
    ),
    AdminRoute(
        "GET",
        "/admin/budgets",
        Access.USAGE_READ,
        reports.budgets,
        "Spend in the current window of every principal's and every key's budgets",
    ),
    AdminRoute(
        "GET",
        "/admin/requests",
        Access.USAGE_READ,
        reports.requests,
        "Requests in flight on every worker, and the last finished ones with their route traces",
    ),
    AdminRoute(
        "GET",
        "/admin/requests/{id}",
        Access.USAGE_READ,
        reports.request_one,
        "One finished request by the x-request-id its client got: usage, rule and route trace (and its "
        "logged bodies for a caller holding bodies:read). The id is the rest of the path, percent-encoded "
        "(an id may hold '/', '?', '#' or '%')",
        rest=True,
    ),
    AdminRoute(
        "GET",
        "/admin/audit",
        Access.CONFIG_READ,
        configuration.audit,
        "The audit log of configuration writes",
    ),
    AdminRoute(
        "GET",
        "/admin/fleet",
        Access.CONFIG_READ,
        reports.fleet,
        "Hosts, workers and backends, from recent reports",
    ),
    AdminRoute(
        "POST",
        "/admin/routing/dry-run",
        Access.CONFIG_READ,
        routing_dry_run,
        "Where a request would go (rule, targets) on the current snapshot, and which budget would refuse "
        "it, sending nothing",
    ),
    AdminRoute("GET", "/admin/openapi.json", Access.OPEN, openapi, "This API as an OpenAPI document"),
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
            AdminRoute(
                "GET",
                f"/admin/{kind}",
                Access.CONFIG_READ,
                configuration.entity_list,
                f"Every {what}, as configured",
                kind,
            ),
            AdminRoute(
                "GET",
                f"/admin/{kind}/{{name}}",
                Access.CONFIG_READ,
                configuration.entity_get,
                f"One {what}",
                kind,
            ),
            AdminRoute(
                "PUT",
                f"/admin/{kind}/{{name}}",
                Access.CONFIG_WRITE,
                configuration.entity_put,
                f"Create or replace a {what}",
                kind,
            ),
            AdminRoute(
                "DELETE",
                f"/admin/{kind}/{{name}}",
                Access.CONFIG_WRITE,
                configuration.entity_delete,
                f"Remove a {what}",
                kind,
            ),
        )
    ),
)


def _match(route: AdminRoute, method: str, path: str) -> dict[str, str] | None:
    if route.method != method:
        return None
    if route.rest:
        prefix, _, name = route.path.rpartition("/{")
        prefix += "/"
        if not path.startswith(prefix) or len(path) == len(prefix):
            return None
        return {name[:-1]: path[len(prefix) :]}  # as it came: an id may end in "/"
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
            caller = None if route.access is Access.OPEN else sessions.authenticate(self.ctx, headers)
            permission = route.access.permission
            if caller is not None and permission is not None and not caller.holds(permission):
                raise Forbidden(f"{route.method} {route.path} needs the permission {permission}")
            if caller is not None and caller.session is not None and method != "GET" and route.csrf:
                sessions.check_csrf(self.ctx, caller.session, headers.get("x-csrf-token"))
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
        call = Call(self.ctx, admission.caller, admission.params, parse_qs(query), body, self._snapshot)
        status, out, data = admission.route.handler(call)
        if secure:
            out = [(k, f"{v}; Secure" if k == "set-cookie" else v) for k, v in out]
        return status, out, data

    def _snapshot(self) -> Snapshot | None:
        doc = self.ctx.current_doc()
        return None if doc is None else self._snapshots.get(doc)


def openapi_document() -> dict[str, Any]:
    """The admin API as OpenAPI 3.1, generated from ``ROUTES`` so the two cannot drift."""
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.handler.__name__,
            "responses": {
                "200": {"description": "OK"},
                "401": {"description": "no or unknown key"},
                "403": {"description": "the key's principal lacks the permission"},
                "503": {"description": "the store is unavailable (writes)"},
            },
        }
        if (r.kind and r.method in ("PUT", "DELETE")) or r.handler is configuration.put_config:
            op["responses"]["409"] = {"description": "the entry is owned by a config file (owned_by_file)"}
        if r.access.permission is not None:
            op["x-permission"] = r.access.permission
        if r.access is not Access.OPEN:
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
