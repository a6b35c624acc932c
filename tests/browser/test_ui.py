"""The admin web UI in headless Chromium, against a running gateway with a mock engine: sign in, create a
key, call the gateway with it through the openai SDK, see its usage, revoke it and see it refused; each
page's permissions (absent controls, and the API's 403 behind them); names that look like HTML shown as
text. Every page is screenshotted to ``build/screenshots/``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.processes import ROOT, Gateway, MockEngine, basic_config, free_port, wait_until
from tests.integration.test_admin_api import ADMIN_ROLES
from tests.integration.test_make_run import demo_admin

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips these tests (or, under GATEWAY_TEST_STRICT=1, fails them)
    expect = None

pytestmark = pytest.mark.browser

# Names are free of whitespace (the config's rule), so the markup uses "/" between attributes.
XSS_MODEL = "<img/src/onerror=window.__xss=1>"
XSS_PRINCIPAL = "<svg/onload=window.__xss=2>"
XSS_KEY = "<img/src/onerror=window.__xss=3>"

EXTRA = (
    ADMIN_ROLES
    + f"""
[[models]]
name = "{XSS_MODEL}"
chain = ["pm-a"]

[[principals]]
name = "{XSS_PRINCIPAL}"
roles = ["chatter"]
budget = {{ period = "month", tokens = 1000000 }}

[[roles]]
name = "body-reader"
permissions = ["usage:read", "bodies:read"]

[[principals]]
name = "auditor"
roles = ["body-reader"]

