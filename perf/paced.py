"""``python -m perf.paced``: an upstream that streams chat completions the way a busy vLLM does, one token
every 20-50 ms per stream, for thousands of streams at once from one process.

vLLM under load steps its whole batch at once and every running sequence gets its next token each step;
the step time varies with the batch. Here each stream's next gap is drawn uniformly from
``[min_ms, max_ms]``. The project's mock engine sleeps per stream (a task and a timer per token), which
costs more CPU than the proxies under test at thousands of streams; this server keeps one timer for the
whole process: a wheel of ``TICK_S`` slots, each holding the streams due in it, and one callback per tick
that writes the next token of every stream due. Per token that is one precomputed chunk handed to
``transport.write`` (one ``send``) and one list append: the least a streaming upstream can spend.

HTTP/1.1 with keep-alive; ``POST <anything>`` with ``"stream": true`` answers an SSE stream in chunked
encoding of ``max_tokens`` tokens (from the body; ``--tokens`` when absent), a usage event when
``stream_options.include_usage`` is asked for, then ``data: [DONE]``; without it, a whole chat completion
at once. ``GET /health`` answers 200; ``POST /pace`` with
``{"min_ms": A, "max_ms": B}`` changes the pacing (``0, 0``: as fast as possible, for check requests).
``--procs N`` forks N such processes on the same port (``SO_REUSEPORT``: the kernel spreads the
connections), for more streams than one process can pace; they share the pacing through one page.
I/O: a listening socket per process on 127.0.0.1, and its connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import mmap
import os
import random
import re
import signal
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["main"]

TICK_S: Final = 0.002  # a token is at most this late against its draw, far below the 20 ms pacing
_MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
_USAGE = b'"include_usage":true'
_STREAM = b'"stream":true'


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


# Every token is the same bytes: the proxies under test see vLLM's chunk shape and size, and the server
# builds nothing per token.
TOKEN: Final = _chunk(
    b'data: {"id":"chatcmpl-paced","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"mock-model","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}\n\n'
)
FINISH: Final = _chunk(
    b'data: {"id":"chatcmpl-paced","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"mock-model","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
)
DONE: Final = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
HEAD: Final = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _usage(tokens: int) -> bytes:
    doc = {
        "id": "chatcmpl-paced",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "mock-model",
        "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": tokens + 9},
    }
    return _chunk(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")


def _whole(tokens: int) -> bytes:
    """A non-streamed answer, at once: the pacing is for streams."""
    doc = {
        "id": "chatcmpl-paced",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "mock-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "tok " * tokens},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": tokens + 9},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


# The names a request may carry: perf.bench's model first (smg registers a worker under the first) and
# the upstream's own.
_MODELS: Final = json.dumps(
    {
        "object": "list",
        "data": [{"id": m, "object": "model", "owned_by": "perf"} for m in ("paced-model", "mock-model")],
    }
).encode()


def _small(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        reason.encode(),
        len(body),
        body,
    )


class Pacing:
    """The shortest and longest gap in seconds, in a shared anonymous page: with ``--procs``, a ``POST
    /pace`` reaches one process (the kernel picks the listener) and every process must follow it."""

    _FORMAT = "dd"

    def __init__(self, min_ms: float, max_ms: float) -> None:
        self.page = mmap.mmap(-1, struct.calcsize(self._FORMAT))  # MAP_SHARED: forked children see writes
        self.set(min_ms, max_ms)

    def set(self, min_ms: float, max_ms: float) -> None:
        struct.pack_into(self._FORMAT, self.page, 0, min_ms / 1000, max_ms / 1000)

    def get(self) -> tuple[float, float]:
        lo, hi = struct.unpack_from(self._FORMAT, self.page, 0)
        return float(lo), float(hi)


class Pacer:
    """The timer wheel: streams due in each ``TICK_S`` slot, and one callback a tick while any is open."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pacing: Pacing) -> None:
        self.loop = loop
        self.pacing = pacing
        self.min_s, self.max_s = pacing.get()
        self.slots: dict[int, list[Conn]] = {}
        self.handle: asyncio.TimerHandle | None = None
        self.open = 0

    def gap(self) -> float:
        return random.uniform(self.min_s, self.max_s)

    def due(self, conn: Conn, at: float) -> None:
        """Put ``conn`` in the slot of loop time ``at`` (the next tick if that has passed)."""
        slot = int(at / TICK_S) + 1
        bucket = self.slots.get(slot)
        if bucket is None:
            self.slots[slot] = [conn]
        else:
            bucket.append(conn)
        if self.handle is None:
            self.handle = self.loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        # Every tick while any stream is open (500 callbacks a second, whatever the number of streams),
        # rather than one timer at the earliest due slot, which a shorter draw would have to move.
        now_slot = int(self.loop.time() / TICK_S)
        for slot in [s for s in self.slots if s <= now_slot]:
            for conn in self.slots.pop(slot):
                conn.next_token()
        self.handle = self.loop.call_later(TICK_S, self._tick) if self.slots else None


