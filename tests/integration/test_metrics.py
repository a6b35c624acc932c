"""GET /metrics: one view of the whole host whatever the number of workers; request counters are exact."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(url + "/metrics", timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def test_request_counters_are_exact_across_workers(tmp_path: Path, mock_engine: MockEngine) -> None:
    admin_port = free_port()
    gw = Gateway(
        tmp_path, basic_config({"a": mock_engine.url}), workers=4, extra=("--admin-port", str(admin_port))
    )
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        key = gw.create_key("alice")
        body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 3}

        def ask(i: int) -> int:
            headers = {"authorization": f"Bearer {key}"} if i % 10 else {"authorization": "Bearer nope"}
            return httpx.post(
                gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=10
            ).status_code

        probes: list[int] = []

        def live_everywhere() -> bool:
            # Fresh connections land on every worker in turn (SO_REUSEPORT): the key is live on all four
            # once a run of probes all succeed.
            batch = [ask(1) for _ in range(16)]
            probes.extend(batch)
            return set(batch) == {200}

        wait_until(live_everywhere, what="key live in every worker")
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(ask, range(1, 201)))
        ok, refused = statuses.count(200) + probes.count(200), statuses.count(401)
        assert statuses.count(200) + refused == 200 and refused == 20

        def settled() -> bool:
            s = scrape(admin)
            # Request counters come from the usage records; per-host figures from the workers' slots, which
            # the workers refresh every second.
            return (
                total(s, "gateway_requests_total") == ok
                and total(s, "gateway_refusals_total", status="401")
                >= refused  # and the probes before the key was live
                and total(s, "gateway_backend_answers_total", backend="a") == ok
            )

        wait_until(settled, timeout=10, what="metrics caught up")
        s = scrape(admin)
        assert (
            total(s, "gateway_requests_total", model="chat", backend="a", status="200", principal="alice")
            == ok
        )
        assert total(s, "gateway_tokens_total", kind="completion") == 3 * ok
        assert total(s, "gateway_request_duration_seconds_count", model="chat") == ok
        assert total(s, "gateway_backend_answers_total", backend="a") == ok
        assert total(s, "gateway_snapshot_revision") >= 1
        assert len([1 for lab, _ in s["gateway_worker_restarts_total"]]) == 5  # control + 4 proxies
    finally:
        gw.stop()
