"""``gateway serve`` and ``gateway status``: run the gateway on this host, and say what it is doing.

``serve`` turns its flags (and the ``GATEWAY_*`` variables their help names) into ``Settings`` and hands
them to ``gateway.supervisor.host.serve``, which runs in the foreground until SIGTERM or Ctrl-C. ``status``
reads the supervisor's state file and the live shared segments (``gateway.supervisor.host``) and prints
them, or one JSON document with ``--json``. I/O: stdout, stderr; the rest is the supervisor's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from gateway.commands.options import (
    add_common_options,
    add_edge_options,
    port_number,
    positive_int,
    settings_from_args,
)
from gateway.supervisor.host import serve, status_document

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="run the gateway: supervisor, control worker and proxy workers",
        description="Run the gateway in the foreground until SIGTERM or Ctrl-C (which drain it): a "
        "supervisor, a control worker that owns the store and the admin port, and proxy workers on --port. "
        "SIGHUP re-applies --config. Flags can also come from the GATEWAY_* variables their help names; "
        "docs/operations.md has the full table.",
    )
    add_common_options(p)
    p.add_argument(
        "--config", dest="config_file", type=Path, help="TOML config applied at start and on SIGHUP"
    )
    p.add_argument(
        "--role",
        choices=["all", "proxy", "control"],
        default=os.environ.get("GATEWAY_ROLE", "all"),
        help="all: control worker and proxies on one store (default); control: control worker and admin "
        "port only; proxy: proxies following --control-url",
    )
    p.add_argument(
        "--revision-poll-interval",
        type=float,
        help="seconds between the control worker's checks of the store's revision (0.25); with PostgreSQL, "
        "NOTIFY wakes it at once anyway",
    )
    p.add_argument("--report-interval", type=float, help="--role proxy: seconds between health reports (10)")
    p.add_argument(
        "--usage-spool-max-mb",
        type=positive_int,
        default=os.environ.get("GATEWAY_USAGE_SPOOL_MAX_MB") or None,
        help="--role proxy: MiB of usage records DATA_DIR/usage-spool/ may hold while the control plane "
        "is away (1024; env GATEWAY_USAGE_SPOOL_MAX_MB)",
    )
    p.add_argument(
        "--ingest-queue-max",
        type=positive_int,
        default=os.environ.get("GATEWAY_INGEST_QUEUE_MAX") or None,
        help="--role control/all: usage records from proxy hosts that may wait for the store or be in its "
        "hands at once; past it a batch is answered 503 with Retry-After and stays in its host's spool "
        "(200000; env GATEWAY_INGEST_QUEUE_MAX)",
    )
    p.add_argument(
        "--host-id",
        default=os.environ.get("GATEWAY_HOST_ID") or None,
        help="this host's id in the fleet (default: generated once and kept in DATA_DIR/host-id; "
        "env GATEWAY_HOST_ID)",
    )
    p.add_argument(
        "--admin-backlog",
        type=positive_int,
        default=os.environ.get("GATEWAY_ADMIN_BACKLOG") or None,
        help="listen backlog of the admin port (2048; env GATEWAY_ADMIN_BACKLOG)",
    )
    p.add_argument(
        "--admin-backpressure",
        type=positive_int,
        default=os.environ.get("GATEWAY_ADMIN_BACKPRESSURE") or None,
        help="connections the admin port serves at once, one per proxy host polling it "
        "(2048; env GATEWAY_ADMIN_BACKPRESSURE)",
    )
    p.add_argument(
        "--postgres-pool-size",
        type=positive_int,
        default=os.environ.get("GATEWAY_POSTGRES_POOL_SIZE") or None,
        help="connections the control worker keeps open to PostgreSQL (4; env GATEWAY_POSTGRES_POOL_SIZE)",
    )
    p.add_argument("--admin-tls-cert", type=Path, help="PEM certificate chain: serve the admin port over TLS")
    p.add_argument("--admin-tls-key", type=Path, help="PEM private key for --admin-tls-cert")
    p.add_argument(
        "--control-ca", type=Path, help="--role proxy: CA bundle for an https:// --control-url (system roots)"
    )
    p.add_argument("--control-url", help="--role proxy: the control plane's admin URL (http://host:8081)")
    p.add_argument("--admin-host", help="where the admin port listens (127.0.0.1)")
    # String defaults from the environment go through ``type`` too, so a bad GATEWAY_PORT is refused the
    # same way as a bad --port.
    p.add_argument(
        "--admin-port",
        type=port_number,
        default=os.environ.get("GATEWAY_ADMIN_PORT") or None,
        help="serve the admin API and web UI here (--role control: 8081; env GATEWAY_ADMIN_PORT)",
    )
    p.add_argument("--host", default=os.environ.get("GATEWAY_HOST"), help="listen address (127.0.0.1)")
    p.add_argument(
        "--port",
        type=port_number,
        default=os.environ.get("GATEWAY_PORT") or None,
        help="listen port (8080; env GATEWAY_PORT)",
    )
    p.add_argument("--workers", type=positive_int, help="proxy workers, at least 1 (default: one per core)")
    p.add_argument("--grace-period", type=float, help="seconds to let requests finish on SIGTERM (30)")
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        help="seconds a proxy worker's event loop may go without its heartbeat (stamped twice a second) "
        "before the supervisor kills and replaces it (5; 0: never; env GATEWAY_HEARTBEAT_TIMEOUT)",
    )
    p.add_argument("--max-body-bytes", type=int, help="largest accepted request body (32 MiB)")
    add_edge_options(p)
    p.add_argument(
        "--backend-cool-down",
        type=float,
        help="seconds a backend that failed 3 times in a row is skipped (5; 0 turns passive health off)",
    )
    p.add_argument(
        "--stream-stall-timeout",
        type=float,
        help="seconds a streamed answer waits for a client that reads nothing before it is cut (60)",
    )
    p.add_argument(
        "--budget-alert-webhook",
        help="URL the control worker POSTs each budget alert to, as JSON (env GATEWAY_BUDGET_ALERT_WEBHOOK)",
    )
    p.add_argument(
        "--max-attempts",
        type=positive_int,
        help="tries of one request, failover targets and pool credentials together (5; env "
        "GATEWAY_MAX_ATTEMPTS)",
    )
    p.add_argument(
        "--retry-backoff",
        type=float,
        help="seconds before a request's second try, doubling for each further one up to 1 s (0.05; env "
        "GATEWAY_RETRY_BACKOFF)",
    )
    p.add_argument(
        "--event-loop",
        choices=("uvloop", "asyncio"),
        help="proxy workers' event loop (uvloop; env GATEWAY_EVENT_LOOP)",
    )
    p.add_argument(
        "--cpu-affinity",
        choices=("auto", "on", "off"),
        help="pin each proxy worker (its event loop and granian's threads) to one core: on, auto (when there "
        "are as many workers as usable cores) or off; faster small answers, slower streams "
        "(env GATEWAY_CPU_AFFINITY; off)",
    )
    p.add_argument(
        "--engine-scrape-interval",
        type=float,
        help="seconds between reads of each backend's /metrics and health probes (2; 0 turns them off)",
    )
    p.add_argument(
        "--drain-delay",
        type=float,
        help="on SIGTERM, seconds /readyz answers 503 while still accepting, so a load balancer can take "
        "the host out first (0; behind one, a few health-check intervals)",
    )
    p.add_argument(
        "--drain-window",
        type=float,
        help="after the drain delay, seconds at most the proxies keep serving clients that still send on "
        "kept-alive connections, every answer with Connection: close, before the listener closes; it ends "
        "sooner once no request came for 0.25 s (2)",
    )
    p.add_argument(
        "--prefix-index-entries",
        type=int,
        help="(block, backend) pairs the host's prefix index keeps for cache_aware pools, a power of two; "
        "16 bytes each (1048576, env GATEWAY_PREFIX_INDEX_ENTRIES)",
    )
    p.add_argument("--log-level", default=os.environ.get("GATEWAY_LOG_LEVEL"), help="debug|info|warning")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("GATEWAY_LOG_FORMAT"),
        help="text (default) or json: one JSON object per line, for journald and log shippers",
    )
    p.add_argument(
        "--access-log",
        action="store_const",
        const=True,
        default=os.environ.get("GATEWAY_ACCESS_LOG") == "1" or None,
        help="one JSON line per forwarded request on stdout (also GATEWAY_ACCESS_LOG=1)",
    )
    p.add_argument(
        "--usage-retention-days",
        type=float,
        help="purge usage records older than this many days, except those inside a budget's current "
        "window (also GATEWAY_USAGE_RETENTION_DAYS; default 0: keep them all)",
    )
    p.add_argument(
        "--no-usage-records",
        dest="usage_records",
        action="store_const",
        const=False,
        help="do not record usage per request (also GATEWAY_USAGE_RECORDS=0); budgets still apply",
    )
    p.add_argument(
        "--no-route-trace",
        dest="route_trace",
        action="store_const",
        const=False,
        help="leave the route trace (each attempt's backend, outcome and times) out of usage records (also "
        "GATEWAY_ROUTE_TRACE=0)",
    )
    p.add_argument(
        "--otel-endpoint",
        help="export OpenTelemetry traces (OTLP/HTTP, protobuf) to this URL, e.g. "
        "http://collector:4318/v1/traces (env GATEWAY_OTEL_ENDPOINT or "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; off)",
    )
    p.add_argument(
        "--otel-sample-ratio",
        type=float,
        help="share of requests without a sampled traceparent that are traced, 0..1 "
        "(env GATEWAY_OTEL_SAMPLE_RATIO; 1)",
    )
    p.add_argument(
        "--body-ring-slots",
        type=positive_int,
        help="4 KiB slots of each proxy worker's ring for logged bodies, a power of two (2048: 8 MiB); "
        "a body the ring has no room for is dropped and counted (env GATEWAY_BODY_RING_SLOTS)",
    )
    p.add_argument(
        "--recent-requests",
        type=int,
        help="finished requests the control worker keeps in memory for the admin API and UI (1000)",
    )
    p.add_argument(
        "--no-rate-limit-headers",
        dest="rate_limit_headers",
        action="store_const",
        const=False,
        help="leave the x-ratelimit-* headers off answers (also GATEWAY_RATE_LIMIT_HEADERS=0); the limits "
        "still apply, and a refusal still says when to retry",
    )
    p.add_argument(
        "--no-inject-stream-usage",
        dest="inject_stream_usage",
        action="store_const",
        const=False,
        help="never add stream_options.include_usage to streamed requests (their usage is then estimated)",
    )
    p.set_defaults(handler=_cmd_serve)

    s = sub.add_parser(
        "status",
        help="show this host's supervisor, workers and snapshot",
        description="What the gateway running on this --data-dir is doing: its supervisor, each worker "
        "(running, restarting or dead), the snapshot it serves and each backend's answers. Exit status 0 "
        "while it runs, 1 otherwise.",
    )
    add_common_options(s)
    s.add_argument("--json", action="store_true", help="print one JSON document (for scripts and monitoring)")
    s.set_defaults(handler=_cmd_status)


def _cmd_serve(args: argparse.Namespace) -> int:
    return serve(settings_from_args(args))


def _cmd_status(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    path = settings.run_dir / "supervisor.json"
    try:
        state = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        if args.json:
            print(orjson.dumps({"running": False, "run_dir": str(settings.run_dir)}).decode())
        else:
            print(f"no gateway state under {settings.run_dir}", file=sys.stderr)
        return 1
    doc = status_document(state)
    if args.json:
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        _print_status(doc)
    return 0 if doc["supervisor"]["running"] else 1


def _print_status(doc: dict[str, Any]) -> None:
    sup = doc["supervisor"]
    print(
        f"supervisor pid={sup['pid']} {'running' if sup['running'] else 'not running'} role={doc['role']}"
        f" listening={doc['listening']} admin_port={doc['admin_port'] or '-'}"
    )
    if sup["stopped_because"]:
        print(f"stopped because: {sup['stopped_because']}")
    snap = doc["snapshot"]
    if snap is not None and "error" in snap:
        print(f"snapshot: unreadable ({snap['error']})")
    elif snap is not None:
        print(
            f"snapshot generation={snap['generation']} published_at={snap['published_at']:.0f}"
            f" source={snap['source']}"
            + (f" last_answered={snap['last_answered']:.0f}" if snap["last_answered"] is not None else "")
        )
    for w in doc["workers"]:
        if w["status"] == "running":
            line = f"  {w['name']:<10} pid={w['pid']:<7} uptime={w['uptime']:>8}s restarts={w['restarts']}"
            if "in_flight" in w:
                line += f" in_flight={w['in_flight']} requests={w['requests']}"
            if "heartbeat_age" in w:
                line += f" heartbeat={w['heartbeat_age']:.1f}s ago"
        else:
            was = f" (was pid {w['last_pid']})" if w["last_pid"] else ""
            line = f"  {w['name']:<10} {w['status'].upper()}{was} restarts={w['restarts']}"
            if w["exit_codes"]:
                line += f" last_exit={w['exit_codes'][-1]}"
            if w["start_failure"]:
                line += f" start_failure={w['start_failure']!r}"
        print(line)
    for name, b in doc["backends"].items():
        print(
            f"  backend {name:<12} answered={b['answered']} failed={b['failed']} in_flight={b['in_flight']}"
            + (f" last_error={b['last_error']!r}" if b["last_error"] else "")
        )
