"""How a draining proxy worker lets go of kept-alive connections without closing one under a request.

granian's stop closes the listener and then shuts every connection down gracefully (hyper's
``graceful_shutdown``): a connection with a request in progress finishes it, but a kept-alive connection
that is idle between two requests is closed at once (granian 2.8, ``src/workers.rs``). A client that sends
its next request just then, or that reuses the connection before it has read the close, finds its request
cut: an EOF or a reset instead of a status line, which it cannot retry safely for a POST. Measured under a
steady load of kept-alive clients, every connection open at SIGTERM lost one request that way.

hyper closes a connection accepted a moment before the stop too, if its request has not been read yet
(``dispatch.rs``, "shut down before any data has been seen"), and closing the listener resets whatever
waits in its accept queue: a client that opens a fresh connection just then loses its request as well.

So a draining worker first tells its clients: from SIGTERM on, every answer carries ``Connection: close``
(``ClosingProtocol``; hyper then closes the connection itself once the answer is written, and the client
opens its next one elsewhere, or here while the listener is still open). The worker keeps its listener and
its connections for the drain delay, then until its clients have gone quiet (``wait_quiet``): every client
still sending has then had its answer with ``Connection: close``. Then it stops taking new connections
while the listener stays open (``stop_accepting``: a socket filter that drops every packet the listener
gets, so a new client's SYN goes unanswered and its retry finds the port closed, while connections
already queued are still accepted), waits until the connections it has accepted have brought their
requests, and only then lets granian stop: only connections silent all that time are left for it to
close. I/O: ``stop_accepting`` lists this process's descriptors (``/proc/self/fd``) and sets a socket
option on the listener; the answers go out through the wrapped object.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import time
from typing import Protocol

from gateway.dataplane.rsgi import Transport, WrappedProtocol

__all__ = ["QUIET", "ClosingProtocol", "stop_accepting", "wait_quiet"]

log = logging.getLogger("gateway.dataplane")

QUIET = 0.25  # seconds with no new request after which a draining worker's clients count as gone
_CLOSE = [("connection", "close")]
_SO_ATTACH_FILTER = 26  # linux/asm-generic/socket.h
# A classic BPF program of one instruction, BPF_RET | BPF_K with k = 0: keep no byte of any packet. On a
# listener the kernel runs it on every SYN and handshake ACK (tcp_v4_rcv's tcp_filter), so nothing new
# gets in; the connections it accepted before carry their own (absent) filter.
_DROP_ALL = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 0), 8)  # struct sock_filter


class ClosingProtocol(WrappedProtocol):
    """An RSGI protocol object whose answer, whole or streamed, says ``Connection: close``."""

    __slots__ = ()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._proto.response_bytes(status, headers + _CLOSE, body)

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Transport:
        return self._proto.response_stream(status, headers + _CLOSE)


class Counted(Protocol):
    """What ``wait_quiet`` watches: how many requests the worker has begun while draining."""

    @property
    def closing_answers(self) -> int: ...


async def wait_quiet(app: Counted, most: float, quiet: float = QUIET) -> float:
    """Return once no request has begun for ``quiet`` seconds, or after ``most`` seconds; the seconds
    waited. Clients that keep sending keep the worker here, each of their connections told to close by
    its next answer; the bound leaves the rest of the grace period to the requests still in flight."""
    started = time.monotonic()
    deadline = started + most
    seen = app.closing_answers
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        await asyncio.sleep(min(quiet, deadline - now))
        count = app.closing_answers
        if count == seen:
            break
        seen = count
    return time.monotonic() - started


def stop_accepting(port: int) -> bool:
    """Have this process's listening socket on ``port`` take no new connection from now on, while it stays
    open; connections already in its accept queue are still accepted. False where it cannot be done (no
    ``/proc``, not Linux, no such listener): the listener then stays open until granian closes it."""
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return False
    program = struct.pack("@HP", 1, ctypes.addressof(_DROP_ALL))  # struct sock_fprog
    for name in descriptors:
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            # A duplicate: the option is the socket's, and closing the duplicate leaves granian's open.
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    continue
                if sock.getsockname()[1] != port:
                    continue
                sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, program)
                return True
        except OSError as exc:
            log.debug("descriptor %d: %s", fd, exc)
    return False
