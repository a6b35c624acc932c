"""The per-worker budget of buffered request bodies and the stall sweep, on a real event loop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.dataplane.bodies import BodyBudget, StallWatch
from gateway.errors import ServiceUnavailable


def test_budget_lets_bodies_in_as_room_comes_back_in_arrival_order() -> None:
    async def go() -> list[str]:
        budget = BodyBudget(asyncio.get_running_loop(), 100, wait=5.0)
        order: list[str] = []
        assert await budget.take(60) == 60

        async def want(name: str, n: int) -> None:
            await budget.take(n)
            order.append(name)

        tasks = [asyncio.create_task(want("big", 80)), asyncio.create_task(want("small", 10))]
        await asyncio.sleep(0.01)
        assert order == []  # "small" would fit, but waits behind "big": no starvation of large bodies
        budget.give(60)
        await asyncio.gather(*tasks)
        assert budget.available == 10
        return order

    assert asyncio.run(go()) == ["big", "small"]


def test_budget_wait_is_bounded_and_ends_in_503() -> None:
    async def go() -> None:
        budget = BodyBudget(asyncio.get_running_loop(), 100, wait=0.05)
        await budget.take(100)
        with pytest.raises(ServiceUnavailable) as info:
            await budget.take(1)
        assert info.value.headers["retry-after"] == "1"
        assert not budget.waiters
        budget.give(100)
        assert budget.available == 100

    asyncio.run(go())


def test_stall_sweep_cancels_only_reads_without_progress() -> None:
    async def go() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        watch = StallWatch(loop, 0.2)

        async def read(progressing: bool) -> bool:
            task = watch.start()
            try:
                for _ in range(8):
                    await asyncio.sleep(0.05)
                    if progressing:
                        watch.progress(task)
            except asyncio.CancelledError:
                assert watch.timed_out(task)
                return False
            finally:
                watch.stop(task)
            return True

        stalled, steady = await asyncio.gather(read(False), read(True))
        await asyncio.sleep(0.1)
        assert watch.timer is None  # nothing reading: the sweep stands down
        return stalled, steady

    assert asyncio.run(go()) == (False, True)


class Chunks:
    """What granian's RSGI protocol object offers a body reader: ``await proto()`` and ``async for``."""

    def __init__(self, chunks: list[bytes], pause: float = 0.0) -> None:
        self.chunks = chunks
        self.pause = pause

    async def __call__(self) -> bytes:
        return b"".join([c async for c in self])

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for c in self.chunks:
            await asyncio.sleep(self.pause)
            yield c


@pytest.mark.parametrize("timeout", [0.1, 0.0])
def test_waiting_for_room_is_not_a_stall_and_room_comes_back(timeout: float) -> None:
    from gateway.dataplane.bodies import BodyReader

    async def go() -> None:
        loop = asyncio.get_running_loop()
        budget = BodyBudget(loop, 300_000, wait=2.0)
        reader = BodyReader(1_000_000, StallWatch(loop, timeout), budget)
        await budget.take(300_000)  # another request holds it all
        loop.call_later(0.3, budget.give, 300_000)  # three stall timeouts later

        async def request() -> bytes:
            try:
                return await reader.read(Chunks([b"x" * 50_000] * 2), "100000")
            finally:
                assert budget.available == 100_000  # twice the body, held until the request ends
                reader.release()

        assert len(await asyncio.create_task(request())) == 100_000
        assert budget.available == 300_000 and not reader.held

    asyncio.run(go())


def test_a_large_body_that_stalls_gets_408() -> None:
    from gateway.dataplane.bodies import BodyReader
    from gateway.errors import RequestTimeout

    async def go() -> None:
        loop = asyncio.get_running_loop()
        budget = BodyBudget(loop, 1_000_000, wait=1.0)
        reader = BodyReader(1_000_000, StallWatch(loop, 0.1), budget)

        async def request() -> None:
            try:
                with pytest.raises(RequestTimeout):
                    await reader.read(Chunks([b"x" * 70_000] * 2, pause=0.5), "140000")
            finally:
                reader.release()

        await asyncio.create_task(request())
        assert budget.available == 1_000_000

    asyncio.run(go())
