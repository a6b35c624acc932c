"""Failover across the chain: what moves on, what does not, and what the client sees when all fail."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, refusing_socket, wait_until


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, list[MockEngine], str]]:
    tmp = tmp_path_factory.mktemp("failover")
    first, second = MockEngine(tmp), MockEngine(tmp)
    hold = refusing_socket()
    dead = f"http://127.0.0.1:{hold.getsockname()[1]}"
    config = basic_config(
        {"first": first.url, "second": second.url, "dead": dead}, chain=["pm-dead", "pm-first", "pm-second"]
    )
    # These tests are about the order of failover, not health: without the cool-down and the engine probes
    # every request meets the chain as configured, whatever the tests before it made fail (a probe could
    # otherwise mark the dead backend down first, and pm-dead's request would get 503, not 502).
    gw = Gateway(tmp, config, workers=2, extra=("--backend-cool-down", "0", "--engine-scrape-interval", "0"))
    key = gw.create_key("root")
    gw.wait_key_live(key)  # in both workers: one answer says only that the worker it reached has it
    yield gw, [first, second], key
    gw.stop()
    first.stop()
    second.stop()
    hold.close()


@pytest.fixture
def engines(env: tuple[Gateway, list[MockEngine], str]) -> list[MockEngine]:
    for e in env[1]:
        e.reset()
    return env[1]


def post(gw: Gateway, key: str, model: str = "chat", stream: bool = False) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": "q"}],
            "max_tokens": 2,
            "stream": stream,
        },
        timeout=30,
    )


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_retryable_status_moves_to_next(
    env: tuple[Gateway, list[MockEngine], str], engines: list[MockEngine], status: int
) -> None:
    gw, _, key = env
    first, second = engines
    first.configure(fail_status=status)
    r = post(gw, key)
    assert r.status_code == 200
    assert len(first.requests()) == 1 and len(second.requests()) == 1


def test_connection_refused_moves_on(
    env: tuple[Gateway, list[MockEngine], str], engines: list[MockEngine]
) -> None:
    gw, _, key = env
    first, second = engines
    assert post(gw, key).status_code == 200  # the dead backend is first in the chain
    assert len(first.requests()) == 1 and len(second.requests()) == 0


def test_client_error_is_not_retried(
    env: tuple[Gateway, list[MockEngine], str], engines: list[MockEngine]
) -> None:
    gw, _, key = env
    first, second = engines
    first.configure(fail_status=400, fail_body='{"error":{"message":"bad thing","code":400}}')
    r = post(gw, key)
    assert r.status_code == 400 and r.json()["error"]["message"] == "bad thing"
    assert len(second.requests()) == 0


def test_all_failing_returns_last_upstream_answer(
    env: tuple[Gateway, list[MockEngine], str], engines: list[MockEngine]
) -> None:
    gw, _, key = env
    first, second = engines
    first.configure(fail_status=500, fail_body='{"error":"first"}')
    second.configure(fail_status=503, fail_body='{"error":"second, verbatim"}')
    r = post(gw, key)
    assert r.status_code == 503
    assert r.content == b'{"error":"second, verbatim"}'


def test_nothing_reachable_is_502(env: tuple[Gateway, list[MockEngine], str]) -> None:
    gw, _, key = env
    r = post(gw, key, model="pm-dead")
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unavailable"


def test_failure_after_first_byte_is_not_retried(
    env: tuple[Gateway, list[MockEngine], str], engines: list[MockEngine]
) -> None:
    gw, _, key = env
    first, second = engines
    first.configure(drop_after_chunks=2, tokens=10)
    got = b""
    try:
        with httpx.stream(
            "POST",
            gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={
                "model": "chat",
                "messages": [{"role": "user", "content": "q"}],
                "max_tokens": 10,
                "stream": True,
            },
            timeout=30,
        ) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                got += chunk
    except httpx.RemoteProtocolError:
        pass  # the cut shows as an unterminated chunked body: what an honest proxy must produce
    assert got.startswith(b"data: ")
    assert b"[DONE]" not in got
    assert len(first.requests()) == 1 and len(second.requests()) == 0


def test_a_failing_backend_cools_down(tmp_path: Path, mock_engine: MockEngine) -> None:
    """After three failures in a row a backend is skipped for a while instead of being tried (and waited
    for) by every request; the status view shows how many tries it got."""
    from gateway.dataplane.forward import FAILURES_TO_COOL_DOWN

    hold = refusing_socket()
    dead = f"http://127.0.0.1:{hold.getsockname()[1]}"
    config = basic_config({"dead": dead, "live": mock_engine.url}, chain=["pm-dead", "pm-live"])
    # Passive health alone: an engine probe could mark the dead backend down before any request tried it.
    gw = Gateway(tmp_path, config, workers=1, extra=("--engine-scrape-interval", "0"))
    try:
        key = gw.create_key("root")
        body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
        headers = {"authorization": f"Bearer {key}"}
        wait_until(
            lambda: (
                httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers).status_code == 200
            ),
            what="key live",
        )
        for _ in range(10):
            assert httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers).status_code == 200

        def dead_tries() -> str:
            out = gw.cli("status").stdout
            return next((line for line in out.splitlines() if "backend dead" in line), "")

        # The workers publish their counters every so often: wait for the count, then check that it stays
        # (ten requests, and a backend that was not skipped would have failed more than that).
        expected = f"failed={FAILURES_TO_COOL_DOWN} "
        wait_until(lambda: expected in dead_tries() + " ", timeout=10, what=f"status shows {expected}")
        time.sleep(1.5)
        assert expected in dead_tries() + " "
    finally:
        gw.stop()
        hold.close()
