"""The ``gateway`` command. Each command family registers its own subcommands; this module only assembles
them, and is the one place where an error that reaches the user becomes one line on stderr and an exit
status: 2 for anything the user can fix (a flag, a file, a store that does not answer), 1 for an internal
error. ``GATEWAY_DEBUG=1`` shows the traceback of the latter. I/O: stderr.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Sequence
from importlib import import_module, metadata

from gateway.commands.options import USAGE_ERROR, Parser
from gateway.errors import GatewayError

__all__ = ["FAMILIES", "build_parser", "command_of", "error_lines", "main"]

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


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


# Each command family (a module of gateway.commands) with the commands it registers, in the order
# ``gateway --help`` lists them; a new family is one more entry. Only the family of the command being run
# is imported: each imports what its commands need (the store, the config parser, the supervisor, the mock
# engine's server), and ``keys create``, which scripts run many times over, paid for importing all of them
# (measured: about 0.1 s of its 0.28 s; a mock engine's start, 0.15 s).
FAMILIES: dict[str, tuple[str, ...]] = {
    "serve": ("serve", "status"),
    "apply": ("apply", "export"),
    "keys": ("keys",),
    "secrets_key": ("secrets",),
    "principals": ("principals",),
    "usage": ("usage", "budgets"),
    "requests": ("requests",),
    "mock_engine": ("mock-engine",),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or, given a ``command`` of ``FAMILIES``, only that command's family."""
    parser = Parser(
        prog="gateway", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"gateway {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for family, commands in FAMILIES.items():
        if command is None or command in commands:
            import_module(f"gateway.commands.{family}").register(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, if it names one of ``FAMILIES``: its first word that is not an option
    (the top level takes no option with a value). None otherwise, for which the whole command line is
    built: ``--help`` lists every command, and an unknown one is refused with the list of them."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if any(first in commands for commands in FAMILIES.values()) else None


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
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_of(argv))
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
