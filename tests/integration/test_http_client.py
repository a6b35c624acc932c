"""``UpstreamClient`` against real servers on loopback: the mock engine (keep-alive, streaming, drops,
delays), a small asyncio server written here for what the mock cannot do (Connection: close, servers that
close idle connections, 100 Continue, HEAD and 204, malformed answers, backpressure), and TLS with a
throwaway self-signed certificate. Every test runs on the plain asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.dataplane import http_client
from gateway.dataplane.http_client import RequestNotSendable, UpstreamClient, UpstreamError, UpstreamTimeout
from tests.fixtures.processes import MockEngine, refusing_socket

CHAT = "/v1/chat/completions"
JSON = [("content-type", "application/json")]
TIMEOUTS: dict[str, float] = {"connect_timeout": 2.0, "first_byte_timeout": 5.0, "read_timeout": 5.0}


def chat_body(stream: bool = False, max_tokens: int = 4) -> bytes:
    return orjson.dumps(
        {
            "model": "mock-model",
            "messages": [{"role": "user", "content": "q"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[Any]], Any]:
    """Run a coroutine to completion on a fresh loop of the parametrised kind."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory = uvloop.new_event_loop

    def runner(coro: Awaitable[Any]) -> Any:
        async def main() -> Any:
            return await asyncio.wait_for(coro, 30)

        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(main())

    return runner


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockEngine]:
    e = MockEngine(tmp_path_factory.mktemp("http-client"))
    yield e
    e.stop()


@pytest.fixture
def mock(engine: MockEngine) -> MockEngine:
    engine.reset()
    return engine


def idle(client: UpstreamClient) -> int:
    return sum(len(p.idle) for p in client._pools.values())


# -- against the mock engine -----------------------------------------------------------------------
def test_plain_answer_and_keep_alive_reuse(run: Any, mock: MockEngine) -> None:
    async def go() -> None:
        client = UpstreamClient()
        try:
            for _ in range(5):
                resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(), **TIMEOUTS)
                assert resp.status == 200
                assert resp.content_type == "application/json"
                body = await resp.read()
                assert resp.content_length == len(body)
                assert orjson.loads(body)["object"] == "chat.completion"
                resp.release()
            assert client.connections_opened == 1 and idle(client) == 1
        finally:
            await client.close()

    run(go())
    rec = mock.requests()[-1]
    assert rec["headers"]["host"] == mock.url.removeprefix("http://")
    assert rec["headers"]["content-length"] == str(len(chat_body()))
    assert rec["body"] == chat_body()


def test_base_url_path_and_query_are_joined(run: Any, mock: MockEngine) -> None:
    async def go() -> int:
        client = UpstreamClient()
        try:
            resp = await client.request(mock.url + "/v1/", "GET", "/models?x=1", [], b"", **TIMEOUTS)
            await resp.read()
            resp.release()
            return resp.status
        finally:
            await client.close()

    assert run(go()) == 200
    rec = mock.requests()[-1]
    assert rec["path"] == "/v1/models" and rec["query"] == "x=1"


def test_concurrent_requests_share_a_bounded_pool(run: Any, mock: MockEngine) -> None:
    async def go() -> None:
        client = UpstreamClient(max_idle_per_host=4)
        try:

            async def one() -> bytes:
                resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(), **TIMEOUTS)
                try:
                    return await resp.read()
                finally:
                    resp.release()

            bodies = await asyncio.gather(*(one() for _ in range(20)))
            assert all(orjson.loads(b)["choices"] for b in bodies)
            assert idle(client) <= 4
            opened = client.connections_opened
            await asyncio.gather(*(one() for _ in range(4)))
            assert client.connections_opened == opened  # the four kept were reused
        finally:
            await client.close()

    run(go())


def test_sse_stream_is_relayed_piece_by_piece(run: Any, mock: MockEngine) -> None:
    frames = ['data: {"a":1}\n\n', 'data: {"b":2}\n\n', "data: [DONE]\n\n"]
    mock.configure(raw_stream=frames, raw_chunk_delay=0.05)

    async def go() -> list[bytes]:
        client = UpstreamClient()
        try:
            resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(stream=True), **TIMEOUTS)
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            assert resp.content_length is None  # chunked
            pieces = [piece async for piece in resp]
            resp.release()
            assert idle(client) == 1  # a complete chunked body leaves the connection reusable
            return pieces
        finally:
            await client.close()

    pieces = run(go())
    assert b"".join(pieces) == "".join(frames).encode()
    assert len(pieces) >= 2  # delivered as they came, not at the end


