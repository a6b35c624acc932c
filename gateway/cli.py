"""The ``gateway`` command. Each area registers its own subcommands; this module only assembles them, turns
shared flags into ``Settings``, and is the one place where an error that reaches the user becomes one line
on stderr and an exit status: 2 for anything the user can fix (a flag, a file, a store that does not
answer), 1 for an internal error. ``GATEWAY_DEBUG=1`` shows the traceback of the latter. I/O: stderr.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sqlite3
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from gateway.config import Settings
from gateway.errors import GatewayError

__all__ = [
    "USAGE_ERROR",
    "Parser",
    "add_common_options",
    "add_edge_options",
    "error_lines",
    "main",
    "port_number",
    "positive_int",
    "settings_from_args",
]

USAGE_ERROR = 2  # argparse's own status for a bad command line; every user-fixable error exits with it
DISTRIBUTION = "llm-gateway"

DESCRIPTION = """\
An inference gateway for OpenAI- and Anthropic-compatible clients in front of vLLM, SGLang and hosted
providers: API keys, rate limits, budgets, routing and usage records.

Start here:
  gateway serve --config gateway.toml      run it (add --admin-port 8081 for the web UI and admin API)
  gateway apply gateway.toml               make the store match a config file
  gateway keys create --principal alice    create an API key
  gateway status                           what this host's gateway is doing

Each command has its own --help. Documentation: README.md and docs/ in the source tree."""


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


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from whatever flags this subcommand defined; unset ones keep their defaults."""
    known = {f for f in Settings.__dataclass_fields__}
    values = {k: v for k, v in vars(args).items() if k in known and v is not None}
    return Settings(**values)


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    from gateway.controlplane import commands as cp_commands
    from gateway.controlplane import request_commands, usage_commands
    from gateway.mockengine import commands as mock_commands
    from gateway.supervisor import commands as sup_commands

    parser = Parser(
        prog="gateway", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"gateway {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    # Each area adds its subcommands here; a new area is one more register() call.
    for area in (sup_commands, cp_commands, usage_commands, request_commands, mock_commands):
        area.register(sub)
    return parser


def error_lines(exc: BaseException) -> list[str]:
    """What the user reads for ``exc``: one line per problem, with the file (and line) first where known.

    Continuation lines (psycopg indents its hints) join the line they continue."""
    if isinstance(exc, GatewayError):
        text = exc.message
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, sqlite3.Error):
        text = f"the SQLite store: {exc}"
    else:
        text = str(exc) or type(exc).__name__
    lines: list[str] = []
    for raw in text.splitlines():
        if lines and raw[:1].isspace():
            lines[-1] += " " + raw.strip()
        elif raw.strip():
            lines.append(raw.rstrip())
    return lines or [type(exc).__name__]


def _report(prog: str, exc: BaseException) -> None:
    for line in error_lines(exc):
        print(f"{prog}: error: {line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"gateway {args.command}"
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 1
    except (GatewayError, OSError, sqlite3.Error) as exc:
        # A bad file, a bad value, a store that does not answer: the user can fix these.
        _report(prog, exc)
        return USAGE_ERROR
    except Exception as exc:
        if _is_store_error(exc):
            _report(prog, exc)
            return USAGE_ERROR
        if os.environ.get("GATEWAY_DEBUG") == "1":
            raise
        what = "; ".join(error_lines(exc))
        print(
            f"{prog}: internal error: {type(exc).__name__}: {what} (GATEWAY_DEBUG=1 shows where)",
            file=sys.stderr,
        )
        return 1


def _is_store_error(exc: BaseException) -> bool:
    """PostgreSQL's errors, told by module so that the CLI does not import psycopg for SQLite users."""
    return type(exc).__module__.split(".")[0] in ("psycopg", "psycopg_pool")
