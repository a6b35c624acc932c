"""The per-address abuse limiter through the real gateway (two workers, so exactness across workers is
part of what is tested): concurrent requests and request rate per client address, the address taken from
X-Forwarded-For only because loopback is a trusted proxy here."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.fixtures.processes import Gateway, basic_config, wait_until
from tests.fixtures.upstream import RawUpstream

CHAT = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    tmp = tmp_path_factory.mktemp("client-limits")
    raw = RawUpstream(delay=1.0)
    gw = Gateway(
        tmp,
        basic_config({"raw": raw.url}),
        workers=2,
        extra=(
            "--engine-scrape-interval",
            "0",
            "--client-max-requests",
            "2",
            "--client-rate",
            "1",
            "--client-burst",
            "4",
            "--trusted-proxies",
            "127.0.0.0/8, ::1/128",
        ),
    )
    key = gw.create_key("alice")
    # Probes as in Gateway.wait_key_live, each from an address of its own so as not to spend a rate.
    probes = iter(range(1, 10**6))
    wait_until(
        lambda: all(
            httpx.get(
                gw.url + "/v1/models",
                headers={
                    "authorization": f"Bearer {key}",
                    "x-forwarded-for": f"198.51.100.{next(probes) % 250}",
                },
            ).status_code
            == 200
            for _ in range(8)
        ),
        what="key published to every worker",
    )
    yield gw, key
    gw.stop()
    raw.stop()


def chat(gw: Gateway, key: str, address: str, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {
        "authorization": f"Bearer {key}",
        "x-api-key": key,
        "x-forwarded-for": f"203.0.113.9, {address}",
    }
    if path == "/v1/messages":
        body = b'{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
    else:
        body = CHAT
    # A fresh connection each: SO_REUSEPORT spreads them over both workers.
    with httpx.Client(timeout=10) as c:
        return c.post(gw.url + path, content=body, headers=headers)


def test_concurrent_requests_per_address_are_capped_across_workers(limited: tuple[Gateway, str]) -> None:
    gw, key = limited
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: chat(gw, key, "10.0.0.1"), range(4)))
        others = list(pool.map(lambda a: chat(gw, key, a), ["10.0.0.2", "10.0.0.2", "10.0.0.3"]))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200, 200, 429, 429], statuses
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "10.0.0.1" in refused.json()["error"]["message"]
    assert [r.status_code for r in others] == [200, 200, 200]  # other addresses are not held back


def test_request_rate_per_address(limited: tuple[Gateway, str]) -> None:
    gw, key = limited
    headers = {"authorization": f"Bearer {key}", "x-forwarded-for": "10.0.0.7"}
    statuses = [httpx.get(gw.url + "/v1/models", headers=headers).status_code for _ in range(6)]
    assert statuses[:4] == [200] * 4 and 429 in statuses[4:], statuses
    r = chat(gw, key, "10.0.0.7", "/v1/messages")
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"  # Anthropic's envelope
    assert int(r.headers["retry-after"]) >= 1


def test_a_client_cannot_pick_its_address_with_a_header_line_of_its_own(
    limited: tuple[Gateway, str],
) -> None:
    gw, key = limited
    # Each request puts a fresh address on a line of its own ahead of its balancer's (which says
    # 10.0.0.21): both lines are one list, so every request counts under 10.0.0.21. Reading the first line
    # only, each counted under the address the client chose and none was refused.
    statuses = [
        httpx.get(
            gw.url + "/v1/models",
            headers=[
                ("authorization", f"Bearer {key}"),
                ("x-forwarded-for", f"192.0.2.{i}"),
                ("x-forwarded-for", "10.0.0.21"),
            ],
        ).status_code
        for i in range(6)
    ]
    assert statuses[:4] == [200] * 4 and 429 in statuses[4:], statuses
