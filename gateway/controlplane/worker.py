"""Entry point of the forked control-plane worker: keeps the published snapshot equal to the store.

It polls the store's config revision (cheap) and, when it moved, builds a snapshot and publishes it into
the shared segment. SIGHUP re-applies the config file given to ``gateway serve --config`` first. A bad
config file is logged and the current snapshot kept: a reload never takes the data plane down.
I/O: the store (SQLite file or PostgreSQL), the config file on SIGHUP, the shared snapshot segment.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import orjson

from gateway.config import Settings
from gateway.controlplane.commands import apply_file
from gateway.controlplane.snapshot_build import build_snapshot_doc
from gateway.controlplane.store import Store, open_store
from gateway.errors import GatewayError
from gateway.shm.snapshot_slot import PublishRefused, SnapshotPublisher

__all__ = ["ControlWorker", "run_control_worker"]

log = logging.getLogger("gateway.controlplane")


def run_control_worker(settings: Settings, snapshot_buf: memoryview) -> int:
    return asyncio.run(ControlWorker(settings, snapshot_buf).run())


class ControlWorker:
    def __init__(self, settings: Settings, snapshot_buf: memoryview) -> None:
        self.settings = settings
        self.publisher = SnapshotPublisher(snapshot_buf)
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        store = open_store(self.settings)
        try:
            while not self._stop.is_set():
                if self._reload.is_set():
                    self._reload.clear()
                    self.reload_config()
                self.publish_if_changed(store)
                await self._sleep(self.settings.revision_poll_interval)
        finally:
            store.close()
        return 0

    async def _sleep(self, seconds: float) -> None:
        waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._reload.wait())]
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

    def publish_if_changed(self, store: Store) -> bool:
        revision = store.revision()
        if self.publisher.generation and revision <= self.publisher.revision:
            return False
        started = time.perf_counter()
        doc = build_snapshot_doc(store)
        blob = orjson.dumps(doc)
        try:
            generation = self.publisher.publish(blob, int(doc["revision"]))
        except PublishRefused as exc:
            log.error("snapshot not published: %s", exc)
            return False
        log.info(
            "published snapshot generation %d (revision %d, %d bytes, %d skipped) in %.1f ms",
            generation,
            doc["revision"],
            len(blob),
            doc.get("skipped", 0),
            (time.perf_counter() - started) * 1000,
        )
        return True
