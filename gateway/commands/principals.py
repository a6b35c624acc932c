"""``gateway principals list``: principals with their roles, active key counts, limits, model limits and
budgets, read from the store. I/O: the store; stdout.
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.commands.options import finish_command, settings_from_args
from gateway.commands.output import budgets_text, limits_text, print_table
from gateway.controlplane.config.specs import LimitsSpec
from gateway.controlplane.store import open_store

__all__ = ["register"]


def register(sub: Any) -> None:
    principals = sub.add_parser("principals", help="list principals")
    principals_sub = principals.add_subparsers(dest="principals_command", required=True)
    p = principals_sub.add_parser(
        "list", help="list principals with their roles, active key counts, limits, model limits and budgets"
    )
    finish_command(p, _cmd_principals_list)


def _model_limits_text(entries: tuple[tuple[str, LimitsSpec], ...]) -> str:
    return ";".join(f"{model}({limits_text(spec)})" for model, spec in entries) or "-"


def _cmd_principals_list(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        principals = store.principals()
    print_table(
        ("ID", "NAME", "ROLES", "ACTIVE_KEYS", "LIMITS", "MODEL_LIMITS", "BUDGETS"),
        [
            (
                p.id,
                p.name,
                ",".join(p.roles) or "-",
                str(p.active_keys),
                limits_text(p.limits),
                _model_limits_text(p.model_limits),
                budgets_text(p.budgets),
            )
            for p in principals
        ],
    )
    return 0
