"""``DisconnectWatch``: a request's client is watched only once the request has run ``after`` seconds, by
one timer per worker that stands at the oldest request's due time."""

from __future__ import annotations

import asyncio

from gateway.dataplane.disconnects import DisconnectWatch

AFTER = 0.4  # wide margins: sleeps on a loaded machine overshoot


class Client:
    """Stands in for granian's protocol object: ``client_disconnect`` resolves when ``leave`` is called."""

    def __init__(self) -> None:
        self.watched = 0
        self.left = asyncio.Event()

    async def client_disconnect(self) -> None:
        self.watched += 1
        await self.left.wait()

    def leave(self) -> None:
        self.left.set()


def test_a_short_request_is_never_watched_and_leaves_no_timer() -> None:
    async def main() -> None:
        watch = DisconnectWatch(asyncio.get_running_loop(), AFTER)
        client = Client()
        watched = watch.add(client)
        await asyncio.sleep(AFTER / 5)
        watch.remove(watched)
        await asyncio.sleep(AFTER * 2)  # the timer fires, finds nothing due, and does not stand again
        assert client.watched == 0 and watched.watcher is None
        assert watch.pending == {} and watch.timer is None

    asyncio.run(main())


def test_a_long_request_is_cancelled_when_its_client_leaves() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        watch = DisconnectWatch(loop, AFTER)
        client = Client()
        started = loop.time()

        async def request() -> str:
            watched = watch.add(client)
            try:
                await asyncio.sleep(30)
                return "answered"
            except asyncio.CancelledError:
                assert watched.gone
                return "client gone"
            finally:
                watch.remove(watched)

        task = loop.create_task(request())
        await asyncio.sleep(AFTER / 2)
        assert client.watched == 0  # not yet due
        await asyncio.sleep(AFTER)
        assert client.watched == 1
        client.leave()
        assert await task == "client gone"
        assert loop.time() - started < 5
        assert watch.pending == {}

    asyncio.run(main())


def test_requests_come_due_in_the_order_they_started() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        watch = DisconnectWatch(loop, AFTER)
        clients = [Client() for _ in range(4)]
        first = watch.add(clients[0])
        second = watch.add(clients[1])
        await asyncio.sleep(AFTER / 2)
        third = watch.add(clients[2])
        ended = watch.add(clients[3])
        watch.remove(ended)  # ended before it came due: never watched
        await asyncio.sleep(AFTER * 0.75)  # the first two are due, the third not yet
        assert [c.watched for c in clients] == [1, 1, 0, 0]
        assert list(watch.pending) == [third] and watch.timer is not None
        await asyncio.sleep(AFTER)
        assert [c.watched for c in clients] == [1, 1, 1, 0]
        assert watch.pending == {} and watch.timer is None
        watchers = [w.watcher for w in (first, second, third)]
        for watched in (first, second, third):
            watch.remove(watched)  # stops each armed watch, and lets go of it
        await asyncio.sleep(0)
        assert all(w is not None and w.cancelled() for w in watchers)
        assert all(w.watcher is None for w in (first, second, third))
        assert not any(w.gone for w in (first, second, third))

    asyncio.run(main())


def test_close_takes_the_timer_down() -> None:
    async def main() -> None:
        watch = DisconnectWatch(asyncio.get_running_loop(), AFTER)
        watch.add(Client())
        assert watch.timer is not None
        watch.close()
        assert watch.timer is None

    asyncio.run(main())


def test_a_watched_request_leaves_no_cycle_holding_its_answer() -> None:
    """A long request's watch, disarmed when the request ends, must not keep the client's protocol object
    (the tap, holding the answer's meter: a translated Responses stream's whole text) in a reference cycle:
    proxy workers collect cycles rarely, and 20 MiB streams kept ~20 MiB each (issue 29, case 5). With the
    collector off, the object goes as soon as the request lets go of it."""
    import gc
    import weakref

    async def main() -> weakref.ref[Client]:
        watch = DisconnectWatch(asyncio.get_running_loop(), 0.01)
        client = Client()
        gone = weakref.ref(client)
        watched = watch.add(client)
        await asyncio.sleep(0.05)  # long enough to be watched
        assert client.watched == 1
        watch.remove(watched)
        del watched, client
        await asyncio.sleep(0.01)  # the cancelled watch runs its end
        return gone

    gc.collect()
    gc.disable()
    try:
        gone = asyncio.run(main())
        assert gone() is None
    finally:
        gc.enable()
