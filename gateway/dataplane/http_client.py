"""The upstream HTTP/1.1 client of one proxy worker: keep-alive pools on ``asyncio.Protocol``.

Why not aiohttp: its client cost ~90 µs of CPU per proxied request here, most of it machinery a proxy
does not need (cookies, redirects, decompression, a task and several objects per request). This client
does one thing: write a request on a pooled connection and hand the response back as it arrives.

Shape of one request: the request bytes are written at once; a future, completed by the protocol's
``data_received``, wakes the caller when the status line and headers are in (no task per request); the
body is buffered as the parser hands it over and read whole (``read``) or piece by piece (``async for``),
where a piece is everything that arrived since the last one (up to ``COALESCE`` bytes): a relay then makes
one send to its client for what one read from the backend brought, not one per chunk of the framing. Or
it is poured (``pour``): each piece goes to the caller's sink from ``data_received`` itself, so a stream
whose tokens arrive one read each costs no future, task step or await per token.
Timeouts cost no timer per request: each connection keeps one deadline and at most one timer, which on
firing re-arms itself if the deadline has moved on.

Pools are per (scheme, host, port), LIFO, so the warmest connection is reused and the coldest age out
(a sweep closes those idle longer than ``keepalive_timeout``). A connection the server closed while idle
is noticed by its protocol and never handed out; one that dies before any response byte right after a
request was written on it after reuse (the server closed it at that same moment) is replaced by a fresh
connection, once: a server that closes an idle connection did not process what arrived on it.

Every failure surfaces as ``UpstreamError`` (``UpstreamTimeout`` for the three timeouts); foreign
exceptions are translated here and nowhere else. I/O: TCP and TLS connections to backends.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Final, cast
from urllib.parse import urlsplit

from gateway.dataplane.tls import make_ssl_context
from gateway.errors import BadRequest
from gateway.native import whole_chunks
from gateway.protocol.http1 import END, HTTP1Error, ResponseHead, ResponseParser, serialize_head
from gateway.protocol.paths import target_is_safe

__all__ = [
    "RequestNotSendable",
    "Sink",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

# Unread body bytes above which reading from the socket pauses (the gateway's client may be slow), and
# the level at which it resumes.
HIGH_WATER: Final = 1 << 20
LOW_WATER: Final = 1 << 18
# Body pieces waiting when the reader asks for the next one are handed over joined, up to about this many
# bytes (a quarter of the relay's drain window, so backpressure still looks often enough).
COALESCE: Final = 64 * 1024
# A reused connection that dies this soon after the request was written, before any response byte, was
# being closed by the server as we wrote: the request is sent again on a fresh connection. Later than
# this, the server may have been working on it, and replaying it could run a generation twice.
_STALE_WINDOW: Final = 1.0
# Bodies up to this size are written together with the head, in one send; larger ones are written after
# it, so they are never copied to be joined.
_JOIN_LIMIT: Final = 64 * 1024
# What a waiter waits for: the head, body data, the end of the body, or (``_POUR``) the end of the body or a
# stop asked for by the sink the body is poured into.
_HEAD, _DATA, _ALL, _POUR = 0, 1, 2, 3

# ``sink(piece, last)`` of ``UpstreamResponse.pour``: True asks the pour to stop after this piece.
Sink = Callable[[bytes, bool], bool]


class UpstreamError(Exception):
    """The backend could not be reached or did not answer properly: connect refused, TLS, reset,
    malformed response, timeout."""


class RequestNotSendable(UpstreamError):
    """The request itself cannot be written as HTTP/1.1 (a CR, LF or space in its target or a header, a
    header that is not UTF-8): nothing was sent, and no backend is to blame."""


class UpstreamTimeout(UpstreamError):
    """Connect, first byte (status line and headers) or read (a wait for body data) took too long."""


class _OriginPool:
    """The idle connections to one (scheme, host, port), most recently used on the right."""

    __slots__ = ("host", "host_header", "idle", "label", "port", "tls")

    def __init__(self, scheme: str, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.tls = scheme == "https"
        bracketed = f"[{host}]" if ":" in host else host
        default = 443 if self.tls else 80
        self.host_header = bracketed if port == default else f"{bracketed}:{port}"
        self.label = f"{scheme}://{bracketed}:{port}"
        self.idle: deque[_Conn] = deque()


class UpstreamResponse:
    """The status line and headers of an answer, and its body to come. Call ``release`` when done."""

    __slots__ = ("_conn", "content_length", "content_type", "headers", "status", "unframed")

    def __init__(self, conn: _Conn, head: ResponseHead) -> None:
        self._conn: _Conn | None = conn
        self.status = head.status
        self.headers = head.headers
        self.content_length = head.content_length
        self.content_type = head.content_type
        # Neither a length nor chunks: the body ends when the connection does, so a backend that drops
        # the connection mid-answer cannot be told from one that finished.
        self.unframed = head.content_length is None and not head.chunked

    async def read(self, limit: int = 0) -> bytes:
        """The whole body. Each wait for more of it is bounded by the request's ``read_timeout``; with a
        ``limit``, a body longer than that fails (``UpstreamError``) as soon as it shows, rather than being
        held whole."""
        conn = self._conn
        if conn is None:
            raise UpstreamError("response already released")
        if limit and ((self.content_length or 0) > limit or conn.buffered > limit):
            conn.abort()
            raise UpstreamError(f"answer of {self.content_length} bytes is over the {limit}-byte limit")
        if not conn.complete:
            conn.limit = limit
            if conn.error is None:
                if conn.paused:
                    conn.paused = False
                    conn.transport.resume_reading()  # type: ignore[union-attr]
                fut = conn.wait(_ALL)
                try:
                    await fut
                except BaseException:
                    conn.abort()
                    raise
            if not conn.complete:
                raise conn.failure()
        pieces = conn.pieces
        data = b"".join(pieces)
        pieces.clear()
        conn.buffered = 0
        return data

    @property
    def ended(self) -> bool:
        """Every piece of the body has arrived and been handed out (the last ``async for`` piece was the
        last one)."""
        conn = self._conn
        return conn is None or (conn.complete and not conn.pieces)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        """The next piece of the body, minus any chunked framing: everything that has arrived since the
        last one (up to ``COALESCE`` bytes), or the next bytes to arrive."""
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        pieces = conn.pieces
        if not pieces:
            if conn.complete:
                raise StopAsyncIteration
            if conn.error is None:
                fut = conn.wait(_DATA)
                try:
                    await fut
                except BaseException:
                    conn.abort()
                    raise
            if not pieces:
                if conn.complete:
                    raise StopAsyncIteration
                raise conn.failure()
        return conn.take()

    async def pour(self, sink: Sink) -> None:
        """Hand the body to ``sink(piece, last)`` as it arrives, from the connection's own callback: while
        it flows there is no future, no task step and no await per piece. ``last`` is true for the piece
        that ends the body, when the parser saw the end with it. Returns once the body ended and every piece
        went to ``sink``, or right after a piece for which ``sink`` returned True (it has something to wait
        for first: call ``pour`` again to go on). What ``sink`` raises is raised here; a body that breaks
        off raises ``UpstreamError``. Each wait for more of the body is bounded by the read timeout."""
        conn = self._conn
        if conn is None:
            return
        while True:
            if conn.pieces and conn.flush(sink):
                return
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.failure()
            if conn.paused:
                conn.paused = False
                conn.transport.resume_reading()  # type: ignore[union-attr]
            conn.sink = sink
            fut = conn.wait(_POUR)
            try:
                await fut
            except BaseException:
                conn.abort()
                raise
            finally:
                conn.sink = None
            stop = conn.sink_stop
            if stop is not None:
                conn.sink_stop = None
                if isinstance(stop, BaseException):
                    raise stop
                return

    def release(self) -> None:
        """Give the connection back: to the pool when the whole response arrived and the server allows
        another request on it, otherwise closed. Idempotent."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.finish()

    def close(self) -> None:
        """Abort: close the connection now, whatever was left unread (the client went away)."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abort()


class _Conn(asyncio.Protocol):
    """One connection: the protocol callbacks feed the parser and complete the waiter."""

    __slots__ = (
        "buffered",
        "client",
        "closed",
        "complete",
        "deadline",
        "error",
        "got_bytes",
        "idle",
        "idle_since",
        "limit",
        "loop",
        "mode",
        "parser",
        "paused",
        "pieces",
        "pool",
        "read_timeout",
        "response",
        "reused",
        "sent_at",
        "sink",
        "sink_stop",
        "timer",
        "timer_at",
        "transport",
        "waiter",
    )

    def __init__(self, client: UpstreamClient, pool: _OriginPool, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser(chunks=whole_chunks)
        self.closed = False
        self.idle = False
        self.idle_since = 0.0
        self.reused = False
        self.response: UpstreamResponse | None = None
        # A list, not a deque: it seldom holds more than a piece or two, and a deque's first block alone
        # is some 600 bytes, which every connection, idle ones too, would carry.
        self.pieces: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.complete = False
        self.got_bytes = False
        self.error: tuple[type[UpstreamError], str] | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.mode = _HEAD
        self.read_timeout = 0.0
        self.limit = 0  # bytes a whole-body read may hold (0: no limit)
        self.sent_at = 0.0
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.sink: Sink | None = None  # where body pieces go as they arrive (``UpstreamResponse.pour``)
        self.sink_stop: BaseException | bool | None = None  # why the sink stopped: True, or what it raised

    # -- driving one exchange (called by the client and the response) ------------------------------
    def send(
        self, head: bytes, body: bytes, head_request: bool, first_byte_timeout: float, read_timeout: float
    ) -> asyncio.Future[None]:
        """Write one request; the future completes when its head arrives or the exchange failed."""
        self.parser.reset(head_request)
        self.response = None
        self.complete = False
        self.got_bytes = False
        self.error = None
        self.read_timeout = read_timeout
        self.limit = 0
        now = self.loop.time()
        self.sent_at = now
        self.mode = _HEAD
        fut = self.waiter = self.loop.create_future()
        self._arm(now + first_byte_timeout)
        transport = self.transport
        assert transport is not None
        try:
            if len(body) > _JOIN_LIMIT:
                transport.write(head)
                transport.write(body)
            else:
                transport.write(head + body if body else head)
        except (OSError, RuntimeError) as exc:  # uvloop raises on a transport closed under us
            self._fail(UpstreamError, f"writing to {self.pool.label} failed: {exc}")
        return fut

    def wait(self, mode: int) -> asyncio.Future[None]:
        """A future completed when body data (``_DATA``), or the end of the body (``_ALL``), arrives."""
        fut = self.loop.create_future()
        self.waiter = fut
        self.mode = mode
        self._arm(self.loop.time() + self.read_timeout)
        return fut

    def take(self) -> bytes:
        """The next piece, joined with those that arrived after it (up to ``COALESCE`` bytes): one send to
        the client for them, not one each. There must be one."""
        pieces = self.pieces
        if len(pieces) == 1:
            piece = pieces.pop()
        else:
            taken, size = 0, 0
            for part in pieces:
                taken += 1
                size += len(part)
                if size >= COALESCE:
                    break
            piece = pieces[0] if taken == 1 else b"".join(pieces[:taken])
            del pieces[:taken]
        self.buffered -= len(piece)
        if self.paused and self.buffered <= LOW_WATER:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return piece

    def flush(self, sink: Sink) -> bool:
        """Every piece there is to ``sink``; True when it asked to stop (the rest stays buffered)."""
        pieces = self.pieces
        while pieces:
            piece = self.take()
            if sink(piece, self.complete and not pieces):
                return True
        return False

    def failure(self) -> UpstreamError:
        """A fresh exception for the recorded failure (a fresh one, so no traceback is shared)."""
        kind, message = self.error or (UpstreamError, f"connection to {self.pool.label} lost")
        return kind(message)

    def finish(self) -> None:
        if self.complete and self.parser.keep_alive and not self.closed and self.error is None:
            self.pieces.clear()
            self.buffered = 0
            self.response = None
            self.client._put_idle(self)
        else:
            self.abort()

    def abort(self) -> None:
        if not self.complete and self.error is None:
            self.error = (UpstreamError, f"connection to {self.pool.label} closed mid-response")
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self._wake()

    # -- timeouts: one deadline, at most one timer --------------------------------------------------
    def _arm(self, deadline: float) -> None:
        self.deadline = deadline
        if self.timer is None or self.timer_at > deadline:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = deadline
            self.timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        deadline = self.deadline
        if deadline is None or self.closed:
            return
        if self.loop.time() + 0.001 < deadline:  # the deadline moved on since the timer was set
            self.timer_at = deadline
            self.timer = self.loop.call_at(deadline, self._on_timer)
            return
        if self.mode == _HEAD:
            message = f"{self.pool.label} sent no response headers in time"
        else:
            message = f"{self.pool.label} sent no body data within {self.read_timeout}s"
        self._fail(UpstreamTimeout, message)

    # -- protocol callbacks -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not registered subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass  # not TCP (tests may use a UNIX socket); nothing to tune

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            events = self.parser.feed(data)
        except HTTP1Error as exc:
            if self.idle:
                self.abort()  # whatever a server sends on an idle connection, it is not for us
            else:
                self._fail(UpstreamError, f"malformed response from {self.pool.label}: {exc}")
            return
        pieces = self.pieces
        for event in events:
            if event.__class__ is bytes:
                pieces.append(event)
                self.buffered += len(event)
            elif event is END:
                self.complete = True
            else:
                self.response = UpstreamResponse(self, event)  # type: ignore[arg-type]
        sink = self.sink
        if sink is not None:  # a pour: the pieces go on at once, from here
            try:
                stopped = bool(pieces) and self.flush(sink)
            except BaseException as exc:  # raised in the task that pours, never into the event loop
                self.sink, self.sink_stop = None, exc
                self._wake()
                return
            if stopped:
                self.sink, self.sink_stop = None, True
                self._wake()
            elif self.complete:
                self._wake()
            else:
                self.deadline = self.loop.time() + self.read_timeout
            return
        waiter = self.waiter
        if waiter is not None:
            mode = self.mode
            if self.complete or (mode == _DATA and pieces) or (mode == _HEAD and self.response is not None):
                self._wake()
            elif mode == _ALL:
                self.deadline = self.loop.time() + self.read_timeout
                if self.limit and self.buffered > self.limit:
                    self._fail(UpstreamError, f"answer from {self.pool.label} is over {self.limit} bytes")
        elif self.buffered > HIGH_WATER and not self.paused and not self.complete:
            # Nobody is waiting: the reader is busy sending what it has to a slow client.
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()
        self.client._forget(self)

    def _ended(self) -> None:
        """The server closed its side (or the connection broke)."""
        closed_before = self.closed
        self.closed = True
        if self.idle:
            self.client._drop_idle(self)
            return
        if self.complete or self.error is not None or closed_before:
            self._wake()
            return
        try:
            events = self.parser.feed_eof()
        except HTTP1Error as exc:
            self._fail(UpstreamError, f"{self.pool.label}: {exc}")
            return
        if events:  # the end of a body delimited by the close
            self.complete = True
        self._wake()

    def _fail(self, kind: type[UpstreamError], message: str) -> None:
        if not self.complete and self.error is None:
            self.error = (kind, message)
        self.abort()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            self.deadline = None
            if not waiter.done():
                waiter.set_result(None)

    @property
    def stale(self) -> bool:
        """Reused, and closed before a response byte just after the request was written."""
        return (
            self.reused
            and not self.got_bytes
            and self.error is not None
            and self.error[0] is not UpstreamTimeout
            and self.loop.time() - self.sent_at < _STALE_WINDOW
        )


class UpstreamClient:
    """Keep-alive HTTP/1.1 connections to every backend a worker talks to. Use from one event loop."""

    def __init__(
        self,
        *,
        keepalive_timeout: float = 60.0,
        max_idle_per_host: int = 256,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.keepalive_timeout = keepalive_timeout
        self.max_idle_per_host = max_idle_per_host
        self._ssl = ssl_context
        self._bases: dict[str, tuple[_OriginPool, str]] = {}
        self._pools: dict[tuple[str, str, int], _OriginPool] = {}
        self._conns: set[_Conn] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self.connections_opened = 0

    async def request(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        connect_timeout: float,
        first_byte_timeout: float,
        read_timeout: float,
    ) -> UpstreamResponse:
        """Send ``method`` ``target`` (path and query, appended to the base URL's path) and return once
        the response's status line and headers are in. ``Host`` and ``Content-Length`` are set here."""
        base = self._bases.get(base_url)
        if base is None:
            base = self._add_base(base_url)
        pool, prefix = base
        if not target_is_safe(target):
            # The proxy refuses such paths from clients (gateway.protocol.paths); this keeps every
            # target, whoever built it, under the backend URL's own path. The caller's error, not the
            # backend's: BadRequest never counts against a backend's health.
            raise BadRequest(f"refusing to send {target[:80]!r} upstream: it would leave the backend's path")
        try:
            head = serialize_head(method, prefix + target, pool.host_header, headers, len(body))
        except HTTP1Error as exc:
            raise RequestNotSendable(f"cannot send this request: {exc}") from None
        head_request = method == "HEAD"
        conn = self._take_idle(pool)
        if conn is not None:
            fut = conn.send(head, body, head_request, first_byte_timeout, read_timeout)
            try:
                await fut
            except BaseException:
                conn.abort()
                raise
            if conn.response is not None:
                return conn.response
            if not conn.stale:
                raise conn.failure()
        conn = await self._connect(pool, connect_timeout)
        fut = conn.send(head, body, head_request, first_byte_timeout, read_timeout)
        try:
            await fut
        except BaseException:
            conn.abort()
            raise
        if conn.response is None:
            raise conn.failure()
        return conn.response

    async def close(self) -> None:
        """Close every connection, idle or busy. The client is unusable afterwards."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in self._pools.values():
            pool.idle.clear()
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()

    # -- pools -------------------------------------------------------------------------------------
    def _add_base(self, base_url: str) -> tuple[_OriginPool, str]:
        try:
            parts = urlsplit(base_url)
            port = parts.port
        except ValueError as exc:
            raise UpstreamError(f"invalid backend URL {base_url!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"invalid backend URL {base_url!r}: expected http(s)://host[:port][/path]")
        if port is None:
            port = 443 if scheme == "https" else 80
        key = (scheme, parts.hostname, port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _OriginPool(scheme, parts.hostname, port)
        base = (pool, parts.path.rstrip("/"))
        self._bases[base_url] = base
        return base

    def _take_idle(self, pool: _OriginPool) -> _Conn | None:
        idle = pool.idle
        while idle:
            conn = idle.pop()
            conn.idle = False
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    def _put_idle(self, conn: _Conn) -> None:
        idle = conn.pool.idle
        if self._closed or len(idle) >= self.max_idle_per_host:
            conn.abort()
            return
        conn.idle = True
        conn.idle_since = conn.loop.time()
        idle.append(conn)
        if self._sweeper is None:
            self._sweeper = conn.loop.call_later(self._sweep_interval(), self._sweep)

    def _drop_idle(self, conn: _Conn) -> None:
        conn.idle = False
        try:
            conn.pool.idle.remove(conn)
        except ValueError:
            pass

    def _forget(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None

    def _sweep_interval(self) -> float:
        return min(max(self.keepalive_timeout / 4, 0.05), 15.0)

    def _sweep(self) -> None:
        """Close connections idle for longer than the keep-alive timeout: the oldest are on the left."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        expired = loop.time() - self.keepalive_timeout
        remaining = False
        for pool in self._pools.values():
            idle = pool.idle
            while idle and idle[0].idle_since <= expired:
                conn = idle.popleft()
                conn.idle = False
                conn.abort()
            remaining = remaining or bool(idle)
        if remaining and not self._closed:
            self._sweeper = loop.call_later(self._sweep_interval(), self._sweep)

    async def _connect(self, pool: _OriginPool, timeout: float) -> _Conn:
        if self._closed:
            raise UpstreamError("the upstream client is closed")
        loop = asyncio.get_running_loop()
        conn = _Conn(self, pool, loop)
        ctx: ssl.SSLContext | None = None
        if pool.tls:
            ctx = self._ssl
            if ctx is None:
                ctx = self._ssl = make_ssl_context()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: conn, pool.host, pool.port, ssl=ctx, server_hostname=pool.host if ctx else None
                )
        except TimeoutError:
            raise UpstreamTimeout(f"connecting to {pool.label} took longer than {timeout}s") from None
        except OSError as exc:  # refused, unreachable, DNS (socket.gaierror), TLS (ssl.SSLError)
            raise UpstreamError(f"cannot connect to {pool.label}: {exc}") from None
        self._conns.add(conn)
        self.connections_opened += 1
        return conn