[[body_logs]]
name = "odd-principal"
principals = ["{XSS_PRINCIPAL}"]
"""
)

PAGES = {
    "fleet": "Fleet",
    "models": "Models",
    "keys": "Keys & principals",
    "usage": "Usage",
    "requests": "Requests",
    "audit": "Audit log",
}
# What shows that a page finished loading (the element a table or its empty note carries).
LOADED = {
    "fleet": "#hosts",
    "models": "#models",
    "keys": "#keys",
    "usage": "#budgets",
    "requests": "#recent-requests",
    "audit": "#audit",
}
WRITE_CONTROLS = "main .write, main #create-key, main #principal-editor, main .revoke"
WRITES = [
    ("POST", "/admin/keys", '{"principal": "alice"}'),
    ("DELETE", "/admin/keys/no-such-key", None),
    ("PUT", "/admin/principals/mallory", '{"roles": []}'),
    ("DELETE", "/admin/models/chat", None),
    ("PUT", "/admin/config", ""),
]


@dataclass
class Site:
    gw: Gateway
    admin: str  # the admin port's base URL
    keys: dict[str, str]


def chat(gw: Gateway, secret: str) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(
        gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"}, timeout=10
    ).status_code


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("ui")
    engine = MockEngine(tmp)
    gw: Gateway | None = None
    try:
        port = free_port()
        config = basic_config({"a": engine.url}, extra=EXTRA, price="{ input = 1.0, output = 2.0 }")
        gw = Gateway(tmp, config, workers=1, extra=("--admin-port", str(port)))
        keys = {who: gw.create_key(who) for who in ("ops", "viewer", "finance", "auditor", XSS_PRINCIPAL)}
        site = Site(gw, f"http://127.0.0.1:{port}", keys)
        finance = {"authorization": f"Bearer {keys['finance']}"}
        wait_until(
            lambda: httpx.get(site.admin + "/admin/whoami", headers=finance).status_code == 200,
            what="admin keys live",
        )
        proxy = gw
        wait_until(lambda: chat(proxy, keys[XSS_PRINCIPAL]) == 200, what="a request by the odd principal")
        yield site
    finally:
        if gw is not None:
            gw.stop()
        engine.stop()


def sign_in(page: Any, site: Site, who: str) -> None:
    page.goto(site.admin + "/ui/")
    page.fill("#key", site.keys[who])
    page.click("#login-form button[type=submit]")
    expect(page.locator("#who .principal")).to_have_text(who)


def cells(page: Any, selector: str) -> list[list[str]]:
    """The text of every cell of a table's body, row by row."""
    rows: list[list[str]] = page.eval_on_selector_all(
        f"{selector} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    return rows


def no_markup_ran(page: Any) -> None:
    assert page.evaluate("window.__xss") is None
    assert page.locator("main img, main svg:not(.chart):not([aria-hidden])").count() == 0


def test_sign_in_create_a_key_use_it_see_its_usage_and_revoke_it(
    page: Any, site: Site, shot: Callable[[str], Path]
) -> None:
    page.goto(site.admin + "/")
    expect(page.locator("#login-form")).to_be_visible()
    assert page.url == site.admin + "/ui/"
    shot("login")
    page.fill("#key", "sk-gw-not-a-key")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-form .error")).to_contain_text("Incorrect API key")
    page.fill("#key", site.keys["ops"])
    page.click("#login-form button[type=submit]")
    expect(page.locator("#who .principal")).to_have_text("ops")
    expect(page.locator("#nav a")).to_have_text(list(PAGES.values()))

    # Create a key: its secret is shown once.
    page.click("#nav a[data-page=keys]")
    page.select_option("#create-key select[name=principal]", "alice")
    page.fill("#create-key input[name=name]", XSS_KEY)
    page.fill("#create-key input[name=requests_per_minute]", "600")
    page.fill("#create-key input[name=period]", "day")
    page.fill("#create-key input[name=budget_tokens]", "100000")  # the key's own, on top of alice's
    page.click("#create-key button[type=submit]")
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("sk-gw-")
    key_row = page.locator("#keys tbody tr", has_text=XSS_KEY)
    expect(key_row).to_have_count(1)
    expect(key_row.locator("td").first).to_have_text(XSS_KEY)
    expect(key_row).to_contain_text("rpm 600")
    expect(key_row.locator("td").nth(7)).to_contain_text("100,000 tokens per day")
    expect(key_row.locator("td").nth(8)).to_have_text("admin API / UI")  # not "cli" (issue 20, item 9)
    cli_row = page.locator("#keys tbody tr", has_text="ops").first
    expect(cli_row.locator("td").nth(8)).to_have_text("gateway keys create")
    expect(page.locator("#principals tbody td:first-child", has_text=XSS_PRINCIPAL)).to_have_count(1)
    no_markup_ran(page)
    page.click("#secret-slot button.link")
    expect(page.locator("#new-secret")).to_have_count(0)
    page.reload()
    expect(page.locator("#keys")).to_be_visible()
    assert secret not in page.content()

    # Use it through the official SDK.
    client = openai.OpenAI(base_url=site.gw.url + "/v1", api_key=secret, max_retries=0, timeout=10)

    def ask() -> None:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )

    def answered() -> bool:
        try:
            ask()
        except openai.AuthenticationError:
            return False
        return True

    wait_until(answered, timeout=10, what="the new key accepted")
    ask()
    ask()

    # Its usage reaches the Usage page (records are written a moment after the requests).
    page.click("#nav a[data-page=usage]")
    deadline = time.monotonic() + 20
    while (rows := {r[0]: r for r in cells(page, "#usage-totals")}).get("alice", ["", "0"])[1] != "3":
        assert time.monotonic() < deadline, f"alice's 3 requests never showed: {rows}"
        page.click("#usage-refresh")
        page.wait_for_timeout(500)
    expect(page.locator("svg.chart")).to_have_count(2)
    expect(page.locator(".legend li", has_text="alice").first).to_be_visible()
    expect(page.locator(".legend li", has_text=XSS_PRINCIPAL).first).to_be_visible()
    assert XSS_PRINCIPAL in rows
    assert cells(page, "#budgets")[0][0] == XSS_PRINCIPAL
    no_markup_ran(page)
    shot("usage")
    with page.expect_download() as download:
        page.click("#usage-csv")
    csv = Path(download.value.path()).read_text()
    assert csv.splitlines()[0].startswith("bucket_start,principal,requests,")
    assert any(line.split(",")[1:3] == ["alice", "3"] for line in csv.splitlines()[1:])
    page.select_option("#usage-by", "model")
    expect(page.locator("#usage-totals tbody td:first-child", has_text="chat")).to_have_count(1)

    # Fleet: the host and the backend the requests went to, refreshed live.
    page.click("#nav a[data-page=fleet]")
    backends = page.locator("#backends tbody tr")
    expect(backends).to_have_count(1)
    row = cells(page, "#backends")[0]
    assert row[1] == "a" and row[2] == "ok", row
    # The engine's queue and the admission gate when they are known, a dash otherwise.
    assert row[6] == "—" or re.fullmatch(r"(\w+: )?\d+ waiting · \d+ running", row[6]), row
    assert row[8] == "—" or re.fullmatch(r"\d+ / \S+ · \d+ queued", row[8]), row
    status = page.locator("#fleet-status").inner_text()
    expect(page.locator("#fleet-status")).not_to_have_text(status, timeout=8000)
    shot("fleet")

    # Models, with the dry-run form.
    page.click("#nav a[data-page=models]")
    expect(page.locator("#models tbody td:first-child", has_text=XSS_MODEL)).to_have_count(1)
    no_markup_ran(page)
    page.fill("#dry-run input[name=model]", "chat")
    page.fill("#dry-run input[name=principal]", "alice")
    page.click("#dry-run button[type=submit]")
    result = page.locator("#dry-run-result")
    expect(result).to_be_visible()
    text = result.inner_text()
    if "Dry run not available" not in text:  # the route is there: chat's chain is its one target
        assert cells(page, "#dry-run-result")[0][1:] == ["pm-a", "a", "mock-model"], text
    shot("models")

    # Revoke it: the gateway refuses it from then on.
    page.click("#nav a[data-page=keys]")
    page.once("dialog", lambda dialog: dialog.accept())
    key_row.locator("button.revoke").click()
    expect(key_row.locator(".badge")).to_have_text("revoked")
    expect(key_row.locator("button.revoke")).to_have_count(0)
    shot("keys")

    def refused() -> bool:
        try:
            ask()
        except openai.AuthenticationError as exc:
            return exc.status_code == 401
        return False

    wait_until(refused, timeout=10, what="the revoked key refused")

    page.click("#nav a[data-page=audit]")
    expect(page.locator("#audit tbody tr").first).to_be_visible()
    actions = [r[2] for r in cells(page, "#audit")]
    assert actions[:2] == ["key.revoke", "key.create"], actions
    shot("audit")

    page.click("#sign-out")
    expect(page.locator("#login-form")).to_be_visible()
    assert page.evaluate("fetch('/admin/whoami').then(r => r.status)") == 401
    no_markup_ran(page)


