"""Who owns a setting, every write audited, provider credentials kept secret (issue 20, items 3-5).

One gateway with a --config file and an admin port; every path that writes to the store is taken in turn
(start-up apply, SIGHUP, ``gateway apply``, ``keys create``/``revoke``, ``secrets rotate``, the admin API's
config, entity, key and session writes) and the audit log read back: one entry each, with its actor
and the names of what changed. The file owns what it declares; the API's entries survive reloads."""

from __future__ import annotations

import getpass
import signal
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until

FILE_SECRET = "sk-provider-from-a-file-0001"
ENV_SECRET = "sk-provider-from-the-env-0002"
INLINE_SECRET = "sk-provider-inline-0003"


def _extra(engine_url: str, key_file: Path) -> str:
    return f"""
[[backends]]
name = "b"
url = "{engine_url}"
api_key_file = "{key_file}"

[[backends]]
name = "c"
url = "{engine_url}"
api_key_env = "C_KEY"

[[backends]]
name = "d"
url = "{engine_url}"
api_key = "{INLINE_SECRET}"

[[provider_models]]
name = "pm-b"
backends = [{{ backend = "b", model = "m" }}]

[[provider_models]]
name = "pm-c"
backends = [{{ backend = "c", model = "m" }}]

[[roles]]
name = "ops"
permissions = ["config:write", "key:create", "key:revoke"]

[[principals]]
name = "ops"
roles = ["ops"]

[[principals]]
name = "dave"
roles = ["chatter"]
"""


