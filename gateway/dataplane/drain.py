"""Backpressure for streamed answers: how far the client's TCP connection is behind what was relayed.

granian's RSGI stream transport gives no drain signal: ``send_bytes`` puts the bytes on an unbounded
channel and its awaitable is complete at once (granian 2.8, ``src/rsgi/io.rs``), so a relay that awaits
it reads a fast upstream as fast as it comes while a slow client takes minutes, and the worker holds the
difference. The kernel knows what granian has written to the client's socket: ``TCP_INFO``'s
``tcpi_bytes_acked`` plus the send queue (``SIOCOUTQ``) counts every byte written to it. ``Drain`` reads
those two counters on a duplicate of the socket's descriptor, and the relay (``forward``) waits while it has
handed granian more than ``window`` bytes beyond what the socket took since the drain started: what a
stream holds in the worker stays about ``window``, however slow its reader.

Only a stream that has already relayed one window (256 KiB) pays for it: the socket is found once, in a
worker thread, from the connection's two addresses (``/proc/net/tcp`` and ``/proc/self/fd``), and each
check after that is two system calls, one per window relayed. A client that takes nothing for
``stall_timeout`` seconds is cut, so a reader that stopped does not hold a backend's stream for ever. Where
the socket cannot be found (not Linux, a UNIX socket, an address granian does not report) the stream is
relayed without backpressure, as before, and the worker logs it once.
I/O: reads ``/proc`` (once per slow stream, off the event loop) and two socket system calls per window.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import struct
import termios
import time

__all__ = ["WINDOW", "ClientStalled", "Drain", "find_socket"]

log = logging.getLogger("gateway.dataplane")

WINDOW = 256 * 1024  # bytes a stream may run ahead of its client's socket
_TCP_INFO_LEN = 128  # up to and including tcpi_bytes_acked
_BYTES_ACKED = 120  # offset of tcpi_bytes_acked in struct tcp_info (Linux 4.1 and later)
_ESTABLISHED = 1
_POLL_FIRST, _POLL_MOST = 0.002, 0.05  # seconds between checks while the client is behind
_warned = False


class ClientStalled(Exception):
    """The client took no byte of the stream for the stall timeout."""


class Drain:
    """The drain of one client connection, for one streamed answer. ``close`` when the answer ends."""

    __slots__ = ("_base_sent", "_base_taken", "_sock", "client", "server", "stall_timeout", "window")

    def __init__(self, client: str, server: str, stall_timeout: float, window: int = WINDOW) -> None:
        self.client = client
        self.server = server
        self.stall_timeout = stall_timeout
        self.window = window
        self._sock: socket.socket | None = None
        self._base_sent = -1  # -1: not looked for yet; -2: looked for and not found
        self._base_taken = 0

    async def wait(self, sent: int) -> None:
        """Return once the client's socket has taken all but ``window`` of the ``sent`` bytes relayed
        since the first call (or at once where the socket cannot be watched). Raises ``ClientStalled``."""
        if self._base_sent < 0:
            if self._base_sent == -2:
                return
            loop = asyncio.get_running_loop()
            self._sock = await loop.run_in_executor(None, find_socket, self.client, self.server)
            if self._sock is None:
                self._base_sent = -2
                _warn_once(self.client, self.server)
                return
            state, self._base_taken = _taken(self._sock)
            self._base_sent = sent
            return
        sock = self._sock
        assert sock is not None
        ahead = sent - self._base_sent + self._base_taken - self.window
        delay = _POLL_FIRST
        deadline = 0.0
        while True:
            state, taken = _taken(sock)
            if taken >= ahead or state != _ESTABLISHED:  # caught up, or leaving: the next send tells
                return
            now = time.monotonic()
            if not deadline:
                deadline = now + self.stall_timeout
                progress = taken
            elif taken != progress:
                deadline, progress = now + self.stall_timeout, taken
            elif now >= deadline:
                raise ClientStalled(f"the client took nothing for {self.stall_timeout}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MOST)

    def close(self) -> None:
        # The duplicate keeps the connection open after granian closes its descriptor: close it now.
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _taken(sock: socket.socket) -> tuple[int, int]:
    """The connection's TCP state and the bytes written to it so far (acknowledged plus queued)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        queued = struct.unpack("=i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0, 0
    if len(info) < _BYTES_ACKED + 8:
        return 0, 0
    return info[0], struct.unpack_from("=Q", info, _BYTES_ACKED)[0] + queued


def _hex(host: str, port: int) -> list[str]:
    """The ways ``/proc/net/tcp{,6}`` spells an address (an IPv4 one also as IPv4-mapped IPv6)."""
    host = host.strip("[]")
    try:
        packed = socket.inet_pton(socket.AF_INET, host)
        spellings = [f"{struct.unpack('=I', packed)[0]:08X}"]
        packed = socket.inet_pton(socket.AF_INET6, "::ffff:" + host)
    except OSError:
        try:
            packed = socket.inet_pton(socket.AF_INET6, host)
        except OSError:
            return []
        spellings = []
    spellings.append("".join(f"{w:08X}" for w in struct.unpack("=4I", packed)))
    return [f"{s}:{port:04X}" for s in spellings]


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def find_socket(client: str, server: str) -> socket.socket | None:
    """A duplicate of this process's descriptor of the TCP connection from ``client`` to ``server``
    (``host:port`` each, as granian's scope gives them); None when there is none to be found."""
    peer, local = _split(client), _split(server)
    if peer is None or local is None:
        return None
    remotes, locals_ = set(_hex(*peer)), set(_hex(*local))
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[2] in remotes and fields[1] in locals_:
                        inode = fields[9]
                        break
        except OSError:
            continue
        if inode is not None:
            break
    if inode is None or inode == "0":
        return None
    want = f"socket:[{inode}]"
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") != want:
                continue
            dup = os.dup(int(name))
        except (OSError, ValueError):
            continue
        # The descriptor may have been closed and reused between the look and the dup: look again.
        try:
            if os.readlink(f"/proc/self/fd/{dup}") == want:
                return socket.socket(fileno=dup)
        except OSError:
            pass
        os.close(dup)
        return None
    return None


def _warn_once(client: str, server: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "cannot watch the socket of a stream from %s to %s: streams are relayed without backpressure",
            client,
            server,
        )
