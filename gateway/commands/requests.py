"""``gateway requests show ID``: one finished request with its route trace, read from the
store (where the control worker writes each request's usage record a fraction of a second after it
ended). ``ID`` is the ``x-request-id`` the client got: its own when it sent one, else the gateway's.
``--bodies`` adds its logged bodies (``[[body_logs]]``), as redacted and stored. ``gateway requests
prune`` purges logged bodies past their retention now (``--older-than DAYS``: those too).
I/O: the store; stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from gateway.budget import format_money
from gateway.commands.options import finish_command, settings_from_args
from gateway.commands.output import cli_actor, print_table, utc_time
from gateway.controlplane.bodies.retention import purge
from gateway.controlplane.store import open_store
from gateway.controlplane.usage.requests_view import request_doc
from gateway.errors import ConfigError, NotFound

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("requests", help="look at finished requests: usage, routing rule and route trace")
    what = p.add_subparsers(dest="requests_command", required=True, metavar="ACTION")
    show = what.add_parser("show", help="one request by the x-request-id its client got")
    show.add_argument("id", help="the request id (the x-request-id header of the answer)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.add_argument(
        "--bodies", action="store_true", help="also print its logged request and response bodies, if any"
    )
    finish_command(show, _cmd_show)
    prune = what.add_parser(
        "prune",
        help="purge logged bodies past their retention now (the control worker also does, every 5 min)",
    )
    prune.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="also purge bodies logged more than DAYS days ago, whatever their retention",
    )
    finish_command(prune, _cmd_prune)


def _ms(value: object) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"  # type: ignore[arg-type]


def _cmd_show(args: argparse.Namespace) -> int:
    with open_store(settings_from_args(args)) as store:
        found = store.usage.find(args.id)
        names = {p.id: p.name for p in store.principals()} if found else {}
        stored = store.bodies.get(found[0].request_id) if found and args.bodies else None
    if not found:
        raise NotFound(f"no finished request with id {args.id!r} (in flight, or not recorded)")
    doc = request_doc(found[0], names)
    doc["same_id"] = [r.request_id for r in found[1:]]
    if args.bodies:
        doc["bodies"] = stored.as_doc() if stored is not None else None
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    _print_request(doc)
    if args.bodies:
        _print_bodies(doc["bodies"])
    return 0


def _print_request(doc: dict[str, Any]) -> None:
    out = sys.stdout
    principal = doc["principal"] or doc["principal_id"]
    out.write(f"request   {doc['request_id']}" + (f" (client id {doc['client_request_id']})\n"
              if doc["client_request_id"] else "\n"))  # fmt: skip
    out.write(f"ended     {utc_time(doc['ts'])}\n")
    out.write(f"caller    {principal}, key {doc['key_id']}\n")
    out.write(f"model     {doc['model']}" + (f", rule {doc['rule']}" if doc["rule"] else "") +
              (f", tag {doc['tag']}" if doc["tag"] else "") + "\n")  # fmt: skip
    out.write(f"answer    {doc['status']} from {doc['backend'] or '(no backend)'} after {doc['tries']} "
              f"tr{'y' if doc['tries'] == 1 else 'ies'}; {_ms(doc['latency_ms'])}, first byte "
              f"{_ms(doc['ttfb_ms'])}\n")  # fmt: skip
    out.write(
        f"usage     {doc['prompt_tokens']} prompt + {doc['completion_tokens']} completion "
        f"({doc['usage_source']}), {format_money(doc['cost_nanos'])}\n"
    )
    if doc["trace_id"]:
        out.write(f"trace id  {doc['trace_id']}\n")
    if doc["same_id"]:
        out.write(f"also      {len(doc['same_id'])} other request(s) with this client id\n")
    if not doc["attempts"]:
        out.write("route     (no route trace recorded)\n")
        return
    out.write("route\n")
    rows: list[tuple[str, ...]] = []
    for n, a in enumerate(doc["attempts"], 1):
        if "omitted" in a:
            rows.append((str(n), f"({a['omitted']} attempts left out)", "", "", "", "", ""))
            continue
        outcome = str(a["status"]) if a["status"] is not None else a["error"]
        rows.append(
            (str(n), a["backend"], a["provider_model"], outcome, _ms(a["ttfb_ms"]), _ms(a["duration_ms"]),
             a["next_because"] or "")
        )  # fmt: skip
    print_table(("#", "BACKEND", "PROVIDER_MODEL", "OUTCOME", "HEADERS", "DURATION", "NEXT_BECAUSE"), rows)


def _print_bodies(bodies: dict[str, Any] | None) -> None:
    out = sys.stdout
    if bodies is None:
        out.write("bodies    (none logged for this request)\n")
        return
    out.write(
        f"bodies    logged by {bodies['rule']}, {bodies['redactions']} redaction(s), kept until "
        f"{utc_time(bodies['expires_at'])}\n"
    )
    for side in ("request", "response"):
        body = bodies[side]
        notes = [body["kind"], f"{body['size']} bytes"]
        if body["truncated"]:
            notes.append("truncated at the entry's max_bytes")
        if "stream_events" in body:
            notes.append(f"rebuilt from {body['stream_events']} stream events")
        out.write(f"{side:<9} ({', '.join(notes)})\n")
        value = body["body"]
        if isinstance(value, str):
            out.write(value.rstrip("\n") + "\n")
        elif value is not None:
            out.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _cmd_prune(args: argparse.Namespace) -> int:
    if args.older_than is not None and args.older_than < 0:
        raise ConfigError("--older-than must be a number of days, at least 0")
    with open_store(settings_from_args(args)) as store:
        rows = purge(store, cli_actor(), args.older_than)
    print(rows)
    print(f"purged {rows} logged request bodies", file=sys.stderr)
    return 0
