"""Backpressure for streamed answers: how far the client's TCP connection is behind what was relayed.

granian's RSGI stream transport gives no drain signal: ``send_bytes`` puts the bytes on an unbounded
channel and its awaitable is complete at once (granian 2.8, ``src/rsgi/io.rs``), so a relay that awaits
it reads a fast upstream as fast as it comes while a slow client takes minutes, and the worker holds the
difference. The kernel knows what granian has written to the client's socket: ``tcpi_bytes_acked`` plus
the unacknowledged send queue counts every byte written to it. ``Drain`` asks the kernel for those two of
the connection named by its two addresses (``sock_diag`` over netlink, an exact lookup: no descriptor, no
``/proc`` scan), and the relay (``forward``) waits while it has handed granian more than ``window`` bytes
beyond what the socket took since the drain started: what a stream holds in the worker stays about
``window``, however slow its reader.

Only a stream that has already relayed one window (256 KiB) pays for it: one netlink request and reply
(about 18 µs) per quarter window relayed, and a few per wait while the client is behind, at most one
timer at a time. A client that takes nothing for ``stall_timeout`` seconds is cut, so a reader that
stopped does not hold a backend's stream for ever. granian names a connection by the listener's address,
which for a listener on ``0.0.0.0`` or ``::`` is not the connection's local end: that is taken to be the
address the host routes to the client from. Where the connection cannot be looked up (not Linux, a UNIX
socket, odd routing) the stream is relayed without backpressure, as before, and the worker logs it once.
I/O: netlink requests to the kernel (``NETLINK_SOCK_DIAG``), on one socket per worker; on a wildcard
listener, one routing lookup (a UDP socket's connect, nothing sent) per watched stream.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

__all__ = ["WINDOW", "ClientStalled", "Drain", "connection_state"]

log = logging.getLogger("gateway.dataplane")

WINDOW = 256 * 1024  # bytes a stream may run ahead of its client's socket
_POLL_FIRST, _POLL_MOST = 0.002, 0.05  # seconds between checks while the client is behind
_ESTABLISHED = 1
# Netlink sock_diag (linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_INET_DIAG_INFO = 2  # the attribute that carries struct tcp_info
_NOCOOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_DIAG_MSG = 16 + 72  # nlmsghdr + inet_diag_msg: where the attributes start
_WQUEUE = 16 + 4 + 48 + 8  # idiag_wqueue: written, not yet acknowledged
_BYTES_ACKED = 120  # tcpi_bytes_acked in struct tcp_info (Linux 4.1 and later)
_warned = False


class ClientStalled(Exception):
    """The client took no byte of the stream for the stall timeout."""


class Drain:
    """The drain of one client connection, for one streamed answer."""

    __slots__ = ("_base_sent", "_base_taken", "_query", "stall_timeout", "window")

    def __init__(self, client: str, server: str, stall_timeout: float, window: int = WINDOW) -> None:
        self.stall_timeout = stall_timeout
        self.window = window
        self._query = _request(server, client)
        self._base_sent = -1  # -1: not started; -2: the connection cannot be watched
        self._base_taken = 0

    async def wait(self, sent: int) -> None:
        """Return once the client's socket has taken all but ``window`` of the ``sent`` bytes relayed
        since the first call (or at once where the socket cannot be watched). Raises ``ClientStalled``."""
        if self._base_sent < 0:
            if self._base_sent == -2:
                return
            got = connection_state(self._query)
            if got is None:
                self._base_sent = -2
                _warn_once()
                return
            self._base_taken, self._base_sent = got[1], sent
            return
        ahead = sent - self._base_sent + self._base_taken - self.window
        delay = _POLL_FIRST
        deadline = progress = 0.0
        while True:
            got = connection_state(self._query)
            if got is None or got[1] >= ahead or got[0] != _ESTABLISHED:
                return  # caught up, or gone or leaving: the next send tells
            taken = got[1]
            now = time.monotonic()
            if not deadline or taken != progress:
                deadline, progress = now + self.stall_timeout, taken
            elif now >= deadline:
                raise ClientStalled(f"the client took nothing for {self.stall_timeout}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MOST)


_netlink: socket.socket | None = None
_seq = 0


def connection_state(query: bytes | None) -> tuple[int, int] | None:
    """(TCP state, bytes written to the socket so far) of the connection ``query`` names; None when the
    kernel does not know it (or cannot be asked)."""
    global _netlink, _seq
    if query is None:
        return None
    try:
        if _netlink is None:
            _netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
            _netlink.settimeout(1.0)  # the kernel answers within the send; never wait long on it
        _seq = (_seq + 1) & 0xFFFFFFFF
        _netlink.send(_HEADER.pack(16 + len(query), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, _seq, 0) + query)
        while True:
            data = _netlink.recv(4096)
            length, kind, _, seq, _ = _HEADER.unpack_from(data)
            if seq == _seq:
                break  # an answer to an earlier request that timed out is skipped
    except (OSError, AttributeError, struct.error):
        return None
    # Not found, the kernel may answer with the listener of that local port instead: only the very
    # connection (both ports as asked) will do.
    if kind == _NLMSG_ERROR or length < _DIAG_MSG or data[20:24] != query[8:12]:
        return None
    state = data[16 + 1]
    queued = struct.unpack_from("=I", data, _WQUEUE)[0]
    at = _DIAG_MSG
    while at + 4 <= min(length, len(data)):
        size, attr = struct.unpack_from("=HH", data, at)
        if size < 4:
            return None
        if attr == _INET_DIAG_INFO and size >= 4 + _BYTES_ACKED + 8:
            return state, struct.unpack_from("=Q", data, at + 4 + _BYTES_ACKED)[0] + queued
        at += (size + 3) & ~3
    return None


def _request(local: str, remote: str) -> bytes | None:
    """The inet_diag_req_v2 that looks up the TCP connection from ``remote`` to ``local`` (``host:port``
    each, as granian's scope gives them); None when they are not IP addresses."""
    ends = []
    for address in (local, remote):
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            return None
        ends.append((host.strip("[]"), int(port)))
    (lhost, lport), (rhost, rport) = ends
    if lhost in ("0.0.0.0", "::", ""):
        lhost = _route_source(rhost) or lhost
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            src, dst = socket.inet_pton(family, lhost), socket.inet_pton(family, rhost)
        except OSError:
            continue
        sockid = (
            struct.pack("!HH", lport, rport)
            + src.ljust(16, b"\0")
            + dst.ljust(16, b"\0")
            + struct.pack("=III", 0, _NOCOOKIE, _NOCOOKIE)
        )
        ext = 1 << (_INET_DIAG_INFO - 1)
        return struct.pack("=BBBBI", family, socket.IPPROTO_TCP, ext, 0, 0xFFFFFFFF) + sockid
    return None


def _route_source(remote: str) -> str | None:
    """The address this host sends from to reach ``remote``: the local end of a connection accepted on an
    unspecified address (granian reports the listener's own, ``0.0.0.0:8080``), in all but odd routing
    set-ups. A UDP socket's connect only consults the routing table; nothing is sent."""
    family = socket.AF_INET6 if ":" in remote else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((remote, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("cannot look up the connection of a stream: streams are relayed without backpressure")
