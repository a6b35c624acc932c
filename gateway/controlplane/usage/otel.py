"""OpenTelemetry export: the sampled requests' spans, sent in batches to an OTLP/HTTP collector (protobuf)
by the control worker.

The proxy workers decide sampling and make the ids (``gateway.dataplane.trace_context``); the usage record
carries them with the route trace, through the same shared-memory ring as every record. Here each sampled
record becomes one SERVER span for the request (parented by the client's ``traceparent`` when it sent one)
and one CLIENT child span per upstream attempt, with the GenAI semantic conventions' attributes
(``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ...).

Records wait in a bounded queue (``otel_queue``); a batch of up to ``BATCH`` goes out every second, or
sooner once that many are waiting. A collector that is down or slow loses the spans of the batch being
sent (a POST has ``DEADLINE`` seconds in all, however the collector dribbles its answer), and once the
queue is full new ones are dropped: both are counted (``gateway_otel_spans_dropped_total``) and nothing
is retried or queued without bound, so the request path and the usage pipeline never wait for a
collector. I/O: HTTP POSTs to the collector.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from gateway.controlplane import outbound
from gateway.usage_record import UsageRecord

__all__ = ["BATCH", "OtelExporter", "spans_of"]

log = logging.getLogger("gateway.controlplane")

BATCH = 512  # records per export request
INTERVAL = 1.0  # seconds between exports when fewer than a batch are waiting
DEADLINE = 2.0  # seconds a collector has to take a batch, the whole call (``outbound.call``)
ANSWER_LIMIT = 1 << 20  # bytes of a collector's answer read at most (an ExportTraceServiceResponse is tiny)

_SERVER, _CLIENT = Span.SpanKind.SPAN_KIND_SERVER, Span.SpanKind.SPAN_KIND_CLIENT
_ERROR = Status.StatusCode.STATUS_CODE_ERROR


def _kv(key: str, value: str | int | float | bool) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _attributes(pairs: Iterable[tuple[str, Any]]) -> list[KeyValue]:
    return [_kv(k, v) for k, v in pairs if v is not None]


def spans_of(record: UsageRecord) -> list[Span]:
    """The request's span and its attempts' spans; none for a record that was not sampled."""
    ids = record.span
    if not ids or len(ids) < 5:
        return []
    trace_id, parent_id, span_id, operation, dialect = ids[:5]
    trace = bytes.fromhex(trace_id)
    own = bytes.fromhex(span_id)
    end = int(record.ts * 1e9)
    start = end - int(record.latency_ms * 1e6)
    usage = (
        ("gen_ai.usage.input_tokens", record.prompt_tokens),
        ("gen_ai.usage.output_tokens", record.completion_tokens),
    )
    request = Span(
        trace_id=trace,
        span_id=own,
        parent_span_id=bytes.fromhex(parent_id) if parent_id else b"",
        name=f"{operation} {record.model}",
        kind=_SERVER,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=_attributes(
            (
                ("gen_ai.operation.name", operation),
                ("gen_ai.request.model", record.model),
                ("gen_ai.provider.name", dialect),
                ("gen_ai.system", dialect),
                *usage,
                ("http.response.status_code", record.status),
                ("gateway.request_id", record.request_id),
                ("gateway.client_request_id", record.client_request_id),
                ("gateway.principal_id", record.principal_id),
                ("gateway.key_id", record.key_id),
                ("gateway.backend", record.backend),
                ("gateway.attempts", record.attempts),
                ("gateway.rule", record.rule),
                ("gateway.tag", record.tag),
                ("gateway.usage_source", record.usage_source),
            )
        ),
    )
    if record.status >= 500:
        request.status.code = _ERROR
        request.status.message = f"HTTP {record.status}"
    spans = [request]
    for entry in record.trace or ():
        if type(entry) is not list or len(entry) < 7:
            continue  # an attempt that was not sent (passed over), or one left out to fit the record
        backend, provider_model, outcome, ttfb, duration, attempt_id, offset = entry[:7]
        begin = start + int(float(offset) * 1e6)
        finish = begin + int(float(duration) * 1e6) if duration is not None else end
        answered = type(outcome) is int
        attempt = Span(
            trace_id=trace,
            span_id=bytes.fromhex(attempt_id),
            parent_span_id=own,
            name=f"{operation} {provider_model}",
            kind=_CLIENT,
            start_time_unix_nano=begin,
            end_time_unix_nano=finish,
            attributes=_attributes(
                (
                    ("gen_ai.operation.name", operation),
                    ("gen_ai.request.model", provider_model),
                    ("gateway.backend", backend),
                    ("http.response.status_code", outcome if answered else None),
                    ("error.type", None if answered else str(outcome or "gone")),
                    ("gateway.time_to_headers_ms", ttfb),
                    *(usage if answered and backend == record.backend and outcome < 400 else ()),
                )
            ),
        )
        if not answered or outcome >= 500 or outcome == 429:
            attempt.status.code = _ERROR
            attempt.status.message = f"HTTP {outcome}" if answered else str(outcome or "gone")
        spans.append(attempt)
    return spans


def span_count(record: UsageRecord) -> int:
    return 1 + sum(1 for e in record.trace or () if type(e) is list and len(e) >= 7)


class OtelExporter:
    def __init__(self, endpoint: str, service_name: str, queue_limit: int) -> None:
        self.endpoint = endpoint
        self.queue: deque[UsageRecord] = deque()
        self.queue_limit = max(1, queue_limit)
        self.exported = 0  # spans the collector accepted
        self.dropped = 0  # spans lost: queue full, collector down or refusing
        self._failing = False
        self._malformed = 0  # records left out because no span could be made of them (logged once)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop run() exports on
        self._resource = Resource(attributes=[_kv("service.name", service_name)])
        self._scope = InstrumentationScope(name="gateway")

    def add(self, records: Iterable[UsageRecord]) -> None:
        """Queue the sampled ones among ``records`` (the control worker's drain calls this)."""
        queue = self.queue
        for r in records:
            if r.span is None:
                continue
            if len(queue) >= self.queue_limit:
                self.dropped += span_count(r)
                continue
            queue.append(r)
        loop = self._loop
        if len(queue) >= BATCH and loop is not None:
            # The drain runs on the control worker's store thread: wake the exporting task through its loop.
            loop.call_soon_threadsafe(self._wake.set)

    def encode(self, records: list[UsageRecord]) -> tuple[bytes, int]:
        """The export request of ``records``' spans, and how many spans it holds. A record no span can be
        made of (its ids or its trace's entries are not what a proxy worker writes: the decoder checks
        only that they are lists) is left out and its spans counted as dropped, found by encoding the
        batch's records one at a time once the batch as a whole fails: it never stops the export."""
        try:
            return self._message(records), sum(map(span_count, records))
        except Exception:  # any record, from any proxy host: one at a time below
            good: list[UsageRecord] = []
            for r in records:
                try:
                    self._message([r])
                except Exception as exc:
                    self.dropped += span_count(r)
                    if not self._malformed:
                        log.error("request %s left out of the OpenTelemetry export: %s", r.request_id, exc)
                    self._malformed += 1
                else:
                    good.append(r)
            return self._message(good), sum(map(span_count, good))

    def _message(self, records: list[UsageRecord]) -> bytes:
        spans = [s for r in records for s in spans_of(r)]
        scope = ScopeSpans(scope=self._scope, spans=spans)
        message = ExportTraceServiceRequest(
            resource_spans=[ResourceSpans(resource=self._resource, scope_spans=[scope])]
        )
        data: bytes = message.SerializeToString()
        return data

    async def export_once(self, client: httpx.AsyncClient) -> int:
        """Send one batch; returns how many records it held."""
        batch = [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]
        if not batch:
            return 0
        content, spans = self.encode(batch)
        try:
            resp = await outbound.call(
                client,
                "POST",
                self.endpoint,
                deadline=DEADLINE,
                limit=ANSWER_LIMIT,
                content=content,
                headers={"content-type": "application/x-protobuf"},
                timeout=DEADLINE,
            )
            ok, why = resp.status_code < 300, f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok:
            self.exported += spans
            if self._failing:
                log.info("OpenTelemetry collector at %s accepts spans again", self.endpoint)
                self._failing = False
        else:
            self.dropped += spans
            if not self._failing:
                log.warning("OpenTelemetry export to %s failed (%s): spans are dropped", self.endpoint, why)
                self._failing = True
        return len(batch)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), INTERVAL)
                except TimeoutError:
                    pass
                self._wake.clear()
                while self.queue:
                    await self.export_once(client)

    def metrics_lines(self) -> list[str]:
        return [
            "# HELP gateway_otel_spans_exported_total Spans an OpenTelemetry collector accepted.",
            "# TYPE gateway_otel_spans_exported_total counter",
            f"gateway_otel_spans_exported_total {self.exported}",
            "# HELP gateway_otel_spans_dropped_total Spans dropped: queue full, collector down or refusing.",
            "# TYPE gateway_otel_spans_dropped_total counter",
            f"gateway_otel_spans_dropped_total {self.dropped}",
            "# HELP gateway_otel_queue Sampled requests waiting for export.",
            "# TYPE gateway_otel_queue gauge",
            f"gateway_otel_queue {len(self.queue)}",
        ]