def test_generated_stream_ends_with_done(run: Any, mock: MockEngine) -> None:
    async def go() -> bytes:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url, "POST", CHAT, JSON, chat_body(stream=True, max_tokens=8), **TIMEOUTS
            )
            data = await resp.read()
            resp.release()
            return data
        finally:
            await client.close()

    data = run(go())
    assert data.startswith(b"data: ") and data.endswith(b"data: [DONE]\n\n")


def test_dropped_stream_raises_mid_iteration(run: Any, mock: MockEngine) -> None:
    mock.configure(drop_after_chunks=2, tokens=10)

    async def go() -> None:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url, "POST", CHAT, JSON, chat_body(stream=True, max_tokens=10), **TIMEOUTS
            )
            got = b""
            with pytest.raises(UpstreamError, match="still expected"):
                async for piece in resp:
                    got += piece
            assert got.startswith(b"data: ") and b"[DONE]" not in got
            resp.release()
            assert idle(client) == 0
        finally:
            await client.close()

    run(go())


# -- pouring a body into a sink ----------------------------------------------------------------------
class Collect:
    """A sink that keeps what it is given; stops the pour after ``stop_after`` pieces, or raises on
    piece ``raise_on``."""

    def __init__(self, stop_after: int = 0, raise_on: int = 0) -> None:
        self.pieces: list[tuple[bytes, bool]] = []
        self.stop_after = stop_after
        self.raise_on = raise_on

    def __call__(self, piece: bytes, last: bool) -> bool:
        self.pieces.append((piece, last))
        if len(self.pieces) == self.raise_on:
            raise LookupError("the sink's own failure")
        return len(self.pieces) == self.stop_after

    @property
    def body(self) -> bytes:
        return b"".join(p for p, _ in self.pieces)


def test_pour_hands_every_piece_as_it_arrives(run: Any, mock: MockEngine) -> None:
    frames = ['data: {"a":1}\n\n', 'data: {"b":2}\n\n', "data: [DONE]\n\n"]
    mock.configure(raw_stream=frames, raw_chunk_delay=0.05)

    async def go() -> Collect:
        client = UpstreamClient()
        try:
            resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(stream=True), **TIMEOUTS)
            sink = Collect()
            await resp.pour(sink)
            assert resp.ended
            resp.release()
            assert idle(client) == 1  # the whole body came: the connection is reusable
            return sink
        finally:
            await client.close()

    sink = run(go())
    assert sink.body == "".join(frames).encode()
    assert len(sink.pieces) >= 2  # as they came, not at the end
    # ``last`` only on the final piece, and only when the body's end came with it.
    assert not any(last for _, last in sink.pieces[:-1])


def test_pour_stops_when_the_sink_asks_and_goes_on_when_poured_again(run: Any, mock: MockEngine) -> None:
    frames = [f"data: {i}\n\n" for i in range(6)]
    mock.configure(raw_stream=frames, raw_chunk_delay=0.05)

    async def go() -> list[int]:
        client = UpstreamClient()
        try:
            resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(stream=True), **TIMEOUTS)
            sink = Collect(stop_after=2)
            await resp.pour(sink)
            counts = [len(sink.pieces)]
            await asyncio.sleep(0.2)  # meanwhile the rest is buffered, not handed to the sink
            counts.append(len(sink.pieces))
            await resp.pour(sink)
            counts.append(len(sink.pieces))
            assert sink.body == "".join(frames).encode() and resp.ended
            resp.release()
            return counts
        finally:
            await client.close()

    first, meanwhile, after = run(go())
    assert first == meanwhile == 2 and after > 2


def test_what_the_sink_raises_comes_out_of_pour(run: Any, mock: MockEngine) -> None:
    mock.configure(raw_stream=[f"data: {i}\n\n" for i in range(4)], raw_chunk_delay=0.05)

    async def go() -> None:
        client = UpstreamClient()
        try:
            resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(stream=True), **TIMEOUTS)
            sink = Collect(raise_on=2)  # raised inside the connection's callback, surfaced in this task
            with pytest.raises(LookupError, match="own failure"):
                await resp.pour(sink)
            resp.close()
            assert idle(client) == 0
        finally:
            await client.close()

    run(go())


