"""Outbound calls off the request path against a peer that dribbles its answer (a real server on loopback,
``tests.fixtures.dribbler``: the status line and headers, then a byte every half second for a minute):
the engine scraper's probes and a proxy-role host's calls to its control plane each end at their total
deadline, counted as the failures they are, instead of lasting as long as the peer dribbles. (The OTLP
exporter and the budget-alert webhook are in test_otel.py and test_budget_alerts.py.)"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.config import Settings
from gateway.controlplane.fleet import engines, remote
from gateway.controlplane.fleet.engines import EngineScraper
from gateway.controlplane.fleet.remote import RemoteControlWorker
from gateway.shm.regions import RegionSizes, SharedRegions
from gateway.shm.snapshot_slot import CONTROL_UNREACHABLE, SnapshotReader
from gateway.snapshot import Backend
from tests.fixtures.dribbler import Dribbler

SLACK = 8.0  # seconds past a deadline a loaded machine may take; the dribble lasts 60 s


@pytest.fixture
def shared() -> Iterator[SharedRegions]:
    regions = SharedRegions.create(
        RegionSizes(workers=1, snapshot_bytes=1 << 20, bucket_capacity=4, ring_slots=2)
    )
    yield regions
    regions.close()


def test_a_backend_that_dribbles_its_metrics_fails_each_probe_at_the_deadline(shared: SharedRegions) -> None:
    engine = Dribbler(interval=0.5, length=60.0)
    backend = Backend("slow", engine.url.rstrip("/"), None, "openai", 1.0, 10.0, 30.0, health_path="/health")
    scraper = EngineScraper(shared)

    async def two_rounds() -> float:
        async with httpx.AsyncClient(timeout=httpx.Timeout(engines.PROBE_TIMEOUT), trust_env=False) as client:
            began = time.monotonic()
            for _ in range(engines.FAILURES_TO_MARK_DOWN):
                await scraper.watch(client, backend)
            return time.monotonic() - began

    try:
        took = asyncio.run(two_rounds())
        w = scraper.watches["slow"]
        assert not w.healthy and w.error == "DeadlineExceeded on GET /metrics"
        assert len(engine.requests) == engines.FAILURES_TO_MARK_DOWN
        assert took < engines.FAILURES_TO_MARK_DOWN * engines.PROBE_TIMEOUT + SLACK
    finally:
        engine.stop()


def test_a_control_plane_that_dribbles_its_snapshot_is_unreachable_at_the_deadline(
    tmp_path: Path, shared: SharedRegions, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = Dribbler(interval=0.5, length=60.0)
    monkeypatch.setenv("GATEWAY_CLUSTER_TOKEN", "t" * 32)
    settings = Settings(role="proxy", control_url=plane.url, data_dir=tmp_path)
    worker = RemoteControlWorker(settings, shared)
    try:
        began = time.monotonic()
        worker.sync_snapshot()
        took = time.monotonic() - began
        state, _ = SnapshotReader(shared.snapshot).control_state()
        assert state == CONTROL_UNREACHABLE
        assert [r.split(b"\r\n")[0] for r in plane.requests] == [b"GET /cluster/snapshot HTTP/1.1"]
        assert took < remote.CONTROL_DEADLINE + SLACK
    finally:
        worker.client.close()
        worker.table.close()  # its views of the shared segments, so that the fixture can close them
        del worker
        gc.collect()
        plane.stop()
