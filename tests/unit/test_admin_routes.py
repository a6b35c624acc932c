"""The admin API's route table, admitted and dispatched in process: every route asks for the access it
declares, a session write needs its CSRF token (logout excepted), and each route runs its own handler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.controlplane.api import sessions
from gateway.controlplane.api.admin import ROUTES, AdminApi, openapi_document
from gateway.controlplane.api.calls import Access
from gateway.errors import Forbidden, Unauthorized
from gateway.keys import hash_secret

HASH_KEY = b"k" * 32
PERMISSIONS = {
    "ops": ["config:write", "key:create", "key:revoke", "usage:read"],
    "viewer": ["config:read"],
    "finance": ["usage:read"],
    "alice": [],  # model grants only: no admin permission at all
}


@dataclass
class FakeStore:
    sessions: dict[str, str] = field(default_factory=dict)  # token hash -> key id

    def session_key(self, token_hash: str) -> str | None:
        return self.sessions.get(token_hash)


@dataclass
class FakeContext:
    """Just enough of the control worker for admission: the snapshot's keys and principals."""

    store: Any = field(default_factory=FakeStore)
    hash_key: bytes = HASH_KEY

    def current_doc(self) -> dict[str, Any]:
        principals = {
            f"p-{who}": {"name": who, "models": [], **({"permissions": perms} if perms else {})}
            for who, perms in PERMISSIONS.items()
        }
        keys = {
            hash_secret(f"secret-{who}", HASH_KEY).hex(): {"id": f"key-{who}", "principal": f"p-{who}"}
            for who in PERMISSIONS
        }
        return {"principals": principals, "keys": keys}


def _concrete(path: str) -> str:
    return path.replace("{key}", "k1").replace("{name}", "n1").replace("{id}", "r1")


def _bearer(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer secret-{who}"}


def _holds(who: str, permission: str) -> bool:
    perms = PERMISSIONS[who]
    return permission in perms or (permission == "config:read" and "config:write" in perms)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_each_route_asks_for_the_access_it_declares(route: Any) -> None:
    api = AdminApi(FakeContext())  # type: ignore[arg-type]
    path = _concrete(route.path)
    if route.access is Access.OPEN:
        admission = api.admit(route.method, path, {})
        assert admission.caller is None and admission.route is route
        return
    assert route.access.permission is not None or route.access is Access.ANY_ADMIN
    with pytest.raises(Unauthorized):
        api.admit(route.method, path, {})
    with pytest.raises(Forbidden):
        api.admit(route.method, path, _bearer("alice"))
    for who in ("ops", "viewer", "finance"):
        permission = route.access.permission
        if permission is None or _holds(who, permission):
            admission = api.admit(route.method, path, _bearer(who))
            assert (admission.route.method, admission.route.path) == (route.method, route.path)
            assert admission.caller is not None
            assert admission.caller.principal == who
        else:
            with pytest.raises(Forbidden, match=permission):
                api.admit(route.method, path, _bearer(who))


def test_session_writes_need_the_csrf_token_but_logout() -> None:
    ctx = FakeContext()
    api = AdminApi(ctx)  # type: ignore[arg-type]
    token = "tok"
    token_hash = hash_secret("session:" + token, HASH_KEY).hex()
    ctx.store.sessions[token_hash] = "key-ops"
    cookie = {"cookie": f"{sessions.SESSION_COOKIE}={token}"}
    for route in ROUTES:
        if route.access is Access.OPEN or route.method == "GET":
            continue
        path = _concrete(route.path)
        if route.handler is sessions.logout:
            assert api.admit(route.method, path, cookie).caller is not None
            continue
        with pytest.raises(Forbidden, match="x-csrf-token"):
            api.admit(route.method, path, cookie)
        with_token = {**cookie, "x-csrf-token": sessions.csrf_token(ctx, token_hash)}  # type: ignore[arg-type]
        assert api.admit(route.method, path, with_token).caller is not None


def test_a_route_runs_its_own_handler() -> None:
    api = AdminApi(FakeContext())  # type: ignore[arg-type]
    status, _, body = api.handle("GET", "/admin/whoami", "", _bearer("viewer"), b"")
    assert status == 200 and b'"principal":"viewer"' in body
    status, _, body = api.handle("GET", "/admin/openapi.json", "", {}, b"")
    assert status == 200 and body.startswith(b'{"openapi":"3.1.0"')


def test_routes_are_unique_and_named_by_their_handlers() -> None:
    # GET /admin/principals is declared twice, as the principals listing and as the principals entity
    # listing; the first answers, and the OpenAPI document names the second (kept as it was).
    seen: dict[tuple[str, str], int] = {}
    for r in ROUTES:
        seen[(r.method, r.path)] = seen.get((r.method, r.path), 0) + 1
    assert {k for k, n in seen.items() if n > 1} == {("GET", "/admin/principals")}
    doc = openapi_document()
    last = {(r.method, r.path): r for r in ROUTES}
    for r in last.values():
        op = doc["paths"][r.path][r.method.lower()]
        assert op["operationId"] == r.handler.__name__
        assert op.get("x-permission") == r.access.permission
        assert ("security" in op) == (r.access is not Access.OPEN)


@pytest.mark.parametrize(
    ("path", "request_id"),
    [
        ("/admin/requests/r1", "r1"),
        ("/admin/requests/a/b", "a/b"),  # what "/admin/requests/a%2Fb" reaches the app as
        ("/admin/requests//lead", "/lead"),
        ("/admin/requests/trail/", "trail/"),
        ("/admin/requests/a//b", "a//b"),
        ("/admin/requests/q?x=1", "q?x=1"),
        ("/admin/requests/..", ".."),
    ],
)
def test_a_request_id_is_the_rest_of_the_path(path: str, request_id: str) -> None:
    admission = AdminApi(FakeContext()).admit("GET", path, _bearer("finance"))  # type: ignore[arg-type]
    assert admission.route.handler.__name__ == "request_one" and admission.params == {"id": request_id}
    # The list's path is not an id, with its trailing slash or without.
    for listed in ("/admin/requests", "/admin/requests/"):
        assert AdminApi(FakeContext()).admit("GET", listed, _bearer("finance")).params == {}  # type: ignore[arg-type]
