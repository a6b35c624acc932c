"""Health of the hosts of a cluster: what each host reports about itself, and the control plane's view.

A host's report (``host_report``) gathers, without touching the request path: its role and listen
address, the supervisor's state file (workers, pids, restarts), each proxy worker's statistics slot
(requests in flight, backends' answers and failures, the snapshot revision it serves), how much usage
is waiting to leave the host, and how many logged bodies its rings had no room for. Proxy-role hosts
send theirs every ``--report-interval`` seconds (10) to ``POST /cluster/report``; a control plane keeps
the reports it received for ``TTL`` seconds and answers ``GET /admin/fleet`` with them plus its own
host's. Reports live in the memory of the control plane that
received them. A host is named by its id (``host_id``): ``--host-id``, or one generated at its first
start and kept in ``DATA_DIR/host-id``, so that two hosts on one machine (or containers sharing the host's
network) are two fleet entries, each counted for rate-limit shares.
I/O: the host's run-state file and its host-id file; shared memory reads.
"""

from __future__ import annotations

import heapq
import os
import secrets
import socket
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from gateway.config import Settings
from gateway.controlplane.fleet.shares import Grant, ShareLedger
from gateway.controlplane.fleet.traffic import RecentTraffic, traffic_window
from gateway.native import BucketTable, PrefixIndex, SpanRing, UsageRing
from gateway.shm.bucket_keys import backend_keys
from gateway.shm.regions import SharedRegions
from gateway.shm.worker_stats import WorkerStats, backend_totals, sum_backends

__all__ = ["SILENCE", "TTL", "Fleet", "host_id", "host_report", "traffic_totals"]

TTL = 30.0
# No report from any host for longer than this (one and a half of the proxies' 10 s report intervals) is
# taken for the control plane's own outage: see ``Fleet``.
SILENCE = 15.0


def host_id(settings: Settings) -> str:
    """This host's id in the fleet: ``--host-id`` when given, else the one kept in ``DATA_DIR/host-id``
    (made at the first start: the machine's name and 8 random hex digits)."""
    return settings.host_id or _kept_host_id(settings.data_dir)


@cache
def _kept_host_id(data_dir: Path) -> str:
    path = data_dir / "host-id"
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    made = f"{socket.gethostname()}-{secrets.token_hex(4)}"
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process of this host made it first: take that one
        return path.read_text().strip() or made
    try:
        os.write(fd, made.encode() + b"\n")
    finally:
        os.close(fd)
    return made


