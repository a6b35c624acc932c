"""The host's engine scraper: every ``interval`` seconds it reads each backend's load and health and
publishes them, with each gate's current ceiling, in the statistics segment's engine slot, where the proxy
workers pick them up for routing (``gateway.dataplane.backend_load``).

Per OpenAI-protocol backend and round: ``GET /metrics``; a text with vLLM or SGLang gauges gives the
engine's running and waiting requests and cache use (``gateway.protocol.prometheus``), noted with this
host's requests in flight on it at that moment (routing counts the other hosts' share of the engine's
requests from the scrape, and this host's own from its live gauge). A backend that
answers without engine metrics is asked again only every ``REDETECT`` seconds, and routing ranks it by the
host's in-flight count instead. Active health: a backend is probed on its ``health_path`` (``/health`` by
default for OpenAI-protocol backends) when the scrape gave nothing; a connect error, a timeout or a 5xx is
a failure, ``FAILURES_TO_MARK_DOWN`` in a row mark it unhealthy, one success marks it healthy again.
Hosted providers (Anthropic, Gemini protocols) are not scraped and are probed only if given a
``health_path``.

Restarts: an engine whose prompt-token counter went down since the last scrape is a new process with an
empty prefix cache. Its line in the document then carries a new ``epoch`` (the time it was seen), which
``cache_aware`` folds into the engine's name in the prefix index, so that what the index remembers of the
old process no longer counts as held (it ages out of the index).

Gate ceilings (backends with ``max_concurrency``): the ceiling halves each round the engine's waiting queue
sits at or above ``waiting_high_water``, and grows by one each round it is below, up to
``max_concurrency`` — additive increase, multiplicative decrease, so the engine's own queue stays short
and the surplus waits in the proxy, where it can be refused early.

KV-cache events: the backends with ``kv_events`` are subscribed to on the same loop
(``gateway.controlplane.fleet.kv_events``), which keeps their exact pairs in the host's prefix index; each
round puts the subscriptions' counts in the backend's line (``"kv_events"``).

It runs in a thread of the host's control slot with its own event loop, so that a slow backend never
delays snapshot publication or usage draining. Each scrape or probe has ``PROBE_TIMEOUT`` in all
(``outbound.call``): a backend that dribbles its answer fails the probe instead of holding the round. I/O:
HTTP to the backends, ZeroMQ subscriptions to their KV events, the shared segments.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway.controlplane import outbound
from gateway.controlplane.fleet.kv_events import KVEventFollower
from gateway.native import Blocks, BucketTable, PrefixIndex
from gateway.protocol.prometheus import engine_load
from gateway.routing.load import StaticLoad, engine_states
from gateway.shm.bucket_keys import backend_keys
from gateway.shm.regions import SharedRegions
from gateway.shm.snapshot_slot import SnapshotReader
from gateway.shm.worker_stats import WorkerStats
from gateway.snapshot import Backend, decode_backends

__all__ = ["FAILURES_TO_MARK_DOWN", "REDETECT", "BackendWatch", "EngineScraper", "PeekedIndex", "host_load"]

log = logging.getLogger("gateway.engines")

FAILURES_TO_MARK_DOWN = 2
REDETECT = 30.0  # seconds between asking a backend without engine metrics whether it has them now
PROBE_TIMEOUT = 1.5  # seconds a scrape or probe has in all, however the backend dribbles its answer
ANSWER_LIMIT = 8 << 20  # bytes of a /metrics or health answer read at most (vLLM's text is ~100 KB)


@dataclass(slots=True)
class BackendWatch:
    """What the scraper keeps about one backend between rounds."""

    kind: str | None = None  # "vllm" | "sglang" once detected
    detect_at: float = 0.0  # monotonic time of the next attempt to find engine metrics
    waiting: int | None = None
    running: int | None = None
    host_in_flight: int | None = None  # this host's requests on the backend around the scrape (the larger)
    kv_cache: float | None = None
    ceiling: int | None = None
    failures: int = 0
    healthy: bool = True
    error: str | None = None
    prompt_tokens: float | None = None  # the engine's counter at the last scrape
    epoch: int = 0  # 0, or the unix second this scraper last saw the engine restart

    def step_ceiling(self, backend: Backend) -> None:
        top = backend.max_concurrency
        if top is None:
            self.ceiling = None
            return
        current = top if self.ceiling is None else min(self.ceiling, top)
        if self.waiting is not None and self.waiting >= backend.waiting_high_water:
            current = max(1, current // 2)
        elif current < top:
            current += 1
        self.ceiling = current

    def record(self, ok: bool, why: str | None = None, name: str = "?") -> None:
        """Count one probe of the backend ``name`` (named in the log line when it is marked down)."""
        if ok:
            self.failures = 0
            self.healthy = True
            self.error = None
            return
        self.failures += 1
        self.error = why
        if self.failures >= FAILURES_TO_MARK_DOWN:
            if self.healthy:
                log.warning(
                    "backend %s marked unhealthy after %d failed probes: %s", name, self.failures, why
                )
            self.healthy = False

    def as_doc(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "waiting": self.waiting,
            "running": self.running,
            "host_in_flight": self.host_in_flight,
            "kv_cache": self.kv_cache,
            "ceiling": self.ceiling,
            "healthy": self.healthy,
            "error": self.error,
            "epoch": self.epoch,
        }

    def count_prompts(self, total: float | None, name: str) -> None:
        """Note the engine's prompt-token counter; one that went down means the engine restarted."""
        if total is None:
            return
        if self.prompt_tokens is not None and total < self.prompt_tokens:
            self.epoch = max(self.epoch + 1, int(time.time()))
            log.warning(
                "backend %s restarted (its prompt-token counter went from %d to %d): what the prefix index "
                "knew of its cache no longer counts",
                name,
                self.prompt_tokens,
                total,
            )
        self.prompt_tokens = total