def test_pour_raises_when_the_stream_breaks_off(run: Any, mock: MockEngine) -> None:
    mock.configure(drop_after_chunks=2, tokens=10)

    async def go() -> Collect:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url, "POST", CHAT, JSON, chat_body(stream=True, max_tokens=10), **TIMEOUTS
            )
            sink = Collect()
            with pytest.raises(UpstreamError, match="still expected"):
                await resp.pour(sink)
            resp.release()
            assert idle(client) == 0
            return sink
        finally:
            await client.close()

    sink = run(go())
    assert sink.body.startswith(b"data: ") and b"[DONE]" not in sink.body


def test_pour_waits_no_longer_than_the_read_timeout(run: Any, mock: MockEngine) -> None:
    mock.configure(raw_stream=["data: 1\n\n", "data: 2\n\n"], raw_chunk_delay=3)

    async def go() -> Collect:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url,
                "POST",
                CHAT,
                JSON,
                chat_body(stream=True),
                connect_timeout=1,
                first_byte_timeout=5,
                read_timeout=0.3,
            )
            sink = Collect()
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout, match="no body data"):
                await resp.pour(sink)
            assert time.monotonic() - start < 2
            resp.release()
            return sink
        finally:
            await client.close()

    assert run(go()).body == b"data: 1\n\n"


def test_first_byte_timeout(run: Any, mock: MockEngine) -> None:
    mock.configure(delay=3)

    async def go() -> None:
        client = UpstreamClient()
        try:
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout, match="no response headers"):
                await client.request(
                    mock.url,
                    "POST",
                    CHAT,
                    JSON,
                    chat_body(),
                    connect_timeout=1,
                    first_byte_timeout=0.3,
                    read_timeout=5,
                )
            assert time.monotonic() - start < 2
            assert idle(client) == 0
            # A later request with a longer deadline on a fresh connection is unaffected.
            resp = await client.request(
                mock.url, "POST", CHAT, [*JSON, ("x-mock-delay", "0")], chat_body(), **TIMEOUTS
            )
            assert resp.status == 200
            await resp.read()
            resp.release()
        finally:
            await client.close()

    run(go())


def test_first_byte_timeout_on_a_reused_connection(run: Any, mock: MockEngine) -> None:
    """The per-connection timer armed by an earlier request with a long deadline must not delay a
    shorter one."""

    async def go() -> None:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url,
                "POST",
                CHAT,
                JSON,
                chat_body(),
                connect_timeout=1,
                first_byte_timeout=60,
                read_timeout=60,
            )
            await resp.read()
            resp.release()
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout):
                await client.request(
                    mock.url,
                    "POST",
                    CHAT,
                    [*JSON, ("x-mock-delay", "3")],
                    chat_body(),
                    connect_timeout=1,
                    first_byte_timeout=0.3,
                    read_timeout=5,
                )
            assert time.monotonic() - start < 2
        finally:
            await client.close()

    run(go())


def test_read_timeout_between_pieces(run: Any, mock: MockEngine) -> None:
    mock.configure(raw_stream=["data: 1\n\n", "data: 2\n\n"], raw_chunk_delay=3)

    async def go() -> None:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url,
                "POST",
                CHAT,
                JSON,
                chat_body(stream=True),
                connect_timeout=1,
                first_byte_timeout=5,
                read_timeout=0.3,
            )
            it = aiter(resp)
            assert await anext(it) == b"data: 1\n\n"
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout, match="no body data"):
                await anext(it)
            assert time.monotonic() - start < 2
            resp.release()
        finally:
            await client.close()

    run(go())


def test_connection_refused(run: Any) -> None:
    hold = refusing_socket()  # bound, never listening: refused, and nobody else can take the port meanwhile
    url = f"http://127.0.0.1:{hold.getsockname()[1]}"

    async def go() -> None:
        client = UpstreamClient()
        try:
            with pytest.raises(UpstreamError, match="cannot connect") as info:
                await client.request(url, "GET", "/", [], b"", **TIMEOUTS)
            assert not isinstance(info.value, UpstreamTimeout)
        finally:
            await client.close()

    try:
        run(go())
    finally:
        hold.close()


