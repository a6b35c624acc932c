"""W3C traceparent parsing and parent-based sampling (gateway.dataplane.trace_context), and the spans the
exporter makes of a record (gateway.controlplane.usage.otel)."""

from __future__ import annotations

import pytest

from gateway.controlplane.usage.otel import spans_of
from gateway.dataplane.trace_context import attempt_header, parse_traceparent, sample
from gateway.usage_record import UsageRecord

T, P = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (f"00-{T}-{P}-01", (T, P, True)),
        (f"00-{T}-{P}-00", (T, P, False)),
        (f"00-{T.upper()}-{P}-03", (T, P, True)),  # other flag bits
        (f"01-{T}-{P}-01-extra", (T, P, True)),  # a later version may add fields
        (f"00-{T}-{P}-01-extra", None),  # version 00 may not
        (f"ff-{T}-{P}-01", None),
        (f"00-{'0' * 32}-{P}-01", None),
        (f"00-{T}-{'0' * 16}-01", None),
        (f"00-{T[:-1]}g-{P}-01", None),
        (f"00-{T}-{P}", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent(header: str | None, parsed: tuple[str, str, bool] | None) -> None:
    assert parse_traceparent(header) == parsed


def test_sampling_follows_the_parent_then_the_ratio() -> None:
    span = sample(f"00-{T}-{P}-01", 0.0)
    assert span is not None and span.trace_id == T and span.parent_id == P and len(span.span_id) == 16
    assert sample(f"00-{T}-{P}-00", 1.0) is None
    assert sample(None, 0.0) is None
    fresh = sample("garbage", 1.0)
    assert fresh is not None and fresh.parent_id is None and len(fresh.trace_id) == 32
    picked = sum(sample(None, 0.25) is not None for _ in range(4000))
    assert 800 < picked < 1200
    span_id, header = attempt_header(fresh)
    assert header == f"00-{fresh.trace_id}-{span_id}-01" and parse_traceparent(header) == (
        fresh.trace_id, span_id, True)  # fmt: skip


def test_a_record_becomes_a_server_span_and_client_spans_for_the_attempts_sent() -> None:
    trace = [
        ["a", "pm-a", "full", None, None],  # passed over: no span
        ["b", "pm-b", "connect", None, 1.0, "1111111111111111", 0.5],
        ["c", "pm-c", 200, 5.0, 9.0, "2222222222222222", 2.0],
    ]
    r = UsageRecord(
        "rid", 1_800_000_000.0, "p", "k", "chat", "c", 200, 7, 3, 0, 10, "reported", 0, 12.0, 6.0, None,
        None, 2, None, None, "r1", trace, [T, P, "3333333333333333", "chat", "anthropic"],
    )  # fmt: skip
    server, failed, answered = spans_of(r)
    assert server.name == "chat chat" and server.parent_span_id.hex() == P
    assert server.end_time_unix_nano - server.start_time_unix_nano == 12_000_000
    assert failed.parent_span_id == answered.parent_span_id == server.span_id
    assert failed.start_time_unix_nano == server.start_time_unix_nano + 500_000
    assert answered.end_time_unix_nano - answered.start_time_unix_nano == 9_000_000
    assert {kv.key for kv in failed.attributes} >= {"error.type", "gen_ai.request.model"}
    assert spans_of(r._replace(span=None)) == []
