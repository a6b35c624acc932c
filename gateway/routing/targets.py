"""Where requests go, as values: backends (with their credential pools) and targets (one provider model
on one backend). The snapshot decodes them and routing orders them; this module imports neither, so both
can depend on it. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.shm.bucket_keys import bucket_key

__all__ = ["Backend", "Credential", "Target", "decode_backends", "positive"]


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    url: str  # base URL without a trailing slash; request paths such as /v1/chat/completions are appended
    api_key: str | None
    protocol: str  # "openai" | "anthropic" | "gemini"
    connect_timeout: float
    first_byte_timeout: float
    read_timeout: float
    # Flow control (``gateway.dataplane.gates``): None = no gate. The ceiling starts at max_concurrency,
    # halves while the engine's waiting queue is at or above waiting_high_water, grows back by one a scrape.
    max_concurrency: int | None = None
    waiting_high_water: int = 8
    queue_size: int = 64  # requests a host lets wait for the gate; past it, 429 at once
    queue_timeout: float = 5.0  # how long one waits before its 429
    # Saturated too (as if its gate were full) while its engine's last scrape shows the KV cache at or
    # above this fraction and this host has requests in flight on it.
    kv_high_water: float = 0.98
    # Of max_concurrency, the places kept for critical and standard requests: a sheddable request takes a
    # place only while more than this many are free.
    reserved_places: int = 0
    health_path: str | None = None  # active probe (GET); None: no probe beyond the metrics scrape
    # An OpenAI backend that serves /v1/responses itself (vLLM does): Responses API requests go to it
    # verbatim; otherwise the gateway translates them to chat completions (gateway.dataplane.dialects).
    responses_api: bool = False
    # The engine's KV-event publisher (tcp://host:port): the host's control slot mirrors what it caches into
    # the prefix index's exact pairs (gateway.routing.kv_mirror); None: routing reads the approximate ones.
    kv_events: str | None = None
    # A credential pool: the API keys tried in turn instead of ``api_key`` (gateway.dataplane.credentials).
    credentials: tuple[Credential, ...] = ()


@dataclass(frozen=True, slots=True)
class Credential:
    """One API key of a backend's pool, with its own quota (shared buckets, keyed by ``scope``)."""

    name: str
    api_key: str = field(repr=False)
    scope: str  # "c:<backend>/<name>": the bucket keys' scope, and how the fleet view names it
    rpm: int | None = None
    tpm: int | None = None
    cool_down: float = 60.0  # seconds after a 429 that names no Retry-After
    rpm_key: int = 0
    tpm_key: int = 0

    @classmethod
    def from_doc(cls, backend: str, doc: dict[str, Any]) -> Credential:
        scope = f"c:{backend}/{doc['name']}"
        return cls(
            name=str(doc["name"]),
            api_key=str(doc["api_key"]),
            scope=scope,
            rpm=positive(doc.get("rpm")),
            tpm=positive(doc.get("tpm")),
            cool_down=float(doc.get("cool_down", 60.0)),
            rpm_key=bucket_key(scope, "rpm"),
            tpm_key=bucket_key(scope, "tpm"),
        )


def decode_backends(doc: dict[str, Any]) -> dict[str, Backend]:
    """The document's backends alone: all that a reader of backends (the engine scraper) needs to decode."""
    return {
        name: Backend(
            name=name,
            url=b["url"].rstrip("/"),
            api_key=b.get("api_key"),
            protocol=b.get("protocol", "openai"),
            connect_timeout=float(b.get("connect_timeout", 5.0)),
            first_byte_timeout=float(b.get("first_byte_timeout", 60.0)),
            read_timeout=float(b.get("read_timeout", 300.0)),
            max_concurrency=positive(b.get("max_concurrency")),
            waiting_high_water=int(b.get("waiting_high_water", 8)),
            queue_size=int(b.get("queue_size", 64)),
            queue_timeout=float(b.get("queue_timeout", 5.0)),
            kv_high_water=float(b.get("kv_high_water", 0.98)),
            reserved_places=int(b.get("reserved_places", 0)),
            health_path=b.get("health_path"),
            responses_api=b.get("responses_api") is True,
            kv_events=b["kv_events"] if isinstance(b.get("kv_events"), str) else None,
            credentials=tuple(Credential.from_doc(name, c) for c in b.get("credentials") or ()),
        )
        for name, b in doc.get("backends", {}).items()
    }


@dataclass(frozen=True, slots=True)
class Target:
    provider_model: str
    backend: Backend
    upstream_model: str
    context_window: int | None = None  # tokens, prompt and completion together; None: not declared


def positive(value: Any) -> int | None:
    """``value`` when it is a positive int (not a bool), else None: how the document says "no limit"."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