@pytest.mark.parametrize(
    ("who", "visible"),
    [("finance", {"usage", "requests"}), ("viewer", {"fleet", "models", "keys", "audit"})],
)
def test_each_page_honours_the_session_s_permissions(
    page: Any, site: Site, shot: Callable[[str], Path], who: str, visible: set[str]
) -> None:
    sign_in(page, site, who)
    expect(page.locator("#nav a")).to_have_text([title for p, title in PAGES.items() if p in visible])
    for pid, title in PAGES.items():
        page.goto(f"{site.admin}/ui/#/{pid}")
        expect(page.locator("main h1")).to_have_text(title)
        if pid in visible:
            expect(page.locator(LOADED[pid])).to_be_visible()
            expect(page.locator("main .denied")).to_have_count(0)
        else:
            expect(page.locator("main .denied")).to_contain_text("do not have permission")
        expect(page.locator(WRITE_CONTROLS)).to_have_count(0)
        if pid == "keys":
            shot(f"keys-as-{who}")
    # What the UI does not offer, the API refuses, even with the session's CSRF token.
    csrf = page.evaluate("fetch('/admin/whoami').then(r => r.json()).then(j => j.csrf_token)")
    assert csrf
    for method, path, body in WRITES:
        status = page.evaluate(
            """([method, path, body, token]) => fetch(path, {method, body, headers: {
                 "content-type": "application/json", "x-csrf-token": token}}).then(r => r.status)""",
            [method, path, body, csrf],
        )
        assert status == 403, (who, method, path, status)


