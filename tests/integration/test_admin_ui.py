"""The admin web UI's HTTP side, without a browser: the static files and their security headers (CSP,
nosniff, no framing, ETags), only the shipped files and nothing else, CSRF tokens on cookie-authenticated
writes, the ``Secure`` cookie over TLS, and the usage CSV export the Usage page links to."""

from __future__ import annotations

import http.client
import importlib.resources
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.controlplane import ui
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until
from tests.integration.test_admin_api import ADMIN_ROLES
from tests.integration.test_cluster import _throwaway_ca

FORMULA = "=SUM(1)"  # a principal whose name a spreadsheet would run
EXTRA = ADMIN_ROLES + f'\n[[principals]]\nname = "{FORMULA}"\nroles = ["chatter"]\n'
# What turns a string into markup or code; none of it may appear in the UI's scripts.
HTML_SINKS = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(")
STATIC = importlib.resources.files("gateway.controlplane.ui").joinpath("static")


@dataclass
class Site:
    gw: Gateway
    admin: str
    keys: dict[str, str]

    def bearer(self, who: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[who]}"}

    def login(self, who: str) -> tuple[dict[str, str], str]:
        """A new session: its cookie jar and its CSRF token."""
        answer = httpx.post(self.admin + "/admin/login", json={"key": self.keys[who]}, timeout=10)
        answer.raise_for_status()
        return {"gw_admin_session": answer.cookies["gw_admin_session"]}, answer.json()["csrf_token"]


@pytest.fixture
def site(tmp_path: Path, mock_engine: MockEngine) -> Iterator[Site]:
    port = free_port()
    config = basic_config({"a": mock_engine.url}, extra=EXTRA)
    gw = Gateway(tmp_path, config, workers=1, extra=("--admin-port", str(port)))
    try:
        s = Site(gw, f"http://127.0.0.1:{port}", {w: gw.create_key(w) for w in ("ops", "alice", FORMULA)})
        wait_until(
            lambda: httpx.get(s.admin + "/admin/whoami", headers=s.bearer("ops")).status_code == 200,
            what="admin key live",
        )
        yield s
    finally:
        gw.stop()


def raw_get(base: str, path: str) -> tuple[int, bytes]:
    """GET a path exactly as written: httpx would resolve the dot segments."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_the_shipped_files_are_the_served_ones_and_build_no_html_from_data() -> None:
    assert sorted(ui.ASSETS) == sorted(p.name for p in STATIC.iterdir() if p.is_file())
    for name in ui.ASSETS:
        text = STATIC.joinpath(name).read_text()
        if name.endswith(".js"):
            for sink in HTML_SINKS:
                assert sink not in text, (name, sink)
            assert not re.search(r"setAttribute\(\s*[\"']style", text), name
        if name.endswith(".html"):
            assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", text)), "inline script"
            assert not re.search(r"\son[a-z]+=|\sstyle=|<style", text), "inline handler or style"


def test_the_ui_is_served_with_strict_headers(site: Site) -> None:
    for path in ("/", "/ui"):
        moved = httpx.get(site.admin + path, follow_redirects=False)
        assert moved.status_code == 308 and moved.headers["location"] == "/ui/", path
    page = httpx.get(site.admin + "/ui/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert csp == ui.CSP
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'none'"
    assert "unsafe" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "DENY"
    assert '<script type="module" src="/ui/app.js"></script>' in page.text
    types = {"js": "text/javascript", "css": "text/css", "html": "text/html", "svg": "image/svg+xml"}
    for name in ui.ASSETS:
        got = httpx.get(f"{site.admin}/ui/{name}")
        assert got.status_code == 200, name
        assert got.content == STATIC.joinpath(name).read_bytes()
        assert got.headers["content-type"].startswith(types[name.rsplit(".", 1)[1]])
        assert got.headers["content-security-policy"] == ui.CSP
        etag = got.headers["etag"]
        again = httpx.get(f"{site.admin}/ui/{name}", headers={"if-none-match": etag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    head = httpx.head(site.admin + "/ui/app.js")
    assert head.status_code == 200 and head.content == b""
    assert httpx.post(site.admin + "/ui/app.js").status_code == 405
    for path in (
        "/ui/nope.js",
        "/ui/static/app.js",
        "/ui/app.js/",
        "/ui/APP.JS",
        "/ui/__init__.py",
        "/ui/../__init__.py",
        "/ui/%2e%2e/__init__.py",
        "/ui/..%2f__init__.py",
        "/ui//etc/passwd",
    ):
        status, body = raw_get(site.admin, path)
        assert status in (400, 404), (path, status)
        assert b"import" not in body and b"root:" not in body, path


def test_session_writes_need_the_session_s_csrf_token(site: Site) -> None:
    jar, token = site.login("ops")
    other_jar, other_token = site.login("ops")
    assert token != other_token
    assert (
        "Secure"
        not in httpx.post(site.admin + "/admin/login", json={"key": site.keys["ops"]}).headers["set-cookie"]
    )
    me = httpx.get(site.admin + "/admin/whoami", cookies=jar)
    assert me.json()["csrf_token"] == token  # a reloaded page gets it again
    assert me.headers["x-content-type-options"] == "nosniff" and me.headers["cache-control"] == "no-store"
    assert "csrf_token" not in httpx.get(site.admin + "/admin/whoami", headers=site.bearer("ops")).json()

    def create(**kw: object) -> httpx.Response:
        return httpx.post(site.admin + "/admin/keys", json={"principal": "alice"}, timeout=10, **kw)  # type: ignore[arg-type]

    refused = create(cookies=jar)
    assert refused.status_code == 403 and "x-csrf-token" in refused.json()["error"]["message"]
    assert create(cookies=jar, headers={"x-csrf-token": "0" * 64}).status_code == 403
    assert create(cookies=jar, headers={"x-csrf-token": other_token}).status_code == 403
    made = create(cookies=jar, headers={"x-csrf-token": token})
    assert made.status_code == 201
    # API-key callers carry no ambient credential: no token needed.
    assert create(headers=site.bearer("ops")).status_code == 201
    # Every other write too; reads need no token.
    path = f"{site.admin}/admin/keys/{made.json()['id']}"
    assert httpx.delete(path, cookies=jar).status_code == 403
    assert httpx.delete(path, cookies=jar, headers={"x-csrf-token": token}).status_code == 200
    put = {"url": "http://127.0.0.1:9", "read_timeout": 5.0}
    assert httpx.put(site.admin + "/admin/backends/b", json=put, cookies=jar).status_code == 403
    assert httpx.get(site.admin + "/admin/keys", cookies=jar).status_code == 200
    # Logout needs none: all a forged one can do is end the session.
    assert httpx.post(site.admin + "/admin/logout", cookies=other_jar).json() == {"logged_out": True}


def test_usage_exports_as_csv(site: Site) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for who in ("alice", FORMULA, FORMULA):
        wait_until(
            lambda who=who: (
                httpx.post(
                    site.gw.url + "/v1/chat/completions", json=body, headers=site.bearer(who), timeout=10
                ).status_code
                == 200
            ),
            what=f"a request by {who}",
        )

    def export(query: str) -> httpx.Response:
        return httpx.get(f"{site.admin}/admin/usage?{query}", headers=site.bearer("ops"), timeout=10)

    def requests(answer: httpx.Response) -> int:
        return sum(int(line.split(",")[2]) for line in answer.text.splitlines()[1:])

    deadline = time.monotonic() + 15  # usage records reach the store a moment after the requests
    while requests(answer := export("since=1h&format=csv")) < 3:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.2)
    assert answer.headers["content-type"] == "text/csv; charset=utf-8"
    assert answer.headers["content-disposition"] == 'attachment; filename="usage-by-principal.csv"'
    lines = answer.text.splitlines()
    fields = "requests,errors,prompt_tokens,completion_tokens,total_tokens,cost"
    assert lines[0] == f"bucket_start,principal,{fields}"
    rows = {line.split(",")[1]: line.split(",") for line in lines[1:]}
    assert rows["alice"][0] == "" and rows["alice"][2] == "1"
    assert rows["'" + FORMULA][2] == "2"  # a leading quote: a spreadsheet shows it, never evaluates it
    hourly = export("since=1h&by=model&bucket=hour&format=csv").text.splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:00:00Z,chat,3,0,.*", hourly[1]), hourly
    assert export("format=xml").status_code == 400


def test_the_session_cookie_is_secure_over_tls(tmp_path: Path, mock_engine: MockEngine) -> None:
    ca, cert, key = _throwaway_ca(tmp_path)
    port = free_port()
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}, extra=ADMIN_ROLES),
        workers=1,
        extra=("--admin-port", str(port), "--admin-tls-cert", str(cert), "--admin-tls-key", str(key)),
    )
    try:
        secret = gw.create_key("ops")
        url = f"https://127.0.0.1:{port}"

        def login() -> httpx.Response:
            return httpx.post(url + "/admin/login", json={"key": secret}, verify=str(ca), timeout=10)

        wait_until(lambda: login().status_code == 200, what="login over TLS")
        cookie = login().headers["set-cookie"]
        assert cookie.endswith("; Secure") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        page = httpx.get(url + "/ui/", verify=str(ca), timeout=10)
        assert page.status_code == 200 and page.headers["content-security-policy"] == ui.CSP
    finally:
        gw.stop()
