"""``gateway usage`` (and ``gateway usage prune``, ``gateway usage rejected``) and ``gateway budgets``: usage
and spend, and the usage records the control worker set aside or clamped.

Both read the store, where the control worker writes usage records within a fraction of a second of a
request ending (``usage_drain_interval``). ``--json`` prints one JSON document for scripts.
I/O: the store; stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from gateway.budget import NANOS, format_money
from gateway.commands.options import finish_command, settings_from_args
from gateway.commands.output import cli_actor, print_table, utc_time
from gateway.controlplane.store import open_store
from gateway.controlplane.usage.rejected import rejected_report
from gateway.controlplane.usage.retention import purge
from gateway.controlplane.usage.spend import budget_report, usage_groups
from gateway.controlplane.usage.time_range import since_arg
from gateway.errors import ConfigError

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("usage", help="summarise usage records: requests, tokens and cost per group")
    p.add_argument("--since", default="24h", help="start: a duration ago (30m, 24h, 7d) or a timestamp (24h)")
    p.add_argument("--until", help="end: a duration ago or a timestamp (now)")
    p.add_argument("--by", choices=["principal", "model", "key", "backend", "tag"], default="principal")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    finish_command(p, _cmd_usage)
    usage_sub = p.add_subparsers(dest="usage_command", required=False)
    prune = usage_sub.add_parser(
        "prune",
        help="delete usage records older than --older-than days, except those a budget's current window "
        "still counts",
    )
    prune.add_argument(
        "--older-than",
        metavar="DAYS",
        type=float,
        default=float(os.environ.get("GATEWAY_USAGE_RETENTION_DAYS") or 0) or None,
        help="age in days (default: GATEWAY_USAGE_RETENTION_DAYS)",
    )
    finish_command(prune, _cmd_usage_prune)
    rejected = usage_sub.add_parser(
        "rejected",
        help="usage records the control worker could not store as they came: set aside, or stored with "
        "figures clamped",
    )
    rejected.add_argument("--limit", type=int, default=100, help="at most this many of each (100)")
    rejected.add_argument("--json", action="store_true", help="print JSON instead of tables")
    finish_command(rejected, _cmd_usage_rejected)

    p = sub.add_parser(
        "budgets", help="show every budget of every principal and key: its spend in its current period"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    finish_command(p, _cmd_budgets)


def _cmd_usage(args: argparse.Namespace) -> int:
    now = time.time()
    start = since_arg(args.since, now)
    end = since_arg(args.until, now) if args.until else now + 1
    with open_store(settings_from_args(args)) as store:
        rows = store.usage.summary(start, end, args.by)
        purged_before = store.usage.purged_before()
    if start < purged_before:
        print(
            f"note: records that ended before {utc_time(purged_before)} were purged (usage retention); "
            "the totals cover what is left",
            file=sys.stderr,
        )
    if args.json:
        doc = {"since": start, "until": end, "by": args.by, "groups": usage_groups(rows)}
        if start < purged_before:
            doc["complete_since"] = purged_before
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_table(
        (args.by.upper(), "REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "TOTAL", "COST"),
        [
            (
                r.group,
                str(r.requests),
                str(r.errors),
                str(r.prompt_tokens),
                str(r.completion_tokens),
                str(r.total_tokens),
                format_money(r.cost_nanos),
            )
            for r in rows
        ],
    )
    return 0


def _cmd_usage_prune(args: argparse.Namespace) -> int:
    if args.older_than is None or args.older_than <= 0:
        raise ConfigError("--older-than DAYS (a positive number) is needed, or GATEWAY_USAGE_RETENTION_DAYS")
    with open_store(settings_from_args(args)) as store:
        rows, cutoff, held = purge(store, args.older_than, cli_actor())
    print(rows)
    print(f"purged {rows} usage record(s) that ended before {utc_time(cutoff)}", file=sys.stderr)
    if held is not None:
        print(
            f"note: records since {utc_time(held)} are kept: a budget's current window still counts them",
            file=sys.stderr,
        )
    return 0


def _cmd_usage_rejected(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        doc = rejected_report(store, max(1, args.limit))
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_table(
        ("SET ASIDE", "SOURCE", "REASON", "RECORD"),
        [(utc_time(r["ts"]), r["source"], r["reason"], r["record"][:200]) for r in doc["rejected"]],
    )
    print()
    print_table(
        ("ENDED", "REQUEST", "CLAMPED"),
        [(utc_time(c["ts"]), c["request_id"], ",".join(c["fields"])) for c in doc["clamped"]],
    )
    return 0


def _cmd_budgets(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        out = budget_report(store, time.time())
    if args.json:
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_table(
        ("PRINCIPAL", "KEY", "PERIOD", "RESETS", "TOKENS", "TOKEN_LIMIT", "COST", "COST_LIMIT", "STATUS"),
        [
            (
                b["principal"],
                b["key"] or "-",
                b["period"],
                utc_time(b["window_end"]),
                str(b["tokens"]),
                "-" if b["tokens_limit"] is None else str(b["tokens_limit"]),
                format_money(round(b["cost"] * NANOS)),
                "-" if b["cost_limit"] is None else format_money(round(b["cost_limit"] * NANOS)),
                "exceeded" if b["exceeded"] else "ok",
            )
            for b in out
        ],
    )
    return 0