class Api:
    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.headers = {"authorization": f"Bearer {key}"}

    def __call__(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers=self.headers, timeout=10, **kw)

    def audit(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self("GET", "/admin/audit?limit=1000").json()
        return entries[::-1]  # oldest first


def _upstream_auth(engine: MockEngine, path_model: str) -> list[str]:
    return [
        r["headers"].get("authorization", "")
        for r in engine.requests()
        if r["path"].endswith("/chat/completions") and orjson.loads(r["body"]).get("model") == path_model
    ]


def test_every_write_is_audited_the_file_owns_what_it_declares_and_credentials_stay_secret(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    key_file = tmp_path / "b.key"
    key_file.write_text(FILE_SECRET + "\n")
    port = free_port()
    config = basic_config({"a": mock_engine.url}, extra=_extra(mock_engine.url, key_file))
    gw = Gateway(tmp_path, config, workers=1, extra=("--admin-port", str(port)), env={"C_KEY": ENV_SECRET})
    me = f"cli:{getpass.getuser()}"
    owner = f"file:{gw.config_path}"
    try:
        ops = gw.cli("keys", "create", "--principal", "ops", "--name", "ops-key").stdout.strip()
        root = gw.cli("keys", "create", "--principal", "root", "--name", "root-key").stdout.strip()
        api = Api(f"http://127.0.0.1:{port}", ops)
        wait_until(lambda: api("GET", "/admin/whoami").status_code == 200, what="admin key live")
        gw.wait_key_live(root)
        as_ops = "ops (key ops-key)"

        # -- item 3: the API adds its own entries; the file's are read-only there -------------------
        assert api("PUT", "/admin/principals/erin", json={"roles": ["chatter"]}).status_code == 201
        refused = api("PUT", "/admin/principals/alice", json={"roles": ["direct"]})
        assert refused.status_code == 409 and str(gw.config_path) in refused.json()["error"]["message"]
        assert api("DELETE", "/admin/backends/d").status_code == 409
        listed = {n: api("GET", f"/admin/principals/{n}").json()["owner"] for n in ("erin", "alice")}
        assert listed == {"erin": "store", "alice": owner}
        made = api("POST", "/admin/keys", json={"principal": "erin", "name": "erin-key"})
        assert made.status_code == 201
        assert api("DELETE", "/admin/keys/erin-key").status_code == 200

        # SIGHUP with a file that drops dave and adds frank: erin (the store's) survives.
        gw.config_path.write_text(config.replace('name = "dave"', 'name = "frank"'))
        gw.signal(signal.SIGHUP)
        wait_until(lambda: "frank" in gw.cli("principals", "list").stdout, timeout=15, what="SIGHUP applied")
        names = gw.cli("principals", "list").stdout
        assert "erin" in names and "dave" not in names

        gw.cli("keys", "revoke", "root-key")
        other = tmp_path / "other.toml"
        other.write_text('[[roles]]\nname = "auditor"\npermissions = ["config:read"]\n')
        assert gw.cli("apply", str(other)).returncode == 0
        assert "auditor" in api("GET", "/admin/roles/auditor").text  # owned by other.toml, kept by both
        rotated = gw.cli("secrets", "rotate")
        assert "re-encrypted 3 credential(s)" in rotated.stderr
        exported = api("GET", "/admin/config").text
        assert api("PUT", "/admin/config", content=exported.encode()).status_code == 200
        login = httpx.post(f"{api.url}/admin/login", json={"key": ops}, timeout=10)
        assert login.status_code == 200
        logout = httpx.post(f"{api.url}/admin/logout", cookies=login.cookies, timeout=10)
        assert logout.status_code == 200

        # -- item 4: one entry per write, with its actor and names ------------------------------------
        entries = api.audit()
        seen = [(e["actor"], e["action"], e["target"]) for e in entries]
        assert seen == [
            (owner, "config.apply", owner),  # the start-up apply
            (me, "key.create", "keys/ops-key"),
            (me, "key.create", "keys/root-key"),
            (as_ops, "principals.put", "principals/erin"),
            (as_ops, "key.create", "keys/erin-key"),
            (as_ops, "key.revoke", "keys/erin-key"),
            (owner, "config.apply", owner),  # SIGHUP
            (me, "key.revoke", "keys/root-key"),
            (me, "config.apply", f"file:{other}"),
            (me, "secrets.rotate", "backends"),
            (as_ops, "config.apply", "config"),
            (as_ops, "session.open", "admin-ui"),
            (as_ops, "session.close", "admin-ui"),
        ], seen
        start = orjson.loads(entries[0]["after"])
        assert start["added"]["principals"] == ["alice", "bob", "dave", "ops", "root"]
        assert start["added"]["backends"] == ["a", "b", "c", "d"]
        assert orjson.loads(entries[6]["after"]) == {
            "added": {"principals": ["frank"]},
            "removed": {"principals": ["dave"]},
        }
        assert orjson.loads(entries[8]["after"]) == {"added": {"roles": ["auditor"]}}
        assert orjson.loads(entries[5]["after"])["principal"] == "erin"
        assert orjson.loads(entries[9]["after"])["backends"] == ["b", "c", "d"]
        assert orjson.loads(entries[10]["after"]) == {}  # the round trip changed nothing

        # -- item 5: credentials are write-only, sealed at rest, and still reach the backend ---------
        for secret in (FILE_SECRET, ENV_SECRET, INLINE_SECRET):
            assert secret not in exported
            assert secret not in api("GET", "/admin/backends").text
            assert all(secret not in (e["after"] or "") + (e["before"] or "") for e in entries)
            assert secret.encode() not in b"".join(
                p.read_bytes() for p in gw.data_dir.glob("gateway.sqlite3*")
            )
        shown = {b["name"]: b for b in api("GET", "/admin/backends").json()}
        assert shown["b"]["api_key_source"] == f"file:{key_file}"
        assert shown["c"]["api_key_source"] == "env:C_KEY" and "api_key" not in shown["c"]
        assert len(shown["d"]["api_key_fingerprint"]) == 8 and "api_key" not in shown["d"]
        assert 'api_key_env = "C_KEY"' in exported
        chat = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
        fresh = gw.cli("keys", "create", "--principal", "root").stdout.strip()
        gw.wait_key_live(fresh)
        for model in ("pm-b", "pm-c"):
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                json={**chat, "model": model},
                headers={"authorization": f"Bearer {fresh}"},
                timeout=10,
            )
            assert r.status_code == 200, r.text
        assert _upstream_auth(mock_engine, "m") == [f"Bearer {FILE_SECRET}", f"Bearer {ENV_SECRET}"]
    finally:
        gw.stop()
    log = gw.log.read_text()
    assert all(secret not in log for secret in (FILE_SECRET, ENV_SECRET, INLINE_SECRET))
