"""``Forwarder`` and ``Outgoing`` in process: failover over real HTTP servers on loopback, answers handed to a
fake RSGI protocol object (``tests.fixtures.rsgi``), and what each kind of target is sent."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from gateway.config import Settings
from gateway.dataplane.app import ProxyApp
from gateway.dataplane.dialects import Outgoing
from gateway.dataplane.forward import Attempted, Forwarder
from gateway.dataplane.upstream import make_client
from gateway.errors import MethodNotAllowed, NotFound, UpstreamUnavailable
from gateway.snapshot import Target, decode_backends
from tests.fixtures.rsgi import FakeHeaders, FakeProto, FakeScope, LoopbackEngine, whole

ANSWER = (
    b'{"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}'
)
CHAT = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9})


def targets(*backends: tuple[str, str, str]) -> tuple[Target, ...]:
    """One target per ``(name, url, protocol)``, its upstream model named after its backend."""
    doc = {
        "backends": {name: {"url": url, "api_key": f"key-{name}", "protocol": p} for name, url, p in backends}
    }
    decoded = decode_backends(doc)
    return tuple(Target("pm", decoded[name], f"model-{name}") for name, _, _ in backends)


def outgoing(
    path: str = "/v1/chat/completions",
    body: bytes = CHAT,
    method: str = "POST",
    headers: Sequence[tuple[str, str]] = (),
    query: str = "",
) -> Outgoing:
    """The request as the app makes it from a client's scope (``ProxyApp.outgoing``)."""
    app = ProxyApp(Settings(), bytes(32), None)
    scope = FakeScope(method, path, FakeHeaders([("content-type", "application/json"), *headers]), query)
    return app.outgoing(scope, path, body)


