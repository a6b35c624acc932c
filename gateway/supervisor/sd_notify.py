"""systemd's notify protocol, spoken by the supervisor: ``READY=1`` once every worker serves,
``STOPPING=1`` when draining starts, ``WATCHDOG=1`` at half the watchdog interval, ``STATUS=…`` lines.

One datagram per message to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace). Without
the variable (not run by systemd with ``Type=notify``) every call does nothing. I/O: that socket only.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["Notifier"]

log = logging.getLogger("gateway.supervisor")


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if path.startswith("@"):
            self.address = b"\0" + path[1:].encode()
        elif path.startswith("/"):
            self.address = path
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        owner = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not owner or owner == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def __call__(self, message: str) -> None:
        if self.address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError as exc:
            log.warning("systemd notification %r not sent: %s", message, exc)
