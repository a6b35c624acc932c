"""The stream relay's assumption about granian, checked against granian itself: its stream transport's
``send_bytes`` queues the bytes at once and hands back an awaitable that is already complete, or already
failed once the client is gone, so ``relay.send_now`` can complete it without a task. A granian that
changed this would fail here rather than in production streams. Real server (granian's embedded one) and a
real client on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

from granian.constants import Interfaces
from granian.server.embed import Server

from gateway.dataplane.relay import Pace, StreamSink, send_now
from tests.fixtures.processes import free_port


class _App:
    """Streams two pieces through ``send_now``, waits for the client to leave, then tries a third."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.outcome: list[str] = []

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        await proto()
        transport = proto.response_stream(200, [("content-type", "text/event-stream")])
        sink = StreamSink(transport, Pace(None, 60.0))
        assert not sink(b"data: 1\n\n", False)  # no peer: backpressure never asks to stop
        send_now(transport, b"data: 2\n\n")
        self.outcome.append("sent")
        await self.left.wait()
        for _ in range(50):  # granian notices the close within a few milliseconds
            await asyncio.sleep(0.02)
            try:
                send_now(transport, b"data: 3\n\n")
            except Exception as exc:  # the very exception is what is checked
                self.outcome.append(type(exc).__name__)
                return
        self.outcome.append("never failed")


def test_granian_sends_complete_at_once_and_fail_once_the_client_left() -> None:
    app = _App()
    port = free_port()

    async def main() -> bytes:
        server = Server(app, address="127.0.0.1", port=port, interface=Interfaces.RSGI)
        serving = asyncio.create_task(server.serve())
        try:
            for _ in range(100):
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            got = b""
            while b"data: 2\n\n" not in got:
                got += await asyncio.wait_for(reader.read(4096), 5)
            writer.transport.abort()
            app.left.set()
            for _ in range(100):
                if len(app.outcome) == 2:
                    break
                await asyncio.sleep(0.05)
            return got
        finally:
            server.stop()
            await asyncio.wait_for(serving, 10)

    got = asyncio.run(main())
    assert got.startswith(b"HTTP/1.1 200") and got.index(b"data: 1\n\n") < got.index(b"data: 2\n\n")
    assert app.outcome == ["sent", "RSGIProtocolClosed"]
