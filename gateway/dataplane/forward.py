"""Forwarding with failover, and the byte-for-byte relay of the answer.

A target is tried, and on a connect error, a timeout before the response headers, a 429 or a 5xx the
next one is, in chain order. Other statuses are the answer. Nothing is retried once the first byte has
been handed to the client. When every target failed, the last HTTP answer any of them gave reaches the
client verbatim; only if none answered at all does the gateway speak (502/504).
I/O: the upstream request through the worker's ``UpstreamClient``, and writes to the client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.dataplane.http_client import UpstreamClient, UpstreamError, UpstreamResponse
from gateway.dataplane.http_client import UpstreamTimeout as ClientTimeout
from gateway.dataplane.upstream import HOP_BY_HOP
from gateway.errors import GatewayError, UpstreamUnavailable
from gateway.protocol.openai_request import RequestInfo, splice_model
from gateway.snapshot import Route, Target

__all__ = ["Attempted", "BackendHealth", "Forwarder", "RelayAborted", "UpstreamTimeout"]


class UpstreamTimeout(GatewayError):
    status = 504
    code = "upstream_timeout"
    openai_type = "server_error"
    anthropic_type = "api_error"


class RelayAborted(Exception):
    """The upstream failed after the answer was committed to the client: the client's response is cut
    short (no terminating chunk), never completed with made-up bytes and never retried."""


@dataclass(slots=True)
class Attempted:
    """What forwarding did: which target answered (or the last tried), its status, how many tries."""

    target: Target | None
    status: int
    attempts: int


def _response_headers(resp: UpstreamResponse) -> list[tuple[str, str]]:
    return [(k, v) for k, v in resp.headers if k.lower() not in HOP_BY_HOP]


def _upstream_headers(headers: list[tuple[str, str]], target: Target) -> list[tuple[str, str]]:
    key = target.backend.api_key
    if key:
        return [*headers, ("Authorization", "Bearer " + key)]
    return headers


class BackendHealth:
    """What this worker saw of one backend: answers, failures (connect errors, timeouts, 429 and 5xx),
    the last failure, and requests in flight. Plain counters on the worker's loop; published about once a
    second through the worker's statistics slot, never on the request path."""

    __slots__ = ("answered", "consecutive", "failed", "in_flight", "last_error", "last_error_at")

    def __init__(self) -> None:
        self.answered = 0
        self.failed = 0
        self.consecutive = 0  # failures since the last answer
        self.in_flight = 0
        self.last_error = ""
        self.last_error_at = 0.0

    def fail(self, why: str) -> bool:
        """Count a failure; True when it takes the backend out (the threshold was just reached)."""
        self.failed += 1
        self.consecutive += 1
        self.last_error = why
        self.last_error_at = time.time()
        return self.consecutive >= FAILURES_TO_COOL_DOWN

    def as_dict(self) -> dict[str, Any]:
        return {
            "answered": self.answered,
            "failed": self.failed,
            "in_flight": self.in_flight,
            "last_error": self.last_error or None,
            "last_error_at": self.last_error_at or None,
            "consecutive_failures": self.consecutive,
        }


# Passive health: a backend that failed this many times in a row (connect errors, timeouts, 5xx; not 429,
# which is an engine shedding load) is skipped for ``cool_down`` seconds, unless every target of the
# request is.
FAILURES_TO_COOL_DOWN = 3