def host_report(
    settings: Settings, shared: SharedRegions, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    try:
        state = orjson.loads((settings.run_dir / "supervisor.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        state = {}
    stats = WorkerStats(shared.stats)
    documents = stats.documents()
    workers = [
        {k: v for k, v in doc.items() if k not in ("backends", "traffic", "live", "credentials")}
        | {"index": index}
        for index, doc in documents
    ]
    backends = sum_backends([doc for _, doc in documents])
    with BucketTable(shared.buckets) as table:
        _add_engines(stats, backends, table)
    ring = UsageRing(shared.usage)
    try:
        pending = sum(ring.pending(i) for i in range(ring.rings))
    finally:
        ring.close()
    segments: dict[str, Any] = {}
    if shared.prefix is not None:
        with PrefixIndex(shared.prefix) as index:
            segments["prefix_index"] = index.stats()._asdict() | {"entries": index.entries}
    if shared.bodies is not None:
        with SpanRing(shared.bodies) as bodies:
            segments["body_logs"] = {
                "dropped": sum(bodies.dropped(i) for i in range(bodies.rings)),
                "pending_slots": sum(bodies.pending(i) for i in range(bodies.rings)),
            }
    return {
        "host": host_id(settings),
        "hostname": socket.gethostname(),
        "role": settings.role,
        "listen": f"{settings.host}:{settings.port}",
        "pid": os.getpid(),
        "reported_at": time.time(),
        "supervisor": {
            "pid": state.get("supervisor_pid"),
            "workers": [
                {k: w.get(k) for k in ("name", "kind", "pid", "uptime", "restarts")}
                for w in state.get("workers", [])
            ],
        },
        "proxy_workers": workers,
        "in_flight": sum(w.get("in_flight", 0) for w in workers),
        "backends": backends,
        "credentials": sum_credentials([doc for _, doc in documents]),
        "usage_pending": pending + sum(w.get("usage_backlog", 0) for w in workers),
        **segments,
        **(extra or {}),
    }


# The state a host shows for a credential when its workers disagree: the worst any of them saw.
_SEVERITY = {"ok": 0, "cooling": 1, "disabled": 2}


def sum_credentials(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each pool credential (``backend/name``) over the host's workers: answers and failures summed, the
    worst state any worker holds it in (a key one worker saw refused is disabled there and soon in all),
    the longest cool-down and the latest error."""
    out: dict[str, dict[str, Any]] = {}
    for doc in documents:
        for name, c in (doc.get("credentials") or {}).items():
            entry = out.setdefault(
                name,
                {
                    "state": "ok",
                    "answered": 0,
                    "failed": 0,
                    "cooling_for": None,
                    "last_error": None,
                    "last_error_at": None,
                },
            )
            entry["answered"] += c.get("answered", 0)
            entry["failed"] += c.get("failed", 0)
            if _SEVERITY.get(c.get("state"), 0) > _SEVERITY[entry["state"]]:
                entry["state"] = c["state"]
            if c.get("cooling_for") is not None:
                entry["cooling_for"] = max(entry["cooling_for"] or 0.0, c["cooling_for"])
            if (c.get("last_error_at") or 0) > (entry["last_error_at"] or 0):
                entry["last_error"], entry["last_error_at"] = c["last_error"], c["last_error_at"]
    return out


def _add_engines(stats: WorkerStats, backends: dict[str, dict[str, Any]], table: BucketTable) -> None:
    """Each backend's engine figures and gate from the scraper's document and the shared gauges:
    ``"engine": {"kind", "waiting", "running", "host_in_flight", "kv_cache"}`` (None without engine
    metrics), ``"gate": {"ceiling", "in_flight", "queued"}`` (None without a gate), ``"healthy"`` and
    ``"probe_error"``."""
    raw = stats.read(stats.engine_slot)
    lines = orjson.loads(raw).get("backends", {}) if raw else {}
    for name, line in lines.items():
        entry = backends.get(name) or backends.setdefault(name, backend_totals())
        entry["engine"] = (
            {k: line.get(k) for k in ("kind", "waiting", "running", "host_in_flight", "kv_cache")}
            if line.get("kind")
            else None
        )
        in_flight_key, queue_key = backend_keys(name)
        entry["gate"] = (
            {
                "ceiling": line["ceiling"],
                "in_flight": table.gauge(in_flight_key),
                "queued": table.gauge(queue_key),
            }
            if line.get("ceiling") is not None
            else None
        )
        entry["healthy"] = line.get("healthy") is not False
        entry["probe_error"] = line.get("error")
        if line.get("kv_events"):  # the host's subscription to the engine's KV events (fleet.kv_events)
            entry["kv_events"] = line["kv_events"]


def traffic_totals(shared: SharedRegions) -> dict[tuple[int, int], dict[str, int]]:
    """Each proxy worker's requests admitted per rate-limit scope since it started, by (slot, pid)."""
    return {
        (index, int(doc.get("pid", 0))): doc.get("traffic", {})
        for index, doc in WorkerStats(shared.stats).documents()
    }


class Fleet:
    """The reports a control plane received, each kept ``TTL`` seconds, and the rate-limit shares they
    imply for proxy-role hosts (``gateway.controlplane.fleet.shares``). Thread-safe: reports arrive on the
    event loop, the admin API reads the view on its own threads.

    Hosts are forgotten, and their shares given back, by *heard time*: the clock runs as usual while
    reports arrive, but a stretch in which no host at all reported for longer than ``SILENCE`` counts as
    ``SILENCE`` only. Such a stretch is this control plane's own outage or a network cut in front of it,
    not every host dying at once, and the hosts kept enforcing their grants through it: the first host to
    report afterwards must not be handed the shares of the others, which have not had their turn yet.

    A report costs the reporting host's scopes, not the number of hosts: the traffic totals and the held
    shares are kept summed per scope (``fleet.traffic``, ``fleet.holdings``), and the hosts are found
    for forgetting in the order they were heard (a heap), not by visiting them all."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._reports: dict[str, tuple[float, dict[str, Any]]] = {}  # host: (heard time, report)
        # (heard time, host) of every report kept: a host's entry before its latest is passed over.
        self._due: list[tuple[float, str]] = []
        self._proxies: set[str] = set()  # the hosts whose latest report says they are proxy hosts
        self._seen_at: dict[str, float] = {}  # host: the clock's time of its last report (for ages)
        self.traffic = RecentTraffic()
        self._last_report: float = clock()
        self._heard: float = self._last_report
        # Two TTLs: a host cut off from the control plane keeps its grant for a TTL, then its default,
        # which the ledger counts for a TTL more (``ShareLedger.forget``).
        self.ledger = ShareLedger(self._heard, warmup=2 * TTL, linger=TTL)

    def heard_time(self, now: float) -> float:
        """The heard-time clock at ``now`` (reading it moves nothing)."""
        return self._heard + min(now - self._last_report, SILENCE)

    def record(self, report: dict[str, Any]) -> dict[str, Any]:
        """Keep a report; returns the reporting host's shares: ``{"shares": {scope: share},
        "default_share": x, "hosts": n}``. Raises BadRequest for a report whose traffic is not counts,
        before anything is kept."""
        with self._lock:
            return self._record(report)

    def _record(self, report: dict[str, Any]) -> dict[str, Any]:
        host = str(report.get("host") or "unknown")
        window = traffic_window(report.get("traffic"))
        proxy = report.get("role") == "proxy"
        real: float = self._clock()
        now = self._heard = self.heard_time(real)
        self._last_report = real
        self._reports[host] = (now, report)
        heapq.heappush(self._due, (now, host))
        self._seen_at[host] = real
        self._count(host, proxy)
        self.traffic.record(host, window)
        self._expire(now)  # the expired stop counting as hosts
        hosts = len(self._proxies)
        if not proxy:
            return {"shares": {}, "default_share": 1.0, "hosts": hosts}
        held = report.get("held")
        granted = self.ledger.grant(
            host,
            hosts,
            self.traffic.targets(host, 1.0 / hosts),
            self.traffic.busy,
            now,
            claim=Grant.from_claim(held),
        )
        return {"shares": granted.shares, "default_share": granted.default, "hosts": hosts}

    def _count(self, host: str, proxy: bool) -> None:
        if proxy:
            self._proxies.add(host)
        else:
            self._proxies.discard(host)
        self.traffic.count(host, proxy)
        self.ledger.count(host, proxy)

    def _expire(self, now: float) -> None:
        while self._due and now - self._due[0][0] > TTL:
            at, host = heapq.heappop(self._due)
            kept = self._reports.get(host)
            if kept is None or kept[0] != at:
                continue  # heard again since
            del self._reports[host]
            self._seen_at.pop(host, None)
            self._count(host, False)
            self.traffic.forget(host)
            self.ledger.forget(host, now)

    def view(self) -> list[dict[str, Any]]:
        with self._lock:
            real: float = self._clock()
            self._expire(self.heard_time(real))
            return [
                dict(report, age_s=round(real - self._seen_at.get(host, real), 1))
                for host, (_, report) in self._reports.items()
            ]