def refused_port() -> socket.socket:
    """A loopback port nothing listens on, held by the test so that nothing else can take it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


async def forward(proto: FakeProto, out: Outgoing, to: tuple[Target, ...], trace: list[Any]) -> Attempted:
    forwarder = Forwarder(make_client(), backoff=0.0)
    try:
        return await forwarder.forward(proto, out, to, None, trace)
    finally:
        await forwarder.client.close()


def test_a_failing_target_fails_over_to_the_next_and_only_the_answer_reaches_the_client() -> None:
    async def main() -> None:
        async with (
            LoopbackEngine(whole(503, b'{"error":"busy"}')) as sick,
            LoopbackEngine(whole(200, ANSWER)) as well,
        ):
            proto, trace = FakeProto(), []
            to = targets(("sick", sick.url, "openai"), ("well", well.url, "openai"))
            attempted = await forward(proto, outgoing(), to, trace)
        assert (proto.status, proto.answer) == (200, ANSWER)
        assert attempted.target is not None and attempted.target.backend.name == "well"
        assert (attempted.status, attempted.attempts) == (200, 2)
        assert [entry[:3] for entry in trace] == [["sick", "pm", 503], ["well", "pm", 200]]
        # Each target gets the model it knows the request's by, and its own key.
        assert [orjson.loads(e.seen[0].body)["model"] for e in (sick, well)] == ["model-sick", "model-well"]
        assert [e.seen[0].headers["authorization"] for e in (sick, well)] == [
            "Bearer key-sick",
            "Bearer key-well",
        ]

    asyncio.run(main())


def test_when_every_target_fails_the_last_answer_reaches_the_client_verbatim() -> None:
    async def main() -> None:
        first, last = b'{"error":"first"}', b'{"error":"overloaded, try later"}'
        retry = [("retry-after", "7")]
        async with LoopbackEngine(whole(503, first)) as a, LoopbackEngine(whole(429, last, retry)) as b:
            proto, trace = FakeProto(), []
            attempted = await forward(
                proto, outgoing(), targets(("a", a.url, "openai"), ("b", b.url, "openai")), trace
            )
        assert (proto.status, proto.answer, proto.header("retry-after")) == (429, last, "7")
        assert (attempted.status, attempted.attempts) == (429, 2)
        # The last target not even reachable: the answer kept from the one before is the client's.
        dead = refused_port()
        try:
            async with LoopbackEngine(whole(503, first)) as a:
                proto = FakeProto()
                to = targets(
                    ("a", a.url, "openai"), ("dead", f"http://127.0.0.1:{dead.getsockname()[1]}", "openai")
                )
                attempted = await forward(proto, outgoing(), to, [])
        finally:
            dead.close()
        assert (proto.status, proto.answer, attempted.attempts) == (503, first, 2)

    asyncio.run(main())


def test_a_client_error_is_the_answer_and_is_not_failed_over() -> None:
    async def main() -> None:
        bad = b'{"error":{"message":"max_tokens is too large"}}'
        async with LoopbackEngine(whole(400, bad)) as a, LoopbackEngine(whole(200, ANSWER)) as b:
            proto = FakeProto()
            await forward(proto, outgoing(), targets(("a", a.url, "openai"), ("b", b.url, "openai")), [])
        assert (proto.status, proto.answer) == (400, bad)
        assert b.seen == []

    asyncio.run(main())


def test_when_no_target_can_be_reached_the_gateway_answers_502() -> None:
    async def main() -> None:
        dead = [refused_port(), refused_port()]
        try:
            urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in dead]
            proto, trace = FakeProto(), []
            with pytest.raises(UpstreamUnavailable) as info:
                await forward(
                    proto, outgoing(), targets(("a", urls[0], "openai"), ("b", urls[1], "openai")), trace
                )
        finally:
            for sock in dead:
                sock.close()
        assert info.value.status == 502 and proto.status is None
        assert [entry[2] for entry in trace] == ["connect", "connect"]

    asyncio.run(main())


def test_an_openai_request_to_an_anthropic_backend_is_translated_both_ways() -> None:
    async def main() -> None:
        message = orjson.dumps(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "model-claude",
                "content": [{"type": "text", "text": "hello"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 4},
            }
        )
        async with LoopbackEngine(whole(200, message, [("content-type", "application/json")])) as engine:
            proto = FakeProto()
            await forward(proto, outgoing(), targets(("claude", engine.url, "anthropic")), [])
        (seen,) = engine.seen
        assert (seen.target, seen.headers["x-api-key"], seen.headers["anthropic-version"]) == (
            "/v1/messages",
            "key-claude",
            "2023-06-01",
        )
        sent = orjson.loads(seen.body)
        assert (sent["model"], sent["max_tokens"], sent["messages"][0]["role"]) == ("model-claude", 9, "user")
        got = orjson.loads(proto.answer)
        assert proto.status == 200 and got["object"] == "chat.completion" and got["model"] == "chat"
        assert got["choices"][0]["message"]["content"] == "hello"
        assert got["usage"]["prompt_tokens"] == 3 and got["usage"]["completion_tokens"] == 4

    asyncio.run(main())


def test_outgoing_drops_the_clients_credentials_and_hop_by_hop_headers_and_keeps_the_rest() -> None:
    headers = [
        ("authorization", "Bearer sk-gw-client"),
        ("x-api-key", "sk-gw-client"),
        ("accept-encoding", "gzip"),
        ("connection", "keep-alive, x-trace-hop"),
        ("x-trace-hop", "1"),
        ("te", "trailers"),
        ("x-custom", "kept"),
    ]
    out = outgoing(headers=headers, query="debug=1")
    assert out.dialect == "openai" and out.path_qs == "/v1/chat/completions?debug=1"
    assert out.headers == [("content-type", "application/json"), ("x-custom", "kept")]
    assert out.info is not None and (out.info.model, out.info.max_tokens) == ("chat", 9)
    (target,) = targets(("a", "http://127.0.0.1:1", "openai"))
    up = out.prepare(target)
    assert up is not None and up.translation is None
    assert up.headers == [*out.headers, ("authorization", "Bearer key-a")]
    assert orjson.loads(up.body)["model"] == "model-a" and up.body.replace(b"model-a", b"chat") == CHAT


def test_outgoing_passes_over_a_target_whose_protocol_cannot_carry_the_request() -> None:
    out = outgoing("/v1/embeddings", b'{"model":"chat","input":"hi"}')
    claude, plain = targets(
        ("claude", "http://127.0.0.1:1", "anthropic"), ("a", "http://127.0.0.1:2", "openai")
    )
    assert out.prepare(claude) is None
    up = out.prepare(plain)
    assert up is not None and up.path_qs == "/v1/embeddings" and orjson.loads(up.body)["model"] == "model-a"


@pytest.mark.parametrize(
    ("method", "path", "error"),
    [
        ("GET", "/v1/messages", MethodNotAllowed),
        ("POST", "/v1/messages/batches", NotFound),
        ("GET", "/v1/responses", MethodNotAllowed),
    ],
)
def test_outgoing_refuses_what_the_gateway_does_not_proxy(
    method: str, path: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        outgoing(path, b'{"model":"chat","max_tokens":1,"messages":[]}', method)


def test_a_stored_response_is_routed_by_its_query_and_reserves_no_completion() -> None:
    out = outgoing("/v1/responses/resp_1", b"", "GET", query="model=chat")
    assert out.dialect == "responses" and out.path_qs == "/v1/responses/resp_1?model=chat"
    assert out.info is not None and (out.info.model, out.info.max_tokens) == ("chat", 0)
