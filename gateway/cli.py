"""The ``gateway`` command. Each area registers its own subcommands; this module only assembles them and
turns shared flags into ``Settings``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.config import Settings

__all__ = ["add_common_options", "main", "settings_from_args"]


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


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from whatever flags this subcommand defined; unset ones keep their defaults."""
    known = {f for f in Settings.__dataclass_fields__}
    values = {k: v for k, v in vars(args).items() if k in known and v is not None}
    return Settings(**values)


def build_parser() -> argparse.ArgumentParser:
    from gateway.controlplane import commands as cp_commands
    from gateway.controlplane import usage_commands
    from gateway.mockengine import commands as mock_commands
    from gateway.supervisor import commands as sup_commands

    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sup_commands.register(sub)
    cp_commands.register(sub)
    usage_commands.register(sub)
    mock_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 1
