"""Who calls the admin API: an admin key on every request (``Authorization: Bearer <key>``), or a session
opened with one (``POST /admin/login``), and the login, logout and whoami routes.

Keys are checked against the snapshot the control worker last built, so the key path costs no query and
keeps working while the store is down. A session lives in the store as a keyed hash of its token, so
every control plane of a cluster honours it, and it ends with its key. Its cookie is HttpOnly and
SameSite=Strict, valid for 8 hours (``Secure`` is added when the port serves TLS). Its CSRF token is
derived from the session, so nothing more is stored. I/O: the store (sessions), through the context.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import replace
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
    write,
)
from gateway.controlplane.store import StoreError
from gateway.errors import BadRequest, Forbidden, ServiceUnavailable, Unauthorized
from gateway.keys import hash_secret

__all__ = [
    "SESSION_COOKIE",
    "SESSION_TTL",
    "authenticate",
    "caller_of_key",
    "check_csrf",
    "csrf_token",
    "login",
    "logout",
    "whoami",
]

SESSION_COOKIE = "gw_admin_session"
SESSION_TTL = 8 * 3600.0


def authenticate(ctx: AdminContext, headers: Any) -> AdminCaller:
    """The caller of a request, from its bearer key or its session cookie. Raises Unauthorized (and
    ServiceUnavailable for a session while the store is down)."""
    authorization = headers.get("authorization")
    if authorization and authorization.startswith(("Bearer ", "bearer ")):
        return caller_of_key(ctx, authorization[7:].strip())
    token = _cookie(headers.get("cookie"), SESSION_COOKIE)
    if token is None:
        raise Unauthorized("Missing admin key: send `Authorization: Bearer <key>`, or log in")
    try:
        key_id = ctx.store.session_key(_token_hash(ctx, token))
    except StoreError as exc:
        raise ServiceUnavailable(f"sessions are unavailable while the store is: {exc.message}") from None
    if key_id is None:
        raise Unauthorized("the session expired or ended; log in again")
    doc = _doc(ctx)
    entry = next((k for k in doc["keys"].values() if str(k["id"]) == key_id), None)
    if entry is None:
        raise Unauthorized("the session's key was revoked")
    return replace(_caller(doc, entry), session=_token_hash(ctx, token))


def caller_of_key(ctx: AdminContext, secret: str) -> AdminCaller:
    doc = _doc(ctx)
    entry = doc["keys"].get(hash_secret(secret, ctx.hash_key).hex())
    if entry is None:
        raise Unauthorized("Incorrect API key provided")
    return _caller(doc, entry)


def csrf_token(ctx: AdminContext, session: str) -> str:
    """The session's CSRF token: derived from the session (its token's hash), so nothing more is stored
    and every control plane of the cluster computes the same one."""
    return hash_secret("csrf:" + session, ctx.hash_key).hex()


def check_csrf(ctx: AdminContext, session: str, sent: str | None) -> None:
    if not sent or not hmac.compare_digest(sent.encode(), csrf_token(ctx, session).encode()):
        raise Forbidden("a write with the session cookie needs the session's x-csrf-token header")


def _doc(ctx: AdminContext) -> dict[str, Any]:
    doc = ctx.current_doc()
    if doc is None:
        raise ServiceUnavailable("the control plane has not built a snapshot yet")
    return doc


def _token_hash(ctx: AdminContext, token: str) -> str:
    return hash_secret("session:" + token, ctx.hash_key).hex()


def _caller(doc: dict[str, Any], entry: dict[str, Any]) -> AdminCaller:
    if entry.get("expires_at") is not None and entry["expires_at"] <= time.time():
        raise Unauthorized("This API key has expired")
    principal = doc["principals"].get(entry["principal"])
    if principal is None:
        raise Unauthorized("Incorrect API key provided")
    perms = frozenset(principal.get("permissions", ()))
    if not perms:
        raise Forbidden("this key's principal holds no admin permission")
    return AdminCaller(entry["principal"], principal["name"], str(entry["id"]), perms)


def _cookie(header: str | None, name: str) -> str | None:
    for part in (header or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value
    return None


# -- handlers --------------------------------------------------------------------------------------------


def login(call: Call) -> Reply:
    ctx = call.ctx
    secret = json_object(call.body).get("key")
    if not isinstance(secret, str) or not secret:
        raise BadRequest("key is required", param="key")
    caller = caller_of_key(ctx, secret)
    token = secrets.token_urlsafe(32)
    expires = write(lambda: ctx.store.create_session(_token_hash(ctx, token), caller.key_id, SESSION_TTL))
    write(lambda: ctx.store.audit(actor(ctx, caller), "session.open", "admin-ui"))
    cookie = f"{SESSION_COOKIE}={token}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={int(SESSION_TTL)}"
    body_out = {
        "principal": caller.principal,
        "permissions": sorted(caller.permissions),
        "expires_at": expires,
        "csrf_token": csrf_token(ctx, _token_hash(ctx, token)),
    }
    return 200, [*JSON, ("set-cookie", cookie)], orjson.dumps(body_out)


def logout(call: Call) -> Reply:
    ctx, caller = call.ctx, call.who
    session = caller.session
    if session is not None:
        write(lambda: ctx.store.end_session(session))
        write(lambda: ctx.store.audit(actor(ctx, caller), "session.close", "admin-ui"))
    cookie = f"{SESSION_COOKIE}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0"
    return 200, [*JSON, ("set-cookie", cookie)], orjson.dumps({"logged_out": session is not None})


def whoami(call: Call) -> Reply:
    caller = call.who
    me = {"principal": caller.principal, "key": caller.key_id, "permissions": sorted(caller.permissions)}
    if caller.session is not None:
        me["csrf_token"] = csrf_token(call.ctx, caller.session)
    return ok(me)
