"""The host's subscriptions to its engines' KV-cache events: one ZeroMQ SUB socket per backend with
``kv_events``, whose batches keep that backend's exact pairs in the host's prefix index
(``gateway.routing.kv_mirror``), which the proxy workers read on the request path.

It runs on the engine scraper's event loop, in the host's control slot: one process per host subscribes,
never a proxy worker. ``follow`` is called each scrape round with the snapshot's backends: it starts a
subscription for a backend that gained an endpoint, and ends (and forgets the exact pairs of) one that lost
it or left. Each subscription connects and watches its socket's monitor: a disconnect (the engine went
away, or sent a message past ``MAX_MESSAGE``) ends the socket, a new one connects half a second later, and
the backend's exact pairs are forgotten, since what the engine did while we were away is unknown
(vLLM's replay socket is not used: the approximate pairs carry the backend until events refill the exact
ones). Its counts go in the engine document the scraper publishes, and from there to ``/metrics``.

I/O: ZeroMQ sockets (connect, receive) on the running loop; the prefix index's shared memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.native import PrefixIndex
from gateway.protocol.kv_events import KVEventError, decode_batch, decode_sequence
from gateway.routing.kv_mirror import BackendMirror, exact_key
from gateway.snapshot import Backend

__all__ = ["KVEventFollower"]

log = logging.getLogger("gateway.kv_events")

RECEIVE_HWM = 10_000  # batches queued in the socket before ZeroMQ drops (a gap we then see)
# The largest message taken: a vLLM batch of one scheduler step is kilobytes; a peer that sends more is
# disconnected by ZeroMQ (a disconnect: its exact pairs are forgotten), so that no endpoint can make the
# control slot hold gigabytes.
MAX_MESSAGE = 16 << 20
RESUBSCRIBE = 0.5  # seconds between a disconnect and the new socket


class _Subscription:
    def __init__(self, endpoint: str, mirror: BackendMirror) -> None:
        self.endpoint = endpoint
        self.mirror = mirror
        self.connected = False
        self.task: asyncio.Task[None] | None = None


class KVEventFollower:
    """The subscriptions of one host. Not thread-safe: call it on the loop it runs on. It owns ``index``
    (attached to the host's segment) and closes it in ``aclose``."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self._context = zmq.asyncio.Context()
        self._subs: dict[str, _Subscription] = {}

    def follow(self, backends: dict[str, Backend]) -> None:
        """Subscribe to the backends with ``kv_events``, and only those."""
        for name, sub in list(self._subs.items()):
            backend = backends.get(name)
            if backend is None or backend.kv_events != sub.endpoint:
                self._end(name, sub)
        for name, backend in backends.items():
            if backend.kv_events and name not in self._subs:
                mirror = BackendMirror(self.index, exact_key(name))
                mirror.restart()  # pairs an earlier control slot left are of unknown age
                sub = self._subs[name] = _Subscription(backend.kv_events, mirror)
                sub.task = asyncio.get_running_loop().create_task(self._run(name, sub))

    def counts(self) -> dict[str, dict[str, Any]]:
        """Each subscribed backend's counts, and whether it is connected now."""
        return {
            name: asdict(sub.mirror.counts) | {"connected": sub.connected, "blocks": len(sub.mirror.blocks)}
            for name, sub in self._subs.items()
        }

    async def aclose(self) -> None:
        """End every subscription (each closes its sockets as its task ends), then the context."""
        tasks = [sub.task for sub in self._subs.values() if sub.task is not None]
        for name, sub in list(self._subs.items()):
            self._end(name, sub)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._context.term()
        self.index.close()

    def _end(self, name: str, sub: _Subscription) -> None:
        if sub.task is not None:
            sub.task.cancel()
        sub.mirror.restart()
        del self._subs[name]

    async def _run(self, name: str, sub: _Subscription) -> None:
        """Subscribe, and after each disconnect subscribe again on a new socket: ZeroMQ's own reconnection
        does not come back from every cause (one is a message past ``MAX_MESSAGE``)."""
        while await self._session(name, sub):
            await asyncio.sleep(RESUBSCRIBE)

    async def _session(self, name: str, sub: _Subscription) -> bool:
        """One socket's life: until its peer disconnects (True: subscribe again) or the endpoint cannot be
        connected to at all (False)."""
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sock.connect(sub.endpoint)
        except zmq.ZMQError as exc:
            log.error("backend %s: cannot subscribe to KV events at %s: %s", name, sub.endpoint, exc)
            monitor.close(0)
            sock.close(0)
            return False
        poller = zmq.asyncio.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:  # before the messages: a disconnect voids what came before it
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_CONNECTED:
                        sub.connected = True
                    elif event["event"] == zmq.EVENT_DISCONNECTED:
                        sub.connected = False
                        sub.mirror.restart()
                        log.info("backend %s: KV events disconnected; its exact pairs are forgotten", name)
                        return True
                if sock in ready:
                    for _ in range(256):  # what queued, a bounded number at a time
                        try:
                            frames = await sock.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._take(name, sub.mirror, frames)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(0)
            sock.close(0)

    def _take(self, name: str, mirror: BackendMirror, frames: list[bytes]) -> None:
        try:
            if len(frames) != 3:
                raise KVEventError(f"{len(frames)} frames, not [topic, sequence, payload]")
            sequence = decode_sequence(frames[1])
            batch = decode_batch(frames[2])
        except KVEventError as exc:
            # Whatever it said is lost: as a gap, the backend's exact pairs are forgotten.
            mirror.counts.undecodable += 1
            mirror.counts.gaps += 1
            mirror.restart()
            if mirror.counts.undecodable == 1:
                log.warning("backend %s: undecodable KV event message: %s", name, exc)
            return
        try:
            mirror.apply(sequence, batch)
        except Exception:  # a batch that decoded but cannot be applied must not end the subscription
            mirror.counts.undecodable += 1
            mirror.counts.gaps += 1
            mirror.restart()
            log.exception("backend %s: a KV event batch could not be applied; exact pairs forgotten", name)
