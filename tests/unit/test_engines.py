"""Engine metrics parsing, gate ceilings and probe health (the scraper's logic), and one round of the scraper
against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time

import httpx
import orjson
import pytest

from gateway.controlplane.fleet.engines import FAILURES_TO_MARK_DOWN, BackendWatch, EngineScraper
from gateway.native import BucketTable
from gateway.protocol.prometheus import engine_load
from gateway.routing.load import engine_states
from gateway.shm.bucket_keys import backend_keys
from gateway.shm.regions import RegionSizes, SharedRegions
from gateway.shm.snapshot_slot import SnapshotPublisher
from gateway.shm.worker_stats import WorkerStats
from gateway.snapshot import Backend

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.5
vllm:prompt_tokens_total{model_name="llama"} 123456.0
"""
VLLM_OLD = 'vllm:num_requests_waiting{model_name="m"} 1\nvllm:gpu_cache_usage_perc{model_name="m"} 0.9\n'
SGLANG = """\
sglang:num_running_reqs{model_name="qwen"} 12.0
sglang:num_queue_reqs{model_name="qwen"} 4.0
sglang:token_usage{model_name="qwen"} 0.71
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, ("vllm", 5, 7, 0.5)),
        (VLLM_OLD, ("vllm", 0, 1, 0.9)),
        (SGLANG, ("sglang", 12, 4, 0.71)),
        ("vllm:num_requests_waiting 2 1700000000000\r\n", ("vllm", 0, 2, None)),
        ('vllm:num_requests_running{a="}"} 4\n', ("vllm", 4, 0, None)),
    ],
)
def test_engine_metrics(text: str, expected: tuple[str, int, int, float | None]) -> None:
    load = engine_load(text)
    assert load is not None
    assert (load.kind, load.running, load.waiting, load.kv_cache) == expected


def test_a_prompt_token_counter_that_goes_down_is_a_restarted_engine() -> None:
    load = engine_load(VLLM)
    assert load is not None and load.prompt_tokens == 123456.0
    w = BackendWatch()
    for total in (100.0, 150.0, None, 150.0):  # rising, then a scrape without the counter: nothing
        w.count_prompts(total, "b")
    assert w.epoch == 0 and w.as_doc()["epoch"] == 0
    w.count_prompts(20.0, "b")  # a new process
    first = w.epoch
    assert first >= int(time.time()) - 5
    w.count_prompts(30.0, "b")
    assert w.epoch == first
    w.count_prompts(10.0, "b")  # restarted again within the same second: still a new epoch
    assert w.epoch > first
    assert engine_states({"backends": {"b": w.as_doc()}})["b"].epoch == w.epoch
    assert engine_load("vllm:prompt_tokens_total 5\n") is None  # a counter alone is not an engine's


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only comments\n",
        "process_cpu_seconds_total 12\n",
        "vllm:num_requests_waiting NaN\n",
        "\x00\xff{{",
    ],
)
def test_not_an_engine(text: str) -> None:
    assert engine_load(text) is None


def backend(max_concurrency: int | None = 16, high_water: int = 4) -> Backend:
    return Backend("b", "http://b", None, "openai", 1, 1, 1, max_concurrency, high_water)


def test_ceiling_halves_while_the_queue_is_high_and_grows_back_by_one() -> None:
    b, w = backend(), BackendWatch()
    seen = []
    for waiting in [0, 5, 9, 4, 3, 0, 0, 0]:
        w.waiting = waiting
        w.step_ceiling(b)
        seen.append(w.ceiling)
    assert seen == [16, 8, 4, 2, 3, 4, 5, 6]
    for _ in range(20):
        w.step_ceiling(b)
    assert w.ceiling == 16
    w.waiting = 100
    for _ in range(10):
        w.step_ceiling(b)
    assert w.ceiling == 1  # never below one


def test_no_gate_without_max_concurrency() -> None:
    w = BackendWatch(waiting=50)
    w.step_ceiling(backend(None))
    assert w.ceiling is None


def test_probe_health_needs_consecutive_failures_and_one_success() -> None:
    w = BackendWatch()
    for _ in range(FAILURES_TO_MARK_DOWN - 1):
        w.record(False, "ConnectError")
    assert w.healthy
    w.record(False, "ConnectError")
    assert not w.healthy and w.error == "ConnectError"
    w.record(True)
    assert w.healthy and w.error is None


def test_engine_document_round_trip() -> None:
    w = BackendWatch(kind="vllm", waiting=3, running=2, kv_cache=0.5, ceiling=8, healthy=False)
    states = engine_states({"backends": {"b": w.as_doc(), "junk": "x", "odd": {"waiting": "many"}}})
    assert states["b"].waiting == 3 and states["b"].ceiling == 8 and not states["b"].healthy
    assert "junk" not in states and states["odd"].waiting is None and states["odd"].healthy


def test_stop_ends_the_wait_between_rounds() -> None:
    """An hour between rounds: stop() still ends the thread (it joins for at most 5 s), whether the
    scraper is waiting after a round or has only just been started."""
    sizes = RegionSizes(workers=1, snapshot_bytes=4096, bucket_capacity=4, ring_slots=2)
    shared = SharedRegions.create(sizes)
    try:
        stats = WorkerStats(shared.stats)
        scraper = EngineScraper(shared, interval=3600).start()
        deadline = time.monotonic() + 10
        while not stats.read(stats.engine_slot) and time.monotonic() < deadline:  # its first round ran
            time.sleep(0.01)
        assert stats.read(stats.engine_slot)
        scraper.stop()
        assert scraper._thread is not None and not scraper._thread.is_alive()
        at_once = EngineScraper(shared, interval=3600).start()
        at_once.stop()
        assert at_once._thread is not None and not at_once._thread.is_alive()
    finally:
        shared.close()


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = VLLM.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_round_notes_this_hosts_in_flight_beside_the_engines_running_count() -> None:
    """The engine's counts (5 running, 7 waiting) include this host's requests of that moment (2 on the
    host's gauge): the document carries both, so routing can count the other hosts' share (10) on top of its
    live gauge after this host's requests have ended, instead of the whole scrape until the next one."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sizes = RegionSizes(workers=1, snapshot_bytes=4096, bucket_capacity=4, ring_slots=2)
    shared = SharedRegions.create(sizes)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        snapshot = orjson.dumps({"backends": {"e": {"url": url}}})
        SnapshotPublisher(shared.snapshot).publish(snapshot, revision=1)
        with BucketTable(shared.buckets) as table:
            key = backend_keys("e")[0]
            assert table.acquire(key, 10) and table.acquire(key, 10)
            scraper = EngineScraper(shared)

            async def one_round() -> None:
                async with httpx.AsyncClient(trust_env=False) as client:
                    await scraper.round(client)

            asyncio.run(one_round())
        stats = WorkerStats(shared.stats)
        doc = stats.read(stats.engine_slot)
        assert doc is not None
        state = engine_states(orjson.loads(doc))["e"]
        assert (state.kind, state.running, state.waiting, state.host_in_flight) == ("vllm", 5, 7, 2)
    finally:
        server.shutdown()
        shared.close()
