"""``gateway keys create|revoke|list``: API keys in the store.

``create`` prints the new key's secret once on stdout (only its keyed hash is stored) and a note on
stderr; its ``--budget`` takes a budget table as a config file writes it (TOML inline table), once per
period; ``revoke`` takes a key's id or name; ``list`` shows keys, never their secrets. Writes are audited
with the OS user who ran the command (``cli:USER``). I/O: the hash key under the data directory, the
store; stdout, stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from typing import Any

from gateway.commands.options import finish_command, settings_from_args
from gateway.commands.output import budgets_text, cli_actor, limits_text, print_table, utc_time
from gateway.controlplane.config.parser import parse_budgets
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.specs import BudgetSpec, LimitsSpec
from gateway.controlplane.config.values import check_limit, parse_timestamp
from gateway.controlplane.store import open_store, store_hash_key
from gateway.errors import ConfigError

__all__ = ["register"]


def register(sub: Any) -> None:
    keys = sub.add_parser("keys", help="create, revoke and list API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    p = keys_sub.add_parser("create", help="create a key; prints its secret once on stdout")
    p.add_argument("--principal", required=True, help="the principal the key authenticates as")
    p.add_argument("--name", help="a unique name for the key (lets `keys revoke` and config files find it)")
    p.add_argument("--expires", help="expiry: RFC 3339 (2027-01-01T00:00:00Z) or unix seconds")
    p.add_argument("--rpm", metavar="N", help="limit: requests per minute through this key")
    p.add_argument("--tpm", metavar="N", help="limit: tokens per minute through this key")
    p.add_argument("--concurrency", metavar="N", help="limit: requests in flight at once through this key")
    p.add_argument(
        "--budget",
        metavar="TABLE",
        action="append",
        default=[],
        help="a budget of this key, on top of its principal's, as in a config file: '{ period = \"day\", "
        "cost = 20, alerts = [0.8, 1.0] }'; repeat it for more periods",
    )
    finish_command(p, _cmd_keys_create)
    p = keys_sub.add_parser("revoke", help="revoke a key by id or name")
    p.add_argument("key", help="key id or name")
    finish_command(p, _cmd_keys_revoke)
    p = keys_sub.add_parser("list", help="list keys (never their secrets)")
    p.add_argument("--principal", help="only this principal's keys")
    finish_command(p, _cmd_keys_list)


def _limit_arg(flag: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{flag} must be a positive integer") from None
    if problem := check_limit(value):
        raise ConfigError(f"{flag} {problem}")
    return value


def _budgets_arg(tables: list[str]) -> tuple[BudgetSpec, ...]:
    """Each ``--budget`` TOML inline table, checked by the config file's own rules."""
    values = []
    for text in tables:
        try:
            values.append(tomllib.loads(f"budget = {text}")["budget"])
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--budget {text!r} is not a TOML inline table ({exc})") from None
        if not isinstance(values[-1], dict):
            raise ConfigError(f'--budget {text!r} is not a table such as {{ period = "day", cost = 20 }}')
    p = Problems()
    budgets = parse_budgets(p, "--budget", {"budgets": values})
    if p.lines:  # "--budget[1].period: ...": the second --budget given
        raise ConfigError("\n".join(line.replace("--budget.budgets", "--budget") for line in p.lines))
    return budgets


def _cmd_keys_create(args: argparse.Namespace) -> int:
    expires_at: float | None = None
    if args.expires is not None:
        raw: object = args.expires
        try:
            raw = float(args.expires)
        except ValueError:
            pass
        try:
            expires_at = parse_timestamp(raw)
        except ValueError as exc:
            raise ConfigError(f"--expires {exc}") from None
        if expires_at <= time.time():
            raise ConfigError("--expires is in the past")
    limits = LimitsSpec(
        _limit_arg("--rpm", args.rpm),
        _limit_arg("--tpm", args.tpm),
        _limit_arg("--concurrency", args.concurrency),
    )
    budgets = _budgets_arg(args.budget)
    settings = settings_from_args(args)
    hash_key = store_hash_key(settings)
    with open_store(settings) as store:
        key_id, secret = store.create_key(
            args.principal,
            args.name,
            expires_at,
            hash_key,
            None if limits.is_empty() else limits,
            actor=cli_actor(),
            budgets=budgets,
        )
    print(secret)
    print(f"created key {key_id} for {args.principal}; the secret above is shown only once", file=sys.stderr)
    return 0


def _cmd_keys_revoke(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        store.revoke_key(args.key, actor=cli_actor())
    print(f"revoked {args.key}", file=sys.stderr)
    return 0


def _cmd_keys_list(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        keys = store.list_keys(args.principal)
    now = time.time()
    print_table(
        (
            "ID",
            "NAME",
            "PRINCIPAL",
            "HASH",
            "STATUS",
            "CREATED",
            "EXPIRES",
            "MANAGED_BY",
            "LIMITS",
            "BUDGETS",
        ),
        [
            (
                k.id,
                k.name or "-",
                k.principal,
                k.hash_prefix,
                k.status(now),
                utc_time(k.created_at),
                utc_time(k.expires_at),
                k.managed_by,
                limits_text(k.limits),
                budgets_text(k.budgets),
            )
            for k in keys
        ],
    )
    return 0