def test_error_status_is_an_answer(run: Any, mock: MockEngine) -> None:
    mock.configure(fail_status=503, fail_body='{"error":"busy"}')

    async def go() -> tuple[int, bytes]:
        client = UpstreamClient()
        try:
            resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(), **TIMEOUTS)
            data = await resp.read()
            resp.release()
            return resp.status, data
        finally:
            await client.close()

    assert run(go()) == (503, b'{"error":"busy"}')


def test_cancelled_stream_closes_the_connection(run: Any, mock: MockEngine) -> None:
    mock.configure(token_delay=0.1, tokens=100)

    async def go() -> None:
        client = UpstreamClient()
        try:
            resp = await client.request(
                mock.url, "POST", CHAT, JSON, chat_body(stream=True, max_tokens=100), **TIMEOUTS
            )

            async def consume() -> None:
                async for _ in resp:
                    pass

            task = asyncio.ensure_future(consume())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            resp.release()
            assert idle(client) == 0
        finally:
            await client.close()

    run(go())
    deadline = time.monotonic() + 5
    while httpx.get(mock.url + "/mock/stats").json()["disconnects"] < 1:
        assert time.monotonic() < deadline, "the engine never saw the connection go"
        time.sleep(0.05)


def test_cancelled_before_headers_never_pools_the_connection(run: Any, mock: MockEngine) -> None:
    async def go() -> None:
        client = UpstreamClient()
        try:
            req = client.request(
                mock.url, "POST", CHAT, [*JSON, ("x-mock-delay", "1")], chat_body(), **TIMEOUTS
            )
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(req, 0.2)
            assert idle(client) == 0 and not client._conns
            resp = await client.request(mock.url, "POST", CHAT, JSON, chat_body(), **TIMEOUTS)
            await resp.read()
            resp.release()
            assert client.connections_opened == 2
        finally:
            await client.close()

    run(go())


def test_a_request_that_cannot_be_written_is_the_requests_fault(run: Any, mock: MockEngine) -> None:
    """A space or CR LF in the target or a header: nothing is sent, and the error says it is the request
    (the forwarder then answers 400 and holds nothing against the backend)."""

    async def go() -> None:
        client = UpstreamClient()
        for target, headers in (("/?q=a b", []), ("/", [("x-a", "1\r\nx-b: 2")])):
            with pytest.raises(RequestNotSendable, match="cannot send this request"):
                await client.request(mock.url, "POST", target, headers, b"{}", **TIMEOUTS)
        assert client.connections_opened == 0
        await client.close()

    run(go())


def test_invalid_base_url(run: Any) -> None:
    async def go() -> None:
        client = UpstreamClient()
        for url in ("ftp://x", "http://", "http://h:notaport"):
            with pytest.raises(UpstreamError, match="invalid backend URL"):
                await client.request(url, "GET", "/", [], b"", **TIMEOUTS)
        await client.close()

    run(go())


# -- a small server written here ------------------------------------------------------------------
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class TinyServer:
    """An asyncio TCP server whose per-connection behaviour is a coroutine; counts connections."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> TinyServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request (head and Content-Length body); None when the client closed."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def fetch(
    client: UpstreamClient, url: str, method: str = "GET", body: bytes = b""
) -> tuple[int, bytes]:
    resp = await client.request(url, method, "/", [], body, **TIMEOUTS)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


def test_connection_close_is_honoured(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await server.read_request(reader) is not None:
            writer.write(ok(b"bye", b"Connection: close\r\n"))
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            for _ in range(3):
                assert await fetch(client, server.url) == (200, b"bye")
            assert idle(client) == 0 and client.connections_opened == 3
            await client.close()

    run(go())


def test_idle_connection_closed_by_the_server_is_not_used(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(ok(b"once"))
        await writer.drain()
        # keep-alive was promised, but the server times the connection out right away

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            assert await fetch(client, server.url) == (200, b"once")
            await asyncio.sleep(0.2)  # the close arrives while the connection is idle
            assert idle(client) == 0
            assert await fetch(client, server.url) == (200, b"once")
            assert client.connections_opened == 2
            await client.close()

    run(go())


def test_stale_connection_is_retried_once_on_a_fresh_one(run: Any) -> None:
    """The server closes a kept-alive connection just as the next request arrives on it."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(ok(b"conn %d" % n))
        await writer.drain()
        await server.read_request(reader)  # arrives, and is dropped unanswered

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            assert await fetch(client, server.url, "POST", b"first") == (200, b"conn 1")
            assert await fetch(client, server.url, "POST", b"second") == (200, b"conn 2")
            assert client.connections_opened == 2
            await client.close()

    run(go())
    assert [r.endswith(b"second") for r in server.requests] == [False, True, True]


