"""Request headers as HTTP says (issue 29), through the real gateway and raw upstreams of our own that
record every header line that reached them: a repeated ``X-Forwarded-For`` is one list (so a client cannot
hide its balancer's line behind its own and pass a key's ``allow_ips``), and a client's credentials, in any
of the headers clients carry them in, never reach an engine on any protocol pair."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.fixtures.processes import Gateway, basic_config, wait_until
from tests.fixtures.upstream import OK, RawUpstream, Received

KEY = "sk-test-headers-office-0001"  # root's, allowed from 10.0.0.0/8 only
ENGINE_KEY = "sk-engine-raw-000000000001"
ANTHROPIC_ANSWER = (
    b'{"id":"msg_1","type":"message","role":"assistant","model":"mock-model","content":[{"type":"text",'
    b'"text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}'
)
# What a client may carry its credentials in; none of it may reach an engine.
CREDENTIALS = {
    "authorization": f"Bearer {KEY}",
    "x-api-key": KEY,
    "api-key": KEY,  # Azure-style SDKs
    "cookie": f"session={KEY}",
    "proxy-authorization": "Basic dXNlcjpwYXNz",
    "x-sso-user": "alice@example.com",  # named by --drop-request-headers
    "X-Internal-Token": "t-0001",  # named there in upper case
}
DROPPED = {k.lower() for k in CREDENTIALS}


@dataclass
class Env:
    gw: Gateway
    openai: RawUpstream  # pm-raw: an OpenAI backend with a key of its own
    anthropic: RawUpstream  # pm-anth
    responses: RawUpstream  # pm-resp: an OpenAI backend serving the Responses API itself


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("request-headers")
    openai, responses = RawUpstream(), RawUpstream()
    anthropic = RawUpstream(OK % len(ANTHROPIC_ANSWER) + ANTHROPIC_ANSWER)
    extra = f"""
[[backends]]
name = "anth"
url = "{anthropic.url}"
protocol = "anthropic"

[[provider_models]]
name = "pm-anth"
backends = [{{ backend = "anth", model = "mock-model" }}]

[[backends]]
name = "resp"
url = "{responses.url}"
responses_api = true

[[provider_models]]
name = "pm-resp"
backends = [{{ backend = "resp", model = "mock-model" }}]

