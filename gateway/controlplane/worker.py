"""Entry point of the forked control-plane worker: keeps the published snapshot equal to the store, and
moves the proxy workers' usage records into it.

It polls the store's config revision (cheap) and, when it moved, builds a snapshot and publishes it into
the shared segment. SIGHUP re-applies the config file given to ``gateway serve --config`` first. A bad
config file is logged and the current snapshot kept: a reload never takes the data plane down. Every
``usage_drain_interval`` it drains the usage rings into the store and keeps the budgets' base spend
current (``UsageSink``); a database that is down only delays that, the rings and the workers' backlogs
hold the records meanwhile, and while the store fails (a full disk too) the snapshot segment's header
says so, for the proxies' ``/healthz``. On SIGTERM (which the supervisor sends after the proxies have
stopped) it drains the rings one last time; a SIGTERM that comes from the kernel because the supervisor
died (``kill -9``) finds the proxies still finishing requests, so it drains until they have all gone.
With an admin port (``--admin-port``, always with ``--role control``) it also serves the cluster API to
proxy-role hosts (``api.cluster``): the snapshot it built, and their usage records, which go through the
same sink as the local rings' so that budgets count them.

When PostgreSQL cannot be reached at start the worker does not exit (under systemd that would be a
restart loop): it publishes its last-known-good snapshot (``DATA_DIR/last-known-good.sealed``, rewritten
after every publish, sealed with the secrets key since it holds backend credentials), reports the store
as down on ``/healthz`` and in the fleet view, and retries with backoff (0.5 s doubling to 10 s). Once
the database answers it applies the config file the supervisor could not (``run/config-pending``) and
publishes as usual. It also purges usage records past ``--usage-retention-days`` (``usage.retention``),
and drains the proxy workers' body-log rings into the store, redacted, purging logged bodies past their
entry's retention (``bodies``).
I/O: the store (SQLite file or PostgreSQL), the config file on SIGHUP, the data directory, the shared
segments.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from granian.constants import Interfaces, SSLProtocols
from granian.server.embed import Server

from gateway.budget import Budget
from gateway.config import Settings, load_hash_key
from gateway.controlplane.api.admin import AdminApi
from gateway.controlplane.api.cluster import ClusterApp
from gateway.controlplane.bodies.retention import BodyPurger
from gateway.controlplane.bodies.rules import BodyRules
from gateway.controlplane.bodies.sink import BodySink
from gateway.controlplane.bodies.stored import StoredBodies
from gateway.controlplane.config.apply import CONFIG_PENDING, apply_file
from gateway.controlplane.fleet.engines import EngineScraper, host_load
from gateway.controlplane.fleet.reports import Fleet, host_report
from gateway.controlplane.snapshot_build import build_snapshot_doc
from gateway.controlplane.store import Store, StoreError, open_store, store_vault, unavailable_store
from gateway.controlplane.store._usage import RejectedRecord
from gateway.controlplane.usage import budget_alerts
from gateway.controlplane.usage.otel import OtelExporter
from gateway.controlplane.usage.requests_view import FlightRecorder, live_requests
from gateway.controlplane.usage.retention import Purger
from gateway.controlplane.usage.sink import UsageSink
from gateway.errors import CredentialError, GatewayError
from gateway.native import BucketTable, SpanRing, UsageRing
from gateway.routing.load import StaticLoad
from gateway.shm.regions import SharedRegions
from gateway.shm.snapshot_slot import CONTROL_LOCAL, CONTROL_STORE_DOWN, PublishRefused, SnapshotPublisher
from gateway.shm.worker_stats import WorkerStats
from gateway.snapshot import Snapshot
from gateway.usage_record import UsageRecord

__all__ = ["ControlWorker", "run_control_worker"]

log = logging.getLogger("gateway.controlplane")


FINAL_DRAIN_SECONDS = 10.0
STORE_BACKOFF_MAX = 1.0  # seconds between a failing step's tries (each a pool wait on the store thread)
LAST_KNOWN_GOOD = "last-known-good.sealed"


@dataclass(slots=True)
class _Outage:
    """A loop step failing on the store: when to try it again."""

    retry_at: float = 0.0
    backoff: float = 0.5


def _write_stdout(lines: bytes) -> None:
    """Access-log lines: written whole, once per drained batch (journald keeps the lines apart)."""
    try:
        os.write(1, lines)
    except OSError as exc:
        log.error("access log not written: %s", exc)


def run_control_worker(settings: Settings, shared: SharedRegions) -> int:
    return asyncio.run(ControlWorker(settings, shared).run())


class ControlWorker:
    def __init__(self, settings: Settings, shared: SharedRegions) -> None:
        self.settings = settings
        self.shared = shared
        self.publisher = SnapshotPublisher(shared.snapshot)
        self.sink: UsageSink | None = None
        self.body_rules = BodyRules()  # the redaction of each [[body_logs]] entry this worker has built
        self.bodies: BodySink | None = None
        self.body_purger: BodyPurger | None = None
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._changed = asyncio.Event()
        self.fleet = Fleet()
        self._outages: dict[str, _Outage] = {}  # by step: the loop's steps that fail on the store
        self._webhook_tasks: set[asyncio.Task[None]] = set()
        self._webhook_client: httpx.AsyncClient | None = None
        # Set by run(): code on the store thread hands loop work (the alert webhook) to it.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._current: tuple[int, bytes] | None = None  # (revision, document) last built
        self._doc: dict[str, Any] | None = None
        self.store: Store
        self.hash_key = b""
        self._store_down_since: float | None = None  # set while the store has not been reached
        self._store_error = ""
        self.purger: Purger | None = None
        self._from_last_known_good = False  # rebuild from the store once reached, whatever the revision
        self._parent = os.getppid()
        # Every call that touches the store or the usage sink runs on this one thread, never on the event
        # loop: with PostgreSQL away a call waits for the pool's timeout, and the loop must meanwhile go on
        # answering snapshot polls and reports from memory. One thread, so that the sink's drains, writes
        # and base recomputations stay in one sequence (see usage.sink).
        self.store_calls: Executor = ThreadPoolExecutor(1, thread_name_prefix="store")
        # Admin API requests (store reads and writes, each its own transaction) run beside it.
        self.admin_calls: Executor = ThreadPoolExecutor(4, thread_name_prefix="admin")

    async def run(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        settings = self.settings
        self.publisher.set_store_state(False)  # an earlier control worker's outage is its own to say
        self.hash_key = load_hash_key(settings.data_dir)
        store = self.store = self._open_store()
        self.sink = UsageSink(
            store,
            UsageRing(self.shared.usage),
            BucketTable(self.shared.buckets),
            self.shared.epoch,
            refresh_interval=settings.budget_refresh_interval,
            recent=settings.recent_requests,
        )
        if self.shared.bodies is not None:
            self.bodies = BodySink(store, SpanRing(self.shared.bodies), self.body_rules)
        if settings.access_log:
            self.sink.access_log = _write_stdout
        export_task = None
        if settings.otel_endpoint:
            exporter = OtelExporter(settings.otel_endpoint, settings.otel_service_name, settings.otel_queue)
            self.sink.exporter = exporter
            export_task = loop.create_task(exporter.run())
            log.info("exporting OpenTelemetry traces to %s", settings.otel_endpoint)
        server = self._start_admin_server()
        scraper = None
        if settings.role == "all" and settings.engine_scrape_interval > 0:
            scraper = EngineScraper(self.shared, settings.engine_scrape_interval).start()

        # Another process's write (a CLI, another control plane) wakes the loop at once where the database
        # can say so (PostgreSQL NOTIFY); the revision poll stays the authority either way.
        def changed(_revision: str) -> None:
            loop.call_soon_threadsafe(self._changed.set)

        unlisten = store.listen_revisions(changed)
        next_poll = 0.0
        try:
            while not self._stop.is_set():
                if self._store_down_since is not None:
                    await self._store_step(self._connect_store)
                    if self._store_down_since is None:
                        unlisten = self.store.listen_revisions(changed)
                        next_poll = 0.0
                if self._reload.is_set():
                    self._reload.clear()
                    await loop.run_in_executor(self.store_calls, self.reload_config)
                if self._changed.is_set():
                    self._changed.clear()
                    next_poll = 0.0
                    for outage in list(self._outages.values()):  # the database answered NOTIFY: retry now
                        outage.retry_at = 0.0
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + settings.revision_poll_interval
                    await self._store_step(self.publish_current)
                await self._store_step(self.account)
                if self.bodies is not None:
                    await self._store_step(self.store_bodies)
                if self.purger is not None:
                    await self._store_step(self.purger.step)
                if self.body_purger is not None:
                    await self._store_step(self.body_purger.step)
                await self._sleep(min(settings.usage_drain_interval, settings.revision_poll_interval))
            if os.getppid() != self._parent:
                await self.drain_orphaned()
            await loop.run_in_executor(self.store_calls, self.final_drain)
        finally:
            if unlisten is not None:
                unlisten()
            if scraper is not None:
                scraper.stop()
            if export_task is not None:
                export_task.cancel()
            if server is not None:
                server[0].stop()  # type: ignore[no-untyped-call]
                await asyncio.wait([server[1]], timeout=5)
            self.admin_calls.shutdown(wait=True)
            self.store_calls.shutdown(wait=True)
            self.store.close()
        return 0

    # -- the store at start, and while it has not been reached ------------------------------------------
    def _open_store(self) -> Store:
        """The store, or, when the database cannot be reached, a stand-in that fails every operation as
        an outage does, with the last-known-good snapshot published meanwhile."""
        try:
            store = open_store(self.settings)
        except StoreError as exc:
            if isinstance(exc, CredentialError):
                raise
            self._store_down_since = time.time()
            self._store_error = exc.message
            log.error("store unreachable at start, serving the last-known-good snapshot: %s", exc.message)
            self.restore_last_known_good()
            self.publisher.set_control_state(CONTROL_STORE_DOWN, 0.0)
            return unavailable_store(f"the store has not been reached since start: {exc.message}")
        self._store_reached(store)
        return store

    def _connect_store(self) -> None:
        """One attempt to reach the store (``_guarded`` spaces them out); raises ``StoreError``."""
        try:
            store = open_store(self.settings)
        except StoreError as exc:
            self._store_error = exc.message
            raise
        log.info("store reached after %.1f s", time.time() - (self._store_down_since or time.time()))
        self._store_down_since = None
        self.store = store
        if self.sink is not None:
            self.sink.store = store
        if self.bodies is not None:
            self.bodies.store = store
        self._store_reached(store)

    def _store_reached(self, store: Store) -> None:
        self.publisher.set_control_state(CONTROL_LOCAL, time.time())
        self.purger = Purger(store, self.settings.usage_retention_days, self.settings.usage_purge_interval)
        self.body_purger = BodyPurger(store, self.settings.usage_purge_interval)
        pending = self.settings.run_dir / CONFIG_PENDING
        if pending.exists():
            self.reload_config()
            pending.unlink(missing_ok=True)

    def restore_last_known_good(self) -> None:
        path = self.settings.data_dir / LAST_KNOWN_GOOD
        try:
            sealed = path.read_text()
        except FileNotFoundError:
            log.error(
                "no last-known-good snapshot in %s: the proxies answer 503 until the store answers", path
            )
            return
        except OSError as exc:
            log.error("cannot read %s: %s", path, exc)
            return
        try:
            blob = store_vault(self.settings).open(sealed, LAST_KNOWN_GOOD).encode()
            revision = Snapshot.decode(blob, 0).revision
            self.publisher.publish(blob, revision)
        except (GatewayError, ValueError, KeyError, TypeError, PublishRefused) as exc:
            log.error("ignoring %s: %s", path, exc)
            return
        self._current = (revision, blob)
        self._doc = orjson.loads(blob)
        self.body_rules.set_entries(self._doc.get("body_logs"))
        self._from_last_known_good = True
        log.info("serving the last-known-good snapshot (revision %d) until the store answers", revision)

    def _write_last_known_good(self, blob: bytes) -> None:
        """Sealed, since the snapshot carries backend credentials; written whole, then renamed."""
        path = self.settings.data_dir / LAST_KNOWN_GOOD
        tmp = path.with_suffix(".tmp")
        try:
            sealed = store_vault(self.settings).seal(blob.decode(), LAST_KNOWN_GOOD)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, sealed.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except (OSError, GatewayError) as exc:
            log.error("could not save the last-known-good snapshot: %s", exc)

    def _start_admin_server(self) -> tuple[Server, asyncio.Task[None]] | None:
        settings = self.settings
        if settings.admin_port is None:
            return None
        app = ClusterApp(
            self,
            os.environ.get("GATEWAY_CLUSTER_TOKEN") or None,
            AdminApi(self),
            ingest_max=self.settings.ingest_queue_max,
        )
        server = Server(
            app,
            address=settings.admin_host,
            port=settings.admin_port,
            interface=Interfaces.RSGI,
            # One keep-alive connection per proxy host: granian's defaults (a backlog of 128, and as many
            # connections at once) starved the hosts past about 125.
            backlog=settings.admin_backlog,
            backpressure=settings.admin_backpressure,
            log_enabled=False,
            ssl_cert=settings.admin_tls_cert,
            ssl_key=settings.admin_tls_key,
            ssl_protocol_min=SSLProtocols.tls12,
        )
        scheme = "https" if settings.admin_tls_cert else "http"
        log.info("admin port on %s://%s:%d", scheme, settings.admin_host, settings.admin_port)
        return server, asyncio.get_running_loop().create_task(server.serve())

    # -- what the cluster API asks of the control worker ------------------------------------------------
    def current_snapshot(self) -> tuple[int, bytes] | None:
        return self._current

    def current_doc(self) -> dict[str, Any] | None:
        return self._doc

    def record_report(self, report: dict[str, Any]) -> dict[str, Any]:
        """Keep a proxy host's report; answer with its rate-limit shares. Memory only."""
        return self.fleet.record(report)

    def budget_bases(self, report: dict[str, Any]) -> dict[str, list[int]] | None:
        """For a reporting host's budgets, the spend the store knows of that its own live counters do not
        hold (other hosts', earlier tables'); None when there is nothing to say or the store is away. Runs
        on the store thread."""
        epoch = report.get("epoch")
        if not (isinstance(epoch, str) and epoch and self.sink is not None and self.sink.budgets):
            return None
        if self._outages:  # the store is failing: the host keeps the bases it has
            return None
        try:
            return self.sink.bases_for(epoch)
        except StoreError as exc:
            log.warning("budget bases for %s not computed: %s", report.get("host"), exc)
            return None

    def metrics_text(self) -> bytes:
        host = host_report(self.settings, self.shared)
        if self._current is not None and self._doc is not None:
            host["revision"] = self._current[0]
            host["snapshot_age_s"] = round(time.time() - float(self._doc.get("built_at", time.time())), 3)
        assert self.sink is not None
        text = self.sink.metrics.render(host) + "\n".join(self.sink.alerts.render()) + "\n"
        if self.sink.exporter is not None:
            text += "\n".join(self.sink.exporter.metrics_lines()) + "\n"
        if self.bodies is not None:
            text += "\n".join(self.bodies.metrics_lines()) + "\n"
        return text.encode()

    def routing_load(self) -> StaticLoad:
        return host_load(self.shared, list((self._doc or {}).get("backends", {})))

    def fleet_view(self) -> list[dict[str, Any]]:
        store: dict[str, Any] = {"state": "ok"}
        if self._store_down_since is not None or self._outages:
            store = {"state": "unreachable", "error": self._store_error}
            if self._store_down_since is not None:
                store["since"] = self._store_down_since
        extra = {
            "control_plane": "self",
            "store": store,
            "status": "ok" if store["state"] == "ok" else "degraded",
        }
        own = host_report(self.settings, self.shared, extra)
        return [own, *(r for r in self.fleet.view() if r.get("host") != own["host"])]

    def recent_requests(self) -> FlightRecorder:
        assert self.sink is not None
        return self.sink.recent

    def live_requests(self) -> list[dict[str, Any]]:
        return live_requests(WorkerStats(self.shared.stats).documents(), time.time())

    def principal_names(self) -> dict[str, str]:
        return self.sink.principal_names if self.sink is not None else {}

    def budget_spend(self, budget: Budget, now: float) -> tuple[int, int]:
        """A budget's current window spend in this host's bucket table (live plus base), for the dry run."""
        assert self.sink is not None
        return self.sink.table.spend(budget.key_at(self.sink.epoch, now))

    def store_usage(self, records: list[UsageRecord], rejected: list[RejectedRecord]) -> None:
        """A proxy-role host's batch (``POST /cluster/usage``): its records, and those that did not decode
        (set aside). Runs on the store thread."""
        assert self.sink is not None
        self.sink.write(records, rejected, "cluster")

    def store_bodies_rows(self, rows: list[StoredBodies]) -> None:
        """Redacted bodies a proxy-role host sent (``POST /cluster/bodies``). Runs on the store thread."""
        assert self.bodies is not None
        self.bodies.write(rows)

    def store_bodies(self) -> None:
        """Drain the body rings into the store: a few batches, so the loop stays responsive."""
        assert self.bodies is not None
        for _ in range(4):
            if not self.bodies.drain():
                break

    def account(self) -> None:
        """Drain the usage rings, then fold window rollovers and refreshes into the budgets."""
        assert self.sink is not None
        for _ in range(8):  # a full batch may leave more behind; bounded so the loop stays responsive
            if not self.sink.drain():
                break
        self.sink.tick()
        due = self.sink.check_alerts()
        url = self.settings.budget_alert_webhook
        if due and url:
            # This runs on the store thread: the webhook is sent by a task of the event loop, handed over
            # thread-safely, so a slow webhook holds up neither the usage drain nor the loop.
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._send_alerts, url, due)

    def _send_alerts(self, url: str, due: list[budget_alerts.Alert]) -> None:
        """On the event loop: one task that posts ``due`` to the webhook."""
        if self._webhook_client is None:
            self._webhook_client = httpx.AsyncClient()
        task = asyncio.get_running_loop().create_task(budget_alerts.send(self._webhook_client, url, due))
        self._webhook_tasks.add(task)
        task.add_done_callback(self._webhook_tasks.discard)

    async def drain_orphaned(self) -> None:
        """The supervisor died (``kill -9``): the kernel sent SIGTERM to every worker at once (their
        parent-death signal), so the proxies are still finishing their requests and writing those
        requests' usage records. Keep draining until the last of them has gone (nobody else maps the
        rings), or for their grace period and the final drain's: stopping at the first empty ring, as a
        supervised stop may, would lose the records written after it, with the rings' segment."""
        attached = self.shared.usage_attached
        log.warning("the supervisor is gone: draining usage records until the proxy workers have stopped")
        deadline = time.monotonic() + self.settings.grace_period + FINAL_DRAIN_SECONDS
        while attached() > 1 and time.monotonic() < deadline:
            await self._store_step(self.account)
            await asyncio.sleep(self.settings.usage_drain_interval)
        if attached() > 1:
            log.error("%d processes still write the usage rings; stopping anyway", attached() - 1)

    def final_drain(self) -> None:
        deadline = time.monotonic() + FINAL_DRAIN_SECONDS
        assert self.sink is not None
        if self.bodies is not None:
            try:  # bodies first: the usage drain may use the whole deadline, and bodies are what is lost
                while self.bodies.drain() and time.monotonic() < deadline:
                    pass
            except StoreError as exc:
                log.error("final body log drain failed: %s", exc)
        while time.monotonic() < deadline:
            try:
                if not self.sink.drain():
                    return
            except StoreError as exc:
                log.error("final usage drain failed: %s", exc)
                time.sleep(0.2)
        log.error("stopping with %d usage records still in the rings", self.sink.pending())

    async def _store_step(self, step: Callable[[], object]) -> None:
        await asyncio.get_running_loop().run_in_executor(self.store_calls, self._guarded, step)

    def _guarded(self, step: Callable[[], object]) -> None:
        """Run one step of the loop, on the store thread. A store that fails is logged once per outage and
        retried with backoff (0.5 s, then every second; a NOTIFY retries at once: an acknowledged write must
        reach the proxies within about two seconds of the database's return). Each
        step keeps its own outage: on a full disk reads (the revision poll) work while writes (usage
        records) fail, and one must not end the other's outage. While any step fails, ``/healthz`` says
        degraded with the store's error (the records wait in the rings meanwhile)."""
        outage = self._outages.get(step.__name__)
        if outage is not None and time.monotonic() < outage.retry_at:
            return
        try:
            step()
        except StoreError as exc:
            if outage is None:
                log.error("store unavailable (%s), will retry: %s", step.__name__, exc)
                outage = self._outages[step.__name__] = _Outage()
                self._store_error = exc.message
                self.publisher.set_control_state(CONTROL_STORE_DOWN, time.time())
                self.publisher.set_store_state(True, exc.message)
            outage.retry_at = time.monotonic() + outage.backoff
            outage.backoff = min(outage.backoff * 2, STORE_BACKOFF_MAX)
            return
        if outage is not None:
            log.info("store available again (%s)", step.__name__)
            del self._outages[step.__name__]
            if not self._outages:
                self.publisher.set_store_state(False)
                if self._store_down_since is None:
                    self.publisher.set_control_state(CONTROL_LOCAL, time.time())

    async def _sleep(self, seconds: float) -> None:
        waits = [
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(self._reload.wait()),
            asyncio.ensure_future(self._changed.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def reload_config(self) -> None:
        path = self.settings.config_file
        if path is None:
            log.info("SIGHUP: no config file to re-read; republishing from the store")
            return
        try:
            revision = apply_file(self.settings, path)
        except (GatewayError, OSError) as exc:
            log.error("SIGHUP: %s not applied, keeping the current snapshot: %s", path, exc)
            return
        log.info("SIGHUP: applied %s as revision %d", path, revision)

    def publish_current(self) -> bool:
        return self.publish_if_changed(self.store)

    def publish_if_changed(self, store: Store) -> bool:
        revision = store.revision()
        # A control worker that restarted finds the previous one's snapshot still published, at the
        # store's revision: it builds its own once all the same, because the admin API, the cluster
        # snapshot endpoint and the budgets all read the document this worker built (``_doc``), not the
        # segment.
        if (
            self._doc is not None
            and self.publisher.generation
            and revision <= self.publisher.revision
            and not self._from_last_known_good
        ):
            return False
        started = time.perf_counter()
        doc = build_snapshot_doc(store)
        blob = orjson.dumps(doc)
        try:
            generation = self.publisher.publish(blob, int(doc["revision"]))
        except PublishRefused as exc:
            log.error("snapshot not published: %s", exc)
            return False
        self._current = (int(doc["revision"]), blob)
        self._doc = doc
        self.body_rules.set_entries(doc.get("body_logs"))
        self._from_last_known_good = False
        self._write_last_known_good(blob)
        if self.sink is not None:
            self.sink.set_budgets(doc["principals"], doc.get("keys"))
        log.info(
            "published snapshot generation %d (revision %d, %d bytes, %d skipped) in %.1f ms",
            generation,
            doc["revision"],
            len(blob),
            doc.get("skipped", 0),
            (time.perf_counter() - started) * 1000,
        )
        return True
