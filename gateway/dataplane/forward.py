"""Forwarding with failover, and the byte-for-byte relay of the answer.

A target is tried, and on a connect error, a timeout before the response headers, a 429 or a 5xx the
next one is, in the order routing decided. A target whose flow-control gate is full is passed over, and
when all are the request waits for a place (``backend_load``). Other statuses are the answer. Nothing is
retried once the first byte has been handed to the client. When every target failed, the last HTTP answer
any of them gave reaches the client verbatim; only if none answered at all does the gateway speak
(502/504). What the client caused (a request that cannot be written, a 4xx) is never held against a
backend's health.

A chunked stream the backend breaks off ends with an error event in the client's protocol; the tap notes
who cut an answer short (``cut``) so that it is billed for what was relayed. Streams are relayed no faster
than the client's connection drains beyond a window (``drain``), and so are answers with a large length,
which are therefore never held whole.
Each attempt, when the request is traced, appends one entry to the route trace list it was handed
(``gateway.usage_record``): backend, provider model, the status or why there was none, time to the
response headers and duration. Two clock reads and one small list per attempt.
I/O: the upstream request through the worker's ``UpstreamClient``, writes to the client, and (for streams
past one window) netlink requests about the client's connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from granian._granian import RSGIProtocolClosed as ProtocolClosed

from gateway.dataplane.backend_load import BackendLoad, Place
from gateway.dataplane.credentials import CredentialPools
from gateway.dataplane.dialects import Outgoing, Translation
from gateway.dataplane.drain import ClientStalled
from gateway.dataplane.flow import STANDARD
from gateway.dataplane.http_client import (
    RequestNotSendable,
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
)
from gateway.dataplane.http_client import UpstreamTimeout as ClientTimeout
from gateway.dataplane.relay import Pace, StreamSink, pour_stream
from gateway.dataplane.rsgi import HTTPProtocol, Scope, Transport
from gateway.dataplane.tap import AnswerMeter, answer_meter
from gateway.dataplane.trace_context import RequestSpan, attempt_header
from gateway.dataplane.upstream import without_hop_by_hop
from gateway.errors import BadRequest, GatewayTimeout, StreamCut, UpstreamUnavailable
from gateway.protocol.sse import encode_event
from gateway.routing.context import says_context_exceeded
from gateway.snapshot import Credential, KeyEntry, Route, Target
from gateway.usage_record import RouteStep

__all__ = ["Attempted", "BackendHealth", "Forwarder", "RelayAborted"]

log = logging.getLogger("gateway.dataplane")


class RelayAborted(Exception):
    """The upstream failed after the answer was committed to the client: the client's response is cut
    short (no terminating chunk), never completed with made-up bytes and never retried."""


@dataclass(slots=True)
class Attempted:
    """What forwarding did: which target answered (or the last tried), its status, how many tries."""

    target: Target | None
    status: int
    attempts: int
    credential: str | None = None  # the name of the pool's credential the answer came with


def _response_headers(resp: UpstreamResponse) -> list[tuple[str, str]]:
    return without_hop_by_hop(resp.headers)


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
# which is an engine shedding load) is cooling for ``cool_down`` seconds: routing leaves it out, and moves
# to the deployment-wide fallback (or answers 503) when every target of a request is out.
FAILURES_TO_COOL_DOWN = 3
# What a credential of a pool may answer that is about the credential, not the backend or the request.
_CREDENTIAL_REFUSALS = frozenset({401, 403, 429})


class Forwarder:
    def __init__(
        self,
        client: UpstreamClient,
        cool_down: float = 5.0,
        load: BackendLoad | None = None,
        stall_timeout: float = 60.0,
        credentials: CredentialPools | None = None,
        max_attempts: int = 5,
        backoff: float = 0.05,
    ) -> None:
        self.client = client
        self.cool_down = cool_down  # 0 turns passive health off
        self.stall_timeout = stall_timeout  # seconds a stream waits for a client that takes nothing
        self.load = load if load is not None else BackendLoad(None, None)
        self.health: dict[str, BackendHealth] = {}
        self.credentials = credentials if credentials is not None else CredentialPools()
        self.max_attempts = max_attempts  # tries of one request, credentials and targets together
        self.backoff = backoff  # seconds before the second try, doubling for each further one (to 1 s)

    def cool(self, name: str, health: BackendHealth) -> None:
        """Take the backend ``name`` out for ``cool_down`` seconds: it just failed too often in a row."""
        if self.cool_down > 0:
            log.warning(
                "backend %s marked unhealthy for %.1fs after %d failures in a row: %s",
                name,
                self.cool_down,
                health.consecutive,
                health.last_error,
            )
        self.load.cool(name, self.cool_down)

    async def forward(
        self,
        proto: HTTPProtocol,
        out: Outgoing,
        targets: tuple[Target, ...],
        peer: Scope | None = None,
        trace: list[RouteStep] | None = None,
        span: RequestSpan | None = None,
        key: KeyEntry | None = None,
        route: Route | None = None,
    ) -> Attempted:
        """Try ``targets`` in order (routing already dropped those known to be down). A target whose gate
        is full is passed over; if every remaining one is, the request waits for a place (bounded). A
        target whose backend has a credential pool is tried with its usable credentials in turn, as long
        as what failed was the credential (401, 403, 429); all tries share ``max_attempts``.
        ``peer`` (the RSGI scope: its ``client`` and ``server`` addresses name the client's connection) lets
        a streamed answer wait for its client; it is read only by a stream that relayed a window (granian
        makes those two strings when they are read: a short request never pays for them). Each
        attempt is appended to ``trace`` when given; with ``span`` (a sampled request) each attempt gets a
        span id of its own, sent to the engine as ``traceparent``. ``key`` and ``route`` place a request
        that must wait in the flow queue (its class and its principal's share); they are read only then, or
        for a gated backend (a sheddable request does not take its ``reserved_places``)."""
        load = self.load
        attempt = _Attempt(self, proto, out, _planned(targets, self.max_attempts), peer, trace, span)
        full: list[Target] = []
        rank: int | None = None  # the request's class: read for a gated backend, or while requests wait
        for target in targets:
            if attempt.tries >= self.max_attempts:
                break
            if attempt.floor is not None and (target.context_window or 0) <= attempt.floor:
                continue  # a context-length refusal: only a larger declared window may take it
            if rank is None and (target.backend.max_concurrency is not None or len(load.flow)):
                rank = _flow_class(key, route)
            if target.backend.credentials:
                if await self._pooled(attempt, target, STANDARD if rank is None else rank):
                    return attempt.result()
                continue
            place = load.enter(target.backend, STANDARD if rank is None else rank)
            if place is None:
                full.append(target)
                if trace is not None:
                    trace.append(RouteStep.start(target.backend.name, target.provider_model, "full"))
                continue
            if await attempt.run(target, place):
                return attempt.result()
        if full and attempt.tries == 0:
            if key is None:
                target, place = await load.wait(full, STANDARD, "")
            else:
                principal = key.principal
                if rank is None:
                    rank = _flow_class(key, route)
                target, place = await load.wait(full, rank, principal.id, principal.weight)
            attempt.last = attempt.tries + 1
            if await attempt.run(target, place):
                return attempt.result()
        return attempt.give_up(proto)

    async def _pooled(self, attempt: _Attempt, target: Target, rank: int) -> bool:
        """``target`` with each usable credential of its backend's pool until one answers, the backend
        itself fails (the next target's turn), or the attempt budget is spent."""
        out = self.out_tokens(attempt.out)
        tried = False
        for cred in self.credentials.usable(target.backend, out):
            if attempt.tries >= self.max_attempts:
                return False
            place = self.load.enter(target.backend, rank)
            if place is None:
                return False  # its gate is full: the next target rather than a wait for this one
            tried = True
            attempt.credential = cred
            if await attempt.run(target, place):
                return True
            if not attempt.credential_refused:
                return False
        if not tried and attempt.error is None and attempt.kept is None:
            attempt.error = NoCredential(f"no credential of backend {target.backend.name} is usable now")
        return False

    @staticmethod
    def out_tokens(out: Outgoing) -> int:
        """The request's token estimate for credentials' quotas: its size and its completion allowance."""
        info = out.info
        wanted = (info.max_tokens if info is not None else None) or out.default_max_tokens
        return len(out.body) // 4 + wanted

    async def _relay(
        self,
        proto: HTTPProtocol,
        answer: AnswerMeter,
        resp: UpstreamResponse,
        translation: Translation | None,
        peer: Scope | None,
    ) -> None:
        """Hand the answer over untouched: whole when it has a small length and is not an event stream,
        chunk by chunk otherwise (a large whole answer too: held once, as it passes, never joined and then
        copied into granian). A streamed answer whose length the engine declared keeps that length, so a
        cut in the middle shows the client a short body instead of a cleanly ended one; a chunked one gets
        an error event in its protocol before its end. A translated answer goes through its translation,
        event by event when streamed."""
        # A whole body's usage is whole or missing; a stream's may have stopped short of its report.
        answer.relaying(translation, resp.unframed and resp.content_type == "text/event-stream")
        headers = _response_headers(resp)
        length = resp.content_length
        # How the answer is framed (a length, chunks, or the connection's close) is the HTTP client's
        # business, read once there for every pair; whether it is a stream is what its type says. A whole
        # answer to translate is read whole however it is framed (real Gemini endpoints send chunked JSON);
        # a verbatim one streams when it has no length or a large one, so it is never held whole.
        if translation is not None:
            streamed = resp.content_type == "text/event-stream"
        else:
            streamed = length is None or length > WHOLE_LIMIT or resp.content_type == "text/event-stream"
        try:
            if not streamed:
                try:
                    data = await resp.read(TRANSLATE_LIMIT if translation is not None else 0)
                except UpstreamError as exc:
                    raise UpstreamUnavailable(f"backend failed while sending its answer: {exc!r}") from None
                if translation is not None:
                    ok = 200 <= resp.status < 300
                    data = translation.whole(data) if ok else translation.error(resp.status, data)
                    if not translation.verbatim:
                        headers = [_JSON_TYPE]
                proto.response_bytes(resp.status, headers, data)
                return
            if translation is not None:
                if not translation.verbatim:
                    headers, length = [_SSE_TYPE, ("cache-control", "no-cache")], None
                elif length is not None:
                    headers.append(("content-length", str(length)))
                transport = proto.response_stream(resp.status, headers)
                pace = Pace(peer, self.stall_timeout)
                await _relay_translated(transport, resp, translation, answer, pace, length is None)
                return
            if length is not None:
                headers.append(("content-length", str(length)))
            transport = proto.response_stream(resp.status, headers)
            # Poured (``relay``): each piece goes out from the upstream connection's callback as it arrives.
            # A tapped stream's end is announced before the client can see it: with its last piece when the
            # engine's framing says which that is, else once the body ended, before the transport goes.
            sink = StreamSink(transport, Pace(peer, self.stall_timeout))
            try:
                await pour_stream(resp, sink)
                answer.end()
            except UpstreamError as exc:
                # The engine's stream broke off: a chunked answer tells the client in OpenAI's terms (a
                # stream ended by [DONE] already told it everything), a sized one is left short.
                answer.cut_short("upstream")
                if length is None and not sink.piece.rstrip().endswith(b"[DONE]"):
                    await _send_quietly(transport, encode_event(None, _cut_error().openai_body()))
                # granian ends the client's response only when the transport object is freed, and the
                # exception pins this frame through its traceback: let go of both.
                del transport, sink
                exc.__traceback__ = None
                raise RelayAborted(f"backend stream failed after the first byte: {exc!r}") from None
        except ProtocolClosed:
            # The client went away (granian's transport is closed): what was relayed is billed (the tap
            # knows), the engine's connection is dropped below so that it stops generating.
            answer.cut_short("client")
            resp.close()
        except ClientStalled as exc:
            answer.cut_short("client")
            resp.close()
            exc.__traceback__ = None  # as above: nothing may pin the transport past the return
            raise RelayAborted(f"stream cut: {exc}") from None
        except BaseException:
            resp.close()  # drop the connection: the engine sees the client leave and stops generating
            raise
        finally:
            resp.release()


_JSON_TYPE = ("content-type", "application/json")
_SSE_TYPE = ("content-type", "text/event-stream")
PING_EVERY = 10.0  # seconds of upstream silence after which an Anthropic client is sent a ping event
# Answers with a length above this are relayed as they arrive rather than read whole: one copy of them is
# held (granian's), a window at a time, instead of the pieces, their join and granian's copy of that.
WHOLE_LIMIT = 256 * 1024
# A failed target's answer is kept (for the client, should every target fail) only up to this size: an error
# body is small, and a backend that sends a huge one must not make the worker hold it.
KEPT_LIMIT = 1 << 20
# A whole answer that must be translated is read whole; one larger than this is refused (502), not held.
TRANSLATE_LIMIT = 64 << 20


def _flow_class(key: KeyEntry | None, route: Route | None) -> int:
    """A request's flow-control class: its key's for ``route``, standard without either."""
    return STANDARD if key is None or route is None else key.flow_class(route)


def _cut_error() -> StreamCut:
    return StreamCut("the backend's stream broke off before the answer was complete")


async def _send_quietly(transport: Transport, data: bytes) -> None:
    try:
        await transport.send_bytes(data)
    except ProtocolClosed:
        pass  # the client left as well


async def _relay_translated(
    transport: Transport,
    resp: UpstreamResponse,
    translation: Translation,
    answer: AnswerMeter,
    pace: Pace,
    chunked: bool,
) -> None:
    """A stream through its translation. A cut upstream ends it with the translation's error event (never
    a made-up end of message); quiet stretches get the client protocol's keepalive where it has one. The
    tap hears of the end before the translation's last events go out."""
    ping = translation.ping()
    quiet: _Keepalive | None = None
    finished = False
    chunk = b""
    try:
        async for chunk in resp:
            data = translation.feed(chunk)
            if resp.ended:  # the engine's last piece: the translation ends with it
                # Sent apart rather than appended: a Response's last events repeat its whole text, and
                # appending would copy them all once more.
                finished = True
                tail = translation.finish()
                answer.end()
                if data:
                    await transport.send_bytes(data)
                data = tail
            if data:
                await transport.send_bytes(data)
                pace.sent += len(data)
                if pace.sent >= pace.check:
                    await pace.wait()
                if quiet is not None:
                    quiet.last = time.monotonic()
                elif ping is not None and not finished:
                    # As Anthropic does: a ping right after message_start, then one per quiet stretch (never
                    # before the stream's first event, nor after its last).
                    await transport.send_bytes(ping)
                    quiet = _Keepalive(transport, ping)
        if not finished:
            tail = translation.finish()
            answer.end()
            if tail:
                await transport.send_bytes(tail)
    except UpstreamError as exc:
        answer.cut_short("upstream")
        tail = translation.cut(chunk) if chunked else b""
        if tail:
            await _send_quietly(transport, tail)
        del transport
        exc.__traceback__ = None
        raise RelayAborted(f"backend stream failed after the first byte: {exc!r}") from None
    finally:
        if quiet is not None:
            quiet.stop()


class _Keepalive:
    """Sends ``ping`` when nothing went to the client for ``PING_EVERY`` seconds. One timer per stream,
    re-armed from the last send, never a task per chunk."""

    def __init__(self, transport: Transport, ping: bytes) -> None:
        self.transport = transport
        self.ping = ping
        self.last = time.monotonic()
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(PING_EVERY, self._due)

    def _due(self) -> None:
        wait = self.last + PING_EVERY - time.monotonic()
        if wait > 0:
            self.timer = self.loop.call_later(wait, self._due)
            return
        self.task = self.loop.create_task(self._send())

    async def _send(self) -> None:
        self.last = time.monotonic()
        try:
            await self.transport.send_bytes(self.ping)
        except ProtocolClosed:
            return  # the client left: the relay finds out with its next send
        self.timer = self.loop.call_later(PING_EVERY, self._due)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


def _outcome(exc: UpstreamError) -> str:
    """Why an attempt got no answer, for its route trace entry."""
    if isinstance(exc, ClientTimeout):
        return "timeout"
    return "connect" if str(exc).startswith("cannot connect") else "error"


class NoCredential(Exception):
    """Every credential of a pool is disabled, cooling or out of quota."""


class Kept(NamedTuple):
    """A failed try's answer, kept for the client in case every later try fails too."""

    status: int
    headers: list[tuple[str, str]]  # hop-by-hop ones out
    body: bytes  # at most ``KEPT_LIMIT`` bytes
    translation: Translation | None  # how it reaches the client in its protocol


def _planned(targets: tuple[Target, ...], max_attempts: int) -> int:
    """How many tries the plan may make: a try per target, a try per credential of a pool."""
    return min(max_attempts, sum(len(t.backend.credentials) or 1 for t in targets))


class _Attempt:
    """One request's walk over its targets: the last 429/5xx answer kept for the client in case every
    target fails, the last error, and how many targets were tried."""

    __slots__ = (
        "answer",
        "credential",
        "credential_refused",
        "error",
        "floor",
        "fwd",
        "kept",
        "last",
        "out",
        "peer",
        "proto",
        "refusal",
        "span",
        "status",
        "target",
        "trace",
        "tries",
    )

    def __init__(
        self,
        fwd: Forwarder,
        proto: HTTPProtocol,
        out: Outgoing,
        count: int,
        peer: Scope | None,
        trace: list[RouteStep] | None = None,
        span: RequestSpan | None = None,
    ) -> None:
        self.fwd = fwd
        self.peer = peer
        self.trace = trace
        self.span = span
        self.proto = proto
        self.answer = answer_meter(proto)  # what the answer's metering hears of this walk
        self.out = out
        self.last = count  # tries after which a failure's answer is relayed rather than kept
        self.tries = 0
        self.kept: Kept | None = None
        self.error: BaseException | None = None
        self.target: Target | None = None
        self.status = 0
        self.refusal: BadRequest | None = None  # a translator's: this request cannot go to that protocol
        self.floor: int | None = None  # after a context-length 400: the window that was too small
        self.credential: Credential | None = None  # of the try under way (or the last one)
        self.credential_refused = False  # the last try's credential was refused (401, 403, 429)

    async def run(self, target: Target, place: Place) -> bool:
        """Try ``target`` holding ``place``; True when its answer went to the client."""
        fwd = self.fwd
        backend = target.backend
        if not backend.credentials:
            self.credential = None
        cred = self.credential
        self.out.credential = cred.api_key if cred is not None else None
        self.credential_refused = False
        try:
            if self.tries and fwd.backoff > 0:  # a short pause before a retry: only failures pay for it
                await asyncio.sleep(min(fwd.backoff * 2 ** (self.tries - 1), 1.0))
            up = self.out.prepare(target)
        except BadRequest as exc:  # the next target may speak a protocol that can carry the request
            self.refusal = self.refusal or exc
            up = None
        except BaseException:
            fwd.load.leave(backend, place)
            raise
        trace = self.trace
        if up is None:  # this backend's protocol cannot serve the request: not a try
            fwd.load.leave(backend, place)
            self.last -= 1
            if trace is not None:
                trace.append(RouteStep.start(backend.name, target.provider_model, "unsupported"))
            return False
        self.tries += 1
        self.target = target
        health = fwd.health.get(backend.name)
        if health is None:
            health = fwd.health[backend.name] = BackendHealth()
        health.in_flight += 1
        # The answering backend, with a pool's credential by name as the store keeps it (BACKEND/NAME).
        label = backend.name if cred is None else f"{backend.name}/{cred.name}"
        entry: RouteStep | None = None
        started = 0.0
        if trace is not None:  # filled in as the attempt goes: a live request shows where it is
            entry = RouteStep.start(label, target.provider_model)
            trace.append(entry)
            started = time.perf_counter()
        headers = up.headers
        span = self.span
        if span is not None and entry is not None:  # sampled: this attempt is a child span of the request
            span_id, traceparent = attempt_header(span)
            headers = [h for h in headers if h[0].lower() != "traceparent"]
            headers.append(("traceparent", traceparent))
            entry.sampled(span_id, round((started - span.started) * 1000.0, 2))
        try:
            try:
                resp = await fwd.client.request(
                    backend.url,
                    self.out.method,
                    up.path_qs,
                    headers,
                    up.body,
                    connect_timeout=backend.connect_timeout,
                    first_byte_timeout=backend.first_byte_timeout,
                    read_timeout=backend.read_timeout,
                )
            except RequestNotSendable as exc:
                # The client's request is at fault, not the backend: a 400, and no mark against its health
                # (eight such requests must not take a backend away from everyone else).
                raise BadRequest(str(exc)) from None
            except UpstreamError as exc:
                if health.fail(f"{type(exc).__name__}: {exc}"):
                    fwd.cool(backend.name, health)
                self.error = exc
                if entry is not None:
                    entry.failed(_outcome(exc))
                return False
            status = self.status = resp.status
            if entry is not None:
                # Milliseconds to two places; round(x, 2) costs 0.25 µs (it formats the float), this 0.05.
                entry.answered(status, int((time.perf_counter() - started) * 100_000.0 + 0.5) / 100)
            if cred is not None and status in _CREDENTIAL_REFUSALS:
                # The key's fault, not the backend's: its health is untouched, the next key is tried.
                fwd.credentials.refused(backend, cred, status, _response_headers(resp))
                self.credential_refused = True
                if self.tries < self.last:
                    await self._keep(resp, up.translation)
                    return False
            elif status == 429 or status >= 500:
                if health.fail(f"HTTP {status}") and status != 429:
                    fwd.cool(backend.name, health)
                if status == 429:
                    health.consecutive -= 1  # load shedding says nothing about the backend's health
                if self.tries < self.last:
                    await self._keep(resp, up.translation)
                    return False
            elif status == 400 and self.out.context_failover and self.tries < self.last:
                # The one 4xx that may fail over: read it (bounded) to see whether it says so.
                try:
                    data = await resp.read(KEPT_LIMIT)
                except UpstreamError:
                    data = b""
                finally:
                    resp.release()
                self.kept = Kept(status, _response_headers(resp), data, up.translation)
                if says_context_exceeded(data):
                    self.floor = target.context_window or 0
                    return False
                self.send_kept(self.proto)
                return True
            else:
                health.answered += 1
                health.consecutive = 0
                if cred is not None:
                    fwd.credentials.answered(cred)
            proto = self.proto
            # The record names the backend even if the client leaves; a pool's credential by name, as the
            # store keeps it (BACKEND/NAME), never its secret.
            self.answer.answered_by(label, self.tries)
            try:
                await fwd._relay(proto, self.answer, resp, up.translation, self.peer)
            except RelayAborted:
                if entry is not None:
                    entry.failed("cut")
                raise
            return True
        finally:
            if entry is not None:
                entry.ended(int((time.perf_counter() - started) * 100_000.0 + 0.5) / 100)  # ms, as above
            health.in_flight -= 1
            fwd.load.leave(backend, place)

    async def _keep(self, resp: UpstreamResponse, translation: Translation | None) -> None:
        """Keep a failed try's answer (at most ``KEPT_LIMIT`` of it) for the client, in case every later
        target fails too; the connection goes back either way."""
        try:
            body = await resp.read(KEPT_LIMIT)
            self.kept = Kept(resp.status, _response_headers(resp), body, translation)
        except UpstreamError:
            pass
        finally:
            resp.release()

    def result(self) -> Attempted:
        return Attempted(self.target, self.status, self.tries, self.credential_name())

    def credential_name(self) -> str | None:
        return self.credential.name if self.credential is not None and self.target is not None else None

    def send_kept(self, proto: HTTPProtocol) -> int:
        """The kept answer to the client, in its protocol; its status."""
        assert self.kept is not None
        status, hdrs, data, translation = self.kept
        if translation is not None and not translation.verbatim:
            data, hdrs = translation.error(status, data), [_JSON_TYPE]
        proto.response_bytes(status, hdrs, data)
        return status

    def give_up(self, proto: HTTPProtocol) -> Attempted:
        """Every target failed: the last kept answer goes to the client (in its protocol), or the gateway
        speaks."""
        if self.kept is not None:
            return Attempted(self.target, self.send_kept(proto), self.tries, self.credential_name())
        if isinstance(self.error, ClientTimeout):
            raise GatewayTimeout("no backend answered in time for this model")
        if self.tries == 0 and self.refusal is not None:
            raise self.refusal
        if self.tries == 0 and isinstance(self.error, NoCredential):
            raise UpstreamUnavailable(f"{self.error}: try again later", headers={"retry-after": "1"})
        if self.tries == 0 and self.error is None:
            raise BadRequest(f"no backend of this model serves {self.out.path_qs.partition('?')[0]}")
        detail = f": {type(self.error).__name__}" if self.error is not None else ""
        raise UpstreamUnavailable(f"no backend could be reached for this model{detail}")
