"""Claim the gateway's listening addresses before any worker starts, and hold them while it runs.

Every worker binds its address with SO_REUSEPORT (granian does so on Linux, see dataplane/worker.py), so a
second gateway started on the same port by the same user would silently share it, and a port that cannot
be bound at all would only fail inside each worker, over and over. The supervisor settles both first:

1. a plain bind (SO_REUSEADDR only, so that connections of an earlier run in TIME_WAIT do not count) fails
   if any other socket holds the address, listening or merely bound, whatever its options;
2. a *claim* socket is then bound with SO_REUSEPORT and held, never listening, until the supervisor exits.
   It receives no connections (only listening sockets do), our workers' SO_REUSEPORT binds succeed beside
   it, and step 1 of any later gateway fails against it, even while all our workers are restarting.

The gap between closing the probe and binding the claim is a few microseconds, not a fork. I/O: sockets.
"""

from __future__ import annotations

import errno
import socket
import time

from gateway.errors import ConfigError

__all__ = ["PortClaim", "claim_port"]

IN_USE_PATIENCE = 1.0  # seconds a taken port is retried before it is reported

_WHY = {
    errno.EADDRINUSE: "is already in use by another process (another gateway?)",
    errno.EACCES: "needs privileges to bind (ports below 1024 do)",
    errno.EADDRNOTAVAIL: "is not an address of this host",
}


class PortClaim:
    """The held claim socket of one address. ``close`` releases it."""

    def __init__(self, sock: socket.socket, what: str) -> None:
        self.sock = sock
        self.what = what

    def close(self) -> None:
        self.sock.close()


def _family(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {host!r} does not resolve ({exc.strerror})"
        ) from None
    family, _, _, _, addr = infos[0]
    return family, (str(addr[0]), int(addr[1]))


def claim_port(host: str, port: int, what: str) -> PortClaim:
    """Claim ``host:port`` for this gateway, or raise ``ConfigError`` saying why it cannot be had.

    ``what`` names the address in the message ("the proxy port", "the admin port")."""
    family, addr = _family(host, port)
    # A gateway restarted right after a `kill -9` of the previous one finds its workers' listeners still
    # open for the moment their parent-death signal takes: wait for that, not longer.
    deadline = time.monotonic() + IN_USE_PATIENCE
    while True:
        probe = socket.socket(family, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(addr)
            break
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            why = _WHY.get(exc.errno or 0, f"cannot be bound: {exc.strerror}")
            raise ConfigError(f"{what} {host}:{port} {why}") from None
        finally:
            probe.close()
    claim = socket.socket(family, socket.SOCK_STREAM)
    try:
        claim.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        claim.bind(addr)
    except OSError as exc:  # taken in the microseconds since the probe
        claim.close()
        raise ConfigError(f"{what} {host}:{port} {_WHY.get(exc.errno or 0, exc.strerror)}") from None
    return PortClaim(claim, what)
