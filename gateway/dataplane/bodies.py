"""Reading a request's body: bounded in size as it arrives, in time without progress, and in the bytes one
worker holds at once.

- Size: a declared ``Content-Length`` over the limit is refused before a byte is read (413); a chunked body
  is refused as soon as what arrived passes it.
- Stalls: a body that brings no byte for ``body_timeout`` seconds gets 408. hyper's head timeout does not
  cover bodies, and a timer per request cost ~1.8 µs (``call_later`` + ``cancel`` on uvloop), so one
  sweep per worker (``StallWatch``) looks at the reads in progress every eighth of the timeout and cancels
  those that made no progress for the whole timeout. A read costs a dict insert and a pop. A body of up to
  ``WHOLE`` bytes is read in one call (``await proto()``), so its progress is not seen: it must arrive
  within the timeout as a whole (64 KiB in 30 s is 2 KiB/s). Larger ones are read chunk by chunk and may
  take as long as they need while bytes keep coming.
- Memory: bodies larger than ``WHOLE`` are held against a per-worker budget (``BodyBudget``); one that
  does not fit waits for room, up to ``body_wait`` seconds, and then gets 503 with Retry-After. While it
  waits its bytes stay in the kernel's socket buffers and TCP slows its sender. A body is held once, but it
  is charged twice its size for the request's lifetime: its chunks and the body joined from them exist
  together for a moment, and so do the body and its copy with the model renamed for a backend
  (``splice_model``). Measured, one 30 MB upload peaks at twice its size in the worker; so charged, a
  worker's request bodies never pass its budget.

I/O: the client connection (reading the body).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from gateway.dataplane.rsgi import HTTPProtocol
from gateway.errors import BadRequest, PayloadTooLarge, RequestTimeout, ServiceUnavailable

__all__ = ["WHOLE", "BodyBudget", "BodyReader", "StallWatch"]

# Bodies up to this size are read in one call and held outside the budget: the common request, and at
# most backpressure x 64 KiB per worker even if every connection sent one.
WHOLE = 64 * 1024


class StallWatch:
    """The body reads in progress on one worker's loop, each with the time of its last progress, and the
    one timer that sweeps them."""

    __slots__ = ("interval", "loop", "reading", "stalled", "timeout", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.interval = max(0.05, timeout / 8)
        self.reading: dict[asyncio.Task[Any], float] = {}
        self.stalled: set[asyncio.Task[Any]] = set()
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> asyncio.Task[Any] | None:
        """Note the current task as reading, from now. (The loop named: it spares a getpid() call.)"""
        if self.timeout <= 0:  # --body-timeout 0: bodies may stall for ever
            return None
        task = asyncio.current_task(self.loop)
        if task is not None:
            now = self.loop.time()
            self.reading[task] = now
            if self.timer is None:
                self.timer = self.loop.call_at(now + self.interval, self._sweep)
        return task

    def progress(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self.reading[task] = self.loop.time()

    def stop(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self.reading.pop(task, None)

    def timed_out(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether ``task`` was cancelled by the sweep (then it is no longer cancelling)."""
        if task is None or task not in self.stalled:
            return False
        self.stalled.discard(task)
        task.uncancel()
        return True

    def _sweep(self) -> None:
        self.timer = None
        reading = self.reading
        if not reading:
            return  # stand again only when a read starts
        now = self.loop.time()
        due = now - self.timeout
        for task, last in list(reading.items()):
            if last <= due:
                del reading[task]
                self.stalled.add(task)
                task.cancel()
        self.timer = self.loop.call_at(now + self.interval, self._sweep)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class BodyBudget:
    """Bytes of large request bodies one worker may hold at once; requests wait for room in arrival order."""

    __slots__ = ("available", "capacity", "loop", "wait", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int, wait: float) -> None:
        self.loop = loop
        self.capacity = capacity
        self.available = capacity
        self.wait = wait
        self.waiters: deque[tuple[asyncio.Future[None], int]] = deque()

    async def take(self, n: int) -> int:
        """Hold ``n`` bytes (at most the whole budget); returns what was taken. Raises ServiceUnavailable
        when no room came within ``wait`` seconds."""
        n = min(n, self.capacity)
        if n <= self.available and not self.waiters:
            self.available -= n
            return n
        fut: asyncio.Future[None] = self.loop.create_future()
        entry = (fut, n)
        self.waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait):  # a timer only for a request that has to wait
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.give(n)  # room came as the wait ended: hand it on
            else:
                self._leave(entry)
            if isinstance(exc, TimeoutError):
                raise ServiceUnavailable(
                    f"this gateway worker is buffering as many request bodies as it may "
                    f"({self.capacity} bytes); retry shortly",
                    headers={"retry-after": "1"},
                ) from None
            raise
        return n

    def give(self, n: int) -> None:
        self.available += n
        self._wake()

    def _leave(self, entry: tuple[asyncio.Future[None], int]) -> None:
        try:
            self.waiters.remove(entry)
        except ValueError:
            pass
        self._wake()

    def _wake(self) -> None:
        waiters = self.waiters
        while waiters:
            fut, n = waiters[0]
            if fut.done():
                waiters.popleft()
                continue
            if n > self.available:
                return
            waiters.popleft()
            self.available -= n
            fut.set_result(None)


