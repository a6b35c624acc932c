"""``ProxyApp`` in process: RSGI requests from a fake protocol object (``tests.fixtures.rsgi``), forwarded
to a real HTTP server on loopback, on the test's own event loop. The process-level tests in
tests/integration drive the same path through granian; these see what it hands granian, byte for byte."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from granian._granian import RSGIHeaders, RSGIHTTPProtocol, RSGIHTTPScope, RSGIHTTPStreamTransport

from gateway.config import Settings
from gateway.dataplane.accounting import Accounting
from gateway.dataplane.app import ProxyApp
from gateway.dataplane.rsgi import Headers, HTTPProtocol, Scope, Transport
from gateway.dataplane.usage_log import UsageLog
from gateway.keys import hash_secret
from gateway.native import UsageRing, ring_region_size, top_members
from gateway.protocol.anthropic import estimate_input_tokens, read_messages_head
from gateway.snapshot import Snapshot
from gateway.usage_record import UsageRecord, decode_record
from tests.fixtures.rsgi import FakeHeaders, FakeProto, FakeScope, LoopbackEngine, chunked, silence, whole

HASH_KEY = bytes(range(32))
SECRET = "sk-gw-alice-0001"
USAGE = b'"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}'
# Spacing and member order no encoder would produce: any re-encoding on the way shows.
ANSWER = (
    b'{"id":"chatcmpl-1",  "object":"chat.completion","model":"meta/llama-8b","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi \\u00e9"},"finish_reason":"stop"}] ,' + USAGE + b"}\n"
)


def snapshot(url: str) -> Snapshot:
    targets = [["llama", "a", "meta/llama-8b"]]
    doc = {
        "schema": 1,
        "revision": 1,
        "backends": {"a": {"url": url, "api_key": "sk-backend-a"}},
        "routes": {
            "chat": {"canonical": "chat", "kind": "frontend", "targets": targets},
            "private": {"canonical": "private", "kind": "frontend", "targets": targets},
        },
        "principals": {"p1": {"name": "alice", "models": ["chat"]}},
        "keys": {hash_secret(SECRET, HASH_KEY).hex(): {"id": "k1", "principal": "p1", "expires_at": None}},
    }
    return Snapshot.from_doc(doc, 1)


def recording(**settings: Any) -> tuple[Accounting, UsageRing]:
    """An accounting with usage records only, into a ring in private memory."""
    ring = UsageRing.create_layout(bytearray(ring_region_size(1, 16, 1024)), 1, 16, 1024)
    return Accounting(None, None, UsageLog(ring, 0), Settings(**settings)), ring


def records(ring: UsageRing) -> list[UsageRecord]:
    return [decode_record(data) for data in ring.read(0)]


@asynccontextmanager
async def running(url: str, accounting: Accounting | None = None, **settings: Any) -> AsyncIterator[ProxyApp]:
    """A proxy worker's app on this loop, as granian starts and stops it, serving ``snapshot(url)``."""
    loop = asyncio.get_running_loop()
    app = ProxyApp(Settings(**settings), HASH_KEY, None, accounting)
    app.__rsgi_init__(loop)
    app.snapshot = snapshot(url)
    try:
        yield app
    finally:
        app.__rsgi_del__(loop)


def chat(
    model: str = "chat", key: str | None = SECRET, stream: bool = False, extra: Sequence[tuple[str, str]] = ()
) -> tuple[FakeScope, FakeProto]:
    doc: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        doc |= {"stream": True, "stream_options": {"include_usage": True}}
    body = orjson.dumps(doc)
    headers = [("content-type", "application/json"), ("content-length", str(len(body))), *extra]
    if key is not None:
        headers.append(("authorization", f"Bearer {key}"))
    return FakeScope("POST", "/v1/chat/completions", FakeHeaders(headers)), FakeProto(body)


