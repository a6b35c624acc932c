"""``gateway serve`` and ``gateway status``: assemble the supervisor, its segments and its workers.

I/O: the data directory (store, hash key, run state), shared-memory creation, fork.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import ssl
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from gateway.cli import add_common_options, add_edge_options, port_number, positive_int, settings_from_args
from gateway.config import Settings, load_hash_key
from gateway.dataplane.limits import HOLD_WORDS
from gateway.errors import ConfigError
from gateway.native import BucketTable, UsageRing, region_size, ring_region_size
from gateway.shm.segment import Segment, SharedRegions
from gateway.shm.snapshot_slot import HEADER_BYTES, SnapshotReader
from gateway.shm.worker_stats import WorkerStats, sum_backends
from gateway.shm.worker_stats import region_bytes as stats_region_bytes
from gateway.supervisor.port_claim import PortClaim, claim_port
from gateway.supervisor.process import Supervisor, WorkerSpec
from gateway.supervisor.sd_notify import Notifier

__all__ = ["register"]

log = logging.getLogger("gateway.supervisor")

RING_SLOT_BYTES = 1024  # a usage record is a few hundred bytes; names are at most 200 characters


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
    p.set_defaults(handler=run_serve)

    s = sub.add_parser(
        "status",
        help="show this host's supervisor, workers and snapshot",
        description="What the gateway running on this --data-dir is doing: its supervisor, each worker "
        "(running, restarting or dead), the snapshot it serves and each backend's answers. Exit status 0 "
        "while it runs, 1 otherwise.",
    )
    add_common_options(s)
    s.add_argument("--json", action="store_true", help="print one JSON document (for scripts and monitoring)")
    s.set_defaults(handler=run_status)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, pid, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def _configure_logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
        )
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    # One line per request the control slot makes (engine scrapes every 2 s, snapshot polls) is noise.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


def _check_role(settings: Settings) -> Settings | str:
    """Settings completed for the role, or what is wrong with them."""
    if settings.role == "control" and settings.admin_port is None:
        settings = replace(settings, admin_port=8081)
    if (settings.admin_tls_cert is None) != (settings.admin_tls_key is None):
        return "--admin-tls-cert and --admin-tls-key go together"
    if settings.admin_tls_cert is not None and settings.admin_tls_key is not None:
        try:  # here, once, rather than in each start of the control worker
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                settings.admin_tls_cert, settings.admin_tls_key
            )
        except (OSError, ssl.SSLError) as exc:
            cert, key = settings.admin_tls_cert, settings.admin_tls_key
            return f"--admin-tls-cert {cert} with --admin-tls-key {key}: {exc.strerror or exc}"
    if not 0.0 <= settings.otel_sample_ratio <= 1.0:
        return f"--otel-sample-ratio {settings.otel_sample_ratio} must be between 0 and 1"
    if settings.otel_endpoint and not settings.otel_endpoint.startswith(("http://", "https://")):
        return f"--otel-endpoint {settings.otel_endpoint}: an http:// or https:// URL (OTLP/HTTP, protobuf)"
    if settings.recent_requests < 0:
        return f"--recent-requests {settings.recent_requests} must be 0 or more"
    if settings.role == "proxy":
        if not settings.control_url:
            return "--role proxy needs --control-url, the control plane's admin URL"
        if settings.config_file is not None:
            return "--role proxy takes its configuration from the control plane, not --config"
        if not os.environ.get("GATEWAY_CLUSTER_TOKEN"):
            return "--role proxy needs GATEWAY_CLUSTER_TOKEN (the control plane's cluster token)"
        if not os.environ.get("GATEWAY_HASH_KEY"):
            return "--role proxy needs GATEWAY_HASH_KEY, the same on every host of the cluster"
    return settings


def run_serve(args: argparse.Namespace) -> int:
    checked = _check_role(settings_from_args(args))
    if isinstance(checked, str):
        raise ConfigError(checked)
    settings = checked
    _configure_logging(settings.log_level, settings.log_format)
    # Before anything else, so that a taken port is one line and exit status 2, not a worker crash loop.
    claims = _claim_ports(settings)
    try:
        return _serve(settings)
    finally:
        for claim in claims:
            claim.close()


def _claim_ports(settings: Settings) -> list[PortClaim]:
    claims: list[PortClaim] = []
    try:
        if settings.role != "control":
            claims.append(claim_port(settings.host, settings.port, "the proxy port"))
        if settings.role != "proxy" and settings.admin_port is not None:
            if settings.admin_port == settings.port and settings.role != "control":
                raise ConfigError(f"--admin-port {settings.admin_port} is also the proxy port --port")
            claims.append(claim_port(settings.admin_host, settings.admin_port, "the admin port"))
    except BaseException:
        for claim in claims:
            claim.close()
        raise
    return claims


def _serve(settings: Settings) -> int:
    from gateway.controlplane.config.apply import CONFIG_PENDING, apply_file
    from gateway.controlplane.config.parser import load_config
    from gateway.controlplane.store import StoreError, is_postgres_url, open_store
    from gateway.errors import ConfigError

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        hash_key = load_hash_key(settings.data_dir)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if settings.role != "proxy":  # a proxy-role host has no store: its control plane has
        try:
            if settings.config_file is not None:
                load_config(settings.config_file)  # a bad file fails the start, database or not
                revision = apply_file(settings, settings.config_file)
                log.info("applied %s as revision %d", settings.config_file, revision)
            else:
                open_store(settings).close()  # migrations run once, here, before any worker forks
        except StoreError as exc:
            # PostgreSQL away at start: the control worker serves its last-known-good snapshot and
            # retries; it applies the file once the database answers (a restart loop helps nobody).
            if isinstance(exc, ConfigError) or not is_postgres_url(settings.database_url):
                raise
            log.error("database unreachable at start, starting degraded: %s", exc.message)
            if settings.config_file is not None:
                (settings.run_dir / CONFIG_PENDING).touch()

    Supervisor.block_signals()
    segment = Segment.create(HEADER_BYTES + 2 * settings.snapshot_segment_bytes)
    buckets = Segment.create(region_size(settings.bucket_capacity))
    BucketTable.create_layout(buckets.buf, settings.bucket_capacity).close()
    workers = max(1, settings.workers)
    rings = Segment.create(ring_region_size(workers, settings.usage_ring_slots, RING_SLOT_BYTES))
    UsageRing.create_layout(rings.buf, workers, settings.usage_ring_slots, RING_SLOT_BYTES).close()
    # Names this bucket table's lifetime in budget keys: spend counted live by an earlier table (before a
    # restart) or by another host is then never mistaken for this one's.
    holdings = Segment.create(workers * HOLD_WORDS * 8)
    stats = Segment.create(stats_region_bytes(workers))
    epoch = secrets.token_hex(8)
    shared = SharedRegions(
        segment.buf, buckets.buf, rings.buf, holdings.buf, stats.buf, epoch, usage_attached=rings.attached
    )
    specs = _worker_specs(settings, shared, hash_key)
    notifier = Notifier()
    stats_view = WorkerStats(stats.buf)

    def every_worker_serves() -> bool:
        """Each proxy worker of the current generation has published its statistics, which it does from
        inside the running server; a control-role host is ready once a snapshot exists."""
        proxies = {s.pid for s in specs if s.kind == "proxy" and s.pid}
        if settings.role == "control":
            return SnapshotReader(segment.buf).generation() > 0
        seen = {doc.get("pid") for _, doc in stats_view.documents()}
        return bool(proxies) and proxies <= seen

    def came_up(spec: WorkerSpec, pid: int) -> bool:
        """A proxy worker came up once it published statistics from inside its running server (its slot
        keeps them after it exits); for the control worker the supervisor goes by how long it lived."""
        return spec.kind == "proxy" and any(doc.get("pid") == pid for _, doc in stats_view.documents())

    sup = Supervisor(
        specs,
        grace_period=settings.grace_period,
        state_file=settings.run_dir / "supervisor.json",
        notify=notifier,
        ready=every_worker_serves,
        watchdog_s=notifier.watchdog_s,
        came_up=came_up,
        heartbeat=stats_view.last_beat,
        heartbeat_timeout=settings.heartbeat_timeout,
    )
    sup.on_reload = lambda: sup.signal_kind("control", signal.SIGHUP)
    sup.extra_state = {
        "snapshot_segment": segment.id,
        "bucket_segment": buckets.id,
        "usage_segment": rings.id,
        "stats_segment": stats.id,
        "epoch": epoch,
        "port": settings.port,
        "host": settings.host,
        "role": settings.role,
        "admin_port": settings.admin_port,
    }

    sup.spawn(specs[0])  # the control worker publishes the first snapshot before proxies take traffic
    reader = SnapshotReader(segment.buf)
    # A proxy-role host with no last known snapshot and no control plane waits less: its proxies answer
    # 503 until a snapshot arrives, which beats not listening at all.
    wait = 10.0 if settings.role == "proxy" else 30.0
    deadline = time.monotonic() + wait
    while reader.generation() == 0 and time.monotonic() < deadline and sup.fatal is None:
        sup.poll()  # a control worker that fails at start is restarted, or stops the gateway, meanwhile
        time.sleep(0.02)
    if sup.fatal is not None:
        sup.drain()
        return 1
    if reader.generation() == 0 and settings.role != "control":
        log.error("no snapshot within %.0f s; starting proxies anyway (they answer 503 until one is)", wait)
    if settings.role == "control":
        log.info("control plane only; admin port on %s:%s", settings.admin_host, settings.admin_port)
    else:
        log.info(
            "listening on http://%s:%d with %d proxy workers (role %s)",
            settings.host,
            settings.port,
            settings.workers,
            settings.role,
        )
    try:
        return sup.run()
    finally:
        segment.close()
        buckets.close()
        rings.close()
        holdings.close()
        stats.close()


def _worker_specs(settings: Settings, shared: SharedRegions, hash_key: bytes) -> list[WorkerSpec]:
    from gateway.controlplane.fleet.remote import run_remote_control_worker
    from gateway.controlplane.worker import run_control_worker
    from gateway.dataplane.worker import run_proxy_worker

    # The control slot is drained last whatever it runs, so the proxies' last usage records still go out.
    if settings.role == "proxy":
        specs = [WorkerSpec("control", "control", lambda: run_remote_control_worker(settings, shared))]
    else:
        specs = [WorkerSpec("control", "control", lambda: run_control_worker(settings, shared))]
    if settings.role == "control":
        return specs
    for i in range(max(1, settings.workers)):
        specs.append(
            WorkerSpec(
                f"proxy-{i + 1}",
                "proxy",
                # i is bound now: each worker owns usage ring i, and a respawned one continues it.
                lambda i=i: run_proxy_worker(settings, shared, i, hash_key),  # type: ignore[misc]
                heartbeat_slot=i,  # and statistics slot i, where it stamps its heartbeat
            )
        )
    return specs


def run_status(args: argparse.Namespace) -> int:
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


def status_document(state: dict[str, Any]) -> dict[str, Any]:
    """What ``gateway status`` shows, from the supervisor's state file and the live shared segments.

    A worker is ``running`` only if its process exists; the state file of a supervisor that was killed
    still lists the pids and uptimes it last wrote, which then say ``dead``. A worker between two lives
    (pid 0 while the supervisor runs) is ``restarting``, or ``stopped`` once the supervisor drains."""
    pid = int(state.get("supervisor_pid", 0))
    alive = _pid_alive(pid)
    doc: dict[str, Any] = {
        "supervisor": {
            "pid": pid,
            "running": alive,
            "stopping": bool(state.get("stopping")),
            "stopped_because": state.get("fatal"),
        },
        "role": state.get("role", "all"),
        "listening": f"{state.get('host')}:{state.get('port')}",
        "admin_port": state.get("admin_port"),
        "snapshot": None,
        "workers": [],
        "backends": {},
    }
    if alive and state.get("snapshot_segment") is not None:
        try:
            seg = Segment.attach(int(state["snapshot_segment"]))
        except Exception as exc:  # the segment went with a supervisor that is exiting
            doc["snapshot"] = {"error": str(exc)}
        else:
            try:
                reader = SnapshotReader(seg.buf)
                control, seen = reader.control_state()
                doc["snapshot"] = {
                    "generation": reader.generation(),
                    "published_at": reader.published_at(),
                    "source": {
                        0: "local store",
                        1: "control plane answering",
                        2: "control plane unreachable",
                    }[control],
                    "last_answered": seen if control else None,
                }
            finally:
                seg.close()
    stats = _worker_stats(state) if alive else {}
    for w in state.get("workers", []):
        wpid = int(w.get("pid") or 0)
        if wpid and alive and _pid_alive(wpid):
            status = "running"
        elif wpid:
            status = "dead"
        elif alive and not state.get("stopping") and not state.get("fatal"):
            status = "restarting"
        else:
            status = "stopped"
        entry: dict[str, Any] = {
            "name": w["name"],
            "kind": w.get("kind"),
            "status": status,
            "pid": wpid if status == "running" else None,
            "last_pid": wpid or None,
            "uptime": w.get("uptime") if status == "running" else None,
            "restarts": w.get("restarts", 0),
            "exit_codes": w.get("exit_codes", []),
            "start_failure": w.get("start_failure"),
        }
        live = stats.get(wpid) if status == "running" else None
        if live is not None:
            entry["in_flight"] = live.get("in_flight", 0)
            entry["requests"] = live.get("requests", 0)
            if live.get("heartbeat_age") is not None:  # proxy workers: what the supervisor judges them by
                entry["heartbeat_age"] = round(live["heartbeat_age"], 1)
        doc["workers"].append(entry)
    doc["backends"] = dict(sorted(sum_backends(list(stats.values())).items()))
    return doc


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


def _worker_stats(state: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each proxy worker's last statistics document, by pid (empty when the segment is gone)."""
    if state.get("stats_segment") is None:
        return {}
    try:
        seg = Segment.attach(int(state["stats_segment"]))
    except Exception:
        return {}
    try:
        view, now = WorkerStats(seg.buf), time.monotonic()
        out = {}
        for slot, doc in view.documents():
            pid = int(doc.get("pid", 0))
            beat = view.last_beat(slot, pid)  # CLOCK_MONOTONIC is one clock for every process of the host
            out[pid] = {**doc, "heartbeat_age": None if beat is None else max(0.0, now - beat)}
        return out
    finally:
        seg.close()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