class Conn(asyncio.Protocol):
    """One client connection: parses requests (head and ``content-length`` body), streams the answers."""

    def __init__(self, pacer: Pacer, default_tokens: int) -> None:
        self.pacer = pacer
        self.default_tokens = default_tokens
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.left = 0  # tokens still to send on the current stream; 0 when idle
        self.usage = b""
        self.due_at = 0.0  # loop time the next token is due at

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None  # a stream in the wheel finds it gone and drops out

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.left == 0 and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, _, rest = head.partition(" ")
            self.request(method, rest.partition(" ")[0], body)

    def request(self, method: str, path: str, body: bytes) -> None:
        assert self.transport is not None
        if method == "GET" and path == "/health":
            self.transport.write(_small(200, b'{"status":"ok"}'))
            return
        if method == "GET" and path == "/v1/models":  # what routers that register workers by model ask
            self.transport.write(_small(200, _MODELS))
            return
        if method == "POST" and path == "/pace":
            try:
                doc = json.loads(body)
                self.pacer.pacing.set(float(doc["min_ms"]), float(doc["max_ms"]))
            except (ValueError, KeyError, TypeError) as exc:
                self.transport.write(_small(400, json.dumps({"error": str(exc)}).encode()))
                return
            self.transport.write(_small(200, b'{"status":"ok"}'))
            return
        if method != "POST":
            self.transport.write(_small(404, b'{"error":"not found"}'))
            return
        found = _MAX_TOKENS.search(body)
        tokens = int(found.group(1)) if found else self.default_tokens
        if _STREAM not in body.replace(b" ", b""):
            self.transport.write(_small(200, _whole(tokens)))
            return
        self.left = max(1, tokens)
        self.usage = _usage(self.left) if _USAGE in body.replace(b" ", b"") else b""
        self.pacer.open += 1
        self.pacer.min_s, self.pacer.max_s = self.pacer.pacing.get()  # once per stream: 0.2 µs
        self.transport.write(HEAD)
        if self.pacer.max_s <= 0:
            self.transport.write(TOKEN * self.left + FINISH + self.usage + DONE)
            self.left = 0
            self.pacer.open -= 1
            return
        self.due_at = self.pacer.loop.time() + self.pacer.gap()
        self.pacer.due(self, self.due_at)

    def next_token(self) -> None:
        transport = self.transport
        if transport is None:
            self.pacer.open -= 1
            return
        self.left -= 1
        if self.left > 0:
            transport.write(TOKEN)
            # From when this token was due, not from when the tick came: a late tick (a busy machine)
            # then shortens the next gap instead of shifting every later token, so the pacing holds on
            # average and a stream lasts what its draws add up to.
            self.due_at += self.pacer.gap()
            self.pacer.due(self, self.due_at)
            return
        transport.write(TOKEN + FINISH + self.usage + DONE)
        self.pacer.open -= 1
        if self.buf:  # a pipelined request waited for this stream's end
            self.data_received(b"")


async def serve(port: int, tokens: int, pacing: Pacing, reuse_port: bool) -> None:
    loop = asyncio.get_running_loop()
    pacer = Pacer(loop, pacing)
    server = await loop.create_server(
        lambda: Conn(pacer, tokens), "127.0.0.1", port, backlog=16384, reuse_port=reuse_port or None
    )
    print(f"perf.paced listening on 127.0.0.1:{port} at {time.strftime('%H:%M:%S')}", flush=True)
    async with server:
        await server.serve_forever()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.paced", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=8800)
    p.add_argument("--tokens", type=int, default=256, help="tokens when the body names no max_tokens (256)")
    p.add_argument("--min-ms", type=float, default=20.0, help="shortest gap between two tokens (20)")
    p.add_argument("--max-ms", type=float, default=50.0, help="longest gap between two tokens (50)")
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        help="processes on the port (SO_REUSEPORT), each with its own streams (1): one writes about 90k "
        "tokens a second at most here",
    )
    return p.parse_args(argv)


def _run_one(args: argparse.Namespace, pacing: Pacing, reuse_port: bool) -> None:
    loop_factory: Callable[[], asyncio.AbstractEventLoop]
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # the bench extra brings uvloop; asyncio's loop works, at a higher cost per write
        loop_factory = asyncio.new_event_loop
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(args.port, args.tokens, pacing, reuse_port))
    except KeyboardInterrupt:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pacing = Pacing(args.min_ms, args.max_ms)
    if args.procs <= 1:
        _run_one(args, pacing, reuse_port=False)
        return 0
    children = []
    for _ in range(args.procs):
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: never outlive us
            _run_one(args, pacing, reuse_port=True)
            os._exit(0)
        children.append(pid)

    def stop(signum: int, frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)  # retried by Python itself when a signal interrupts it (PEP 475)
    return 0


if __name__ == "__main__":
    sys.exit(main())
