"""``gateway apply FILE`` and ``gateway export``: make the store match a config file, and print the
store's configuration as one.

Both open the store named by ``--data-dir``/``--database``, do one thing and close it. ``apply`` prints
the new revision on stdout; a file with problems is a ``ConfigError`` listing every one. The file owns
what it declares (``gateway.controlplane.config.apply``), and the write is audited with the OS user who
ran the command (``cli:USER``). I/O: the file, the store; stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.commands.options import finish_command, settings_from_args
from gateway.commands.output import cli_actor
from gateway.controlplane.config.apply import apply_file
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.store import MANAGED_BY_FILE, open_store

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("apply", help="make the store match a TOML config file; prints the new revision")
    p.add_argument("file", type=Path, help="the TOML file (see docs/configuration.md)")
    finish_command(p, _cmd_apply)

    p = sub.add_parser("export", help="print the current configuration as TOML (keys without secrets)")
    finish_command(p, _cmd_export)


def _cmd_apply(args: argparse.Namespace) -> int:
    print(apply_file(settings_from_args(args), args.file, cli_actor()))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        revision = store.revision()
        doc = store.config_doc()
        cli_keys = sum(
            1 for k in store.list_keys() if k.managed_by != MANAGED_BY_FILE and k.revoked_at is None
        )
    header = (
        f"Exported by `gateway export` at revision {revision}.\n"
        "Keys are listed without secrets; applying this file keeps their hashes.\n"
        "Backend credentials are write-only: give them again (api_key, api_key_env, api_key_file).\n"
        f"{cli_keys} key(s) created with `gateway keys create` or the admin API are not listed;"
        " apply keeps them."
    )
    sys.stdout.write(dump_config(doc, header))
    return 0
