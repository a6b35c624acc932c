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
        for watched in (first, second, third):
            watch.remove(watched)  # stops each armed watch
        await asyncio.sleep(0)
        assert all(w.watcher is not None and w.watcher.cancelled() for w in (first, second, third))
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