class Forwarder:
    def __init__(self, client: UpstreamClient, cool_down: float = 5.0) -> None:
        self.client = client
        self.cool_down = cool_down  # 0 turns passive health off
        self.health: dict[str, BackendHealth] = {}
        self.cooling: dict[str, float] = {}  # backend -> monotonic time it may be tried again

    async def forward(
        self,
        proto: Any,
        method: str,
        path_qs: str,
        headers: list[tuple[str, str]],
        body: bytes,
        info: RequestInfo | None,
        route: Route,
    ) -> Attempted:
        kept: tuple[int, list[tuple[str, str]], bytes] | None = None
        last_error: BaseException | None = None
        targets = route.targets
        if self.cooling:
            targets = self._skip_cooling(targets)
        last_index = len(targets) - 1
        target: Target | None = None
        for index, target in enumerate(targets):
            backend = target.backend
            health = self.health.get(backend.name)
            if health is None:
                health = self.health[backend.name] = BackendHealth()
            payload = body
            if info is not None and target.upstream_model != info.model:
                payload = splice_model(body, info, target.upstream_model)
            health.in_flight += 1
            try:
                try:
                    resp = await self.client.request(
                        backend.url,
                        method,
                        path_qs,
                        _upstream_headers(headers, target),
                        payload,
                        connect_timeout=backend.connect_timeout,
                        first_byte_timeout=backend.first_byte_timeout,
                        read_timeout=backend.read_timeout,
                    )
                except UpstreamError as exc:
                    if health.fail(f"{type(exc).__name__}: {exc}") and self.cool_down:
                        self.cooling[backend.name] = time.monotonic() + self.cool_down
                    last_error = exc
                    continue
                status = resp.status
                if status == 429 or status >= 500:
                    if health.fail(f"HTTP {status}") and status != 429 and self.cool_down:
                        self.cooling[backend.name] = time.monotonic() + self.cool_down
                    if status == 429:
                        health.consecutive -= 1  # load shedding says nothing about the backend's health
                    if index < last_index:
                        try:
                            kept = (status, _response_headers(resp), await resp.read())
                        except UpstreamError:
                            pass
                        finally:
                            resp.release()
                        continue
                else:
                    health.answered += 1
                    health.consecutive = 0
                await self._relay(proto, resp)
                return Attempted(target, status, index + 1)
            finally:
                health.in_flight -= 1
        if kept is not None:
            status, hdrs, data = kept
            proto.response_bytes(status, hdrs, data)
            return Attempted(target, status, len(targets))
        if isinstance(last_error, ClientTimeout):
            raise UpstreamTimeout("no backend answered in time for this model")
        detail = f": {type(last_error).__name__}" if last_error is not None else ""
        raise UpstreamUnavailable(f"no backend could be reached for this model{detail}")

    def _skip_cooling(self, targets: tuple[Target, ...]) -> tuple[Target, ...]:
        """The targets whose backend is not cooling down; all of them when every one is (trying a backend
        that failed beats failing without trying). Expired cool-downs are dropped: the next request tries
        the backend again, and one more failure takes it out at once."""
        now = time.monotonic()
        for name in [n for n, until in self.cooling.items() if until <= now]:
            del self.cooling[name]
        cooling = self.cooling
        kept = tuple(t for t in targets if t.backend.name not in cooling)
        return kept or targets

    async def _relay(self, proto: Any, resp: UpstreamResponse) -> None:
        """Hand the answer over untouched: whole when it has a length and is not an event stream, chunk by
        chunk otherwise. A streamed answer whose length the engine declared keeps that length, so a cut
        in the middle shows the client a short body instead of a cleanly ended one."""
        headers = _response_headers(resp)
        length = resp.content_length
        streamed = length is None or resp.content_type == "text/event-stream"
        try:
            if not streamed:
                try:
                    data = await resp.read()
                except UpstreamError as exc:
                    raise UpstreamUnavailable(f"backend failed while sending its answer: {exc!r}") from None
                proto.response_bytes(resp.status, headers, data)
                return
            if length is not None:
                headers.append(("content-length", str(length)))
            transport = proto.response_stream(resp.status, headers)
            try:
                async for chunk in resp:
                    await transport.send_bytes(chunk)
            except UpstreamError as exc:
                # granian ends the client's response only when the transport object is freed, and the
                # exception pins this frame through its traceback: let go of both.
                del transport
                exc.__traceback__ = None
                raise RelayAborted(f"backend stream failed after the first byte: {exc!r}") from None
        except BaseException:
            resp.close()  # drop the connection: the engine sees the client leave and stops generating
            raise
        finally:
            resp.release()
