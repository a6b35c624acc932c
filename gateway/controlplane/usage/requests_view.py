"""Requests as an operator reads them: one finished request with its route trace, the flight recorder of
the last finished ones, and the requests in flight that the proxy workers publish.

The flight recorder is a bounded ring in the control worker's memory (``recent_requests`` records, the
newest last) filled as the usage rings are drained, so the admin API and the UI show a request a fraction
of a second after it ended without a database query; older ones are looked up in the store. In-flight
requests come from the proxy workers' statistics slots (``gateway.shm.worker_stats``), where each worker
publishes about once a second the requests it is serving. Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from gateway.usage_record import UsageRecord

__all__ = ["FlightRecorder", "attempts_doc", "live_requests", "request_doc"]

# Why the next target was tried after an attempt with this outcome, in an operator's words.
_WHY = {
    "connect": "no connection",
    "timeout": "no response headers in time",
    "error": "the connection failed",
    "unsupported": "its protocol cannot carry the request",
    "full": "its flow-control gate was full",
    "cut": "the answer was cut after it started",
    "gone": "the client went away",
}


def attempts_doc(trace: list[Any] | None) -> list[dict[str, Any]]:
    """The route trace's attempts as objects; an entry that counts attempts left out to fit the record
    becomes ``{"omitted": N}``."""
    out: list[dict[str, Any]] = []
    if not trace:
        return out
    for i, entry in enumerate(trace):
        if type(entry) is int:
            out.append({"omitted": entry})
            continue
        # Only a list is an attempt; anything else a record carried there reads as an attempt of nothing.
        backend, provider_model, outcome, ttfb, duration = (
            (entry if type(entry) is list else []) + [None] * 5
        )[:5]
        status = outcome if type(outcome) is int else None
        item = {
            "backend": backend,
            "provider_model": provider_model,
            "status": status,
            "error": None if status is not None else (outcome or "gone"),
            "ttfb_ms": ttfb,
            "duration_ms": duration,
            "next_because": None,
        }
        if i + 1 < len(trace):
            item["next_because"] = f"HTTP {status}" if status is not None else _WHY.get(str(outcome), outcome)
        out.append(item)
    return out


def request_doc(record: UsageRecord, names: dict[str, str] | None = None) -> dict[str, Any]:
    """One finished request for the admin API, the UI and ``gateway requests show``. ``id`` is what the
    client got as ``x-request-id`` (its own id when it sent one), ``request_id`` the gateway's."""
    span = record.span
    return {
        "id": record.client_request_id or record.request_id,
        "request_id": record.request_id,
        "client_request_id": record.client_request_id,
        "ts": record.ts,
        "principal_id": record.principal_id,
        "principal": (names or {}).get(record.principal_id),
        "key_id": record.key_id,
        "model": record.model,
        "backend": record.backend,
        "status": record.status,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cached_tokens": record.cached_tokens,
        "total_tokens": record.total_tokens,
        "usage_source": record.usage_source,
        "cost_nanos": record.cost_nanos,
        "latency_ms": record.latency_ms,
        "ttfb_ms": record.ttfb_ms,
        "tries": record.attempts,
        "tag": record.tag,
        "rule": record.rule,
        "attempts": attempts_doc(record.trace),
        "trace_id": span[0] if span else None,
    }


class FlightRecorder:
    """The last ``size`` finished requests, newest last. Filled by the control worker's drain (one
    ``deque.extend`` per batch), read by the admin API on the same loop."""

    def __init__(self, size: int) -> None:
        self.records: deque[UsageRecord] = deque(maxlen=max(0, size))

    def add(self, records: Iterable[UsageRecord]) -> None:
        self.records.extend(records)

    def find(self, request_id: str) -> list[UsageRecord]:
        """Records with this gateway or client request id, newest first."""
        return [r for r in reversed(self.records) if request_id in (r.request_id, r.client_request_id)]

    def latest(
        self, limit: int, *, model: str | None = None, status: str | None = None, failover: bool = False
    ) -> list[UsageRecord]:
        """Up to ``limit`` records, newest first; ``status`` ``"error"`` keeps those not 2xx, or a number
        keeps that status; ``failover`` those that tried more than one target."""
        out: list[UsageRecord] = []
        for r in reversed(self.records):
            if model is not None and r.model != model:
                continue
            if status == "error" and 200 <= r.status < 300:
                continue
            if status is not None and status != "error" and str(r.status) != status:
                continue
            if failover and r.attempts < 2:
                continue
            out.append(r)
            if len(out) >= limit:
                break
        return out


def live_requests(documents: Iterable[tuple[int, dict[str, Any]]], now: float) -> list[dict[str, Any]]:
    """The requests in flight that each worker last published, longest running first."""
    out: list[dict[str, Any]] = []
    for index, doc in documents:
        published = float(doc.get("published_at") or now)
        for item in doc.get("live") or ():
            if not isinstance(item, dict):
                continue
            started = float(item.get("started_at") or published)
            out.append({**item, "worker": index, "pid": doc.get("pid"), "running_s": max(0.0, now - started)})
    out.sort(key=lambda r: -r["running_s"])
    return out