class BodyReader:
    """One worker's body reading: its limit, its stall watch, its budget, and which requests hold room."""

    __slots__ = ("budget", "held", "limit", "stalls")

    def __init__(self, limit: int, stalls: StallWatch, budget: BodyBudget) -> None:
        self.limit = limit
        self.stalls = stalls
        self.budget = budget
        self.held: dict[asyncio.Task[Any], int] = {}  # the tasks holding budget room, and how much

    async def read(self, proto: HTTPProtocol, content_length: str | None) -> bytes:
        limit = self.limit
        declared = -1
        if content_length is not None:
            try:
                declared = int(content_length)
            except ValueError:
                raise BadRequest("invalid Content-Length header") from None
            if declared > limit:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
            if declared <= WHOLE:
                return await self._whole(proto)
        return await self._chunks(proto, declared)

    async def _whole(self, proto: HTTPProtocol) -> bytes:
        stalls = self.stalls
        task = stalls.start()
        try:
            body = await proto()
        except asyncio.CancelledError:
            if stalls.timed_out(task):
                raise self._stalled() from None
            raise
        finally:
            stalls.stop(task)
        return body

    async def _chunks(self, proto: HTTPProtocol, declared: int) -> bytes:
        limit = self.limit
        stalls = self.stalls
        # Room for twice what arrives, for the request's lifetime: see the module's docstring. Taken
        # before the stall watch starts: a wait for room is not the client's stall.
        me = asyncio.current_task(self.budget.loop)
        held = await self._hold(me, 2 * declared) if declared > 0 else 0
        task = stalls.start()  # None when bodies may stall (--body-timeout 0)
        try:
            parts: list[bytes] = []
            size = 0
            async for chunk in proto:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
                if 2 * size > held and size > WHOLE:  # chunked (or longer than declared): hold as it grows
                    stalls.stop(task)
                    held += await self._hold(me, 2 * size - held)
                    task = stalls.start()
                parts.append(chunk)
                stalls.progress(task)
        except asyncio.CancelledError:
            if stalls.timed_out(task):
                raise self._stalled() from None
            raise
        finally:
            stalls.stop(task)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _hold(self, task: asyncio.Task[Any] | None, n: int) -> int:
        taken = await self.budget.take(n)
        if task is not None:
            self.held[task] = self.held.get(task, 0) + taken
        return taken

    def release(self) -> None:
        """The current request ended: give back the room its body held (if any)."""
        task = asyncio.current_task(self.budget.loop)
        n = self.held.pop(task, 0) if task is not None else 0
        if n:
            self.budget.give(n)

    def _stalled(self) -> RequestTimeout:
        # granian closes the connection after this answer, as it must with a body left unread.
        return RequestTimeout(
            f"the request body stopped arriving: no byte for {self.stalls.timeout:g} seconds"
        )
