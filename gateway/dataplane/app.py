"""The RSGI application of one proxy worker, and the request path itself.

Per request: read the body (bounded), authenticate the key (one keyed hash, one dict lookup, an expiry
check), resolve the model (404 for everyone, before authorisation), authorise the name the caller used
(one set lookup), forward. The snapshot reference is read once per request, so a request sees one
consistent generation even if a new one lands meanwhile. I/O: the client connection and the upstream
call; a background task re-reads the shared snapshot segment when its generation moves.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import unquote_plus

import orjson

from gateway.config import Settings
from gateway.dataplane.accounting import Accounting
from gateway.dataplane.backend_load import BackendLoad
from gateway.dataplane.bodies import BodyBudget, BodyReader, StallWatch
from gateway.dataplane.body_log import BodyCapture
from gateway.dataplane.clients import ClientLimiter, TrustedProxies, peer_address
from gateway.dataplane.closing import ClosingProtocol
from gateway.dataplane.credentials import CredentialPools
from gateway.dataplane.dialects import Outgoing
from gateway.dataplane.disconnects import DisconnectWatch
from gateway.dataplane.forward import Forwarder, RelayAborted
from gateway.dataplane.rsgi import Headers, HTTPProtocol, Scope
from gateway.dataplane.upstream import HOP_BY_HOP, connection_named, make_client
from gateway.errors import (
    AddressNotAllowed,
    BadRequest,
    Forbidden,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    RoutingRefused,
    Unauthorized,
)
from gateway.keys import hash_secret
from gateway.native import top_members
from gateway.protocol.anthropic import estimate_input_tokens, read_messages_head
from gateway.protocol.openai_request import RequestInfo, inspect_json, inspect_multipart
from gateway.protocol.paths import MESSAGES, anthropic_envelope, check_client_path
from gateway.protocol.responses_openai import inspect_request as inspect_responses
from gateway.routing.context import estimate_prompt_tokens, fitting
from gateway.routing.context import refusal as context_refusal
from gateway.routing.rules import Facts
from gateway.shm.snapshot_slot import (
    CONTROL_REACHABLE,
    CONTROL_STORE_DOWN,
    CONTROL_UNREACHABLE,
    SnapshotReader,
)
from gateway.shm.worker_stats import WorkerStats
from gateway.snapshot import KeyEntry, Route, Snapshot

__all__ = ["ProxyApp"]

log = logging.getLogger("gateway.dataplane")

_JSON = [("content-type", "application/json")]
# Never forwarded upstream: the client's credentials (its gateway key, as Bearer, x-api-key or the
# api-key of Azure-style SDKs, and its cookies; Proxy-Authorization is hop-by-hop), connection-level
# headers, and Accept-Encoding (bytes must arrive uncompressed so usage can be read from them). The
# operator's --drop-request-headers join these once, at start (ProxyApp.drop_request_headers).
_DROP_REQUEST_HEADERS = HOP_BY_HOP | {"authorization", "x-api-key", "api-key", "cookie", "accept-encoding"}
_KEEP_ALIVE = ["keep-alive"]
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
# Anthropic's Messages API: its own request shape and its own error envelope.
_COUNT_TOKENS = MESSAGES + "/count_tokens"
# OpenAI's Responses API: POST creates; its sub-resources (a stored response) name the model in the query.
_RESPONSES = "/v1/responses"
LIVE_LIMIT = 25  # in-flight requests a worker publishes each second (they share a 16 KiB slot)
T = TypeVar("T")


class ProxyApp:
    def __init__(
        self,
        settings: Settings,
        hash_key: bytes,
        reader: SnapshotReader | None,
        accounting: Accounting | None = None,
        stats: tuple[WorkerStats, int] | None = None,
        load: BackendLoad | None = None,
        clients: ClientLimiter | None = None,
    ) -> None:
        self.settings = settings
        # Without one, an accounting of nothing: every request goes the one path, unmetered.
        self.accounting = accounting if accounting is not None else Accounting(None, None, None)
        self.hash_key = hash_key
        self.reader = reader
        self.snapshot = Snapshot.empty()
        self.draining = False  # SIGTERM came: /readyz says 503, every answer says Connection: close
        self.closing_answers = 0  # requests begun while draining (``closing.wait_quiet`` watches it)
        self.forwarder: Forwarder | None = None
        self.disconnects: DisconnectWatch | None = None  # made on the worker's loop
        self.bodies: BodyReader | None = None  # made on the worker's loop
        self.clients = clients if clients is not None and clients.active else None
        # Who the client is, as --trusted-proxies decides it: per-key allow_ips test this address.
        self.trusted = clients.trusted if clients is not None else TrustedProxies(settings.trusted_proxies)
        self.drop_request_headers = _DROP_REQUEST_HEADERS | frozenset(settings.drop_request_headers)
        self.load = load if load is not None else BackendLoad(None, None)
        self._models_cache: dict[str, bytes] = {}
        self._follow_task: asyncio.Task[None] | None = None
        self._usage_task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self.stats = stats  # (the host's statistics slots, this worker's slot)
        self._host_raw = b""  # the host slot's document the shares were last read from
        self.in_flight = 0
        self.requests = 0
        self.refused: dict[int, int] = {}  # answers the gateway gave itself, by status
        self.started_at = time.time()

    # -- lifecycle (called by granian on the worker's loop) --------------------------------------
    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.refresh_snapshot()
        limiter = self.accounting.limiter
        self.forwarder = Forwarder(
            make_client(),
            self.settings.backend_cool_down,
            self.load,
            self.settings.stream_stall_timeout,
            credentials=CredentialPools(limiter.table if limiter is not None else None),
            max_attempts=self.settings.max_attempts,
            backoff=self.settings.retry_backoff,
        )
        self.disconnects = DisconnectWatch(loop, self.settings.disconnect_watch_after)
        settings = self.settings
        self.bodies = BodyReader(
            settings.max_body_bytes,
            StallWatch(loop, settings.body_timeout),
            # Room for one body of the largest size at least (charged twice while it arrives: bodies.py).
            BodyBudget(
                loop, max(settings.body_buffer_bytes, 2 * settings.max_body_bytes), settings.body_wait
            ),
        )
        self._follow_task = loop.create_task(self._follow_snapshots())
        if self.accounting.usage is not None:
            self._usage_task = loop.create_task(self.accounting.usage.run())
        if self.stats is not None:
            self._stats_task = loop.create_task(self._publish_stats())

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        for task in (self._follow_task, self._usage_task, self._stats_task):
            if task is not None:
                task.cancel()
        if self.forwarder is not None:
            loop.create_task(self.forwarder.client.close())
        if self.disconnects is not None:
            self.disconnects.close()
        if self.bodies is not None:
            self.bodies.stalls.close()

    def refresh_snapshot(self) -> bool:
        """Swap in the published snapshot if its generation moved. Never raises on a bad document."""
        if self.reader is None or self.reader.generation() == self.snapshot.generation:
            return False
        got = self.reader.read()
        if got is None:
            return False
        generation, blob = got
        try:
            snap = Snapshot.decode(blob, generation)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("ignoring undecodable snapshot generation %d: %s", generation, exc)
            return False
        self.snapshot = snap
        self._models_cache = {}
        self.load.set_kv_floor(min((b.kv_high_water for b in snap.backends.values()), default=1.0))
        if self.accounting.limiter is not None:
            self.accounting.limiter.forget_plans()
            # The host's control slot writes the shares before it publishes a first snapshot: read them
            # now rather than at the next statistics round, so no request is admitted on a whole limit.
            self.apply_shares()
        return True

    def apply_shares(self) -> None:
        """This host's shares of rate limits, as its control slot last wrote them (proxy-role hosts)."""
        limiter = self.accounting.limiter
        if limiter is None or limiter.shares is None or self.stats is None:
            return
        raw = self.stats[0].read(self.stats[0].host_slot)
        if not raw or raw == self._host_raw:
            return
        self._host_raw = raw
        given = orjson.loads(raw)
        if isinstance(given, dict) and "default_share" in given:
            limiter.set_shares(given.get("shares", {}), float(given["default_share"]))

    async def _publish_stats(self) -> None:
        """About once a second: this worker's counters, for the host's health reports."""
        assert self.stats is not None
        slots, index = self.stats
        accounting = self.accounting
        while True:
            forwarder = self.forwarder
            document = {
                "pid": os.getpid(),
                "started_at": self.started_at,
                "in_flight": self.in_flight,
                "requests": self.requests,
                "refused": {str(status): n for status, n in self.refused.items()},
                "generation": self.snapshot.generation,
                "revision": self.snapshot.revision,
                "usage_backlog": len(accounting.usage.backlog) if accounting.usage is not None else 0,
                "backends": {n: h.as_dict() for n, h in forwarder.health.items()} if forwarder else {},
                "prefixes": self.load.prefixes,
                "credentials": forwarder.credentials.as_dict() if forwarder else {},
                "flow": self.load.flow_stats.as_dict(self.load.flow.depth),
            }
            document["live"] = accounting.live_doc(LIVE_LIMIT)
            document["live_count"] = len(accounting.live)
            document["published_at"] = time.time()
            limiter = accounting.limiter
            if limiter is not None and limiter.shares is not None:
                document["traffic"] = dict(limiter.traffic)
                self.apply_shares()
            if not slots.write(index, orjson.dumps(document)) and document.get("live"):
                document["live"] = []  # too many long names for the slot: the counts still go
                slots.write(index, orjson.dumps(document))
            await asyncio.sleep(1.0)

    async def _follow_snapshots(self) -> None:
        interval = self.settings.snapshot_poll_interval
        while True:
            await asyncio.sleep(interval)
            self.refresh_snapshot()
            self.load.refresh_engines()
            # A share that shrank is enforced within this poll interval: the control plane counts a
            # host's previous share as held until its next report (see controlplane.fleet.reports).
            self.apply_shares()

    # -- dispatch ----------------------------------------------------------------------------------
    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None:
        if self.draining:  # the client's next request goes to a fresh connection, never to this one
            self.closing_answers += 1
            proto = ClosingProtocol(proto)
        path: str = scope.path
        if path.startswith("/v1/"):
            self.in_flight += 1
            self.requests += 1
            clients = self.clients
            ticket = None
            try:
                if clients is not None:  # the per-address abuse limiter, before any work for the request
                    ticket = clients.admit(scope)
                await self.handle_v1(scope, proto, path)
            except GatewayError as exc:
                self.refused[exc.status] = self.refused.get(exc.status, 0) + 1
                envelope = exc.anthropic_body() if anthropic_envelope(path) else exc.openai_body()
                proto.response_bytes(exc.status, _JSON + list(exc.headers.items()), envelope)
            except RelayAborted as exc:
                # The answer is committed: returning ends the client's response where it stopped. With a
                # declared length the client sees it short; a chunked one ends without its terminator event.
                log.warning("%s", exc)
            finally:
                self.in_flight -= 1
                if ticket is not None and clients is not None:
                    clients.finish(ticket)
                bodies = self.bodies
                if bodies is not None and bodies.held:  # only while some large body holds room
                    bodies.release()
            return
        if path == "/healthz":
            snap = self.snapshot
            body = {
                "status": "ok" if snap.generation else "starting",
                "generation": snap.generation,
                "revision": snap.revision,
            }
            body["control_plane"], body["control_plane_detail"] = self.control_plane_state()
            store_failing, since, reason = self.reader.store_state() if self.reader else (False, 0.0, "")
            if store_failing:  # still serving: usage records wait in shared memory for the store
                body["status"] = "degraded"
                body["store"] = "failing"
                body["store_detail"] = (
                    f"usage records wait in shared memory since "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since))}: {reason}"
                )
            body_log = self.accounting.bodies
            dropped = body_log.dropped() if body_log is not None else 0
            if dropped:  # logged bodies the rings had no room for: still serving, nothing else lost
                body["body_logs_dropped"] = dropped
            spool = self.host_document().get("usage_spool")
            if spool is not None:  # a proxy-role host: what waits on its disk for the control plane
                body["usage_spool"] = spool
            proto.response_bytes(200 if snap.generation else 503, _JSON, orjson.dumps(body))
        elif path == "/readyz":
            ready = not self.draining and self.snapshot.generation > 0
            proto.response_bytes(
                200 if ready else 503, _JSON, b'{"ready":true}' if ready else b'{"ready":false}'
            )
        else:
            err = NotFound(f"no route for {path}")
            err.code = "not_found"
            proto.response_bytes(404, _JSON, err.openai_body())

    def host_document(self) -> dict[str, Any]:
        """What the host's control slot tells the workers (``WorkerStats.host_slot``): on a proxy-role host
        its shares of rate limits and its usage spool's state; empty elsewhere."""
        if self.stats is None:
            return {}
        raw = self.stats[0].read(self.stats[0].host_slot)
        doc = orjson.loads(raw) if raw else {}
        return doc if isinstance(doc, dict) else {}

    def control_plane_state(self) -> tuple[str, str]:
        """``("ok" | "degraded", detail)``: degraded while a proxy-role host cannot reach its control
        plane, or a local control worker its database (either keeps serving the last snapshot it has)."""
        if self.reader is None:
            return "ok", "local"
        state, seen_at = self.reader.control_state()
        if state == CONTROL_REACHABLE:
            return "ok", "remote"
        if state == CONTROL_UNREACHABLE:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen_at)) if seen_at else "never"
            return "degraded", f"unreachable, serving the last snapshot known; last answered: {since}"
        if state == CONTROL_STORE_DOWN:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen_at)) if seen_at else "start"
            return "degraded", f"local; its store does not answer since {since}, serving the last snapshot"
        return "ok", "local"

    # -- the request path ---------------------------------------------------------------------------
    async def handle_v1(self, scope: Scope, proto: HTTPProtocol, path: str) -> None:
        unsafe = check_client_path(path)
        if unsafe is not None:
            raise BadRequest(unsafe)
        snap = self.snapshot
        headers = scope.headers
        key = self.authenticate(snap, headers)
        key_rules = key.rules
        if key_rules is not None and key_rules.networks:
            refusal = key_rules.address_refusal(self.client_address(scope))
            if refusal is not None:
                raise AddressNotAllowed(refusal)
        if path == "/v1/models" and scope.method == "GET":
            proto.response_bytes(200, _JSON, self.models_body(snap, key))
            return
        body = await self.read_body(proto, headers.get("content-length"))
        out = self.outgoing(scope, path, body)
        route = self.authorise(snap, key, out)
        if path == _COUNT_TOKENS:
            await self.count_tokens(proto, out, route)
            return
        info = out.info
        assert info is not None
        facts = None
        if route.rules:
            prompt = len(body) // 4
            facts = Facts(
                key.principal,
                headers,
                info.user,
                prompt,
                info.max_tokens,
                info.stream,
                body,
                classifier=snap.classifier,
            )
        decision = snap.decide(route, facts, self.load)
        if decision.refused is not None:
            status, message = decision.refused
            by_rule = decision.rule is not None and decision.rule.action == "refuse"
            raise RoutingRefused(status, message, by_rule=by_rule)
        targets = decision.targets
        if snap.windows:  # one test when no provider model declares a context window
            prompt, wanted = estimate_prompt_tokens(body), info.max_tokens or 0
            fit = fitting(targets, prompt + wanted)
            if not fit:
                raise context_refusal(decision.model, targets, prompt, wanted)
            targets = fit
            decided = snap.routes.get(decision.model)
            out.context_failover = decided is not None and decided.context_failover
        forwarder = self.forwarder_or_fail()
        allowance = info.max_tokens
        if info.choices > 1:  # each of ``n`` choices may use the whole allowance
            default = self.settings.default_completion_tokens
            allowance = (allowance if allowance is not None else default) * info.choices
        exchange = self.accounting.admit(
            key,
            info.model,
            route,
            len(body),
            allowance,
            self.settings.default_completion_tokens,
            headers.get("x-request-id"),
        )
        capture = None
        body_logs = snap.body_logs
        if body_logs is not None:  # no [[body_logs]] entry: the one test the request path makes for them
            picked = body_logs.pick(key.principal.id, key.id, info.model, route.name, route.canonical)
            if picked is not None:
                capture = BodyCapture(picked, body, out.dialect, path, info.stream)
        # The tap, or (nothing to account for) the client's own protocol object: one path either way.
        client = exchange.open(proto, headers, out, path, decision.tag, decision.rule, capture)
        try:
            attempted = await self.run_guarded(
                client,
                forwarder.forward(
                    client, out, targets, scope, exchange.trace, exchange.request_span, key, route
                ),
            )
        except BaseException as exc:
            exchange.finish(client, None, exc)
            raise
        exchange.finish(client, attempted, None)

    def authorise(self, snap: Snapshot, key: KeyEntry, out: Outgoing) -> Route:
        """The route of the model the request names, if the key may call it: 404 for a name nobody may
        call (before authorisation, so a name's existence is not told apart), else 403."""
        info = out.info
        assert info is not None
        route = snap.route(info.model)
        if route is None:
            # Each API's own wording: Anthropic's clients match on "model: NAME" with not_found_error.
            missing = f"model: {info.model}" if out.dialect == "anthropic" else None
            raise NotFound(missing or f"The model `{info.model}` does not exist", param="model")
        # By the route's name: the caller's own, or the pattern alias (``claude-*``) that matched it.
        if not key.principal.may_use(route.name):
            raise Forbidden(f"You are not allowed to use the model `{info.model}`", param="model")
        key_rules = key.rules
        if key_rules is not None and (refusal := key_rules.model_refusal(route.name, info.model)):
            raise Forbidden(refusal, param="model")
        return route

    async def count_tokens(self, proto: HTTPProtocol, out: Outgoing, route: Route) -> None:
        """``POST /v1/messages/count_tokens``: an Anthropic backend counts for itself, exactly (and reads
        what it wants of the body); for a route without one the gateway answers its estimate. Neither is
        rate-limited nor recorded."""
        native = tuple(t for t in route.targets if t.backend.protocol == "anthropic")
        if native:
            await self.run_guarded(proto, self.forwarder_or_fail().forward(proto, out, native))
            return
        assert out.messages is not None
        proto.response_bytes(200, _JSON, orjson.dumps({"input_tokens": estimate_input_tokens(out.messages)}))

    def outgoing(self, scope: Scope, path: str, body: bytes) -> Outgoing:
        """The request as the forwarder sends it: parsed just enough, in the client's protocol."""
        headers = scope.headers
        method: str = scope.method
        qs: str = scope.query_string
        named = headers.get_all("connection")
        # Headers the client's Connection header names are hop-by-hop as well (RFC 9110 7.6.1). Clients
        # send none or "keep-alive", so the usual drop set serves.
        drop = self.drop_request_headers
        if named and named != _KEEP_ALIVE:
            drop = drop | connection_named(named)
        forwarded = [(k, v) for k, v in headers.items() if k not in drop]
        path_qs = path + "?" + qs if qs else path
        if path.startswith(MESSAGES + "/") and path != _COUNT_TOKENS:
            # Message batches and other Messages sub-resources are not proxied: say so in Anthropic's terms
            # rather than failing on a body that has no model.
            raise NotFound(f"{path} is not supported by this gateway")
        if path in (MESSAGES, _COUNT_TOKENS):
            if method != "POST":
                raise MethodNotAllowed(f"{path} takes POST")
            # Only what the gateway reads is checked here; the rest is the backend's, or the translator's.
            req = read_messages_head(body, count_tokens=path == _COUNT_TOKENS, members=top_members)
            info = RequestInfo(req.model, req.stream, False, req.max_tokens or None, None, user=req.user_id)
            return Outgoing(
                "anthropic",
                method,
                path_qs,
                forwarded,
                body,
                info,
                req,
                self.settings.default_completion_tokens,
            )
        if path == _RESPONSES or path.startswith(_RESPONSES + "/"):
            default = self.settings.default_completion_tokens
            if path != _RESPONSES:  # a stored response: bodiless, routed by ?model= (cancel's POST too)
                # Nothing is generated: no completion tokens reserved (dialects bills it nothing).
                info = self.inspect(body, "", method if body else "GET", qs)._replace(max_tokens=0)
                return Outgoing("responses", method, path_qs, forwarded, body, info, None, default)
            if method != "POST":
                raise MethodNotAllowed(f"{path} takes POST")
            info, doc = inspect_responses(body, top_members)
            return Outgoing("responses", method, path_qs, forwarded, body, info, None, default, responses=doc)
        info = self.inspect(body, headers.get("content-type") or "", method, qs)
        return Outgoing(
            "openai", method, path_qs, forwarded, body, info, None, self.settings.default_completion_tokens
        )

    def authenticate(self, snap: Snapshot, headers: Headers) -> KeyEntry:
        """The caller's key from ``Authorization: Bearer`` or, as Anthropic clients send it, ``x-api-key``."""
        authorization = headers.get("authorization")
        if authorization and authorization.startswith(("Bearer ", "bearer ")):
            secret = authorization[7:].strip()
        else:
            secret = (headers.get("x-api-key") or "").strip()
            if not secret:
                raise Unauthorized("Missing API key: send it as `Authorization: Bearer <key>` or `x-api-key`")
        entry = snap.keys.get(hash_secret(secret, self.hash_key))
        if entry is None:
            raise Unauthorized("Incorrect API key provided")
        if entry.expires_at is not None and entry.expires_at <= time.time():
            raise Unauthorized("This API key has expired")
        return entry

    async def read_body(self, proto: HTTPProtocol, content_length: str | None) -> bytes:
        bodies = self.bodies
        assert bodies is not None  # made on the worker's loop, before the first request
        return await bodies.read(proto, content_length)

    @staticmethod
    def inspect(body: bytes, content_type: str, method: str, query: str) -> RequestInfo:
        if content_type.startswith("multipart/form-data"):
            return inspect_multipart(body, content_type)
        if not body and method in _NO_BODY_METHODS:
            # Bodiless calls to other /v1/* suffixes name their model in the query string.
            for pair in query.split("&"):
                name, _, value = pair.partition("=")
                if name == "model" and value:
                    return RequestInfo(unquote_plus(value), False, False, None, None)
            raise BadRequest("you must provide a model parameter", param="model")
        return inspect_json(body, top_members)

    def client_address(self, scope: Scope) -> str:
        """The client's address: the socket's peer, or the hop a trusted proxy vouches for."""
        peer = peer_address(scope.client or "")
        if self.trusted:
            return self.trusted.client_of(peer, scope.headers.get_all("x-forwarded-for"))
        return peer

    def models_body(self, snap: Snapshot, key: KeyEntry) -> bytes:
        principal = key.principal
        narrowed = key.rules is not None and key.rules.models is not None
        memo = "k:" + key.id if narrowed else principal.id
        cached = self._models_cache.get(memo)
        if cached is None:
            names = sorted(n for n in snap.routes if key.may_use(n))
            data = [
                {"id": n, "object": "model", "created": int(snap.built_at), "owned_by": "gateway"}
                for n in names
            ]
            cached = orjson.dumps({"object": "list", "data": data})
            self._models_cache[memo] = cached
        return cached

    def forwarder_or_fail(self) -> Forwarder:
        if self.forwarder is None:
            raise GatewayError("worker is not initialised")
        return self.forwarder

    async def run_guarded(self, proto: HTTPProtocol, work: Awaitable[T]) -> T | None:
        """Run ``work`` and return its result, or None when the client went away: then ``work`` is
        cancelled, and with it the upstream request. The client is watched only once the request has run
        for ``disconnect_watch_after`` seconds (``disconnects``): short requests never pay for it."""
        disconnects = self.disconnects
        assert disconnects is not None  # made with the forwarder, which the caller already needed
        watched = disconnects.add(proto)
        try:
            return await work
        except asyncio.CancelledError:
            if not watched.gone:
                raise
            return None
        finally:
            disconnects.remove(watched)
