"""What the ``gateway`` subcommands share on the command line: the parser class whose errors are one line,
the types of port and count flags, the store flags (``--data-dir``, ``--database``) and the proxy port's
edge flags, and the ``Settings`` those flags make. No I/O (flag defaults read the environment).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from gateway.config import Settings

__all__ = [
    "USAGE_ERROR",
    "Handler",
    "Parser",
    "add_common_options",
    "add_edge_options",
    "finish_command",
    "port_number",
    "positive_int",
    "settings_from_args",
]

USAGE_ERROR = 2  # argparse's own status for a bad command line; every user-fixable error exits with it

Handler = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (argparse prints the whole usage first), naming the
    command and where to look; subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def port_number(raw: str) -> int:
    """A TCP port to listen on: 1-65535. Port 0 (any free port) would give each proxy worker its own."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port number (1-65535)") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1-65535)")
    return value


def positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Flags every subcommand that touches the store understands."""
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("GATEWAY_DATA_DIR", "var/data")),
        help="directory for the SQLite store, the hash key and run state (env GATEWAY_DATA_DIR)",
    )
    p.add_argument(
        "--database",
        default=os.environ.get("GATEWAY_DATABASE") or None,
        help="postgresql://… URL; default: SQLite under --data-dir (env GATEWAY_DATABASE)",
    )


def _cidrs(text: str) -> tuple[str, ...]:
    """``--trusted-proxies``: comma-separated networks, checked here so that a typo stops the start."""
    out = tuple(c.strip() for c in text.split(",") if c.strip())
    for cidr in out:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a network: {cidr!r} ({exc})") from None
    return out


# RFC 9110's token: what a field name may be made of.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


def _header_names(text: str) -> tuple[str, ...]:
    """``--drop-request-headers``: comma-separated header names, lowercased (granian hands the data plane
    lowercase names), checked here so that a typo stops the start."""
    out = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    for name in out:
        if not set(name) <= _TOKEN:
            raise argparse.ArgumentTypeError(f"not a header name: {name!r}")
    return out


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def add_edge_options(p: argparse.ArgumentParser) -> None:
    """Flags of the proxy port's edge: connection and body timeouts, buffering, per-address limits
    (docs/operations.md, "Hostile traffic and faults")."""
    p.add_argument(
        "--head-timeout",
        type=float,
        default=_env("GATEWAY_HEAD_TIMEOUT"),
        help="seconds a connection may take to send a complete request head, idle keep-alive time "
        "included, before it is closed (30; 0: never, not advised; env GATEWAY_HEAD_TIMEOUT)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=_env("GATEWAY_BODY_TIMEOUT"),
        help="seconds a request body may bring no byte before the request gets 408 (30; 0: never; env "
        "GATEWAY_BODY_TIMEOUT)",
    )
    p.add_argument(
        "--backpressure",
        type=positive_int,
        default=_env("GATEWAY_BACKPRESSURE"),
        help="connections each proxy worker holds open at most, idle ones included (16384; env "
        "GATEWAY_BACKPRESSURE)",
    )
    p.add_argument(
        "--body-buffer-bytes",
        type=positive_int,
        default=_env("GATEWAY_BODY_BUFFER_BYTES"),
        help="bytes of request bodies over 64 KiB one proxy worker holds at once (96 MiB; at least twice "
        "--max-body-bytes); others wait (env GATEWAY_BODY_BUFFER_BYTES)",
    )
    p.add_argument(
        "--body-wait",
        type=float,
        default=_env("GATEWAY_BODY_WAIT"),
        help="seconds a body waits for room in --body-buffer-bytes before the request gets 503 (10)",
    )
    p.add_argument(
        "--client-max-requests",
        type=int,
        default=_env("GATEWAY_CLIENT_MAX_REQUESTS"),
        help="concurrent requests per client address, across the host's workers (4096; 0: no limit; env "
        "GATEWAY_CLIENT_MAX_REQUESTS)",
    )
    p.add_argument(
        "--client-rate",
        type=float,
        default=_env("GATEWAY_CLIENT_RATE"),
        help="requests per second per client address (0: no limit, the default; env GATEWAY_CLIENT_RATE)",
    )
    p.add_argument(
        "--client-burst",
        type=int,
        default=_env("GATEWAY_CLIENT_BURST"),
        help="requests a client address may send at once within --client-rate (twice the rate)",
    )
    p.add_argument(
        "--trusted-proxies",
        type=_cidrs,
        default=_cidrs(os.environ.get("GATEWAY_TRUSTED_PROXIES", "")) or None,
        help="comma-separated networks (CIDRs) of load balancers whose X-Forwarded-For names the client "
        "(none: the socket's peer is the client; env GATEWAY_TRUSTED_PROXIES)",
    )
    p.add_argument(
        "--drop-request-headers",
        type=_header_names,
        default=_header_names(os.environ.get("GATEWAY_DROP_REQUEST_HEADERS", "")) or None,
        help="comma-separated names of request headers never forwarded to an engine, besides the client "
        "credentials always dropped (authorization, x-api-key, api-key, cookie, proxy-authorization; env "
        "GATEWAY_DROP_REQUEST_HEADERS)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from whatever flags this subcommand defined; unset ones keep their defaults."""
    known = {f for f in Settings.__dataclass_fields__}
    values = {k: v for k, v in vars(args).items() if k in known and v is not None}
    return Settings(**values)


def finish_command(p: argparse.ArgumentParser, handler: Handler) -> None:
    """The store flags and the handler; errors the handler raises are reported by ``main.main``."""
    add_common_options(p)
    p.set_defaults(handler=handler)
