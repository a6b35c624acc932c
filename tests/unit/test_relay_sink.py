"""The verbatim relay's sink (``gateway.dataplane.relay``): what goes out through which method of the
client's transport, when it asks the pour to stop for backpressure, and a send that would wait. Stand-in
transports record the calls; no sockets (the pour itself is tested against real servers in
tests/integration/test_http_client.py, granian's sends in tests/integration/test_relay.py)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from gateway.dataplane.drain import WINDOW
from gateway.dataplane.relay import Pace, SendPending, StreamSink, send_now


class Awaiting:
    """Only the awaitable sends, as granian's transport or a wrapper coroutine around it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def send_bytes(self, data: bytes) -> None:
        self.calls.append(("send_bytes", data))

    async def send_last(self, data: bytes) -> None:
        self.calls.append(("send_last", data))


class Writing:
    """The tap's shape: sends at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def write_last(self, data: bytes) -> None:
        self.calls.append(("write_last", data))


class Waits:
    """A send whose awaitable does wait (not granian 2.x)."""

    def send_bytes(self, data: bytes) -> Any:
        class _Pending:
            def __await__(self) -> Generator[None, None, None]:
                yield None

        return _Pending()


@pytest.mark.parametrize(
    ("transport", "names"),
    [(Awaiting(), ["send_bytes", "send_last"]), (Writing(), ["write", "write_last"])],
    ids=["awaitable", "immediate"],
)
def test_the_last_piece_goes_through_the_last_send(transport: Any, names: list[str]) -> None:
    sink = StreamSink(transport, Pace(None, 60.0))
    assert not sink(b"a", False)
    assert not sink(b"b", True)
    assert transport.calls == [(names[0], b"a"), (names[1], b"b")]
    assert sink.piece == b"b" and sink.pace.sent == 2


def test_a_transport_without_a_last_send_gets_the_last_piece_as_any_other() -> None:
    class Plain:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        async def send_bytes(self, data: bytes) -> None:
            self.sent.append(data)

    transport = Plain()
    sink = StreamSink(transport, Pace(None, 60.0))
    sink(b"x", False)
    sink(b"y", True)
    assert transport.sent == [b"x", b"y"]


def test_the_sink_stops_the_pour_when_backpressure_is_due() -> None:
    pace = Pace("peer", 60.0)  # a peer: the first look at the client's socket is due after a window
    sink = StreamSink(Writing(), pace)
    piece = b"x" * (WINDOW // 4)
    assert [sink(piece, False) for _ in range(4)] == [False, False, False, True]


def test_a_send_that_waits_is_refused_rather_than_lost() -> None:
    with pytest.raises(SendPending):
        send_now(Waits(), b"z")