def test_a_fresh_connection_closed_without_answer_is_not_retried(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            with pytest.raises(UpstreamError, match="before any response"):
                await fetch(client, server.url, "POST", b"x")
            await client.close()

    run(go())
    assert server.connections == 1


def test_reused_connection_dying_late_is_not_replayed(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that worked on the request for a while before dying may have acted on it."""
    monkeypatch.setattr(http_client, "_STALE_WINDOW", 0.1)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(ok())
        await writer.drain()
        await server.read_request(reader)
        await asyncio.sleep(0.3)

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            await fetch(client, server.url, "POST", b"x")
            with pytest.raises(UpstreamError, match="before any response"):
                await fetch(client, server.url, "POST", b"y")
            await client.close()

    run(go())
    assert server.connections == 1


def test_100_continue_head_and_204(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (req := await server.read_request(reader)) is not None:
            if req.startswith(b"HEAD"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: text/plain\r\n\r\n")
            elif req.startswith(b"DELETE"):
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.02)
                writer.write(ok(b"after continue"))
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            resp = await client.request(server.url, "HEAD", "/", [], b"", **TIMEOUTS)
            assert resp.status == 200 and resp.content_length == 1000 and resp.content_type == "text/plain"
            assert await resp.read() == b""
            resp.release()
            assert await fetch(client, server.url, "DELETE") == (204, b"")
            assert await fetch(client, server.url, "POST", b"data") == (200, b"after continue")
            assert client.connections_opened == 1
            await client.close()

    run(go())


def test_body_until_close_and_trailers(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        req = await server.read_request(reader)
        assert req is not None
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nstreamed ")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"until close")
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"
            )
        await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            resp = await client.request(server.url, "GET", "/", [], b"", **TIMEOUTS)
            assert resp.content_length is None
            assert b"".join([p async for p in resp]) == b"streamed until close"
            resp.release()
            assert await fetch(client, server.url) == (200, b"hello")
            await client.close()

    run(go())


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Content-Length"),
        (b"ICY 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
    ],
)
def test_malformed_answers(run: Any, answer: bytes, message: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(1)

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            with pytest.raises(UpstreamError, match=message):
                resp = await client.request(server.url, "GET", "/", [], b"", **TIMEOUTS)
                await resp.read()
            assert idle(client) == 0
            await client.close()

    run(go())


def test_garbage_after_the_answer_discards_the_connection(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await server.read_request(reader) is not None:
            writer.write(ok(b"fine") + b"HTTP/1.1 200 OK\r\n")
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            assert await fetch(client, server.url) == (200, b"fine")
            assert await fetch(client, server.url) == (200, b"fine")
            assert client.connections_opened == 2
            await client.close()

    run(go())


def test_slow_reader_pauses_the_socket(run: Any) -> None:
    total = 8 * http_client.HIGH_WATER
    piece = b"x" * 65536

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // len(piece)):
            writer.write(piece)
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            resp = await client.request(server.url, "GET", "/", [], b"", **TIMEOUTS)
            conn = resp._conn
            assert conn is not None
            await asyncio.sleep(0.5)  # the server pushes as fast as it can; nobody reads
            assert conn.paused
            assert conn.buffered < 2 * http_client.HIGH_WATER
            got = 0
            async for chunk in resp:
                got += len(chunk)
                assert conn.buffered < 2 * http_client.HIGH_WATER
            assert got == total
            resp.release()
            assert idle(client) == 1
            await client.close()

    run(go())


def test_pieces_that_arrived_meanwhile_are_handed_over_joined(run: Any) -> None:
    # 40 chunks of 4 KiB written one by one: a reader that comes late gets what is there as few pieces,
    # none past COALESCE by more than one chunk, and the bytes in order.
    chunks = [bytes([65 + i % 26]) * 4096 for i in range(40)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for chunk in chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            await asyncio.sleep(0.001)  # separate reads on the client's side
        writer.write(b"0\r\n\r\n")

    server = TinyServer(handler)

    async def go() -> list[bytes]:
        async with server:
            client = UpstreamClient()
            resp = await client.request(server.url, "GET", "/", [], b"", **TIMEOUTS)
            await asyncio.sleep(0.5)  # everything arrives while nobody reads
            pieces = [piece async for piece in resp]
            resp.release()
            await client.close()
            return pieces

    pieces = run(go())
    assert b"".join(pieces) == b"".join(chunks)
    assert all(len(p) < http_client.COALESCE + 4096 for p in pieces)
    assert len(pieces) <= -(-len(chunks) * 4096 // http_client.COALESCE)


@pytest.mark.parametrize("size", [0, 1000, 64 * 1024, 64 * 1024 + 1, 3 * 1024 * 1024])
def test_request_bodies_of_every_size_arrive_whole(run: Any, size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (req := await server.read_request(reader)) is not None:
            got = req.split(b"\r\n\r\n", 1)[1]
            writer.write(ok(b"%d %d" % (len(got), got == body)))
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            for _ in range(2):
                assert await fetch(client, server.url, "POST", body) == (200, b"%d 1" % size)
            assert client.connections_opened == 1
            await client.close()

    run(go())


def test_keepalive_timeout_closes_idle_connections(run: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await server.read_request(reader) is not None:
            writer.write(ok())
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient(keepalive_timeout=0.2)
            await fetch(client, server.url)
            assert idle(client) == 1
            await asyncio.sleep(0.5)
            assert idle(client) == 0
            await fetch(client, server.url)
            assert client.connections_opened == 2
            await client.close()

    run(go())


# -- TLS ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl CLI is not installed: cannot make a throwaway certificate for the TLS tests")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_keep_alive(run: Any, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (req := await server.read_request(reader)) is not None:
            writer.write(ok(req.split(b"\r\n\r\n", 1)[1] or b"empty"))
            await writer.drain()

    server = TinyServer(handler, server_ctx)

    async def go() -> None:
        async with server:
            client = UpstreamClient(ssl_context=ssl.create_default_context(cafile=str(cert)))
            for i in range(3):
                assert await fetch(client, server.url, "POST", b"secret %d" % i) == (200, b"secret %d" % i)
            assert client.connections_opened == 1
            await client.close()

    run(go())
    assert b"Host: 127.0.0.1:" in server.requests[0]


def test_tls_untrusted_certificate_is_an_upstream_error(run: Any, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)

    server = TinyServer(handler, server_ctx)

    async def go() -> None:
        async with server:
            client = UpstreamClient()  # the system roots: our throwaway certificate is not among them
            with pytest.raises(UpstreamError, match="cannot connect"):
                await fetch(client, server.url)
            await client.close()

    run(go())


def test_a_bounded_read_refuses_a_body_over_its_limit(run: Any) -> None:
    """A whole-body read with a limit fails as soon as the body shows it is over it (declared or chunked),
    without holding it; within the limit it is the body."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await server.read_request(reader) is not None:
            count = len(server.requests)  # the answers are told apart by request, whatever the connection
            if count == 1:
                writer.write(ok(b"e" * 1000))
            elif count == 2:
                writer.write(b"HTTP/1.1 500 Oops\r\nContent-Length: 50000000\r\n\r\n" + b"x" * 65536)
            else:
                writer.write(b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(64):  # 4 MiB, never ended
                    writer.write(b"10000\r\n" + b"y" * 65536 + b"\r\n")
                    await writer.drain()
            await writer.drain()

    server = TinyServer(handler)

    async def go() -> None:
        async with server:
            client = UpstreamClient()
            for expect in (b"e" * 1000, "over the 4096-byte limit", f"over {1 << 20} bytes"):
                resp = await client.request(server.url, "GET", "/", [], b"", **TIMEOUTS)
                try:
                    if isinstance(expect, bytes):
                        assert await resp.read(4096) == expect
                    else:
                        with pytest.raises(UpstreamError, match=expect):
                            await resp.read(4096 if expect.startswith("over the") else 1 << 20)
                finally:
                    resp.release()
            await client.close()

    run(go())