def test_a_bad_key_gets_the_error_envelope_of_its_api_and_nothing_goes_upstream() -> None:
    async def main() -> None:
        async with LoopbackEngine(whole(200, ANSWER)) as engine, running(engine.url) as app:
            scope, proto = chat(key="sk-gw-wrong")
            await app.__rsgi__(scope, proto)
            assert (proto.status, proto.header("content-type")) == (401, "application/json")
            assert orjson.loads(proto.answer) == {
                "error": {
                    "message": "Incorrect API key provided",
                    "type": "authentication_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
            scope, proto = chat(key=None)
            await app.__rsgi__(scope, proto)
            assert proto.status == 401 and b"Missing API key" in proto.answer
            # Anthropic's path answers in Anthropic's envelope.
            body = b'{"model":"chat","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
            headers = FakeHeaders([("x-api-key", "sk-gw-wrong"), ("content-length", str(len(body)))])
            proto = FakeProto(body)
            await app.__rsgi__(FakeScope("POST", "/v1/messages", headers), proto)
            assert proto.status == 401
            assert orjson.loads(proto.answer) == {
                "type": "error",
                "error": {"type": "authentication_error", "message": "Incorrect API key provided"},
            }
            assert engine.seen == [] and app.refused == {401: 3} and app.in_flight == 0

    asyncio.run(main())


def test_a_model_not_granted_is_403_and_an_unknown_one_404() -> None:
    async def main() -> None:
        async with LoopbackEngine(whole(200, ANSWER)) as engine, running(engine.url) as app:
            for model, status, code in (
                ("private", 403, "model_not_allowed"),
                ("nope", 404, "model_not_found"),
            ):
                scope, proto = chat(model)
                await app.__rsgi__(scope, proto)
                assert proto.status == status
                assert orjson.loads(proto.answer)["error"]["code"] == code
            assert engine.seen == []

    asyncio.run(main())


@pytest.mark.parametrize("recorded", [False, True], ids=["unmetered", "recorded"])
def test_a_good_request_is_forwarded_and_its_answer_passes_untouched(recorded: bool) -> None:
    async def main() -> None:
        accounting, ring = recording(route_trace=True) if recorded else (None, None)
        upstream_headers = [("x-engine", "a"), ("Connection", "keep-alive, x-hop"), ("x-hop", "1")]
        extra = [("x-custom", "kept"), ("x-api-key", "sk-client-other"), ("connection", "x-private")]
        scope, proto = chat(extra=[*extra, ("x-private", "dropped")])
        async with (
            LoopbackEngine(whole(200, ANSWER, upstream_headers)) as engine,
            running(engine.url, accounting) as app,
        ):
            await app.__rsgi__(scope, proto)
        assert (proto.status, proto.answer, proto.streamed) == (200, ANSWER, False)
        assert proto.header("x-engine") == "a"
        assert proto.header("x-hop") is None and proto.header("connection") is None  # hop-by-hop, named
        (seen,) = engine.seen
        assert (seen.method, seen.target) == ("POST", "/v1/chat/completions")
        # The backend's key replaces the client's; what the client's Connection header names stays behind.
        assert seen.headers["authorization"] == "Bearer sk-backend-a"
        assert "x-api-key" not in seen.headers and "x-private" not in seen.headers
        assert seen.headers["x-custom"] == "kept"
        assert orjson.loads(seen.body) == {
            "model": "meta/llama-8b",
            "messages": [{"role": "user", "content": "hi"}],
        }
        if ring is None:
            assert proto.header("x-request-id") is None
            return
        (record,) = records(ring)
        assert proto.header("x-request-id") == record.request_id
        assert (record.status, record.backend, record.model, record.attempts) == (200, "a", "chat", 1)
        assert (record.prompt_tokens, record.completion_tokens, record.usage_source) == (5, 7, "reported")
        assert record.trace is not None and [entry[:3] for entry in record.trace] == [["a", "llama", 200]]

    asyncio.run(main())


def test_a_backend_nobody_answers_at_gets_502_with_the_request_id_and_a_record() -> None:
    async def main() -> None:
        accounting, ring = recording()
        dead = socket.socket()  # bound and held, never listening: connections to it are refused
        dead.bind(("127.0.0.1", 0))
        try:
            async with running(f"http://127.0.0.1:{dead.getsockname()[1]}", accounting) as app:
                scope, proto = chat()
                await app.__rsgi__(scope, proto)
        finally:
            dead.close()
        assert proto.status == 502 and proto.header("content-type") == "application/json"
        assert orjson.loads(proto.answer)["error"]["type"] == "server_error"
        (record,) = records(ring)
        assert (record.status, record.backend, record.usage_source) == (502, None, "none")
        assert proto.header("x-request-id") == record.request_id  # the refusal can be looked up
        assert app.refused == {502: 1}

    asyncio.run(main())


def test_every_answer_of_a_draining_worker_says_connection_close() -> None:
    """From SIGTERM on (``draining``), every answer, whole or streamed, forwarded or the gateway's own,
    says ``Connection: close`` (issue 29): hyper then closes the connection once the answer is written,
    so the worker's stop finds no kept-alive connection to close under a request. Before, none does."""

    def requests() -> list[tuple[FakeScope, FakeProto]]:
        readyz = (FakeScope("GET", "/readyz", FakeHeaders([])), FakeProto(b""))
        return [chat(), chat(key="sk-gw-wrong"), readyz]

    async def main() -> None:
        async with LoopbackEngine(whole(200, ANSWER)) as engine, running(engine.url) as app:
            for scope, proto in requests():
                await app.__rsgi__(scope, proto)
                assert proto.header("connection") is None
            app.draining = True
            answered = requests()
            for scope, proto in answered:
                await app.__rsgi__(scope, proto)
                assert proto.header("connection") == "close", proto.status
            assert [proto.status for _, proto in answered] == [200, 401, 503]
            assert app.closing_answers == 3
        async with LoopbackEngine(chunked(STREAM, gap=0.01)) as engine, running(engine.url) as app:
            app.draining = True
            scope, proto = chat(stream=True)
            await app.__rsgi__(scope, proto)
            assert (proto.status, proto.streamed, proto.header("connection")) == (200, True, "close")
            assert proto.answer == b"".join(STREAM)

    asyncio.run(main())


STREAM = [
    b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" two"}}]}\n\n',
    b'data: {"choices":[],' + USAGE + b"}\n\n",
    b"data: [DONE]\n\n",
]