def test_the_requests_page_lists_finished_requests_and_shows_a_route_trace(
    page: Any, site: Site, shot: Callable[[str], Path]
) -> None:
    r = httpx.post(
        site.gw.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {site.keys[XSS_PRINCIPAL]}", "x-request-id": "ui-trace-1"},
        timeout=10,
    )
    assert r.status_code == 200
    sign_in(page, site, "finance")
    page.goto(site.admin + "/ui/#/requests")
    expect(page.locator("main h1")).to_have_text("Requests")
    row = page.locator("#recent-requests tbody tr", has_text="ui-trace-1")
    expect(row).to_have_count(1, timeout=15_000)  # the page refreshes every 3 s
    assert XSS_PRINCIPAL in row.inner_text()  # the odd name as text
    expect(page.locator("#live-requests")).to_contain_text("No request in flight")
    row.locator("a").click()
    detail = page.locator("#request-detail")
    expect(detail).to_have_attribute("data-request", "ui-trace-1")
    expect(detail).to_contain_text(r.headers["x-gateway-request-id"])
    trace = cells(page, "#route-trace")
    assert len(trace) == 1 and trace[0][1:4] == ["a", "pm-a", "200"], trace
    assert trace[0][4].endswith(" ms") and trace[0][6] == "—"
    shot("requests")
    # Looked up by id, from the form.
    page.fill("#request-id", "no-such-request")
    page.click("#request-lookup button[type=submit]")
    expect(page.locator("#request-detail-box .error")).to_contain_text("no finished request")
    no_markup_ran(page)


def test_the_request_page_shows_logged_bodies_redacted_and_as_text(
    page: Any, site: Site, shot: Callable[[str], Path]
) -> None:
    content = "reach me at ana@example.net <img/src/onerror=window.__xss=4>"
    r = httpx.post(
        site.gw.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": content}], "max_tokens": 3},
        headers={"authorization": f"Bearer {site.keys[XSS_PRINCIPAL]}", "x-request-id": "ui-bodies-1"},
        timeout=10,
    )
    assert r.status_code == 200
    sign_in(page, site, "auditor")
    page.goto(site.admin + "/ui/#/requests")
    row = page.locator("#recent-requests tbody tr", has_text="ui-bodies-1")
    expect(row).to_have_count(1, timeout=15_000)
    row.locator("a").click()
    request = page.locator("#body-request pre")
    expect(request).to_contain_text("reach me at [REDACTED:email] <img/src/onerror=window.__xss=4>")
    assert "ana@example.net" not in page.locator("#bodies").inner_text()
    expect(page.locator("#body-response pre")).to_contain_text('"content": "tok tok tok"')
    expect(page.locator("#bodies")).to_contain_text("Logged by odd-principal · 1 redaction")
    shot("request-bodies")
    no_markup_ran(page)


def test_without_bodies_read_the_request_page_says_who_may_see_bodies(page: Any, site: Site) -> None:
    r = httpx.post(
        site.gw.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers={"authorization": f"Bearer {site.keys[XSS_PRINCIPAL]}", "x-request-id": "ui-bodies-2"},
        timeout=10,
    )
    assert r.status_code == 200
    finance = {"authorization": f"Bearer {site.keys['finance']}"}
    wait_until(
        lambda: httpx.get(site.admin + "/admin/requests/ui-bodies-2", headers=finance).status_code == 200,
        what="the request recorded",
    )
    # usage:read alone shows the request and its trace, and says who may see its bodies.
    sign_in(page, site, "finance")
    page.goto(site.admin + "/ui/#/requests?id=ui-bodies-2")
    expect(page.locator("#request-detail")).to_have_attribute("data-request", "ui-bodies-2")
    expect(page.locator("#bodies")).to_have_text("Logged bodies are shown to keys holding bodies:read.")
    expect(page.locator("#body-request")).to_have_count(0)


