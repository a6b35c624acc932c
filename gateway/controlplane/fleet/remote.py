"""The control slot of a proxy-role host: follows a remote control plane instead of a local store.

On a ``gateway serve --role proxy`` host the supervisor forks this worker where an all-in-one host has its
control worker. It does two things, both over the control plane's cluster API (``api.cluster``), with the
cluster token:

- **Snapshots.** Every ``revision_poll_interval`` it asks ``GET /cluster/snapshot`` with ``If-None-Match``
  (the revision it holds); a new document is checked (it must decode), published into the host's
  snapshot segment for the proxy workers, and written to ``DATA_DIR/last-known-good.json`` (write, fsync,
  rename). At a cold start that file is published first, so a host restarted while the control plane is
  away serves the keys and routes it last knew. When the control plane does not answer, the worker keeps
  what is published, retries with backoff (0.5 s doubling to 30 s), logs the outage once and its end
  once, and says so in the snapshot segment, which ``/healthz`` reports. It never exits for want of a
  control plane.
- **Usage.** Every ``usage_drain_interval`` it empties the usage rings: straight to ``POST /cluster/usage``
  while the control plane answers and nothing older waits, into ``DATA_DIR/usage-spool/`` otherwise
  (``spool``: a file per batch, fsynced before the rings' tails move, bounded by ``--usage-spool-max-mb``),
  so that a host that dies or stops during an outage has its records on disk. The spool is sent again,
  oldest first, as the backoff allows. The control plane writes records idempotently by request id, so a
  batch sent twice (a crash between sending and moving a tail) is stored once. A control plane whose store
  is behind answers ``503`` with ``Retry-After`` (``ingest_busy``): the batch goes to the spool like in an
  outage, and is sent again after about that long (spread by a quarter either way over hosts), without
  the outage's growing backoff.
- **Bodies.** Every tick it empties the body-log rings too, redacting each body here by the entry that
  logged it (``bodies``), so no unredacted body leaves the host, and sends them to ``POST
  /cluster/bodies``. Bodies are not spooled: while the control plane does not answer they are dropped
  and counted (``body_logs.unsent`` in the host's report), never queued.
- **Reports and shares.** Every ``--report-interval`` it sends the host's health report with the traffic
  of each rate-limit scope and the shares it holds, and writes the shares the control plane answers with
  into the host slot for the proxy workers (and ``DATA_DIR/shares.json``, restored at start); without an
  answer for the fleet's TTL it falls back to the default share. The host slot also carries the spool's
  state, which the workers' ``/healthz`` shows.

Every call to the control plane has ``CONTROL_DEADLINE`` seconds in all, connect to the answer's last
byte (``outbound.BlockingCaller``): httpx's per-read timeout alone let a control plane that dribbles its
answer hold this loop, and with it the usage drain and the snapshot polls, for as long as it dribbled.

I/O: HTTP to the control plane, the data directory, the shared segments.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import orjson

from gateway.config import Settings
from gateway.controlplane.bodies.rules import BodyRules
from gateway.controlplane.bodies.sink import read_bodies
from gateway.controlplane.bodies.stored import StoredBodies
from gateway.controlplane.fleet.engines import EngineScraper
from gateway.controlplane.fleet.reports import TTL, host_report, traffic_totals
from gateway.controlplane.fleet.spool import UsageSpool
from gateway.controlplane.outbound import BlockingCaller
from gateway.dataplane.tls import make_ssl_context
from gateway.native import BucketTable, SpanRing, UsageRing
from gateway.shm.regions import SharedRegions
from gateway.shm.snapshot_slot import (
    CONTROL_REACHABLE,
    CONTROL_UNREACHABLE,
    PublishRefused,
    SnapshotPublisher,
)
from gateway.shm.worker_stats import WorkerStats
from gateway.snapshot import Snapshot
from gateway.usage_record import access_line, record_from_values

__all__ = ["RemoteControlWorker", "run_remote_control_worker"]

log = logging.getLogger("gateway.controlplane")

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
BATCH_PER_RING = 2048
FINAL_DRAIN_SECONDS = 10.0
BODIES_PER_POST = 8 << 20  # bytes of logged bodies a POST /cluster/bodies carries at most (about)
CONTROL_DEADLINE = 10.0  # seconds one call to the control plane has in all, however it dribbles its answer


def run_remote_control_worker(settings: Settings, shared: SharedRegions) -> int:
    return RemoteControlWorker(settings, shared).run()


class _Unanswered(Exception):
    """The control plane did not take the request (unreachable, timeout, 5xx)."""


class _Busy(_Unanswered):
    """The control plane is up but its store is behind (``503`` with ``Retry-After``): send again then."""

    def __init__(self, message: str, after: float) -> None:
        super().__init__(message)
        self.after = after


class RemoteControlWorker:
    def __init__(self, settings: Settings, shared: SharedRegions) -> None:
        if not settings.control_url:
            raise ValueError("--role proxy needs --control-url")
        token = os.environ.get("GATEWAY_CLUSTER_TOKEN")
        if not token:
            raise ValueError("--role proxy needs GATEWAY_CLUSTER_TOKEN, the control plane's cluster token")
        self.settings = settings
        self.shared = shared
        self.publisher = SnapshotPublisher(shared.snapshot)
        self.ring = UsageRing(shared.usage)
        self.body_ring = SpanRing(shared.bodies) if shared.bodies is not None else None
        self.body_rules = BodyRules()
        self.bodies_unsent = 0  # redacted bodies the control plane did not take: dropped
        self.client = BlockingCaller(
            base_url=settings.control_url.rstrip("/"),
            headers={"authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(CONTROL_DEADLINE, connect=2.0),
            verify=make_ssl_context(str(settings.control_ca) if settings.control_ca else None),
        )
        # No answer worth reading is larger than a snapshot the segment could hold.
        self.answer_limit = settings.snapshot_segment_bytes
        self.last_known_good = settings.data_dir / "last-known-good.json"
        self.etag: str | None = None
        self._stop = False
        self._parent = os.getppid()
        self._sync_at = 0.0
        self._sync_backoff = BACKOFF_FIRST
        self._ship_at = 0.0
        self._ship_backoff = BACKOFF_FIRST
        self._down_since: float | None = None
        self._report_at = 0.0
        self._traffic_seen: dict[tuple[int, int], dict[str, int]] = {}
        self.host_slot = WorkerStats(shared.stats)
        self.table = BucketTable(shared.buckets)
        self.spool = UsageSpool(settings.data_dir / "usage-spool", settings.usage_spool_max_mb << 20)
        # What this host's proxy workers read from the host slot: the shares the control plane last gave
        # (kept in DATA_DIR/shares.json, so a host restarted during an outage keeps enforcing them rather
        # than the whole of every limit) and the spool's state, which their /healthz shows.
        self.shares_file = settings.data_dir / "shares.json"
        self._answer: dict[str, Any] = {}
        self._host_doc: bytes = b""

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nothing to re-read: the control plane has the config
        self.restore_shares()
        self.restore_last_known_good()
        scraper = None
        if self.settings.engine_scrape_interval > 0:
            scraper = EngineScraper(self.shared, self.settings.engine_scrape_interval).start()
        try:
            while not self._stop:
                now = time.monotonic()
                # The report first: a host that starts gets its shares before the first snapshot lets
                # its workers serve anything.
                if now >= self._report_at:
                    self._report_at = now + self.settings.report_interval
                    self.report()
                if now >= self._sync_at:
                    self.sync_snapshot()
                self.ship_usage()
                self.ship_bodies()
                time.sleep(self.settings.usage_drain_interval)
            if os.getppid() != self._parent:
                self.ship_until_proxies_stop()
            self.final_ship()
            self.ship_bodies()  # what the proxies logged last, once, if the control plane takes it
        finally:
            if scraper is not None:
                scraper.stop()
            self.client.close()
        return 0

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, deadline=CONTROL_DEADLINE, limit=self.answer_limit, **kwargs)

    # -- snapshots ---------------------------------------------------------------------------------------
    def restore_last_known_good(self) -> None:
        try:
            blob = self.last_known_good.read_bytes()
        except FileNotFoundError:
            return
        try:
            revision = Snapshot.decode(blob, 0).revision
            self.publisher.publish(blob, revision)
        except (ValueError, KeyError, TypeError, PublishRefused) as exc:
            log.error("ignoring %s: %s", self.last_known_good, exc)
            return
        self.body_rules.set_entries(orjson.loads(blob).get("body_logs"))
        self.etag = f'"{revision}"'
        log.info("serving the last known snapshot (revision %d) until the control plane answers", revision)

    def sync_snapshot(self) -> None:
        headers = {"if-none-match": self.etag} if self.etag else {}
        try:
            resp = self._call("GET", "/cluster/snapshot", headers=headers)
        except httpx.HTTPError as exc:
            self._sync_failed(f"{type(exc).__name__}: {exc}")
            return
        if resp.status_code == 304:
            self._sync_ok()
            return
        if resp.status_code != 200:
            self._sync_failed(f"HTTP {resp.status_code}: {resp.text[:200]}")
            return
        blob = resp.content
        try:
            revision = Snapshot.decode(blob, 0).revision
            self.publisher.publish(blob, revision)
        except (ValueError, KeyError, TypeError) as exc:
            self._sync_failed(f"undecodable snapshot: {exc}")
            return
        except PublishRefused as exc:
            log.error("control plane sent an older snapshot, kept ours: %s", exc)
            self._sync_ok()
            return
        self.etag = resp.headers.get("etag", f'"{revision}"')
        self.body_rules.set_entries(orjson.loads(blob).get("body_logs"))
        self._write_last_known_good(blob)
        log.info("published snapshot revision %d from the control plane", revision)
        self._sync_ok()

    def _write_last_known_good(self, blob: bytes) -> None:
        tmp = self.last_known_good.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.last_known_good)
        except OSError as exc:
            log.error("could not save the last known snapshot: %s", exc)

    def _sync_ok(self) -> None:
        now = time.time()
        if self._down_since is not None:
            log.info("control plane answers again after %.1f s", now - self._down_since)
            self._down_since = None
        self.publisher.set_control_state(CONTROL_REACHABLE, now)
        self._sync_backoff = BACKOFF_FIRST
        self._sync_at = time.monotonic() + self.settings.revision_poll_interval

    def _sync_failed(self, why: str) -> None:
        if self._down_since is None:
            self._down_since = time.time()
            log.error("control plane unreachable, serving the last snapshot known: %s", why)
        self.publisher.set_control_state(CONTROL_UNREACHABLE)
        self._sync_at = time.monotonic() + self._sync_backoff
        self._sync_backoff = min(self._sync_backoff * 2, BACKOFF_MAX)

    # -- health ------------------------------------------------------------------------------------------
    def report(self) -> None:
        """Send this host's health report with the requests each rate-limit scope admitted since the last
        one and the shares it enforces now, and hand the shares the control plane answers with to the
        proxy workers. A control plane that does not answer gets the next report; the workers keep the
        shares they have."""
        state = "ok" if self._down_since is None else "unreachable"
        totals = traffic_totals(self.shared)
        traffic: dict[str, int] = {}
        for worker, counts in totals.items():
            before = self._traffic_seen.get(worker, {})  # a restarted worker (new pid) starts from zero
            for scope, n in counts.items():
                traffic[scope] = traffic.get(scope, 0) + n - before.get(scope, 0)
        held = self._enforced()
        extra = {
            "control_plane": state,
            "traffic": traffic,
            "epoch": self.shared.epoch,
            "held": held,
            "usage_spool": self.spool.state().as_dict(),
        }
        try:
            doc = host_report(self.settings, self.shared, extra)
            if "body_logs" in doc:
                doc["body_logs"]["unsent"] = self.bodies_unsent
            body = orjson.dumps(doc)
            resp = self._call(
                "POST", "/cluster/report", content=body, headers={"content-type": "application/json"}
            )
        except (httpx.HTTPError, OSError) as exc:
            log.debug("health report not sent: %s", exc)
            return
        self._traffic_seen = totals
        if resp.status_code != 200:
            return
        try:
            answer = resp.json()
            bases = answer.get("budget_bases") or {}
            for key, (tokens, cost) in bases.items():
                self.table.spend_set_base(int(key), int(tokens), int(cost))
        except (ValueError, TypeError, AttributeError) as exc:
            log.error("unreadable answer to the health report: %s", exc)
            return
        shares = {k: answer[k] for k in ("shares", "default_share", "hosts") if k in answer}
        if shares:
            self._answer = {**shares, "answered_at": time.time()}
            self._save_shares()
        self._write_host_doc()

    def restore_shares(self) -> None:
        try:
            saved = orjson.loads(self.shares_file.read_bytes())
        except FileNotFoundError:
            return
        except orjson.JSONDecodeError as exc:
            log.error("ignoring %s: %s", self.shares_file, exc)
            return
        if isinstance(saved, dict):
            self._answer = saved
            self._write_host_doc()

    def _save_shares(self) -> None:
        tmp = self.shares_file.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(self._answer))
            os.replace(tmp, self.shares_file)
        except OSError as exc:
            log.error("could not save the rate-limit shares: %s", exc)

    def _enforced(self) -> dict[str, Any]:
        """The shares this host's workers are to enforce: the last answer, or only its default once it is
        older than the fleet's TTL (the control plane has forgotten this host by then and may have given
        its share to the others; see ``fleet.shares``)."""
        answer = self._answer
        if "default_share" not in answer:
            return {}
        held: dict[str, Any] = {k: answer[k] for k in ("shares", "default_share", "hosts") if k in answer}
        if time.time() - float(answer.get("answered_at", 0)) > TTL:
            held["shares"] = {}
        return held

    def _write_host_doc(self) -> None:
        doc = orjson.dumps({**self._enforced(), "usage_spool": self.spool.state().as_dict()})
        if doc != self._host_doc:  # written when it changes, not every tick
            self._host_doc = doc
            self.host_slot.write(self.host_slot.host_slot, doc)

    # -- usage -------------------------------------------------------------------------------------------
    def ship_usage(self) -> None:
        """Empty the rings every tick, whatever the control plane does: straight to it while it answers and
        nothing older waits, into the spool otherwise (so that a host that dies or stops during an outage
        has its records on disk, not in memory); then resend the spool, oldest first, as the backoff
        allows."""
        try:
            self._drain_rings()
            if not self.spool.empty and time.monotonic() >= self._ship_at:
                self._send_spool()
        except OSError as exc:
            log.error("usage spool: %s", exc)
        self._write_host_doc()

    def _drain_rings(self) -> None:
        for _ in range(8):  # a full read leaves more behind; bounded so that snapshots and reports go on
            taken, body = self._read_rings()
            if not taken:
                return
            if self.spool.empty and time.monotonic() >= self._ship_at:
                try:
                    self._post_usage(body)
                except _Unanswered as exc:
                    self._ship_failed(exc)
                else:
                    self._advance(taken, body)
                    self._ship_ok()
                    continue
            if not self.spool.room_for(len(body)):
                return  # the records stay in the rings; the spool's state says why
            self.spool.write(body)
            self._advance(taken, body)

    def _send_spool(self) -> None:
        # At most about a second of resending per tick, so that the rings keep draining meanwhile.
        deadline = time.monotonic() + 1.0
        while not self.spool.empty and time.monotonic() < deadline:
            paths, body = self.spool.oldest()
            try:
                self._post_usage(body)
            except _Unanswered as exc:
                self._ship_failed(exc)
                return
            self.spool.remove(paths)
        self._ship_ok()

    def _ship_ok(self) -> None:
        self._ship_backoff = BACKOFF_FIRST
        self._ship_at = 0.0

    def _ship_failed(self, exc: Exception) -> None:
        if isinstance(exc, _Busy):
            # Up but behind: when it says, spread over hosts (so that they do not all come back at once),
            # and without growing the backoff, which is for a control plane that does not answer.
            self._ship_at = time.monotonic() + exc.after * random.uniform(0.75, 1.25)
        else:
            self._ship_at = time.monotonic() + self._ship_backoff
            self._ship_backoff = min(self._ship_backoff * 2, BACKOFF_MAX)
        log.debug("usage not sent: %s", exc)

    def _read_rings(self) -> tuple[list[tuple[int, int]], bytes]:
        taken: list[tuple[int, int]] = []
        records: list[bytes] = []
        for index in range(self.ring.rings):
            batch = self.ring.read(index, BATCH_PER_RING)
            if batch:
                taken.append((index, len(batch)))
                records += batch
        return taken, b"[" + b",".join(records) + b"]"

    def _access_log(self, body: bytes) -> None:
        """This host's access lines, written as its records leave the rings."""
        try:
            lines = b"".join(access_line(record_from_values(v)) for v in orjson.loads(body))
            os.write(1, lines)
        except (ValueError, OSError) as exc:
            log.error("access log not written: %s", exc)

    def _advance(self, taken: list[tuple[int, int]], body: bytes) -> None:
        for index, n in taken:
            self.ring.advance(index, n)
        if self.settings.access_log:
            self._access_log(body)

    def _post_usage(self, body: bytes) -> None:
        try:
            resp = self._call(
                "POST", "/cluster/usage", content=body, headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            raise _Unanswered(f"{type(exc).__name__}: {exc}") from None
        if resp.status_code == 200:
            return
        if resp.status_code == 400:
            # The control plane cannot read the batch: keep it aside for a person, never resend it forever.
            kept = self.spool.path / f"rejected-{time.time_ns()}.jsonl"
            kept.write_bytes(body)
            log.error("control plane refused a usage batch (kept in %s): %s", kept, resp.text[:200])
            return
        after = _retry_after(resp.headers.get("retry-after"))
        if resp.status_code in (429, 503) and after is not None:
            raise _Busy(f"HTTP {resp.status_code}: {resp.text[:200]}", after)
        raise _Unanswered(f"HTTP {resp.status_code}: {resp.text[:200]}")

    # -- bodies ------------------------------------------------------------------------------------------
    def ship_bodies(self) -> None:
        """Empty the body rings, redacting here, and send what they held; while the control plane is in
        backoff (or when it does not take them) the bodies are dropped and counted, never kept."""
        if self.body_ring is None:
            return
        for _ in range(4):  # bounded, as the usage drain is
            rows, taken = read_bodies(self.body_ring, self.body_rules)
            if not taken:
                return
            for batch in _batches(rows, BODIES_PER_POST):
                if time.monotonic() >= self._ship_at and self._post_bodies(batch):
                    continue
                self._bodies_lost(len(batch))
            for index, slots in taken:
                self.body_ring.advance(index, slots)

    def _post_bodies(self, rows: list[StoredBodies]) -> bool:
        try:
            resp = self._call(
                "POST",
                "/cluster/bodies",
                content=orjson.dumps([r.row() for r in rows]),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def _bodies_lost(self, n: int) -> None:
        self.bodies_unsent += n
        if self.bodies_unsent == n or self.bodies_unsent % 1000 < n:
            log.warning(
                "control plane did not take %d logged bodies: %d dropped so far", n, self.bodies_unsent
            )

    def ship_until_proxies_stop(self) -> None:
        """The supervisor died and every worker got SIGTERM at once (their parent-death signal): the
        proxies are still finishing requests and writing their records. Ship (or spool) until none of
        them maps the rings any more, bounded by their grace period and the final drain's."""
        attached = self.shared.usage_attached
        log.warning("the supervisor is gone: shipping usage records until the proxy workers have stopped")
        deadline = time.monotonic() + self.settings.grace_period + FINAL_DRAIN_SECONDS
        while attached() > 1 and time.monotonic() < deadline:
            self.final_ship()
            time.sleep(self.settings.usage_drain_interval)

    def final_ship(self) -> None:
        """On SIGTERM, after the proxies stopped: send (or spool) everything the rings still hold. While
        the control plane is in backoff nothing is tried: the records go to disk at once."""
        deadline = time.monotonic() + FINAL_DRAIN_SECONDS
        while time.monotonic() < deadline:
            try:
                self._drain_rings()
            except OSError as exc:
                log.error("usage spool: %s", exc)
                break
            if not any(self.ring.pending(i) for i in range(self.ring.rings)):
                return
            time.sleep(0.05)  # the spool is full: its state is logged; wait for the control plane
        left = sum(self.ring.pending(i) for i in range(self.ring.rings))
        if left:
            log.error("stopping with %d usage records in the rings: the spool is full", left)


def _batches(rows: list[StoredBodies], limit: int) -> list[list[StoredBodies]]:
    """``rows`` in consecutive batches of at most ``limit`` bytes of bodies (one row at least each), so
    that no POST nears the cluster API's body limit."""
    out: list[list[StoredBodies]] = []
    size = limit
    for row in rows:
        weight = len(row.request_body or "") + len(row.response_body or "") + 512
        if size + weight > limit:
            out.append([])
            size = 0
        out[-1].append(row)
        size += weight
    return out


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (the control plane sends whole seconds), bounded to the backoff's cap."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return min(max(seconds, 0.0), BACKOFF_MAX) if math.isfinite(seconds) else None


def pending_spool(data_dir: Path) -> int:
    """Batches waiting in a proxy host's spool (for ``gateway status``)."""
    return sum(1 for _ in (data_dir / "usage-spool").glob("*.json"))