@pytest.mark.parametrize("recorded", [False, True], ids=["unmetered", "recorded"])
def test_a_stream_is_relayed_piece_by_piece_untouched(recorded: bool) -> None:
    async def main() -> None:
        accounting, ring = recording() if recorded else (None, None)
        async with (
            LoopbackEngine(chunked(STREAM, gap=0.01)) as engine,
            running(engine.url, accounting) as app,
        ):
            scope, proto = chat(stream=True)
            await app.__rsgi__(scope, proto)
        assert (proto.status, proto.streamed, proto.header("content-type")) == (
            200,
            True,
            "text/event-stream",
        )
        assert proto.answer == b"".join(STREAM)
        assert len(proto.pieces) >= 2  # sent as the engine sent them, not gathered into one
        if ring is not None:
            (record,) = records(ring)
            assert (record.status, record.cut, record.usage_source, record.total_tokens) == (
                200,
                None,
                "reported",
                12,
            )

    asyncio.run(main())


def test_a_client_that_leaves_mid_stream_stops_the_upstream_and_is_billed_for_what_it_got() -> None:
    async def main() -> None:
        accounting, ring = recording()
        pieces = [b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'] * 1000  # 10 s of them
        scope, proto = chat(stream=True)
        proto.close_after = 3  # the transport raises granian's RSGIProtocolClosed on the 4th piece
        async with (
            LoopbackEngine(chunked(pieces, gap=0.01)) as engine,
            # Only the failed send tells: the disconnect watch would take a minute to arm.
            running(engine.url, accounting, disconnect_watch_after=60.0) as app,
        ):
            await asyncio.wait_for(app.__rsgi__(scope, proto), 5)
            await asyncio.wait_for(engine.hung_up.wait(), 5)  # the engine's connection was dropped
            assert app.in_flight == 0
        assert proto.status == 200 and len(proto.pieces) == 3
        (record,) = records(ring)
        assert (record.status, record.cut, record.usage_source) == (200, "client", "estimated")
        assert record.completion_tokens > 0

    asyncio.run(main())


def test_a_client_that_leaves_before_the_answer_cancels_the_upstream_request() -> None:
    async def main() -> None:
        accounting, ring = recording()
        scope, proto = chat()
        async with (
            LoopbackEngine(silence()) as engine,
            running(engine.url, accounting, disconnect_watch_after=0.05) as app,
        ):
            request = asyncio.create_task(app.__rsgi__(scope, proto))
            while not engine.seen:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the watch is armed after 0.05 s
            proto.leave()
            await asyncio.wait_for(request, 5)
            await asyncio.wait_for(engine.hung_up.wait(), 5)
            assert app.in_flight == 0
        assert proto.status is None  # nothing was answered: nobody is there to read it
        (record,) = records(ring)
        assert (record.status, record.backend, record.cut) == (499, None, None)

    asyncio.run(main())


def test_count_tokens_is_answered_by_the_gateway_for_a_route_without_an_anthropic_backend() -> None:
    async def main() -> None:
        accounting, ring = recording()
        body = b'{"model":"chat","messages":[{"role":"user","content":"how many tokens is this?"}]}'
        headers = FakeHeaders([("x-api-key", SECRET), ("content-length", str(len(body)))])
        async with LoopbackEngine(whole(200, ANSWER)) as engine, running(engine.url, accounting) as app:
            proto = FakeProto(body)
            await app.__rsgi__(FakeScope("POST", "/v1/messages/count_tokens", headers), proto)
        expected = estimate_input_tokens(read_messages_head(body, count_tokens=True, members=top_members))
        assert (
            proto.status == 200 and orjson.loads(proto.answer) == {"input_tokens": expected} and expected > 0
        )
        assert engine.seen == [] and records(ring) == []  # neither forwarded nor recorded

    asyncio.run(main())


def protocol_members(protocol: type) -> set[str]:
    dunders = {"__call__", "__aiter__"}
    return {
        name
        for name, value in vars(protocol).items()
        if (callable(value) or isinstance(value, property)) and (not name.startswith("_") or name in dunders)
    }


@pytest.mark.parametrize(
    ("protocol", "real"),
    [
        (Scope, RSGIHTTPScope),
        (Headers, RSGIHeaders),
        (HTTPProtocol, RSGIHTTPProtocol),
        (Transport, RSGIHTTPStreamTransport),
    ],
    ids=lambda c: c.__name__,
)
def test_granians_objects_have_every_member_our_protocols_name(protocol: type, real: type) -> None:
    wanted = protocol_members(protocol)
    assert wanted  # the introspection found the Protocol's members at all
    assert not {name for name in wanted if not hasattr(real, name)}
