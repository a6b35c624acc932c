"""Everything the request path does around a forwarded request for limits, budgets and usage.

``admit`` runs after authorisation and model resolution, before anything is sent upstream: the budget
checks (402: every budget of the principal and of the key, one window each), the rate limits (429), and a
request id. ``settle`` runs as the answer ends, before the client can see its end (the tap calls it just
before a whole answer or a stream's last bytes go out): it reads the usage from the response's tail,
settles the token reservation, gives concurrency back and adds the spend to every one of those budgets,
so that the client's next request already meets them. ``finish`` runs once the
answer has ended, however it ended: it settles if that has not happened (an error, a cut stream) and pushes
one usage record to the control worker, and, for a request a ``[[body_logs]]`` entry picked, its bodies
(``body_log``). I/O: none (shared memory only).

The request path sees one interface whatever is on: ``admit`` gives an ``Exchange``, or ``UNMETERED``
when nothing needs accounting for this request (no limit on its key, no budget, no usage records; an
``Accounting`` of nothing, the app's default, always does), a do-nothing exchange whose ``open`` hands the
client's protocol object back untouched and whose ``finish`` does nothing. ``Exchange.open`` notes the
deciding routing rule and its tag, samples the request for OpenTelemetry, starts its route trace (the
forwarder appends one entry per attempt), asks a stream for its usage (``--inject-stream-usage``) and
wraps the client's protocol object in the tap; the record carries the trace and the tag, cut to what fits
the ring's slot (``gateway.usage_record.fit_record``).

Tokens counted for a request: what the engine reported; for an answer that ended short (its client went
away, or its backend broke off: ``ResponseTap.cut``) without the engine's report, an estimate of what was
relayed before the end (the prompt estimate plus the relayed content, ``gateway.protocol.relayed``), which
settles the token reservation like a reported count; for another successful answer without usage (a
stream whose client opted out of usage) the estimate reserved before dispatch; for an error answer
nothing. The record of a cut answer keeps the status the client was sent and says why in ``cut``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from gateway.config import Settings
from gateway.dataplane.body_log import BodyCapture, BodyLog, CapturingTap
from gateway.dataplane.budgets import BudgetGuard, held
from gateway.dataplane.dialects import Outgoing
from gateway.dataplane.forward import Attempted, RelayAborted
from gateway.dataplane.limits import Limiter, Ticket, estimate_tokens
from gateway.dataplane.rsgi import Headers, HTTPProtocol
from gateway.dataplane.tap import ResponseTap
from gateway.dataplane.trace_context import RequestSpan, operation_of, sample
from gateway.dataplane.usage_log import UsageLog
from gateway.errors import GatewayError
from gateway.native import NativeError
from gateway.protocol.openai_request import inject_stream_usage
from gateway.protocol.paths import anthropic_envelope
from gateway.routing.rules import Rule
from gateway.snapshot import KeyEntry, Route
from gateway.usage_record import RouteStep, UsageRecord, encode_record, fit_record

__all__ = ["CLIENT_GONE", "UNMETERED", "Accounting", "Exchange", "Settled", "Unmetered"]

log = logging.getLogger("gateway.dataplane")

CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer
_CLIENT_ID = re.compile(r"[!-~]{1,128}")  # printable ASCII, no spaces: safe in logs and headers
# Where an engine reports a stream's usage only when asked with stream_options.include_usage.
_STREAM_USAGE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# A NamedTuple from exactly its fields, without its generated ``__new__``'s frame: twice per request.
_new = tuple.__new__


class Settled(NamedTuple):
    """What an answer used, counted once (``Accounting.settle``): the record's token and cost fields."""

    prompt: int
    completion: int
    cached: int
    total: int
    source: str  # "reported" | "estimated" | "none"
    cost: int  # in nano-units of the price's currency
    # The live spend counters charged, one per budget window; None when none was.
    principal_keys: tuple[int, ...] | None  # the principal's budgets'
    key_keys: tuple[int, ...] | None  # the key's own budgets'


