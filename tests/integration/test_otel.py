"""OpenTelemetry export end to end: a real OTLP/HTTP receiver decodes what the control worker sends — one
SERVER span per sampled request and one CLIENT child per upstream attempt, with the GenAI semantic
conventions — and the mock engine shows the ``traceparent`` each attempt carried. A collector that is down
costs the requests nothing: its spans are dropped and counted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

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