def test_principals_are_edited_in_place(page: Any, site: Site) -> None:
    sign_in(page, site, "ops")
    page.click("#nav a[data-page=keys]")
    editor = page.locator("#principal-editor")
    editor.locator("input[name=name]").fill("carol")
    editor.locator("label", has_text="chatter").locator("input").check()
    editor.locator("input[name=tokens_per_minute]").fill("5000")
    editor.locator("input[name=period]").fill("day")
    editor.locator("input[name=budget_tokens]").fill("20000")
    editor.locator("button[type=submit]").click()
    expect(editor.locator(".ok-note")).to_have_text("Principal carol saved.")
    carol = page.locator("#principals tbody tr", has_text="carol")
    expect(carol).to_contain_text("tpm 5,000")
    expect(carol).to_contain_text("20,000 tokens per day")
    # Edit loads the entry into the form; saving keeps what the form does not show.
    carol.locator("button.edit").click()
    expect(editor.locator("input[name=name]")).to_have_value("carol")
    expect(editor.locator("label", has_text="chatter").locator("input")).to_be_checked()
    editor.locator("input[name=budget_tokens]").fill("")
    editor.locator("input[name=period]").fill("")
    editor.locator("button[type=submit]").click()
    expect(carol.locator("td").nth(5)).to_have_text("—")
    expect(carol).to_contain_text("tpm 5,000")


ROUTING = """
[[pools]]
name = "gpu"
policy = "round_robin"
members = ["pm-a"]

[[models]]
name = "routed"
chain = ["pm-a"]

[[models.rules]]
name = "<img/src/onerror=window.__xss=4>"
when = { headers = { x-tier = "free" } }
refuse = { status = 429, message = "<b>paid</b>only" }

[[models.rules]]
name = "pooled"
route = ["gpu"]
tag = "pool"
"""


def test_rules_pools_and_the_dry_run(
    page: Any, shot: Callable[[str], Path], tmp_path: Path, mock_engine: MockEngine
) -> None:
    port = free_port()
    config = basic_config({"a": mock_engine.url}, extra=ADMIN_ROLES + ROUTING)
    gw = Gateway(tmp_path, config, workers=1, extra=("--admin-port", str(port)))
    try:
        site = Site(gw, f"http://127.0.0.1:{port}", {"viewer": gw.create_key("viewer")})
        viewer = {"authorization": f"Bearer {site.keys['viewer']}"}
        wait_until(lambda: httpx.get(site.admin + "/admin/whoami", headers=viewer).status_code == 200)
        sign_in(page, site, "viewer")
        page.goto(site.admin + "/ui/#/models")
        expect(page.locator("#pools tbody tr")).to_have_count(1)
        assert cells(page, "#pools")[0][:3] == ["gpu", "round_robin", "pm-a"]
        rules = cells(page, ".rules table")
        assert [r[1] for r in rules] == ["<img/src/onerror=window.__xss=4>", "pooled"]
        assert rules[0][3:] == ["refuse", "refuse 429: <b>paid</b>only"]
        assert rules[1][3:] == ["route", "route to gpu · tag pool"]
        page.fill("#dry-run input[name=model]", "routed")
        page.fill("#dry-run input[name=principal]", "alice")  # may call chat only
        page.click("#dry-run button[type=submit]")
        expect(page.locator("#dry-run-result .refused")).to_contain_text("may not call this model")
        page.fill("#dry-run input[name=principal]", "root")
        page.fill("#dry-run textarea[name=headers]", '{"x-tier": "free"}')
        page.click("#dry-run button[type=submit]")
        expect(page.locator("#dry-run-result .refused")).to_have_text("Refused with 429: <b>paid</b>only")
        page.fill("#dry-run textarea[name=headers]", "{}")
        page.click("#dry-run button[type=submit]")
        expect(page.locator("#dry-run-result")).to_contain_text("#1 pooled (route)")
        assert cells(page, "#dry-run-result")[0][1:] == ["pm-a", "a", "mock-model"]
        no_markup_ran(page)
        shot("models-rules")
    finally:
        gw.stop()


LEGEND_COLOURS = """figure => Object.fromEntries([...figure.querySelectorAll('.legend li')].map(
    li => [li.textContent, li.querySelector('rect').getAttribute('fill')]))"""


