"""The gateway on this host: ``serve`` assembles the supervisor, its segments and its workers and runs it
(``gateway serve``); ``status_document`` says what a running one is doing (``gateway status``).

``serve`` checks the settings for the role, claims the ports, applies ``--config`` (or at least migrates
the store) before any worker forks, has ``gateway.shm.regions`` create the shared segments, starts the
control worker, waits for its first snapshot, then the proxy workers, and hands over to the
``Supervisor``.
I/O: the data directory (store, hash key, run state), shared-memory creation and reads, fork.
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import sys
import time
from dataclasses import replace
from typing import Any

import orjson

from gateway.config import Settings, load_hash_key
from gateway.errors import ConfigError
from gateway.shm.regions import RegionSizes, SharedRegions
from gateway.shm.snapshot_slot import (
    CONTROL_LOCAL,
    CONTROL_REACHABLE,
    CONTROL_STORE_DOWN,
    CONTROL_UNREACHABLE,
    SnapshotReader,
)
from gateway.shm.worker_stats import WorkerStats, sum_backends
from gateway.supervisor.port_claim import PortClaim, claim_port
from gateway.supervisor.process import Supervisor, WorkerSpec
from gateway.supervisor.sd_notify import Notifier

__all__ = ["serve", "snapshot_status", "status_document"]

log = logging.getLogger("gateway.supervisor")


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
    shared = SharedRegions.create(
        RegionSizes(
            workers=settings.workers,
            snapshot_bytes=settings.snapshot_segment_bytes,
            bucket_capacity=settings.bucket_capacity,
            ring_slots=settings.usage_ring_slots,
            body_slots=settings.body_ring_slots,
            prefix_entries=settings.prefix_index_entries,
        )
    )
    try:
        return _supervise(settings, shared, hash_key)
    finally:
        shared.close()


def _supervise(settings: Settings, shared: SharedRegions, hash_key: bytes) -> int:
    """Start the control worker, wait for its first snapshot, start the proxies, and run the supervisor
    until it drains."""
    specs = _worker_specs(settings, shared, hash_key)
    notifier = Notifier()
    stats_view = WorkerStats(shared.stats)
    reader = SnapshotReader(shared.snapshot)

    def every_worker_serves() -> bool:
        """Each proxy worker of the current generation has published its statistics, which it does from
        inside the running server; a control-role host is ready once a snapshot exists."""
        proxies = {s.pid for s in specs if s.kind == "proxy" and s.pid}
        if settings.role == "control":
            return reader.generation() > 0
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
        "segments": shared.ids(),
        "epoch": shared.epoch,
        "port": settings.port,
        "host": settings.host,
        "role": settings.role,
        "admin_port": settings.admin_port,
    }

    sup.spawn(specs[0])  # the control worker publishes the first snapshot before proxies take traffic
    # A proxy-role host with no last known snapshot waits less, and not at all once its control slot has
    # found the control plane unreachable: its proxies answer 503 until a snapshot arrives, which beats not
    # listening at all (and a later try of the control slot is as likely to succeed with them listening).
    wait = 10.0 if settings.role == "proxy" else 30.0
    deadline = time.monotonic() + wait
    unreachable = False
    while reader.generation() == 0 and time.monotonic() < deadline and sup.fatal is None:
        if settings.role == "proxy" and reader.control_state()[0] == CONTROL_UNREACHABLE:
            unreachable = True
            break
        sup.poll()  # a control worker that fails at start is restarted, or stops the gateway, meanwhile
        time.sleep(0.02)
    if sup.fatal is not None:
        sup.drain()
        return 1
    if reader.generation() == 0 and settings.role != "control":
        why = "the control plane is unreachable" if unreachable else f"no snapshot within {wait:.0f} s"
        log.error("%s and no snapshot is known; starting proxies anyway (they answer 503 until one is)", why)
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
    return sup.run()


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
    stats: dict[int, dict[str, Any]] = {}
    ids = state.get("segments") or {}
    if alive and "snapshot" in ids and "stats" in ids:
        # Only the two it reads: attaching the usage rings would count as a process still writing them.
        try:
            shared = SharedRegions.attach({"snapshot": ids["snapshot"], "stats": ids["stats"]})
        except Exception as exc:  # the segments went with a supervisor that is exiting
            doc["snapshot"] = {"error": str(exc)}
        else:
            try:
                doc["snapshot"] = snapshot_status(SnapshotReader(shared.snapshot))
                stats = _worker_stats(WorkerStats(shared.stats))
            finally:
                shared.close()
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


_SOURCES = {
    CONTROL_LOCAL: "local store",
    CONTROL_REACHABLE: "control plane answering",
    CONTROL_UNREACHABLE: "control plane unreachable",
    CONTROL_STORE_DOWN: "local store unreachable (serving the last-known-good)",
}


def snapshot_status(reader: SnapshotReader) -> dict[str, Any]:
    """Where the host's snapshot comes from, as ``gateway status`` shows it."""
    control, seen = reader.control_state()
    return {
        "generation": reader.generation(),
        "published_at": reader.published_at(),
        "source": _SOURCES.get(control, f"unknown ({control})"),
        "last_answered": seen if control != CONTROL_LOCAL and seen else None,
    }


def _worker_stats(view: WorkerStats) -> dict[int, dict[str, Any]]:
    """Each proxy worker's last statistics document, by pid."""
    now = time.monotonic()
    out = {}
    for slot, doc in view.documents():
        pid = int(doc.get("pid", 0))
        beat = view.last_beat(slot, pid)  # CLOCK_MONOTONIC is one clock for every process of the host
        out[pid] = {**doc, "heartbeat_age": None if beat is None else max(0.0, now - beat)}
    return out


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
