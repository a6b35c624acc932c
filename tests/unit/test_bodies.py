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
