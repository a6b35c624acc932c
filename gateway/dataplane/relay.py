"""Relaying a verbatim stream: each piece of the backend's body goes to the client as its connection
delivers it, from the upstream protocol's own callback (``UpstreamResponse.pour``), with backpressure.

Why not ``async for piece in resp: await transport.send_bytes(piece)``: with an engine pacing tokens, each
token is a read of its own, and that loop made a future, woke the task, resumed every coroutine frame of
the request and made a coroutine for ``__anext__`` per token. Poured, a token costs the parser, one call of
the sink below and granian's send: granian's stream ``send_bytes`` queues the bytes at once and returns an
awaitable that is already complete (or already failed, when the client is gone), so the sink completes it
where it is (``send_now``) instead of awaiting it in a task.

Backpressure (``drain``): the sink adds each piece's length to what was relayed and, once that passes the
next check, stops the pour; the relaying task then waits for the client's socket and pours again. One
addition and one comparison per piece until a window has gone out, a look at the socket once per quarter
window after that.
I/O: the client's transport (granian's, or the tap's around it), and through ``drain`` netlink requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gateway.dataplane.drain import WINDOW, Drain
from gateway.dataplane.http_client import UpstreamResponse
from gateway.dataplane.rsgi import Scope

__all__ = ["Pace", "StreamSink", "complete_now", "pour_stream", "send_now"]

# The RSGI scope of the request: its ``client`` and ``server`` ("host:port") name the client's connection.
# Handed over as it is, and read only by a stream past one window: the two strings granian makes when read
# are not made for every request.
Peer = Scope


class SendPending(RuntimeError):
    """granian's ``send_bytes`` returned an awaitable that does not complete at once: this relay is
    written for granian 2.x, whose stream transport queues bytes as they are handed over."""


def send_now(transport: Any, data: bytes) -> None:
    """``transport.send_bytes(data)`` completed where it is: raises what awaiting it would (granian's
    ``RSGIProtocolClosed`` once the client is gone)."""
    complete_now(transport.send_bytes, data)


def complete_now(send: Callable[[bytes], Awaitable[None]], data: bytes) -> None:
    """``await send(data)`` for a ``send`` whose awaitable completes without waiting (granian's, or a
    wrapper's coroutine around it), completed here, outside any task."""
    step = send(data).__await__()
    try:
        next(step)
    except StopIteration:
        return
    raise SendPending("the client transport's send waits; a verbatim stream cannot be poured into it")


class Pace:
    """The backpressure of one stream: bytes relayed, the next count at which to look at the client's
    socket, and the drain (made then: streams shorter than a window never pay for it)."""

    __slots__ = ("check", "drain", "peer", "sent", "stall_timeout")

    def __init__(self, peer: Peer | None, stall_timeout: float) -> None:
        self.peer = peer
        self.stall_timeout = stall_timeout
        self.sent = 0
        self.check = WINDOW if peer is not None else 1 << 62
        self.drain: Drain | None = None

    async def wait(self) -> None:
        drain = self.drain
        if drain is None:
            peer = self.peer
            assert peer is not None  # no peer, no check: ``check`` is out of reach
            drain = self.drain = Drain(peer.client, peer.server, self.stall_timeout)
        await drain.wait(self.sent)
        self.check = self.sent + WINDOW // 4


class StreamSink:
    """Where a verbatim stream's pieces go (a ``http_client.Sink``): the client's transport, through its
    ``write`` when it sends at once (the tap's), else its awaitable ``send_bytes`` completed here; the piece
    that ends the body through ``write_last`` or ``send_last`` when the transport has one (the tap announces
    the end before the client can see it). Keeps the last piece sent, whose ending tells whether a broken
    stream had finished."""

    __slots__ = ("pace", "piece", "write", "write_last")

    def __init__(self, transport: Any, pace: Pace) -> None:
        self.pace = pace
        self.piece = b""
        write = getattr(transport, "write", None)
        if write is not None:  # the tap's, which writes at once
            self.write = write
            self.write_last = getattr(transport, "write_last", write)
        else:  # granian's own, or a wrapper with only the awaitable sends
            self.write = partial(send_now, transport)
            send_last = getattr(transport, "send_last", None)
            self.write_last = self.write if send_last is None else partial(complete_now, send_last)

    def __call__(self, piece: bytes, last: bool) -> bool:
        self.piece = piece
        if last:
            self.write_last(piece)
        else:
            self.write(piece)
        pace = self.pace
        pace.sent += len(piece)
        return pace.sent >= pace.check


async def pour_stream(resp: UpstreamResponse, sink: StreamSink) -> None:
    """The whole body into ``sink``, waiting for the client's socket whenever the sink says it is due."""
    pace = sink.pace
    while True:
        await resp.pour(sink)
        if pace.sent < pace.check:
            return  # the body ended
        await pace.wait()
