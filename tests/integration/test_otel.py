"""OpenTelemetry export end to end: a real OTLP/HTTP receiver decodes what the control worker sends — one
SERVER span per sampled request and one CLIENT child per upstream attempt, with the GenAI semantic
conventions — and the mock engine shows the ``traceparent`` each attempt carried. A collector that is down
costs the requests nothing: its spans are dropped and counted; one that dribbles its answer holds an export
no longer than its deadline, and the queue stays bounded meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from gateway.controlplane.usage import otel
from gateway.controlplane.usage.otel import OtelExporter
from gateway.usage_record import UsageRecord
from tests.fixtures.dribbler import Dribbler
from tests.fixtures.otlp import OtlpReceiver, attributes
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@dataclass
class Env:
    gw: Gateway
    admin: str
    first: MockEngine
    second: MockEngine
    receiver: OtlpReceiver
    key: str

    def chat(self, **headers: str) -> httpx.Response:
        return httpx.post(
            self.gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.key}", **headers},
            json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 3},
            timeout=30,
        )

    def spans(self, trace_id: str, count: int) -> list[Span]:
        wait_until(lambda: len(self.receiver.of_trace(trace_id)) >= count, timeout=20, what=f"{count} spans")
        return self.receiver.of_trace(trace_id)

    def metric(self, name: str) -> float:
        for line in httpx.get(self.admin + "/metrics", timeout=5).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not exported")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("otel")
    first, second = MockEngine(tmp), MockEngine(tmp)
    receiver = OtlpReceiver()
    port = free_port()
    config = basic_config({"first": first.url, "second": second.url}, chain=["pm-first", "pm-second"])
    extra = (
        "--admin-port", str(port), "--otel-endpoint", receiver.url, "--backend-cool-down", "0",
        "--engine-scrape-interval", "0",
    )  # fmt: skip
    gw = Gateway(tmp, config, workers=1, extra=extra, env={"OTEL_SERVICE_NAME": "gw-under-test"})
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        yield Env(gw, f"http://127.0.0.1:{port}", first, second, receiver, key)
    finally:
        gw.stop()
        first.stop()
        second.stop()
        receiver.stop()


@pytest.fixture(autouse=True)
def _reset(env: Env) -> None:
    env.first.reset()
    env.second.reset()
    env.receiver.status = 200


def test_a_failover_is_one_server_span_with_a_client_span_per_attempt(env: Env) -> None:
    env.first.configure(fail_status=503)
    r = env.chat(traceparent=f"00-{TRACE}-{PARENT}-01")
    assert r.status_code == 200
    usage = r.json()["usage"]
    spans = env.spans(TRACE, 3)
    assert len(spans) == 3
    server = next(s for s in spans if s.kind == Span.SpanKind.SPAN_KIND_SERVER)
    clients = sorted(
        (s for s in spans if s.kind == Span.SpanKind.SPAN_KIND_CLIENT), key=lambda s: s.start_time_unix_nano
    )
    assert server.name == "chat chat" and server.parent_span_id.hex() == PARENT  # continues the client's
    attrs = attributes(server)
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "chat"
    assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == "openai"
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attrs["http.response.status_code"] == 200 and attrs["gateway.attempts"] == 2
    assert attrs["gateway.request_id"] == r.headers["x-request-id"] and attrs["gateway.backend"] == "second"
    assert [s.name for s in clients] == ["chat pm-first", "chat pm-second"]
    assert all(s.parent_span_id == server.span_id for s in clients)
    one, two = (attributes(s) for s in clients)
    assert one["http.response.status_code"] == 503 and clients[0].status.code == Status.STATUS_CODE_ERROR
    assert two["http.response.status_code"] == 200 and two["gen_ai.request.model"] == "pm-second"
    assert two["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert server.start_time_unix_nano <= clients[0].start_time_unix_nano
    assert clients[0].end_time_unix_nano <= clients[1].start_time_unix_nano
    assert clients[1].end_time_unix_nano <= server.end_time_unix_nano
    assert env.receiver.content_types[-1] == "application/x-protobuf"
    assert {"service.name": "gw-under-test"} in env.receiver.resources
    # Each engine was handed the trace, with its own attempt's span as the parent.
    for engine, span in ((env.first, clients[0]), (env.second, clients[1])):
        (got,) = engine.requests()
        assert got["headers"]["traceparent"] == f"00-{TRACE}-{span.span_id.hex()}-01"


def test_without_traceparent_a_trace_starts_and_an_unsampled_parent_is_respected(env: Env) -> None:
    r = env.chat()
    assert r.status_code == 200
    sent = env.second.requests() or env.first.requests()
    trace_id = sent[0]["headers"]["traceparent"].split("-")[1]
    (server, attempt) = sorted(env.spans(trace_id, 2), key=lambda s: s.kind)
    assert (
        server.parent_span_id == b"" and attributes(server)["gateway.request_id"] == r.headers["x-request-id"]
    )
    assert attempt.parent_span_id == server.span_id

    env.first.reset()
    unsampled = f"00-{'ab' * 16}-{'cd' * 8}-00"
    assert env.chat(traceparent=unsampled).status_code == 200
    assert env.first.requests()[0]["headers"]["traceparent"] == unsampled  # passed on untouched
    time.sleep(1.5)  # more than an export interval
    assert env.receiver.of_trace("ab" * 16) == []


def test_a_collector_that_is_down_costs_requests_nothing_and_is_counted(env: Env) -> None:
    dropped = env.metric("gateway_otel_spans_dropped_total")
    env.receiver.status = 503
    started = time.perf_counter()
    for _ in range(5):
        assert env.chat().status_code == 200
    assert time.perf_counter() - started < 5
    wait_until(
        lambda: env.metric("gateway_otel_spans_dropped_total") >= dropped + 10,
        timeout=10,
        what="drops counted",
    )
    assert env.metric("gateway_otel_queue") == 0  # nothing kept for later
    env.receiver.status = 200
    assert env.chat(traceparent=f"00-{'12' * 16}-{PARENT}-01").status_code == 200
    assert len(env.spans("12" * 16, 2)) == 2  # and export resumes
    assert env.metric("gateway_otel_spans_exported_total") >= 7


def _metric(admin: str, name: str) -> float:
    for line in httpx.get(admin + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_a_collector_that_dribbles_its_answer_loses_the_batch_at_the_deadline(tmp_path: Path) -> None:
    # Status line and headers at once, then a byte every half second for 40 s: every read brings
    # something, so httpx's per-read timeout never fires and only a total deadline ends the POST.
    collector = Dribbler(interval=0.5, length=40.0, path="/v1/traces")
    engine = MockEngine(tmp_path)
    port = free_port()
    admin = f"http://127.0.0.1:{port}"
    extra = ("--admin-port", str(port), "--otel-endpoint", collector.url, "--engine-scrape-interval", "0")
    gw = Gateway(tmp_path, basic_config({"a": engine.url}), workers=1, extra=extra)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 3}
        r = httpx.post(gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body)
        assert r.status_code == 200
        wait_until(lambda: collector.answered, timeout=10, what="the export reaching the collector")
        began = collector.answered[0]
        # The deadline is 2 s; the dribble would last 40 s. Generous slack for a loaded machine.
        wait_until(
            lambda: _metric(admin, "gateway_otel_spans_dropped_total") >= 2,
            timeout=otel.DEADLINE + 8,
            what="the dribbled batch dropped and counted",
        )
        assert time.monotonic() - began < otel.DEADLINE + 8
        assert _metric(admin, "gateway_otel_spans_exported_total") == 0
        assert "OpenTelemetry export to" in gw.log.read_text() and "DeadlineExceeded" in gw.log.read_text()
    finally:
        gw.stop()
        engine.stop()
        collector.stop()


def _record(n: int) -> UsageRecord:
    """A sampled record with no attempts: one span."""
    span = ["ab" * 16, None, f"{n + 1:016x}", "chat", "openai"]
    return UsageRecord(
        f"r{n}", time.time(), "p", "k", "chat", "a", 200, 1, 1, 0, 2, "reported", 0, 5.0, 1.0, None,
        span=span,
    )  # fmt: skip


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    ends = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < ends, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_the_queue_stays_bounded_while_the_collector_dribbles() -> None:
    collector = Dribbler(interval=0.5, length=40.0, path="/v1/traces")
    exporter = OtelExporter(collector.url, "svc", queue_limit=8)

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(exporter.run())
        try:
            exporter.add([_record(i) for i in range(5)])
            await _until(lambda: len(collector.answered) == 1, 5, "the first batch in flight")
            assert len(exporter.queue) == 0  # the batch left the queue when its POST began
            exporter.add([_record(i) for i in range(5, 25)])  # while the collector holds that POST
            assert len(exporter.queue) == 8 and exporter.dropped == 12  # full: the rest dropped, counted
            # The first POST ends at its deadline (the collector would dribble for 40 s): its 5 spans
            # are dropped; the next batch, the 8 queued, meets the same fate one deadline later.
            await _until(lambda: exporter.dropped == 17, otel.DEADLINE + 8, "the first batch dropped")
            await _until(lambda: exporter.dropped == 25, otel.DEADLINE + 8, "the second batch dropped")
            assert len(collector.answered) == 2 and exporter.exported == 0 and len(exporter.queue) == 0
        finally:
            task.cancel()

    try:
        asyncio.run(scenario())
    finally:
        collector.stop()
