"""The mock engine's RSGI application and the coroutine that serves it with granian's embedded server.

``MockEngine`` answers vLLM's OpenAI-compatible endpoints from ``responses`` (its Responses API, with
the store of responses, from ``responses_api``), Anthropic's
``/v1/messages`` from ``anthropic`` and Gemini's ``/v1beta/models/{model}:generateContent`` from ``gemini``
(each on its own paths, so one mock process can stand for a backend of any protocol; errors come in the
envelope of the path's protocol), and obeys a ``Behaviour`` that tests change over HTTP under ``/mock/``.
All state (behaviour, recordings, counters) lives on the instance, one per process; everything runs on one
event loop, so nothing needs a lock. With a ``SimConfig`` (``--sim``), chat and text completions are not
planned whole: each becomes a sequence in a simulated engine (``sim``, stepped by ``simulated.StepLoop``)
and is answered token by token as its steps emit them, and ``/metrics`` reports that engine.

I/O: reads request bodies and writes responses through the RSGI protocol object, sleeps for configured
delays, and ``serve`` binds a TCP listener.

A stream is cut short (``drop_after_chunks``) by declaring the length of the whole stream in
``content-length`` and then ending the body early: granian's RSGI API has no way to abort a response, and
a handler that returns or raises mid-stream gets a cleanly terminated chunked body. With a declared
length, the HTTP layer closes the connection instead, and clients report an incomplete body.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson
from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian._granian import RSGIProtocolClosed as ProtocolClosed
from granian.constants import Interfaces
from granian.log import LogLevels
from granian.rsgi import Scope
from granian.server.embed import Server

from gateway.mockengine import anthropic, gemini, responses_api, sim, simulated
from gateway.mockengine import responses as r
from gateway.mockengine.behaviour import Behaviour
from gateway.routing.chat_tokenizer import ChatTokenizer, TemplateError

__all__ = ["MockEngine", "serve"]

RECORDING_LIMIT = 1000
_SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
_TEXT_HEADERS = [("content-type", "text/plain; charset=utf-8")]
_METRICS_HEADERS = [("content-type", "text/plain; version=0.0.4; charset=utf-8")]
_OK = orjson.dumps({"status": "ok"})
# path -> (method, kind); every one of them is subject to failure injection and delays.
_API_ROUTES = {
    "/v1/chat/completions": ("POST", "chat"),
    "/v1/completions": ("POST", "completion"),
    "/v1/embeddings": ("POST", "embedding"),
    "/v1/audio/transcriptions": ("POST", "transcription"),
    "/v1/audio/translations": ("POST", "translation"),
    "/v1/models": ("GET", "models"),
    "/v1/messages": ("POST", "messages"),
    "/v1/messages/count_tokens": ("POST", "count_tokens"),
    "/v1/responses": ("POST", "responses"),
}
_RESPONSES_PREFIX = "/v1/responses/"  # a stored response: GET or DELETE {id}, GET {id}/input_items
_DIALECT = {"messages": "anthropic", "count_tokens": "anthropic", "gemini": "gemini"}
Recording = tuple[str, str, str, list[tuple[str, str]], bytes]


@dataclass(slots=True)
class Stats:
    total: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    failed: int = 0
    """Failures injected by ``fail_status`` or ``x-mock-fail-status``."""
    dropped: int = 0
    """Streams cut short by ``drop_after_chunks``."""
    disconnects: int = 0
    """Streams whose client went away before the end."""


@dataclass(frozen=True, slots=True)
class Plan:
    reply: r.Reply | r.StreamReply
    model: str | None
    chunk_delay: float


class MockEngine:
    """The RSGI application. ``defaults`` is what ``/mock/reset`` returns to."""

    def __init__(
        self,
        defaults: Behaviour,
        models: Sequence[str],
        sim_config: sim.SimConfig | None = None,
        kv_events: str | None = None,
        tokenizer: ChatTokenizer | None = None,
    ) -> None:
        if not models:
            raise ValueError("at least one model name is required")
        self.defaults = defaults
        self.behaviour = defaults
        self.models = list(models)
        self.stats = Stats()
        self.running: dict[str, int] = {}
        self.recordings: deque[Recording] = deque(maxlen=RECORDING_LIMIT)
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()
        self.closing = False
        self._sleepers: set[asyncio.Future[None]] = set()
        self.stored = responses_api.ResponseStore()
        # --sim: chat and text completions go through a simulated engine (see ``sim``) instead of ``_plan``.
        # --sim-kv-events: the engine publishes vLLM's KV events on a ZeroMQ PUB socket bound there.
        # --sim-tokenizer: prompts are the token ids of that model's chat template, as vLLM's are.
        self.sim = None
        if sim_config is not None:
            publisher = simulated.KVEventPublisher(kv_events) if kv_events else None
            self.sim = simulated.StepLoop(sim.Engine(sim_config, publisher is not None), publisher)
        self.tokenizer = tokenizer

    def begin_shutdown(self) -> None:
        """Cut waits short and end streams at their next chunk, so the server can drain promptly."""
        self.closing = True
        for sleeper in self._sleepers:
            _wake(sleeper)

    async def _pause(self, seconds: float) -> None:
        """``asyncio.sleep`` that ``begin_shutdown`` can end early."""
        if self.closing:
            return
        sleeper = asyncio.get_running_loop().create_future()
        timer = asyncio.get_running_loop().call_later(seconds, _wake, sleeper)
        self._sleepers.add(sleeper)
        try:
            await sleeper
        finally:
            self._sleepers.discard(sleeper)
            timer.cancel()

    async def __rsgi__(self, scope: Scope, proto: HTTPProtocol) -> None:
        path = scope.path
        if path.startswith("/mock/"):
            await self._control(scope, proto, path)
            return
        body = await proto()
        b = self.behaviour
        # Monitoring (a gateway's engine scraper and probes) is counted in the stats, never recorded: the
        # recordings are what the engine was asked to do.
        if b.record and path not in _MONITORING:
            self.recordings.append((scope.method, path, scope.query_string, scope.headers.items(), body))
        stats = self.stats
        stats.total += 1
        stats.by_path[path] = stats.by_path.get(path, 0) + 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            if path.startswith(("/v1/", gemini.PREFIX)):
                await self._api(scope, proto, path, body, b)
            elif path == "/health":
                proto.response_bytes(b.health_status, r.JSON_HEADERS, _OK)
            elif path == "/metrics" and b.metrics_enabled and self.sim is not None:
                proto.response_bytes(
                    200, _METRICS_HEADERS, simulated.metrics_text(self.sim.engine, self.models[0])
                )
            elif path == "/metrics" and b.metrics_enabled:
                text = r.metrics_text(self.models, self.running, b.waiting, b.kv_cache_usage)
                proto.response_bytes(200, _METRICS_HEADERS, text)
            else:
                _error(proto, r.MockRequestError(404, f"no route for {path}", "NotFoundError"))
        finally:
            stats.in_flight -= 1

    async def _api(self, scope: Scope, proto: HTTPProtocol, path: str, body: bytes, b: Behaviour) -> None:
        gemini_route = gemini.route(path)
        route = ("POST", "gemini") if gemini_route is not None else _API_ROUTES.get(path)
        if path.startswith(gemini.PREFIX):
            dialect = "gemini"
        else:
            dialect = _DIALECT.get(route[1], "openai") if route is not None else "openai"
        if route is None and path.startswith(_RESPONSES_PREFIX):
            rid, _, sub = path[len(_RESPONSES_PREFIX) :].partition("/")
            try:
                stored = self.stored.answer(scope.method, rid, sub)
            except r.MockRequestError as exc:
                _error(proto, exc)
                return
            proto.response_bytes(stored.status, stored.headers, stored.body)
            return
        if route is None:
            _error(proto, r.MockRequestError(404, f"no route for {path}", "NotFoundError"), dialect)
            return
        if scope.method != route[0]:
            _error(proto, r.MockRequestError(405, f"{path} takes {route[0]}", "MethodNotAllowed"), dialect)
            return
        try:
            fail, delay, tokens = self._overrides(scope, b)
            if fail is None and self.sim is not None and route[1] in _SIM_KINDS:
                job = self._sim_job(route[1], body, tokens)
                if delay:
                    await self._pause(delay)
                await self._sim_answer(proto, self.sim, *job)
                return
            plan = None if fail is not None else self._plan(route[1], scope, body, b, tokens, gemini_route)
        except r.MockRequestError as exc:
            _error(proto, exc, dialect)
            return
        if plan is None:
            assert fail is not None
            self.stats.failed += 1
            if delay:
                await self._pause(delay)
            fail_body = b.fail_body.encode() if b.fail_body is not None else _failure_body(fail, dialect)
            headers = r.JSON_HEADERS
            if fail == 429 and b.retry_after is not None:
                headers = [*headers, ("retry-after", b.retry_after)]
            proto.response_bytes(fail, headers, fail_body)
            return
        model = plan.model
        if model is not None:
            self.running[model] = self.running.get(model, 0) + 1
        try:
            if delay:
                await self._pause(delay)
            reply = plan.reply
            if isinstance(reply, r.Reply):
                proto.response_bytes(reply.status, reply.headers, reply.body)
            else:
                await self._stream(proto, reply.chunks, plan.chunk_delay, b.drop_after_chunks)
        finally:
            if model is not None:
                left = self.running[model] - 1
                if left or model in self.models:
                    self.running[model] = left
                else:
                    del self.running[model]

    def _overrides(self, scope: Scope, b: Behaviour) -> tuple[int | None, float, int]:
        """Failure status (consuming ``fail_count``), delay and token count for this request."""
        headers = scope.headers
        fail: int | None = None
        header_fail = headers.get("x-mock-fail-status")
        if header_fail is not None:
            fail = _header_number(header_fail, int, "x-mock-fail-status")
            if not 200 <= fail <= 599:
                raise r.MockRequestError(400, "x-mock-fail-status must be between 200 and 599")
        elif b.key_status and (key := _api_key(headers)) in b.key_status:
            fail = b.key_status[key]
        elif b.fail_status is not None and b.fail_count != 0:
            fail = b.fail_status
            if b.fail_count is not None:
                # No await since ``b`` was read, so ``b`` is still the current behaviour.
                self.behaviour = dataclasses.replace(b, fail_count=b.fail_count - 1)
        header_delay = headers.get("x-mock-delay")
        delay = b.delay if header_delay is None else _header_number(header_delay, float, "x-mock-delay")
        header_tokens = headers.get("x-mock-tokens")
        tokens = b.tokens if header_tokens is None else _header_number(header_tokens, int, "x-mock-tokens")
        return fail, max(delay, 0.0), max(tokens, 0)

    def _plan(
        self,
        kind: str,
        scope: Scope,
        body: bytes,
        b: Behaviour,
        tokens: int,
        gemini_route: tuple[str, str] | None = None,
    ) -> Plan:
        """Decide the whole answer before anything is sent, so bad requests fail before headers."""
        if kind == "models":
            return Plan(r.Reply(200, r.JSON_HEADERS, r.models_list(self.models, int(time.time()))), None, 0.0)
        if kind in ("transcription", "translation"):
            content_type: str = scope.headers.get("content-type") or ""
            parts = r.parse_multipart(body, content_type)
            model = parts["model"].data.decode() if "model" in parts else self.models[0]
            if b.raw_response is not None:
                return Plan(_raw(b), model, 0.0)
            return Plan(r.transcription(parts, self.models[0], kind), model, 0.0)
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            if b.raw_response is None and b.raw_stream is None:
                raise r.MockRequestError(400, "the body is not valid JSON") from None
            req = {}
        if not isinstance(req, dict):
            raise r.MockRequestError(400, "the body must be a JSON object")
        requested = gemini_route[0] if gemini_route is not None else req.get("model")
        model = requested if isinstance(requested, str) else self.models[0]
        streamed = req.get("stream") is True
        if gemini_route is not None:
            streamed = gemini_route[1] == "streamGenerateContent"
            if streamed and parse_qs(scope.query_string).get("alt") != ["sse"]:
                raise r.MockRequestError(400, "the mock streams Gemini answers with alt=sse only")
        if streamed and b.raw_stream is not None:
            return Plan(r.StreamReply([c.encode() for c in b.raw_stream]), model, b.raw_chunk_delay)
        if not streamed and b.raw_response is not None:
            return Plan(_raw(b), model, 0.0)
        created = int(time.time())
        seq = next(self._ids)
        if kind == "count_tokens":
            return Plan(anthropic.count_tokens(body), None, 0.0)
        if kind == "messages":
            rid = f"msg_{self._id_prefix}{seq:08x}"
            reply = anthropic.messages(body, model, tokens, rid, b.cache_read_tokens)
        elif kind == "gemini":
            rid = f"{self._id_prefix}{seq:08x}"
            reply = gemini.generate(req, model, tokens, rid, b.cache_read_tokens, stream=streamed)
        elif kind == "chat":
            reply = r.chat_completion(req, model, tokens, f"chatcmpl-{self._id_prefix}{seq:08x}", created)
        elif kind == "responses":
            rid = f"{self._id_prefix}{seq:08x}"
            reply = responses_api.create(req, model, tokens, rid, created, self.stored)
        elif kind == "completion":
            reply = r.completion(req, model, tokens, f"cmpl-{self._id_prefix}{seq:08x}", created)
        else:
            reply = r.embeddings(req, model, f"embd-{self._id_prefix}{seq:08x}", created)
        return Plan(reply, model, b.token_delay)

    async def _stream(
        self, proto: HTTPProtocol, chunks: list[bytes], delay: float, drop_after: int | None
    ) -> None:
        headers = _SSE_HEADERS
        if drop_after is not None:
            # See the module docstring: the declared length is what makes the early end an abort.
            headers = [*_SSE_HEADERS, ("content-length", str(sum(map(len, chunks)) or 1))]
            chunks = chunks[: min(drop_after, max(len(chunks) - 1, 0))]
            self.stats.dropped += 1
        transport = proto.response_stream(200, headers)
        try:
            if not chunks:
                # A stream that ends with no frame at all is sent as an empty, complete body (granian
                # rewrites the length to 0); an empty frame keeps the declared length and so the abort.
                await transport.send_bytes(b"")
            for i, chunk in enumerate(chunks):
                if delay and i:
                    await self._pause(delay)
                if self.closing:
                    # Shutting down: end the body here (cleanly; RSGI cannot abort) rather than drain it.
                    break
                await transport.send_bytes(chunk)
        except ProtocolClosed:
            self.stats.disconnects += 1

    def _sim_job(self, kind: str, body: bytes, tokens: int) -> tuple[sim.Sequence, simulated.Frames, bool]:
        """The simulated engine's sequence for a chat or text completion, and how to answer it."""
        assert self.sim is not None
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise r.MockRequestError(400, "the body is not valid JSON") from None
        if not isinstance(req, dict):
            raise r.MockRequestError(400, "the body must be a JSON object")
        chat = kind == "chat"
        if chat:
            messages = req.get("messages")
            if (
                not isinstance(messages, list)
                or not messages
                or not all(isinstance(m, dict) for m in messages)
            ):
                raise r.MockRequestError(400, "messages must be a non-empty list of objects")
            prompt = sim.render_chat(messages) if self.tokenizer is None else self._token_prompt(messages)
        else:
            text = req.get("prompt")
            if isinstance(text, list) and all(isinstance(t, str) for t in text):
                text = "".join(text)
            if not isinstance(text, str):
                raise r.MockRequestError(400, "the simulated engine takes a string prompt")
            prompt = text.encode() if self.tokenizer is None else sim.pack_tokens(self.tokenizer.encode(text))
        configured = self.sim.engine.config.output_tokens
        # The request's cap is the answer's length unless --sim-output-tokens is shorter; --tokens (or
        # x-mock-tokens) only when there is no cap.
        cap, capped = r.budget(req, _NO_CAP, "max_completion_tokens", "max_tokens")
        n = (tokens if cap == _NO_CAP else cap) if configured is None else min(configured, cap)
        finish = "length" if capped == "length" and n == cap else "stop"
        requested = req.get("model")
        model = requested if isinstance(requested, str) else self.models[0]
        loop = asyncio.get_running_loop()
        try:
            answer = self._token_answer(prompt, n) if self.tokenizer is not None else None
            seq = self.sim.engine.sequence(model, prompt, n, loop.time(), answer)
        except ValueError as exc:
            raise r.MockRequestError(400, str(exc)) from None
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{self._id_prefix}{next(self._ids):08x}"
        options = req.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        frames = simulated.Frames(chat, model, rid, int(time.time()), usage, finish == "length")
        return seq, frames, req.get("stream") is True

    def _token_prompt(self, messages: list[dict[str, Any]]) -> bytes:
        assert self.tokenizer is not None
        try:
            return sim.pack_tokens(self.tokenizer.chat_ids(messages))
        except (TemplateError, ValueError) as exc:
            raise r.MockRequestError(400, f"the chat template failed: {exc}") from None

    def _token_answer(self, prompt: bytes, n: int) -> tuple[bytes, list[str]]:
        """``n`` answer tokens: those of a text made of the prompt's words (``sim.answer_text``), repeated
        when it encodes to fewer; each with its text as the tokenizer decodes it."""
        assert self.tokenizer is not None
        if n <= 0:
            return b"", []
        text = self.tokenizer.decode(sim.unpack_tokens(prompt))
        ids = self.tokenizer.encode(sim.answer_text(text.encode(), n)) or [0]
        ids = (ids * (n // len(ids) + 1))[:n]
        return sim.pack_tokens(ids), [self.tokenizer.decode([i]) for i in ids]

    async def _sim_answer(
        self,
        proto: HTTPProtocol,
        driver: simulated.StepLoop,
        seq: sim.Sequence,
        frames: simulated.Frames,
        streamed: bool,
    ) -> None:
        """Run ``seq`` through the simulated engine; stream each token as its step emits it."""
        loop = asyncio.get_running_loop()
        driver.submit(seq)
        transport = proto.response_stream(200, _SSE_HEADERS) if streamed else None
        sent = 0
        try:
            while True:
                if transport is not None and (seq.generated > sent or seq.done):
                    await transport.send_bytes(frames.tokens(seq, sent, seq.generated))
                    sent = seq.generated
                if seq.done or self.closing:
                    break
                waiter: asyncio.Future[None] = loop.create_future()
                seq.listener = waiter
                self._sleepers.add(waiter)
                try:
                    await waiter
                finally:
                    self._sleepers.discard(waiter)
                    seq.listener = None
        except ProtocolClosed:
            self.stats.disconnects += 1
        finally:
            if not seq.done:
                driver.cancel(seq)
        if transport is None:
            if seq.state is sim.State.FINISHED:
                proto.response_bytes(200, r.JSON_HEADERS, frames.whole(seq))
            else:
                _error(proto, r.MockRequestError(503, "the engine is shutting down", "ServiceUnavailable"))

    async def _control(self, scope: Scope, proto: HTTPProtocol, path: str) -> None:
        method = scope.method
        if path == "/mock/config" and method == "POST":
            try:
                update = orjson.loads(await proto())
                if not isinstance(update, dict):
                    raise ValueError("expected a JSON object")
                self.behaviour = self.behaviour.merged(update)
            except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
                _error(proto, r.MockRequestError(400, str(exc)))
                return
            _json(proto, self.behaviour.to_dict())
        elif path == "/mock/reset-cache" and method == "POST":
            # The simulated engine forgets its prefix cache, as a restarted engine has (AllBlocksCleared).
            if self.sim is None:
                _error(proto, r.MockRequestError(404, "reset-cache needs --sim", "NotFoundError"))
            elif not self.sim.engine.reset_cache():
                _error(proto, r.MockRequestError(409, "requests are running", "Conflict"))
            else:
                self.sim.flush()
                _json(proto, simulated.stats_json(self.sim.engine))
        elif path == "/mock/config" and method == "GET":
            _json(proto, self.behaviour.to_dict())
        elif path == "/mock/reset" and method == "POST":
            self.behaviour = self.defaults
            self.recordings.clear()
            self.stats = Stats(in_flight=self.stats.in_flight)
            _json(proto, self.behaviour.to_dict())
        elif path == "/mock/requests" and method == "GET":
            wanted = parse_qs(scope.query_string).get("path")
            _json(proto, [_recording_json(rec) for rec in self.recordings if not wanted or rec[1] in wanted])
        elif path == "/mock/stats" and method == "GET":
            s = self.stats
            _json(
                proto,
                {
                    "total": s.total,
                    "by_path": s.by_path,
                    "in_flight": s.in_flight,
                    "max_in_flight": s.max_in_flight,
                    "failed": s.failed,
                    "dropped": s.dropped,
                    "disconnects": s.disconnects,
                    "running": self.running,
                    **({"sim": simulated.stats_json(self.sim.engine)} if self.sim is not None else {}),
                },
            )
        else:
            _error(proto, r.MockRequestError(404, f"no control route {method} {path}", "NotFoundError"))


_NO_CAP = 1 << 62
_SIM_KINDS = frozenset({"chat", "completion"})
_MONITORING = frozenset({"/metrics", "/health"})


def _wake(sleeper: asyncio.Future[None]) -> None:
    if not sleeper.done():
        sleeper.set_result(None)


def _raw(b: Behaviour) -> r.Reply:
    assert b.raw_response is not None
    return r.Reply(200, [("content-type", b.raw_content_type)], b.raw_response.encode())


def _header_number(value: str, kind: type[int] | type[float], name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise r.MockRequestError(400, f"{name} must be a number, got {value!r}") from None


def _failure_body(status: int, dialect: str) -> bytes:
    message = f"mock engine: injected failure with status {status}"
    if dialect == "anthropic":
        return anthropic.error_body(status, message)
    if dialect == "gemini":
        return gemini.error_body(status, message)
    return r.error_body(status, message, "MockFailure")


def _recording_json(rec: Recording) -> dict[str, Any]:
    method, path, query, headers, body = rec
    return {
        "method": method,
        "path": path,
        "query": query,
        "headers": {k.lower(): v for k, v in headers},
        "body_b64": base64.b64encode(body).decode(),
    }


def _json(proto: HTTPProtocol, value: Any) -> None:
    proto.response_bytes(200, r.JSON_HEADERS, orjson.dumps(value))


def _error(proto: HTTPProtocol, exc: r.MockRequestError, dialect: str = "openai") -> None:
    if dialect == "anthropic":
        body = anthropic.error_body(exc.status, exc.message)
    elif dialect == "gemini":
        body = gemini.error_body(exc.status, exc.message)
    else:
        body = exc.body()
    proto.response_bytes(exc.status, r.JSON_HEADERS, body)


async def serve(
    app: MockEngine,
    host: str,
    port: int,
    *,
    backpressure: int = 8192,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on the running loop until SIGTERM or SIGINT; ``on_listening`` runs once bound.

    On a signal, in-flight streams end at their next chunk (without ``[DONE]``) and pending delays end at
    once, so shutdown takes milliseconds instead of waiting for slow streams to finish.
    """
    server = Server(
        app,
        address=host,
        port=port,
        interface=Interfaces.RSGI,
        backlog=4096,
        backpressure=backpressure,
        log_level=LogLevels.error,
    )
    if on_listening is not None:
        server.on_startup(on_listening)

    def stop() -> None:
        # Both only set flags and wake futures; the serve loop and the handlers act on them.
        server.stop()  # type: ignore[no-untyped-call]
        app.begin_shutdown()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    try:
        await server.serve()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _api_key(headers: Any) -> str:
    """The API key a request presents, as OpenAI (bearer) and Anthropic (x-api-key) clients send it."""
    authorization: str = headers.get("authorization") or ""
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return str(headers.get("x-api-key") or headers.get("x-goog-api-key") or "")