@dataclass(slots=True)
class Exchange:
    """A request that is accounted for, from admission to its record."""

    accounting: Accounting
    key: KeyEntry
    model: str
    route: Route
    estimate: int  # tokens reserved: prompt estimate + completion budget
    prompt_estimate: int
    ticket: Ticket | None
    request_id: str
    started: float  # perf_counter
    headers: list[tuple[str, str]]
    client_request_id: str | None = None
    tag: str | None = None  # the routing rule's usage tag (``open``)
    rule: str | None = None  # the routing rule that decided, by name (``#N`` when it has none)
    trace: list[RouteStep] | None = None  # the forwarder's attempts; None: not traced
    span: list[Any] | None = None  # OpenTelemetry ids when sampled, as the record carries them
    request_span: RequestSpan | None = None  # the same span, for the forwarder's attempts
    settled: Settled | None = None  # set by ``settle``
    capture: BodyCapture | None = None  # the bodies, when a [[body_logs]] entry picked this request

    def open(
        self,
        proto: HTTPProtocol,
        headers: Headers,
        out: Outgoing,
        path: str,
        tag: str | None,
        rule: Rule | None,
        capture: BodyCapture | None = None,
    ) -> ResponseTap:
        """Start the answer's accounting: what the record says of the routing decision, the trace and
        span, the stream usage asked for, the bodies when a ``[[body_logs]]`` entry picked the request
        (``capture``); the tap the answer goes out through."""
        accounting = self.accounting
        self.tag = tag
        if rule is not None:
            self.rule = rule.name or f"#{rule.index}"
        span = None
        if accounting.otel_ratio:  # OpenTelemetry export on: is this request sampled?
            span = sample(headers.get("traceparent"), accounting.otel_ratio)
            if span is not None:
                self.request_span = span
                self.span = span.ids(operation_of(path), out.dialect)
        if accounting.route_trace or span is not None:
            self.trace = []
        request_id = self.request_id
        if out.dialect == "anthropic" and request_id:
            # Anthropic's SDKs read the id from ``request-id`` (``x-request-id`` stays for everyone else).
            self.headers.append(("request-id", self.client_request_id or request_id))
        info = out.info
        injected = (
            info is not None
            and info.stream
            and not info.stream_options
            and path in _STREAM_USAGE_PATHS
            and accounting.stream_usage
        )
        if injected:
            out.body = inject_stream_usage(out.body)
        settle = partial(accounting.settle, self)
        if capture is None or accounting.bodies is None:
            tap = ResponseTap(proto, self.headers, settle)
        else:
            self.capture = capture
            tap = CapturingTap(proto, self.headers, settle, capture)
        tap.withhold_usage = injected
        if request_id:
            accounting.live[request_id] = self
        return tap

    def finish(self, client: HTTPProtocol, attempted: Attempted | None, failed: BaseException | None) -> None:
        """The request ended: with ``attempted`` (None when the client went away first), or ``failed``
        with that exception, which goes on to the client. Settles if the answer did not, and records."""
        tap = client
        assert isinstance(tap, ResponseTap)  # the one ``open`` made
        status, backend, attempts = CLIENT_GONE, None, 0
        if attempted is not None:
            status = tap.status or attempted.status
            backend = attempted.target.backend.name if attempted.target is not None else None
            if backend is not None and attempted.credential is not None:
                backend += "/" + attempted.credential  # the credential by name, as the store has it
            attempts = attempted.attempts
        elif isinstance(failed, GatewayError):
            status = failed.status
            # The gateway's own answer carries the id too, so the refusal can be looked up.
            if self.request_id:
                failed.headers["x-request-id"] = self.client_request_id or self.request_id
            capture = self.capture
            if capture is not None:
                capture.gateway_answer(
                    failed.anthropic_body() if anthropic_envelope(capture.path) else failed.openai_body()
                )
        elif isinstance(failed, RelayAborted):
            status = tap.status
        self.accounting.finish(self, tap, status, backend, attempts)


