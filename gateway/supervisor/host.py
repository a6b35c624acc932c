"""The gateway on this host: ``serve`` assembles the supervisor, its segments and its workers and runs it
(``gateway serve``); ``status_document`` says what a running one is doing (``gateway status``).

``serve`` checks the settings for the role, claims the ports, applies ``--config`` (or at least migrates
the store) before any worker forks, creates the shared segments, starts the control worker, waits for
its first snapshot, then the proxy workers, and hands over to the ``Supervisor``.
I/O: the data directory (store, hash key, run state), shared-memory creation and reads, fork.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import ssl
import sys
import time
from dataclasses import replace
from typing import Any

import orjson

from gateway.config import Settings, load_hash_key
from gateway.dataplane.limits import HOLD_WORDS
from gateway.errors import ConfigError
from gateway.native import BucketTable, SpanRing, UsageRing, region_size, ring_region_size
from gateway.shm.segment import Segment, SharedRegions
from gateway.shm.snapshot_slot import HEADER_BYTES, SnapshotReader
from gateway.shm.worker_stats import WorkerStats, sum_backends
from gateway.shm.worker_stats import region_bytes as stats_region_bytes
from gateway.supervisor.port_claim import PortClaim, claim_port
from gateway.supervisor.process import Supervisor, WorkerSpec
from gateway.supervisor.sd_notify import Notifier

__all__ = ["RING_SLOT_BYTES", "serve", "status_document"]

log = logging.getLogger("gateway.supervisor")

RING_SLOT_BYTES = 1024  # a usage record is a few hundred bytes; names are at most 200 characters
# Body logs span slots: 4 KiB each keeps a short chat in one or two, and the memory a body ring maps is
# only touched once bodies are logged.
BODY_SLOT_BYTES = 4096


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


def serve(settings: Settings) -> int:
    """Run the gateway in the foreground until SIGTERM or SIGINT, which drain it; returns the exit status.
    Raises ``ConfigError`` for settings that cannot work (before anything is started)."""
    checked = _check_role(settings)
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

    slots = settings.body_ring_slots
    if slots < 2 or slots & (slots - 1) or slots > 1 << 20:
        raise ConfigError(f"--body-ring-slots must be a power of two from 2 to {1 << 20}, not {slots}")
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
    # Made whether or not any [[body_logs]] entry exists yet: one may be applied while the host runs, and
    # pages of the segment nobody writes take no memory.
    body_rings = Segment.create(ring_region_size(workers, settings.body_ring_slots, BODY_SLOT_BYTES))
    SpanRing.create_layout(body_rings.buf, workers, settings.body_ring_slots, BODY_SLOT_BYTES).close()
    epoch = secrets.token_hex(8)
    shared = SharedRegions(
        segment.buf,
        buckets.buf,
        rings.buf,
        holdings.buf,
        stats.buf,
        epoch,
        usage_attached=rings.attached,
        bodies=body_rings.buf,
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
        "body_segment": body_rings.id,
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
        body_rings.close()


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
