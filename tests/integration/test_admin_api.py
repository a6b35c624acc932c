"""The admin API on the control worker's admin port: every route checks its permission, keys made and
revoked through it take effect on the proxies, config writes are applied and audited."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.controlplane.api.admin import ROUTES
from gateway.controlplane.api.calls import Access
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until

ADMIN_ROLES = """
[[roles]]
name = "operator"
permissions = ["config:write", "key:create", "key:revoke", "usage:read"]

[[roles]]
name = "reader"
permissions = ["config:read"]

[[roles]]
name = "accountant"
permissions = ["usage:read"]

[[principals]]
name = "ops"
roles = ["operator"]

[[principals]]
name = "viewer"
roles = ["reader"]

[[principals]]
name = "finance"
roles = ["accountant"]
"""

PERMISSIONS_OF = {
    "ops": {"config:write", "config:read", "key:create", "key:revoke", "usage:read"},
    "viewer": {"config:read"},
    "finance": {"usage:read"},
}


@dataclass
class Admin:
    gw: Gateway
    url: str
    keys: dict[str, str]

    def call(self, method: str, path: str, who: str | None, **kw: object) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.keys[who]}"} if who else {}
        return httpx.request(method, self.url + path, headers=headers, timeout=10, **kw)  # type: ignore[arg-type]


@pytest.fixture
def admin(tmp_path: Path, mock_engine: MockEngine) -> Iterator[Admin]:
    port = free_port()
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}, extra=ADMIN_ROLES),
        workers=1,
        extra=("--admin-port", str(port)),
    )
    try:
        keys = {name: gw.create_key(name) for name in ("ops", "viewer", "finance", "alice")}
        a = Admin(gw, f"http://127.0.0.1:{port}", keys)
        # alice's key is created last: once it is known (403, not 401), all of them are.
        wait_until(lambda: a.call("GET", "/admin/whoami", "alice").status_code == 403, what="keys live")
        yield a
    finally:
        gw.stop()


def _concrete(path: str) -> str:
    return (
        path.replace("{key}", "no-such-key").replace("{name}", "no-such-name").replace("{id}", "no-such-id")
    )


def test_every_route_checks_its_permission(admin: Admin) -> None:
    for route in ROUTES:
        path = _concrete(route.path)
        body = {"content": b"{}"} if route.method in ("POST", "PUT") else {}
        if route.access is Access.OPEN:  # the OpenAPI document, and the login itself
            assert admin.call(route.method, path, None, **body).status_code not in (401, 403), route
            continue
        assert admin.call(route.method, path, None, **body).status_code == 401, route
        assert admin.call(route.method, path, "alice", **body).status_code == 403, route  # model grants only
        for who, perms in PERMISSIONS_OF.items():
            status = admin.call(route.method, path, who, **body).status_code
            if route.access.permission is None or route.access.permission in perms:
                assert status not in (401, 403), (route, who, status)
            else:
                assert status == 403, (route, who, status)


def test_a_key_made_through_the_api_works_and_revoking_it_stops_it(admin: Admin) -> None:
    made = admin.call("POST", "/admin/keys", "ops", json={"principal": "alice", "name": "via-api"})
    assert made.status_code == 201
    secret = made.json()["secret"]
    chat = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}

    def status() -> int:
        return httpx.post(
            admin.gw.url + "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {secret}"}
        ).status_code

    wait_until(lambda: status() == 200, timeout=5, what="new key live")
    listed = admin.call("GET", "/admin/keys?principal=alice", "viewer").json()
    assert {k["name"] for k in listed} >= {"via-api"}
    assert all("secret" not in k for k in listed)
    assert admin.call("DELETE", "/admin/keys/via-api", "ops").json() == {
        "id": made.json()["id"],
        "revoked": True,
    }
    wait_until(lambda: status() == 401, timeout=5, what="revoked key refused")
    audit = admin.call("GET", "/admin/audit", "viewer").json()
    assert [(e["action"], e["target"]) for e in audit[:2]] == [
        ("key.revoke", "keys/via-api"),
        ("key.create", "keys/via-api"),
    ]
    assert audit[0]["actor"].startswith("ops (key ")
    assert admin.call("POST", "/admin/keys", "ops", json={"principal": "nobody"}).status_code == 400
    assert admin.call("POST", "/admin/keys", "ops", content=b"[1]").status_code == 400
    assert (
        admin.call(
            "POST", "/admin/keys", "ops", json={"principal": "alice", "limits": {"rpm": 1}}
        ).status_code
        == 400
    )


def test_config_round_trips_and_is_audited(admin: Admin) -> None:
    exported = admin.call("GET", "/admin/config", "viewer")
    assert exported.status_code == 200 and exported.headers["content-type"] == "application/toml"
    # The --config file owns "chat": a whole document that changes it is refused, naming the file.
    changed = exported.text.replace('aliases = ["gpt-4o-mini"]', 'aliases = ["gpt-4o-mini", "assistant"]')
    refused = admin.call("PUT", "/admin/config", "ops", content=changed.encode())
    assert refused.status_code == 409, refused.text
    assert str(admin.gw.config_path) in refused.json()["error"]["message"]
    # Adding a model of the store's own is fine, and the audit entry names what was added.
    added = exported.text + '\n[[models]]\nname = "assistant"\nchain = ["pm-a"]\n'
    applied = admin.call("PUT", "/admin/config", "ops", content=added.encode())
    assert applied.status_code == 200 and applied.json()["revision"] > 0
    entry = admin.call("GET", "/admin/audit?limit=1", "ops").json()[0]
    assert (entry["action"], entry["target"]) == ("config.apply", "config")
    assert entry["actor"].startswith("ops (key ")
    assert orjson.loads(entry["after"]) == {"added": {"models": ["assistant"]}}
    bad = admin.call("PUT", "/admin/config", "ops", content=b"[[backends]]\nname = 1\n")
    assert bad.status_code == 400 and "backends[0].name" in bad.json()["error"]["message"]


def test_usage_and_openapi(admin: Admin) -> None:
    usage = admin.call("GET", "/admin/usage?since=1h&by=model", "finance")
    assert usage.status_code == 200 and usage.json()["by"] == "model"
    assert admin.call("GET", "/admin/usage?by=colour", "finance").status_code == 400
    assert admin.call("GET", "/admin/usage?bucket=week", "finance").status_code == 400
    hourly = admin.call("GET", "/admin/usage?bucket=hour", "finance").json()
    assert hourly["bucket"] == "hour" and all("bucket_start" in g for g in hourly["groups"])
    doc = httpx.get(admin.url + "/admin/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert {(p, m.upper()) for p, ops in doc["paths"].items() for m in ops} == {
        (r.path, r.method) for r in ROUTES
    }


def test_sessions_carry_the_key_s_permissions_and_end_with_it(admin: Admin) -> None:
    def login(who: str) -> httpx.Response:
        return httpx.post(admin.url + "/admin/login", json={"key": admin.keys[who]}, timeout=10)

    assert login("alice").status_code == 403  # model grants only: no session
    assert httpx.post(admin.url + "/admin/login", json={"key": "sk-gw-nope"}).status_code == 401
    viewer = login("viewer")
    assert viewer.status_code == 200 and viewer.json()["permissions"] == ["config:read"]
    set_cookie = viewer.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/admin" in set_cookie
    jar = {"gw_admin_session": viewer.cookies["gw_admin_session"]}
    assert httpx.get(admin.url + "/admin/principals", cookies=jar).status_code == 200
    assert httpx.post(admin.url + "/admin/keys", cookies=jar, json={"principal": "alice"}).status_code == 403
    out = httpx.post(admin.url + "/admin/logout", cookies=jar)
    assert out.json() == {"logged_out": True} and "Max-Age=0" in out.headers["set-cookie"]
    assert httpx.get(admin.url + "/admin/principals", cookies=jar).status_code == 401
    # A session ends with its key.
    ops = {"gw_admin_session": login("ops").cookies["gw_admin_session"]}
    assert httpx.get(admin.url + "/admin/whoami", cookies=ops).json()["principal"] == "ops"
    ops_id = httpx.get(admin.url + "/admin/whoami", cookies=ops).json()["key"]
    assert admin.call("DELETE", f"/admin/keys/{ops_id}", "ops").status_code == 200
    wait_until(
        lambda: httpx.get(admin.url + "/admin/whoami", cookies=ops).status_code == 401, what="session ended"
    )


def test_configuration_one_entity_at_a_time(admin: Admin, mock_engine: MockEngine) -> None:
    assert [b["name"] for b in admin.call("GET", "/admin/backends", "viewer").json()] == ["a"]
    put = admin.call("PUT", "/admin/backends/b", "ops", json={"url": mock_engine.url, "read_timeout": 30.0})
    assert put.status_code == 201
    assert admin.call("GET", "/admin/backends/b", "viewer").json()["url"] == mock_engine.url
    assert (
        admin.call("PUT", "/admin/provider_models/pm-b", "ops", json={"backends": ["b"]}).status_code == 201
    )
    chat = admin.call("GET", "/admin/models/chat", "viewer").json()
    assert chat["owner"] == f"file:{admin.gw.config_path}"
    chat["chain"] = [*chat["chain"], "pm-b"]
    owned = admin.call("PUT", "/admin/models/chat", "ops", json=chat)
    assert owned.status_code == 409 and str(admin.gw.config_path) in owned.json()["error"]["message"]
    assert admin.call("DELETE", "/admin/principals/alice", "ops").status_code == 409
    chat2 = {"name": "chat2", "chain": ["pm-a", "pm-b"]}
    assert admin.call("PUT", "/admin/models/chat2", "ops", json=chat2).status_code == 201
    shown = admin.call("GET", "/admin/models/chat2", "viewer").json()
    assert shown["owner"] == "store"
    shown["chain"] = ["pm-b"]
    assert admin.call("PUT", "/admin/models/chat2", "ops", json=shown).status_code == 200
    # The file's rules hold: what is still referenced cannot go, and bad fields are named.
    refused = admin.call("DELETE", "/admin/backends/b", "ops")
    assert refused.status_code == 400 and "unknown backend 'b'" in refused.json()["error"]["message"]
    bad = admin.call("PUT", "/admin/backends/c", "ops", json={"url": "ftp://x"})
    assert bad.status_code == 400 and "backends[2].url: must be an http" in bad.json()["error"]["message"]
    assert (
        admin.call("PUT", "/admin/backends/c", "ops", json={"name": "d", "url": mock_engine.url}).status_code
        == 400
    )
    assert admin.call("DELETE", "/admin/roles/no-such-role", "ops").status_code == 404
    # A new principal, usable at once.
    assert (
        admin.call("PUT", "/admin/principals/newbie", "ops", json={"roles": ["chatter"]}).status_code == 201
    )
    made = admin.call("POST", "/admin/keys", "ops", json={"principal": "newbie"})
    assert made.status_code == 201
    entry = admin.call("GET", "/admin/audit?limit=20", "viewer").json()
    assert ("principals.put", "principals/newbie") in {(e["action"], e["target"]) for e in entry}
    assert ("models.put", "models/chat2") in {(e["action"], e["target"]) for e in entry}
