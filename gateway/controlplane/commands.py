"""CLI subcommands of the control plane: ``apply``, ``export``, ``keys``, ``principals``, ``secrets``
(``usage`` and ``budgets`` are in ``usage_commands``).

Each opens the store named by ``--data-dir``/``--database``, does one thing and closes it. Output meant
for scripts goes to stdout (the new revision, the exported TOML, a new key's secret, listings); notes
for the operator go to stderr. A ``GatewayError`` (an invalid file, an unknown principal, ...) propagates
to ``gateway.cli.main``, which prints it as one ``gateway COMMAND: error: ...`` line per problem with exit
status 2. Every write is audited with the OS user who ran the command as its actor (``cli:USER``).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.cli import add_common_options, settings_from_args
from gateway.controlplane.config.apply import apply_file
from gateway.controlplane.config.specs import LimitsSpec
from gateway.controlplane.config.values import check_limit, parse_timestamp
from gateway.controlplane.config.writer import dump_config
from gateway.controlplane.credentials import SECRETS_KEY_ENV, new_env_key, rotate_key_file
from gateway.controlplane.store import MANAGED_BY_FILE, open_store, store_hash_key, store_vault
from gateway.errors import ConfigError

__all__ = ["cli_actor", "finish_command", "print_table", "register", "utc_time"]

Handler = Callable[[argparse.Namespace], int]


def cli_actor() -> str:
    """The audit log's actor for a CLI command: the OS user running it."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no passwd entry (a container's arbitrary uid)
        return f"cli:uid {os.getuid()}"


def register(sub: Any) -> None:
    """Add this area's subcommands to the ``gateway`` parser's subparsers object."""
    p = sub.add_parser("apply", help="make the store match a TOML config file; prints the new revision")
    p.add_argument("file", type=Path, help="the TOML file (see docs/configuration.md)")
    finish_command(p, _cmd_apply)

    p = sub.add_parser("export", help="print the current configuration as TOML (keys without secrets)")
    finish_command(p, _cmd_export)

    keys = sub.add_parser("keys", help="create, revoke and list API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    p = keys_sub.add_parser("create", help="create a key; prints its secret once on stdout")
    p.add_argument("--principal", required=True, help="the principal the key authenticates as")
    p.add_argument("--name", help="a unique name for the key (lets `keys revoke` and config files find it)")
    p.add_argument("--expires", help="expiry: RFC 3339 (2027-01-01T00:00:00Z) or unix seconds")
    p.add_argument("--rpm", metavar="N", help="limit: requests per minute through this key")
    p.add_argument("--tpm", metavar="N", help="limit: tokens per minute through this key")
    p.add_argument("--concurrency", metavar="N", help="limit: requests in flight at once through this key")
    finish_command(p, _cmd_keys_create)
    p = keys_sub.add_parser("revoke", help="revoke a key by id or name")
    p.add_argument("key", help="key id or name")
    finish_command(p, _cmd_keys_revoke)
    p = keys_sub.add_parser("list", help="list keys (never their secrets)")
    p.add_argument("--principal", help="only this principal's keys")
    finish_command(p, _cmd_keys_list)

    secrets = sub.add_parser("secrets", help="the key that encrypts backend credentials in the store")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    p = secrets_sub.add_parser(
        "rotate",
        help=f"re-encrypt every backend credential with a new key (DATA_DIR/secrets.key, or "
        f"{SECRETS_KEY_ENV}_NEW when the key comes from {SECRETS_KEY_ENV})",
    )
    finish_command(p, _cmd_secrets_rotate)

    principals = sub.add_parser("principals", help="list principals")
    principals_sub = principals.add_subparsers(dest="principals_command", required=True)
    p = principals_sub.add_parser(
        "list", help="list principals with their roles, active key counts, limits and model limits"
    )
    finish_command(p, _cmd_principals_list)


def finish_command(p: argparse.ArgumentParser, handler: Handler) -> None:
    """The store flags and the handler; errors the handler raises are reported by ``gateway.cli.main``."""
    add_common_options(p)
    p.set_defaults(handler=handler)


def utc_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _limits_text(spec: LimitsSpec | None) -> str:
    if spec is None:
        return "-"
    values = (spec.requests_per_minute, spec.tokens_per_minute, spec.concurrent_requests)
    return ",".join(
        f"{name}={value}"
        for name, value in zip(("rpm", "tpm", "concurrency"), values, strict=True)
        if value is not None
    )


def _model_limits_text(entries: tuple[tuple[str, LimitsSpec], ...]) -> str:
    return ";".join(f"{model}({_limits_text(spec)})" for model, spec in entries) or "-"


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


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _cmd_apply(args: argparse.Namespace) -> int:
    print(apply_file(settings_from_args(args), args.file, cli_actor()))
    return 0


def _cmd_secrets_rotate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    vault = store_vault(settings)
    with open_store(settings, vault) as store:
        if os.environ.get(SECRETS_KEY_ENV):
            new = new_env_key()
            count = store.seal_credentials(vault.with_current(new), actor=cli_actor())
            print(
                f"re-encrypted {count} credential(s) with the key in {SECRETS_KEY_ENV}_NEW; set "
                f"{SECRETS_KEY_ENV} to it on every control plane and restart them",
                file=sys.stderr,
            )
            return 0
        old_id, new_id, count = rotate_key_file(
            settings.data_dir,
            lambda key: store.seal_credentials(vault.with_current(key), actor=cli_actor()),
        )
    print(f"re-encrypted {count} credential(s): secrets key {old_id} replaced by {new_id}", file=sys.stderr)
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
        ("ID", "NAME", "PRINCIPAL", "HASH", "STATUS", "CREATED", "EXPIRES", "MANAGED_BY", "LIMITS"),
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
                _limits_text(k.limits),
            )
            for k in keys
        ],
    )
    return 0


def _cmd_principals_list(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        principals = store.principals()
    print_table(
        ("ID", "NAME", "ROLES", "ACTIVE_KEYS", "LIMITS", "MODEL_LIMITS"),
        [
            (
                p.id,
                p.name,
                ",".join(p.roles) or "-",
                str(p.active_keys),
                _limits_text(p.limits),
                _model_limits_text(p.model_limits),
            )
            for p in principals
        ],
    )
    return 0