def test_both_usage_charts_give_a_group_the_same_colour(page: Any, site: Site) -> None:
    """bob sends one long request and carol three short ones: bob leads the tokens chart and carol the
    requests chart, and each keeps one colour in both (issue 20, item 9)."""
    gw = site.gw
    bob, carol = gw.create_key("bob"), gw.create_key("alice")
    gw.wait_key_live(bob)
    gw.wait_key_live(carol)
    long = {"model": "pm-a", "messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 4}
    short = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert (
        httpx.post(
            gw.url + "/v1/chat/completions", json=long, headers={"authorization": f"Bearer {bob}"}
        ).status_code
        == 200
    )
    for _ in range(3):
        r = httpx.post(
            gw.url + "/v1/chat/completions", json=short, headers={"authorization": f"Bearer {carol}"}
        )
        assert r.status_code == 200
    sign_in(page, site, "ops")
    page.click("#nav a[data-page=usage]")
    deadline = time.monotonic() + 20
    while "bob" not in (rows := {r[0]: r for r in cells(page, "#usage-totals")}):
        assert time.monotonic() < deadline, f"bob's request never showed: {rows}"
        page.click("#usage-refresh")
        page.wait_for_timeout(500)
    requests = {name: int(r[1].replace(",", "")) for name, r in rows.items()}
    tokens = {name: int(r[5].replace(",", "")) for name, r in rows.items()}
    assert tokens["bob"] > tokens["alice"] and requests["bob"] < requests["alice"], rows
    figures = page.locator("figure.chart-box")
    expect(figures).to_have_count(2)
    line, bars = (figures.nth(i).evaluate(LEGEND_COLOURS) for i in range(2))
    assert line == bars and len(set(line.values())) == len(line), (line, bars)
    # The marks carry their legend's colour: bob's line and bob's bar.
    stroke = figures.nth(0).locator("polyline.series").nth(list(line).index("bob")).get_attribute("stroke")
    assert stroke == line["bob"]
    bob_bars = figures.nth(1).locator("rect.series", has=page.locator("title", has_text="bob"))
    assert {bob_bars.nth(i).get_attribute("fill") for i in range(bob_bars.count())} == {line["bob"]}


def test_the_demo_script_prints_a_ui_address_and_an_admin_key_that_signs_in(
    page: Any, tmp_path: Path, shot: Callable[[str], Path]
) -> None:
    """What `make run` runs (issue 20, item 7), from this checkout: its printed key signs in to the UI."""
    port, mock_port, admin_port = free_port(), free_port(), free_port()
    log = tmp_path / "demo.log"
    demo = subprocess.Popen(
        ["scripts/run-demo.sh", str(port), str(mock_port), str(tmp_path / "data"), str(admin_port)],
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            if demo.poll() is not None:
                raise RuntimeError(log.read_text())
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200

        wait_until(up, timeout=30, what="the demo serving")
        ui = demo_admin(log.read_text())
        assert ui.url == f"http://127.0.0.1:{admin_port}/ui/"
        assert (tmp_path / "data" / "demo-admin.secret").stat().st_mode & 0o077 == 0
        assert (tmp_path / "data" / "demo.toml").stat().st_mode & 0o077 == 0
        page.goto(ui.url)
        page.fill("#key", ui.key)
        page.click("#login-form button[type=submit]")
        expect(page.locator("#who .principal")).to_have_text("demo-admin")
        expect(page.locator("#nav a")).to_have_text(list(PAGES.values()))
        page.click("#nav a[data-page=keys]")
        expect(page.locator("#keys tbody tr", has_text="demo-admin-key")).to_have_count(1)
        shot("demo-signed-in")
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()


def test_file_owned_entries_are_shown_read_only_with_their_owner(page: Any, site: Site) -> None:
    ops = {"authorization": f"Bearer {site.keys['ops']}"}
    made = httpx.put(
        site.admin + "/admin/principals/dora", json={"roles": ["chatter"]}, headers=ops, timeout=10
    )
    assert made.status_code in (200, 201)
    sign_in(page, site, "ops")
    page.click("#nav a[data-page=keys]")
    alice = page.locator("#principals tbody tr", has_text="alice")
    expect(alice).to_contain_text(f"file {site.gw.config_path} (read-only)")
    expect(alice.locator("button.edit")).to_have_count(0)
    dora = page.locator("#principals tbody tr", has_text="dora")
    expect(dora).to_contain_text("store (API / UI)")
    expect(dora.locator("button.edit")).to_have_count(1)
    page.click("#nav a[data-page=models]")
    expect(page.locator("#models tbody tr", has_text="chat").first).to_contain_text("(read-only)")
    expect(page.locator("#config-backends tbody tr").first).to_contain_text(f"file {site.gw.config_path}")