class EngineScraper:
    def __init__(self, shared: SharedRegions, interval: float = 2.0) -> None:
        self.interval = interval
        self.reader = SnapshotReader(shared.snapshot)
        self.stats = WorkerStats(shared.stats)
        self.watches: dict[str, BackendWatch] = {}
        self._generation = 0
        self._backends: dict[str, Backend] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The thread's loop and the event that ends its wait between rounds; the lock orders stop() with
        # the thread setting them up, so a stop that comes first is seen by the loop's own check.
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._lock = threading.Lock()
        self._prefix = shared.prefix
        self._buckets = shared.buckets
        # Made on the thread's loop by the first round that finds a backend with kv_events.
        self.kv: KVEventFollower | None = None

    def start(self) -> EngineScraper:
        self._thread = threading.Thread(target=self._main, name="engine-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread. The wait between rounds ends at once (it was a plain sleep, and every
        stop of the control slot, so of the gateway, waited out up to an interval); a round in progress
        finishes, each request bounded by ``PROBE_TIMEOUT``."""
        with self._lock:
            self._stop.set()
            wake = self._wake
        if wake is not None:
            loop, event = wake
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has closed: the thread is ending anyway
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _main(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        wake = asyncio.Event()
        with self._lock:
            self._wake = (asyncio.get_running_loop(), wake)
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(PROBE_TIMEOUT), trust_env=False) as client:
                while not self._stop.is_set():
                    started = time.monotonic()
                    try:
                        await self.round(client)
                    except Exception:  # a bug here must not stop routing's view from refreshing next round
                        log.exception("engine scrape round failed")
                    pause = max(0.05, self.interval - (time.monotonic() - started))
                    try:
                        await asyncio.wait_for(wake.wait(), pause)
                    except TimeoutError:
                        pass
        finally:
            if self.kv is not None:
                await self.kv.aclose()

    def backends(self) -> dict[str, Backend]:
        """The published snapshot's backends; only that part of a new generation is decoded (its keys,
        possibly 100k of them, are of no use here)."""
        generation = self.reader.generation()
        if generation != self._generation:
            got = self.reader.read()
            if got is not None:
                try:
                    self._backends = decode_backends(orjson.loads(got[1]))
                    self._generation = got[0]
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.error("engine scraper: undecodable snapshot: %s", exc)
        return self._backends

    async def round(self, client: httpx.AsyncClient) -> None:
        backends = self.backends()
        for gone in set(self.watches) - set(backends):
            del self.watches[gone]
        if self.kv is None and self._prefix is not None and any(b.kv_events for b in backends.values()):
            self.kv = KVEventFollower(PrefixIndex(self._prefix))
        if self.kv is not None:
            self.kv.follow(backends)
        with BucketTable(self._buckets) as table:  # this host's in-flight gauges, noted with each scrape
            await asyncio.gather(*(self.watch(client, b, table) for b in backends.values()))
        lines = {n: w.as_doc() for n, w in self.watches.items()}
        if self.kv is not None:
            for name, counts in self.kv.counts().items():
                if name in lines:
                    lines[name]["kv_events"] = counts
        doc = {"at": time.time(), "backends": lines}
        if not self.stats.write(self.stats.engine_slot, orjson.dumps(doc)):
            log.error("engine document of %d backends does not fit its slot", len(self.watches))

    async def watch(
        self, client: httpx.AsyncClient, backend: Backend, table: BucketTable | None = None
    ) -> None:
        """One round for ``backend``: scrape or probe it. ``table``, the host's bucket table, gives this
        host's in-flight gauge to note with the scrape (without it, none is noted)."""
        w = self.watches.get(backend.name)
        if w is None:
            w = self.watches[backend.name] = BackendWatch()
        scraped = False
        now = time.monotonic()
        if backend.protocol == "openai" and (w.kind is not None or now >= w.detect_at):
            scraped = await self._scrape(client, backend, w, now, table)
        if not scraped:
            w.waiting = w.running = w.host_in_flight = None
            w.kv_cache = None
            if backend.health_path:
                await self._probe(client, backend, w)
        w.step_ceiling(backend)

    async def _get(self, client: httpx.AsyncClient, backend: Backend, path: str) -> httpx.Response | str:
        headers = {"authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
        try:
            resp = await outbound.call(
                client, "GET", backend.url + path, deadline=PROBE_TIMEOUT, limit=ANSWER_LIMIT, headers=headers
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__} on GET {path}"
        if resp.status_code >= 500:
            return f"HTTP {resp.status_code} on GET {path}"
        return resp

    async def _scrape(
        self,
        client: httpx.AsyncClient,
        backend: Backend,
        w: BackendWatch,
        now: float,
        table: BucketTable | None,
    ) -> bool:
        key = backend_keys(backend.name)[0]
        before = table.gauge(key) if table is not None else None
        resp = await self._get(client, backend, "/metrics")
        if isinstance(resp, str):
            w.record(False, resp, backend.name)
            w.waiting = w.running = w.host_in_flight = None
            w.kv_cache = None
            return True  # the failure is this round's probe answer
        load = engine_load(resp.text) if resp.status_code == 200 else None
        if load is None:
            w.kind = None
            w.detect_at = now + REDETECT
            return False
        w.kind, w.waiting, w.running, w.kv_cache = load.kind, load.waiting, load.running, load.kv_cache
        # The engine's counts include this host's own requests of that moment: noted with them, routing
        # takes the other hosts' share from the (older) scrape and this host's from its live gauge. The
        # larger of the gauge before and after the scrape: a request of this host that ended (or began)
        # while the answer was on its way must not pass for another host's until the next scrape.
        w.host_in_flight = None if table is None or before is None else max(before, table.gauge(key))
        w.count_prompts(load.prompt_tokens, backend.name)
        w.record(True, name=backend.name)
        return True

    async def _probe(self, client: httpx.AsyncClient, backend: Backend, w: BackendWatch) -> None:
        assert backend.health_path is not None
        resp = await self._get(client, backend, backend.health_path)
        w.record(not isinstance(resp, str), resp if isinstance(resp, str) else None, backend.name)


class PeekedIndex(PrefixIndex):
    """The host's prefix index as the dry run reads it: what each target would match, nothing noted."""

    __slots__ = ()

    def insert(self, blocks: Blocks, target: int, pinned: bool = False) -> int:
        return 0

    def count_exact(self, held: bool) -> None:
        return None  # a dry run is not a decision the host made


def host_load(shared: SharedRegions, backends: list[str]) -> StaticLoad:
    """This host's load as the proxy workers see it now, frozen, and its prefix index read-only: for the
    routing dry run."""
    stats = WorkerStats(shared.stats)
    raw = stats.read(stats.engine_slot)
    engines = engine_states(orjson.loads(raw)) if raw else {}
    with BucketTable(shared.buckets) as table:
        flights = {name: table.gauge(backend_keys(name)[0]) for name in backends}
    region = shared.prefix
    return StaticLoad(flights, engines, index=PeekedIndex(region) if region is not None else None)
