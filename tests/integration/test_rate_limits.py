"""Rate limits are exact on one host: the buckets live in shared memory, so four workers admit exactly
what one would."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until

LIMITED = """
[[principals]]
name = "limited"
roles = ["chatter"]
limits = {{ {limits} }}
"""


def start(
    tmp_path: Path, engine: MockEngine, limits: str, extra: tuple[str, ...] = (), workers: int = 4
) -> tuple[Gateway, str]:
    config = basic_config({"a": engine.url}, extra=LIMITED.format(limits=limits))
    gw = Gateway(tmp_path, config, workers=workers, extra=extra)
    key = gw.create_key("limited")
    gw.wait_key_live(key)
    return gw, key


def fire(gw: Gateway, key: str, n: int, threads: int = 16, body: bytes | None = None) -> list[httpx.Response]:
    payload = body or orjson.dumps(
        {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 1}
    )

    def one(_: int) -> httpx.Response:
        # A fresh connection each time, so SO_REUSEPORT spreads the burst over all four workers.
        return httpx.post(
            gw.url + "/v1/chat/completions",
            content=payload,
            timeout=30,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        )

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


def test_requests_per_minute_exact_across_four_workers(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw, key = start(tmp_path, mock_engine, "requests_per_minute = 100")
    try:
        started = time.monotonic()
        responses = fire(gw, key, 400)
        elapsed = time.monotonic() - started
        ok = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 429]
        assert len(ok) + len(refused) == 400
        # GCRA refills continuously (100 per 60 s): a burst that takes `elapsed` seconds may see that refill.
        assert 100 <= len(ok) <= 100 + int(elapsed * 100 / 60)
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
        assert ok[0].headers["x-ratelimit-limit-requests"] == "100"
    finally:
        gw.stop()


def test_rate_limit_headers_can_be_left_off(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw, key = start(tmp_path, mock_engine, "requests_per_minute = 3", ("--no-rate-limit-headers",), workers=2)
    try:
        responses = fire(gw, key, 5, threads=1)
        assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
        assert not [h for r in responses for h in r.headers if h.startswith("x-ratelimit-")]
        assert int(responses[-1].headers["retry-after"]) >= 1
        assert responses[0].headers["x-request-id"]  # the other headers the gateway adds stay
    finally:
        gw.stop()


def test_concurrency_limit_exact_across_four_workers(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw, key = start(tmp_path, mock_engine, "concurrent_requests = 3")
    try:
        mock_engine.configure(delay=1.5)
        responses = fire(gw, key, 12, threads=12)
        assert sum(r.status_code == 200 for r in responses) == 3
        assert sum(r.status_code == 429 for r in responses) == 9
        mock_engine.configure(delay=0)
        assert all(r.status_code == 200 for r in fire(gw, key, 6, threads=3))  # slots came back
    finally:
        gw.stop()


def test_tokens_per_minute_settle_to_real_usage(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw, key = start(tmp_path, mock_engine, "tokens_per_minute = 1000")
    try:
        mock_engine.configure(tokens=90)  # every answer uses 90 completion tokens, as max_tokens allows
        body = orjson.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 90}
        )
        reserve = len(body) // 4 + 90
        statuses, used = [], None
        for _ in range(15):
            r = fire(gw, key, 1, threads=1, body=body)[0]
            statuses.append(r.status_code)
            if r.status_code == 200 and used is None:
                used = r.json()["usage"]["total_tokens"]
        assert used is not None and used < reserve
        # Each admitted request ends up costing its real usage; the next one must still fit its reservation.
        expected = (1000 - reserve) // used + 1
        assert statuses[:expected] == [200] * expected
        assert statuses[expected] == 429
    finally:
        gw.stop()


def test_kill_9_mid_burst_keeps_the_buckets_consistent(tmp_path: Path, mock_engine: MockEngine) -> None:
    """Every proxy worker dies with requests in flight. What those requests took from the request bucket
    stays taken (as if they had finished); the concurrency places they held come back once the supervisor
    has replaced the workers; nothing else moves."""
    gw, key = start(tmp_path, mock_engine, "requests_per_minute = 30, concurrent_requests = 4")
    try:
        mock_engine.configure(delay=30)
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(fire, gw, key, 1, 1) for _ in range(4)]
            wait_until(lambda: mock_engine.stats()["in_flight"] == 4, what="4 requests at the engine")
            assert fire(gw, key, 1)[0].status_code == 429  # all four places are taken
            old = gw.worker_pids()
            for pid in old:
                os.kill(pid, signal.SIGKILL)
            for f in in_flight:
                with pytest.raises(httpx.HTTPError):
                    f.result()
        wait_until(
            lambda: len(set(gw.worker_pids()) - set(old)) == 4, timeout=30, what="proxy workers replaced"
        )
        gw.wait_ready()
        mock_engine.configure(delay=2)
        # The four places are free again: four slow requests at once are admitted, a fifth is not.
        responses = fire(gw, key, 5, threads=5)
        assert sorted(r.status_code for r in responses) == [200, 200, 200, 200, 429]
        assert "concurrent" in next(r for r in responses if r.status_code == 429).text
        mock_engine.configure(delay=0)
        # Of the 30 requests per minute, the four killed and the four just admitted are spent (refusals
        # take nothing); the rest, plus what refilled meanwhile, remains.
        elapsed = time.monotonic() - started
        ok = sum(r.status_code == 200 for r in fire(gw, key, 40, threads=4))
        assert 30 - 8 <= ok <= 30 - 8 + int(elapsed * 30 / 60) + 1
    finally:
        gw.stop()
