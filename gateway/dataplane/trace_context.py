"""W3C trace context on the request path: whether a request is sampled for OpenTelemetry, and the ids of
its span and of each upstream attempt's span.

Sampling is parent-based, as OpenTelemetry's default sampler: a client ``traceparent`` whose sampled flag
is set is continued (same trace id, its span as the parent) and one whose flag is clear is not sampled;
without one, a request is sampled with the configured ratio and starts a trace. Each attempt's span id goes
to the engine as ``traceparent`` (vLLM continues it), replacing the client's. A request that is not sampled
keeps the client's ``traceparent`` untouched and costs one comparison. Ids come from ``random`` (no system
call per request): they need to be unique, not secret. Pure; no I/O.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["RequestSpan", "attempt_header", "operation_of", "parse_traceparent", "sample"]

_HEX = frozenset("0123456789abcdef")
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}


@dataclass(slots=True)
class RequestSpan:
    trace_id: str  # 32 hex
    parent_id: str | None  # 16 hex: the client's span, when it sent a traceparent
    span_id: str  # 16 hex: the gateway's span for the request
    started: float  # perf_counter at the start of forwarding, for the attempts' offsets

    def ids(self, operation: str, dialect: str) -> list[Any]:
        """What the usage record carries (``UsageRecord.span``)."""
        return [self.trace_id, self.parent_id, self.span_id, operation, dialect]


def parse_traceparent(value: str | None) -> tuple[str, str, bool] | None:
    """``(trace_id, parent_span_id, sampled)`` of a valid version-00 ``traceparent``; None otherwise."""
    if value is None or len(value) < 55:
        return None
    value = value.strip().lower()
    parts = value.split("-")
    if len(parts) < 4 or parts[0] == "ff" or len(parts[0]) != 2 or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace_id, parent, flags = parts[:4]
    if len(trace_id) != 32 or len(parent) != 16 or len(flags) != 2:
        return None
    if not _HEX.issuperset(version + trace_id + parent + flags):
        return None
    if trace_id == "0" * 32 or parent == "0" * 16:
        return None
    return trace_id, parent, bool(int(flags, 16) & 1)


def _span_id() -> str:
    return f"{random.getrandbits(64) or 1:016x}"


def sample(traceparent: str | None, ratio: float) -> RequestSpan | None:
    """The request's span when it is sampled, else None."""
    parent = parse_traceparent(traceparent) if traceparent is not None else None
    if parent is not None:
        trace_id, parent_id, sampled = parent
        if not sampled:
            return None
        return RequestSpan(trace_id, parent_id, _span_id(), time.perf_counter())
    if ratio < 1.0 and random.random() >= ratio:
        return None
    return RequestSpan(f"{random.getrandbits(128) or 1:032x}", None, _span_id(), time.perf_counter())


def attempt_header(span: RequestSpan) -> tuple[str, str]:
    """A new span id for one upstream attempt, and the ``traceparent`` that carries it."""
    span_id = _span_id()
    return span_id, f"00-{span.trace_id}-{span_id}-01"


def operation_of(path: str) -> str:
    """The GenAI semantic conventions' operation name for an API path."""
    return _OPERATIONS.get(path, "chat")
