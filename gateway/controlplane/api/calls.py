"""What an admin API handler is given and what it returns, and what every route's table entry says about
who may call it.

A route's ``Access`` is who may call it: nobody needs to authenticate (``OPEN``: the login itself and the
OpenAPI document), any key whose principal holds an admin permission (``ANY_ADMIN``), or a key holding
one permission. A handler is a plain function from one admitted ``Call`` (the control worker's context,
the authenticated caller, the path parameters, the query and the body) to a ``Reply``. The helpers at the
end are the few every handler family uses: a JSON answer, a store write that fails closed, a query
parameter, a JSON object body, and who a write is audited as. No I/O of its own (``write`` and ``actor``
run what they are handed against the store).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.budget import Budget
from gateway.controlplane.store import Store, StoreError
from gateway.controlplane.usage.requests_view import FlightRecorder
from gateway.errors import BadRequest, ConfigError, ServiceUnavailable
from gateway.routing.load import Load
from gateway.snapshot import Snapshot

__all__ = [
    "JSON",
    "Access",
    "AdminCaller",
    "AdminContext",
    "Call",
    "Handler",
    "Reply",
    "actor",
    "json_object",
    "ok",
    "one",
    "write",
]

Reply = tuple[int, list[tuple[str, str]], bytes]
JSON = [("content-type", "application/json")]


class Access(enum.Enum):
    """Who may call a route."""

    OPEN = "open"  # nobody is authenticated: the login itself, the OpenAPI document
    ANY_ADMIN = "any admin key"  # a key whose principal holds at least one admin permission
    CONFIG_READ = "config:read"
    CONFIG_WRITE = "config:write"
    KEY_CREATE = "key:create"
    KEY_REVOKE = "key:revoke"
    USAGE_READ = "usage:read"
    BODIES_READ = "bodies:read"  # logged request and response bodies, beside what usage:read shows

    @property
    def permission(self) -> str | None:
        """The permission a caller must hold, or None (``OPEN``, ``ANY_ADMIN``)."""
        return None if self in (Access.OPEN, Access.ANY_ADMIN) else self.value


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

    def budget_spend(self, budget: Budget, now: float) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True)
class AdminCaller:
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
class Call:
    """One admitted request, as its handler sees it."""

    ctx: AdminContext
    caller: AdminCaller | None  # None on the open routes
    params: dict[str, str]  # the path's captures, and "kind" on the per-entity routes
    query: dict[str, list[str]]
    body: bytes
    # The snapshot the control worker built last, decoded once per document (None before the first).
    snapshot: Callable[[], Snapshot | None]

    @property
    def who(self) -> AdminCaller:
        """The authenticated caller, on every route but the open ones."""
        if self.caller is None:
            raise AssertionError("an open route's handler asked for its caller")
        return self.caller


Handler = Callable[[Call], Reply]


def ok(body: Any) -> Reply:
    return 200, JSON, orjson.dumps(body)


def write(operation: Callable[[], Any]) -> Any:
    """Run a store write; a store that is down fails the request closed with 503."""
    try:
        return operation()
    except ConfigError:
        raise  # the caller's mistake (unknown principal, duplicate name...): its own 400
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable, nothing was written: {exc.message}") from None


def one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    return doc


def actor(ctx: AdminContext, caller: AdminCaller) -> str:
    """Who a write is audited as: the principal and the name of the key it came with (the key's id
    when it has no name). The name is read at write time: writes need the store anyway."""
    try:
        name = ctx.store.key_name(caller.key_id)
    except StoreError:
        name = None
    return f"{caller.principal} (key {name or caller.key_id})"