[[keys]]
name = "office"
principal = "root"
secret = "{KEY}"
allow_ips = ["10.0.0.0/8"]
"""
    config = basic_config({"raw": openai.url}, extra=extra).replace(
        f'url = "{openai.url}"', f'url = "{openai.url}"\napi_key = "{ENGINE_KEY}"', 1
    )
    gw = Gateway(
        tmp,
        config,
        workers=2,
        extra=(
            "--engine-scrape-interval",
            "0",
            # The tests' requests come from 127.0.0.1: a trusted balancer, whose X-Forwarded-For counts.
            "--trusted-proxies",
            "127.0.0.1/32",
            "--drop-request-headers",
            "x-sso-user, X-Internal-Token",
        ),
    )
    # As Gateway.wait_key_live, from inside the key's networks.
    probe = {"authorization": f"Bearer {KEY}", "x-forwarded-for": "10.0.0.1"}
    wait_until(
        lambda: all(httpx.get(gw.url + "/v1/models", headers=probe).status_code == 200 for _ in range(16)),
        what="key published to every worker",
    )
    yield Env(gw, openai, anthropic, responses)
    gw.stop()
    for up in (openai, anthropic, responses):
        up.stop()


def chat(gw: Gateway, forwarded_for: list[str], **extra: str) -> httpx.Response:
    # httpx sends each pair of a list as a header line of its own, repeated names included.
    headers = [("authorization", f"Bearer {KEY}"), *(("x-forwarded-for", v) for v in forwarded_for)]
    headers += list(extra.items())
    body = {"model": "pm-raw", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(gw.url + "/v1/chat/completions", headers=headers, json=body, timeout=10)


# -- X-Forwarded-For on several lines ----------------------------------------------------------------------
def test_every_forwarded_for_line_counts_for_allow_ips(env: Env) -> None:
    gw = env.gw
    assert chat(gw, ["10.1.2.3"]).status_code == 200
    assert chat(gw, ["198.51.100.7"]).status_code == 403
    # The client's own line first, its balancer's after: the balancer's hop is the client. Reading the
    # first line only, this was 200.
    r = chat(gw, ["10.1.2.3", "198.51.100.7"])
    assert r.status_code == 403, r.text
    assert r.json()["error"]["message"] == "This API key may not be used from 198.51.100.7"
    # Both lines on one: the same list, the same answer.
    assert chat(gw, ["10.1.2.3, 198.51.100.7"]).status_code == 403
    # The other way round the balancer vouches for 10.1.2.3.
    assert chat(gw, ["198.51.100.7", "10.1.2.3"]).status_code == 200


def test_a_garbled_hop_is_no_address_and_nothing_left_of_it_is_believed(env: Env) -> None:
    r = chat(env.gw, ["10.1.2.3", "unknown"])
    assert r.status_code == 403
    assert r.json()["error"]["message"] == "This API key may not be used from unknown"


def test_forwarded_is_not_read(env: Env) -> None:
    # RFC 7239's header names no client here: a balancer that sets only X-Forwarded-For passes a
    # client's Forwarded on as it came. The client is the peer, 127.0.0.1, outside the key's networks.
    assert chat(env.gw, [], forwarded="for=10.1.2.3").status_code == 403


# -- a client's credentials --------------------------------------------------------------------------------
def send(env: Env, method: str, path: str, body: dict[str, object] | None) -> httpx.Response:
    headers = {**CREDENTIALS, "x-forwarded-for": "10.1.2.3", "x-keep": "yes"}
    return httpx.request(method, env.gw.url + path, headers=headers, json=body, timeout=10)


def last(upstream: RawUpstream) -> Received:
    assert upstream.received, "nothing reached the upstream"
    return upstream.received[-1]


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("method", "path", "body", "upstream", "verbatim"),
    [
        ("POST", "/v1/chat/completions", {"model": "pm-raw", **CHAT}, "openai", True),
        ("GET", "/v1/files?model=pm-raw", None, "openai", True),  # a bodiless call, routed by its query
        ("POST", "/v1/messages", {"model": "pm-anth", **MESSAGES}, "anthropic", True),
        ("POST", "/v1/messages/count_tokens", {"model": "pm-anth", **MESSAGES}, "anthropic", True),
        ("POST", "/v1/responses", {"model": "pm-resp", "input": "hi"}, "responses", True),
        ("GET", "/v1/responses/resp_1?model=pm-resp", None, "responses", True),
        # Translated pairs build their own headers: nothing of the client's goes, credentials least.
        ("POST", "/v1/chat/completions", {"model": "pm-anth", **CHAT}, "anthropic", False),
        ("POST", "/v1/messages", {"model": "pm-raw", **MESSAGES}, "openai", False),
        ("POST", "/v1/responses", {"model": "pm-raw", "input": "hi"}, "openai", False),
    ],
)
def test_client_credentials_never_reach_an_engine(
    env: Env, method: str, path: str, body: dict[str, object] | None, upstream: str, verbatim: bool
) -> None:
    up: RawUpstream = getattr(env, upstream)
    before = len(up.received)
    send(env, method, path, body)
    assert len(up.received) == before + 1
    got = last(up)
    names = {k.lower() for k, _ in got.headers}
    assert not names & (DROPPED - {"authorization", "x-api-key"}), got.headers
    # The only credential an engine sees is its own backend's, in its own header.
    if upstream == "openai":
        assert got.header("authorization") == f"Bearer {ENGINE_KEY}" and "x-api-key" not in names
    else:
        assert "authorization" not in names and "x-api-key" not in names
    assert KEY not in repr(got.headers)
    # On a verbatim path the client's other headers do go: the test sees what was forwarded.
    assert (got.header("x-keep") == "yes") is verbatim