class Unmetered:
    """The exchange of a request nothing is accounted for: the client's protocol object goes to the
    forwarder as it is, and nothing is traced, sampled or recorded (a record is where those go)."""

    __slots__ = ()

    trace: list[RouteStep] | None = None
    request_span: RequestSpan | None = None

    def open(
        self,
        proto: HTTPProtocol,
        headers: Headers,
        out: Outgoing,
        path: str,
        tag: str | None,
        rule: Rule | None,
        capture: BodyCapture | None = None,
    ) -> HTTPProtocol:
        return proto

    def finish(self, client: HTTPProtocol, attempted: Attempted | None, failed: BaseException | None) -> None:
        return None


UNMETERED = Unmetered()


class Accounting:
    """One worker's accounting: its rate limits, budgets and usage ring, each None when off
    (``Accounting(None, None, None)`` accounts for nothing). ``settings`` says what a recorded request
    carries besides its usage: a route trace, an OpenTelemetry span, a stream's usage asked for."""

    def __init__(
        self,
        limiter: Limiter | None,
        budgets: BudgetGuard | None,
        usage: UsageLog | None,
        settings: Settings | None = None,
        bodies: BodyLog | None = None,
    ) -> None:
        self.limiter = limiter
        self.budgets = budgets
        self.usage = usage
        self.route_trace = settings is not None and settings.route_trace
        # The share of requests sampled for OpenTelemetry; 0 when no collector is configured.
        self.otel_ratio = 0.0
        if settings is not None and settings.otel_endpoint:
            self.otel_ratio = settings.otel_sample_ratio
        self.stream_usage = settings is not None and settings.inject_stream_usage
        # This worker's body ring; None without usage records (bodies are filed under the record's id).
        self.bodies = bodies if usage is not None else None
        self.max_record = usage.ring.max_record if usage is not None else 0
        # Requests between dispatch and their record, by request id: what the worker publishes as its
        # live requests (``live_doc``). One dict store and one pop per request.
        self.live: dict[str, Exchange] = {}

    def admit(
        self,
        key: KeyEntry,
        model: str,
        route: Route,
        body_len: int,
        max_tokens: int | None,
        default: int,
        client_request_id: str | None = None,
    ) -> Exchange | Unmetered:
        """Check the budgets and take the rate limits; ``UNMETERED`` when nothing needs accounting."""
        budgets, guard = key.budgets, self.budgets
        windows = guard.windows(budgets, time.time()) if budgets is not None and guard is not None else None
        prompt, estimate = estimate_tokens(body_len, max_tokens, default)
        # The budgets and the limits in one C call; the budgets alone when the request has no limits.
        ticket = self.limiter.admit(key, model, estimate, windows) if self.limiter is not None else None
        if ticket is None:
            if windows is not None and guard is not None:
                guard.check_windows(windows)
            elif self.usage is None:
                return UNMETERED
        request_id = self.usage.request_id() if self.usage is not None else ""
        headers = ticket.headers if ticket is not None else []
        client_id = (
            client_request_id if client_request_id and _CLIENT_ID.fullmatch(client_request_id) else None
        )
        if request_id:
            # The client's id, when it sent a usable one, comes back as it sent it; the gateway's own (the
            # record's key) comes back beside it.
            headers = [("x-request-id", client_id or request_id), *headers]
            if client_id:
                headers.append(("x-gateway-request-id", request_id))
        return Exchange(
            self,
            key,
            model,
            route,
            estimate,
            prompt,
            ticket,
            request_id,
            time.perf_counter(),
            headers,
            client_id,
        )

    def settle(self, ex: Exchange, tap: ResponseTap, status: int) -> None:
        """Count what the answer used (once): settle the token reservation and give the concurrency
        places back, add the spend to the budgets."""
        if ex.settled is not None:
            return
        usage = tap.usage()
        used: int | None  # what the token reservation settles to; None keeps the reservation
        if tap.unframed and tap.cut is None and tap.ended_short():  # only close-delimited streams look
            tap.cut = "upstream"
        relayed = tap.relayed_usage(ex.prompt_estimate) if tap.cut is not None else None
        if usage is not None and (relayed is None or usage.completion_tokens >= relayed[1]):
            prompt, completion = usage.prompt_tokens, usage.completion_tokens
            cached, total, source = usage.cached_tokens, usage.total_tokens, "reported"
            used = total
        elif relayed is not None:
            # Cut short before the engine's final count: what was relayed, with the prompt the stream's
            # start reported where it did (an Anthropic message_start: its output count is a placeholder).
            prompt, completion = relayed
            cached = 0
            if usage is not None and usage.prompt_tokens:
                prompt, cached = usage.prompt_tokens, usage.cached_tokens
            total, source = prompt + completion, "estimated"
            used = total
        elif 200 <= status < 300:
            prompt, completion, cached = ex.prompt_estimate, ex.estimate - ex.prompt_estimate, 0
            total, source, used = ex.estimate, "estimated", None
        else:
            prompt = completion = cached = total = used = 0
            source = "none"
        price = ex.route.price
        cost = price.cost(prompt, completion, cached) if price is not None and total else 0
        live: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        budgets, guard, ticket = ex.key.budgets, self.budgets, ex.ticket
        # A shared table that fails (it is full) is logged, not raised: the answer still goes out and its
        # record is still written; a spend the live counters missed reaches the budgets through the store
        # (the record then names no live counter, so the control worker folds it into the bases).
        windows = guard.windows(budgets, time.time()) if budgets is not None and guard is not None else None
        try:
            # The limits and the budgets in one C call; the budgets alone when the request has no limits.
            added = 0
            if ticket is not None and self.limiter is not None:
                added = self.limiter.finish(ticket, used, windows, total, cost)
            elif windows is not None and guard is not None:
                added = guard.charge_windows(windows, total, cost)
            if windows is not None and budgets is not None:
                live = held(budgets, windows, added, ex.request_id or "-")
        except NativeError as exc:
            log.error("settling request %s in the bucket table failed: %s", ex.request_id or "-", exc)
        ex.settled = _new(Settled, (prompt, completion, cached, total, source, cost, *live))

    def live_doc(self, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` requests in flight, oldest first, for the worker's statistics slot."""
        now, wall = time.perf_counter(), time.time()
        out = []
        for ex in list(self.live.values())[:limit]:
            trace = ex.trace
            last = trace[-1] if trace else None
            out.append(
                {
                    "id": ex.client_request_id or ex.request_id,
                    "request_id": ex.request_id,
                    "principal_id": ex.key.principal.id,
                    "key_id": ex.key.id,
                    "model": ex.model,
                    "started_at": wall - (now - ex.started),
                    "backend": last.backend if last is not None else None,
                    "tries": len(trace) if trace else 0,
                    "answering": ex.settled is not None or (last is not None and type(last.outcome) is int),
                }
            )
        return out

    def finish(
        self, ex: Exchange, tap: ResponseTap, status: int, backend: str | None, attempts: int = 1
    ) -> None:
        ended = time.perf_counter()
        if backend is None:  # the client left while the answer was relayed: the tap knows whose it was
            backend, attempts = tap.backend, max(attempts, tap.attempts)
        if status == CLIENT_GONE and tap.started is not None:
            status = tap.status  # the answer had started: the record keeps what the client was sent
            tap.cut = tap.cut or "client"
        self.live.pop(ex.request_id, None)
        if ex.settled is None:
            self.settle(ex, tap, status)
        if self.usage is not None:
            assert ex.settled is not None
            prompt, completion, cached, total, source, cost, principal_keys, key_keys = ex.settled
            record = encode_record(
                _new(
                    UsageRecord,
                    (
                        ex.request_id,
                        time.time(),
                        ex.key.principal.id,
                        ex.key.id,
                        ex.model,
                        backend,
                        status,
                        prompt,
                        completion,
                        cached,
                        total,
                        source,
                        cost,
                        (ended - ex.started) * 1000.0,
                        None if tap.started is None else (tap.started - ex.started) * 1000.0,
                        principal_keys,
                        ex.client_request_id,
                        attempts,
                        ex.tag,
                        tap.cut,
                        ex.rule,
                        ex.trace,
                        ex.span,
                        key_keys,
                    ),
                )
            )
            if len(record) > self.max_record:
                record = fit_record(record, self.max_record)
            self.usage.push(record)
        capture = ex.capture
        if capture is not None and self.bodies is not None:
            self.bodies.push(capture.frame(ex.request_id, ex.key.principal.id, ex.key.id, ex.model, status))
