"""Per-key network and model rules through a running gateway: a key used from outside its ``allow_ips``
is refused with 403 before anything else happens, a key's ``models`` narrow its principal's (requests,
``/v1/models`` and Anthropic's envelope), and the dry run shows what a key's rules decide."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until

KEYS = {
    "office": "sk-test-office-0000000001",  # alice, from 10.0.0.0/8 only
    "local": "sk-test-local-00000000002",  # alice, from loopback
    "narrow": "sk-test-narrow-0000000003",  # root (model/*), narrowed to pm-a
    "ops": "sk-test-ops-00000000000004",
}

EXTRA = f"""
[[roles]]
name = "ops"
permissions = ["config:read"]

[[principals]]
name = "ops"
roles = ["ops"]

[[keys]]
name = "office"
principal = "alice"
secret = "{KEYS["office"]}"
allow_ips = ["10.0.0.0/8", "2001:db8::/32"]

[[keys]]
name = "local"
principal = "alice"
secret = "{KEYS["local"]}"
allow_ips = ["127.0.0.0/8"]

[[keys]]
name = "narrow"
principal = "root"
secret = "{KEYS["narrow"]}"
models = ["pm-a"]

[[keys]]
name = "ops"
principal = "ops"
secret = "{KEYS["ops"]}"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, int]]:
    tmp = tmp_path_factory.mktemp("key-rules")
    engine = MockEngine(tmp)
    admin_port = free_port()
    gw = Gateway(
        tmp,
        basic_config({"a": engine.url}, extra=EXTRA),
        # The tests' own requests come from 127.0.0.1: trusted, its X-Forwarded-For names the client.
        extra=("--admin-port", str(admin_port), "--trusted-proxies", "127.0.0.1/32"),
    )
    gw.wait_key_live(KEYS["local"])
    yield gw, admin_port
    gw.stop()
    engine.stop()


def post(
    gw: Gateway,
    key: str,
    model: str = "chat",
    path: str = "/v1/chat/completions",
    forwarded_for: str | None = None,
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"authorization": f"Bearer {KEYS[key]}"}
    if forwarded_for is not None:
        headers["x-forwarded-for"] = forwarded_for
    return httpx.post(gw.url + path, headers=headers, json=body, timeout=10)


def test_a_key_outside_its_networks_is_refused(env: tuple[Gateway, int]) -> None:
    gw, _ = env
    assert post(gw, "local").status_code == 200
    resp = post(gw, "office")
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert error["code"] == "address_not_allowed"
    assert error["message"] == "This API key may not be used from 127.0.0.1"
    # The same refusal in Anthropic's envelope on /v1/messages.
    resp = post(gw, "office", path="/v1/messages")
    assert resp.status_code == 403
    assert resp.json() == {
        "type": "error",
        "error": {"type": "permission_error", "message": "This API key may not be used from 127.0.0.1"},
    }
    # Refused before the model is even looked up: an unknown model is still 403, not 404.
    assert post(gw, "office", model="nope").status_code == 403


def test_the_client_address_is_the_one_trusted_proxies_decide(env: tuple[Gateway, int]) -> None:
    gw, _ = env
    # Through the trusted proxy (127.0.0.1) from inside the office network: allowed.
    assert post(gw, "office", forwarded_for="10.20.3.4").status_code == 200
    assert post(gw, "office", forwarded_for="2001:db8::7").status_code == 200
    # The right-most untrusted hop counts, not what the client wrote further left.
    resp = post(gw, "office", forwarded_for="10.0.0.1, 192.0.2.7")
    assert resp.status_code == 403
    assert resp.json()["error"]["message"] == "This API key may not be used from 192.0.2.7"
    # The loopback key is now used "from" the office: refused.
    assert post(gw, "local", forwarded_for="10.20.3.4").status_code == 403


def test_repeated_forwarded_for_lines_are_one_list(env: tuple[Gateway, int]) -> None:
    """Issue 29, case 6: the client writes ``X-Forwarded-For: 10.1.2.3``, the balancer adds a second line
    naming the client's real address (HAProxy's ``option forwardfor`` does): only the first line was read,
    and the office key was served from outside the office. The lines are one list (RFC 9110)."""
    gw, _ = env
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = [
        ("authorization", f"Bearer {KEYS['office']}"),
        ("x-forwarded-for", "10.1.2.3"),
        ("x-forwarded-for", "198.51.100.7"),
    ]
    resp = httpx.post(gw.url + "/v1/chat/completions", headers=headers, json=body, timeout=10)
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["message"] == "This API key may not be used from 198.51.100.7"
    headers[1:] = [("x-forwarded-for", "198.51.100.7"), ("x-forwarded-for", "10.1.2.3")]
    assert (
        httpx.post(gw.url + "/v1/chat/completions", headers=headers, json=body, timeout=10).status_code == 200
    )


def test_a_keys_models_narrow_its_principals(env: tuple[Gateway, int]) -> None:
    gw, _ = env
    assert post(gw, "narrow", model="pm-a").status_code == 200
    resp = post(gw, "narrow", model="chat")
    assert resp.status_code == 403
    assert resp.json()["error"]["message"] == "This API key may not use the model `chat`"
    assert resp.json()["error"]["param"] == "model"
    listed = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {KEYS['narrow']}"}).json()
    assert [m["id"] for m in listed["data"]] == ["pm-a"]
    # The principal's other keys keep the principal's models: the cache of /v1/models is per key here.
    listed = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {KEYS['local']}"}).json()
    assert {m["id"] for m in listed["data"]} == {"chat", "gpt-4o-mini"}


def test_dry_run_shows_the_keys_decision(env: tuple[Gateway, int]) -> None:
    admin_port = env[1]

    def dry(**request: object) -> httpx.Response:
        return httpx.post(
            f"http://127.0.0.1:{admin_port}/admin/routing/dry-run",
            headers={"authorization": f"Bearer {KEYS['ops']}"},
            json=request,
            timeout=10,
        )

    wait_until(lambda: dry(model="chat").status_code == 200, what="admin API up")
    office = dry(model="chat", key="office", client_ip="192.0.2.7").json()["key"]
    assert office == {
        "name": "office",
        "rules": {"allow_ips": ["10.0.0.0/8", "2001:db8::/32"], "models": None},
        "refusal": "This API key may not be used from 192.0.2.7",
    }
    assert dry(model="chat", key="office", client_ip="10.9.8.7").json()["key"]["refusal"] is None
    assert dry(model="chat", key="office", client_ip="::ffff:10.1.1.1").json()["key"]["refusal"] is None
    narrow = dry(model="gpt-4o-mini", key="narrow").json()["key"]
    assert narrow["rules"]["models"] == ["pm-a"]
    assert narrow["refusal"] == "This API key may not use the model `gpt-4o-mini`"
    assert dry(model="chat", key="ops").json()["key"] == {"name": "ops", "rules": None, "refusal": None}
