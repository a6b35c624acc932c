"""A thin wrapper around granian's RSGI protocol object that adds response headers (the request id and
the rate-limit ones), notes when the answer started, and keeps the response's last bytes (a stream's in a
``StreamTail``, one window written round), so usage can be read once at the end.

The bytes themselves are handed to granian untouched. When the forwarder translates an answer (or relays
an Anthropic one), it sets ``meter``, and usage is the translation's rather than the tail's. The tap keeps
the tail buffer, never the stream transport: granian ends a response when its transport object is freed,
and the forwarder relies on that.

A streamed answer also counts the bytes relayed (one addition per chunk) and notes which backend sent it,
and, when it ended short, why (``cut``): then ``relayed_usage`` estimates what was relayed from that count
and the tail, once, so that an abandoned or broken stream is still billed.
I/O: none of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Literal, Protocol

from gateway.dataplane.relay import send_now
from gateway.dataplane.rsgi import HTTPProtocol, Transport, WrappedProtocol
from gateway.dataplane.stream_tail import StreamTail
from gateway.dataplane.usage_withhold import WithheldUsage
from gateway.native import Usage, parse_usage
from gateway.protocol.relayed import estimate_relayed_tokens

__all__ = ["UNTAPPED", "AnswerMeter", "Cut", "Metered", "ResponseTap", "TapTransport", "answer_meter"]

TAIL_BYTES = 4096
# What the last events of a complete stream contain, in each protocol a client speaks.
_ENDS = (b"[DONE]", b"message_stop", b"response.completed", b"response.incomplete", b"response.failed")


Cut = Literal["client", "upstream"]  # who ended a started answer short


class Metered(Protocol):
    """What reads an answer's usage as it passes, instead of the tail: a translation, an Anthropic meter.
    One whose ``unbilled`` attribute is true bills nothing, not even what was relayed of it."""

    def usage(self) -> Usage | None: ...


class AnswerMeter(Protocol):
    """The forwarder's whole interface to the metering of the answer it relays, in every protocol pair:
    which backend answered after how many tries, what reads its usage and whether its framing can show a
    cut, who cut it short, and when it ended (``end``: settle now, before the client sees the end).
    ``ResponseTap`` is the one; ``UNTAPPED`` stands in for a request nothing is accounted for."""

    def answered_by(self, backend: str, attempts: int) -> None: ...

    def relaying(self, meter: Metered | None, unframed: bool) -> None: ...

    def cut_short(self, by: Cut) -> None: ...

    def end(self) -> None: ...


class _Untapped:
    """The answer meter of a request nothing is accounted for: it hears everything and keeps nothing."""

    __slots__ = ()

    def answered_by(self, backend: str, attempts: int) -> None:
        pass

    def relaying(self, meter: Metered | None, unframed: bool) -> None:
        pass

    def cut_short(self, by: Cut) -> None:
        pass

    def end(self) -> None:
        pass


UNTAPPED = _Untapped()


def answer_meter(proto: HTTPProtocol) -> AnswerMeter:
    """The meter of the answer going out through ``proto``: the tap itself, or ``UNTAPPED``."""
    return proto if isinstance(proto, ResponseTap) else UNTAPPED


class ResponseTap(WrappedProtocol):
    __slots__ = (
        "attempts",
        "backend",
        "cut",
        "extra_headers",
        "meter",
        "on_end",
        "relayed",
        "started",
        "status",
        "tail",
        "unframed",
        "whole",
        "withhold_usage",
    )

    def __init__(
        self,
        proto: HTTPProtocol,
        extra_headers: list[tuple[str, str]],
        on_end: Callable[[ResponseTap, int], None] | None = None,
    ) -> None:
        self._proto = proto
        self.extra_headers = extra_headers
        # Called once with the tap and its status, just before the client can see the answer's end: a
        # whole answer's bytes, or (from the forwarder, ``end``) a stream's last ones. Accounting settles
        # there, so that the client's next request already meets this one's spend and released places.
        # Handed the tap rather than closing over it: a callback that refers back to the tap would be a
        # reference cycle, left for the collector by every request that ends without an answer.
        self.on_end = on_end
        self.status = 0
        self.started: float | None = None  # perf_counter when the answer started
        self.whole: bytes | None = None
        self.tail: StreamTail | None = None
        # A translated or Anthropic answer: the forwarder's translation reads usage instead of the tail.
        self.meter: Metered | None = None
        # The gateway asked for this stream's usage, the client did not: what the engine added for it is
        # taken out of what the client gets (``usage_withhold``), after the tail has seen it.
        self.withhold_usage = False
        self.backend: str | None = None  # the backend whose answer this is (set by the forwarder)
        self.attempts = 0
        self.relayed = 0  # bytes of a streamed answer handed to the client
        self.cut: Cut | None = None  # when a started answer ended short
        # A stream delimited by the connection's close: its end may have been a cut nobody could see, so
        # settling looks at its last bytes for its protocol's end (``ended_short``).
        self.unframed = False

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.started = time.perf_counter()
        self.status = status
        self.whole = body
        self.end()
        self._proto.response_bytes(status, headers + self.extra_headers, body)

    # -- the forwarder's interface (``AnswerMeter``) ------------------------------------------------------
    def answered_by(self, backend: str, attempts: int) -> None:
        self.backend = backend
        self.attempts = attempts

    def relaying(self, meter: Metered | None, unframed: bool) -> None:
        if meter is not None:
            self.meter = meter
        self.unframed = unframed

    def cut_short(self, by: Cut) -> None:
        self.cut = by

    def end(self) -> None:
        on_end = self.on_end
        if on_end is not None:
            self.on_end = None
            on_end(self, self.status)

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> TapTransport:
        self.started = time.perf_counter()
        self.status = status
        transport: Transport = self._proto.response_stream(status, headers + self.extra_headers)
        # Translated streams are tapped too: their usage is the meter's, but a cut one is estimated from
        # the tail like any other.
        self.tail = StreamTail(TAIL_BYTES)
        if self.withhold_usage and self.meter is None:
            transport = WithheldUsage(transport)
        return TapTransport(transport, self.tail, self)

    def usage(self) -> Usage | None:
        """Usage from the last bytes of a successful answer, parsed once; None when absent or not 2xx."""
        if not 200 <= self.status < 300:
            return None
        if self.meter is not None:
            usage: Usage | None = self.meter.usage()
            return usage
        whole = self.whole
        if whole is not None:  # bytes are parsed where they are; a longer body through a view of its tail
            return parse_usage(whole if len(whole) <= TAIL_BYTES else memoryview(whole)[-TAIL_BYTES:])
        if self.tail is not None:
            return self.tail.usage()
        return None

    def ended_short(self) -> bool:
        """Whether a stream delimited by the connection's close (``unframed``; settling asks only of
        those) was cut where nobody could see it: its last bytes hold no end of the client's protocol
        (``[DONE]``, ``message_stop``, a Response's last event). One search of the 4 KiB tail."""
        tail = self.tail
        if tail is None:
            return False
        last = tail.getvalue()
        return not any(marker in last for marker in _ENDS)

    def relayed_usage(self, prompt_estimate: int) -> tuple[int, int] | None:
        """(prompt, completion) tokens of a streamed answer that ended short without its usage report,
        estimated from what was relayed; None when nothing was."""
        tail = self.tail
        if tail is None or not self.relayed or getattr(self.meter, "unbilled", False):
            return None
        return prompt_estimate, estimate_relayed_tokens(tail.getvalue(), self.relayed)


class TapTransport:
    """The client's transport of a tapped stream: each piece is mirrored into the tail and counted, then
    sent at once (``write``; ``send_bytes`` is the same, awaitable)."""

    __slots__ = ("_send", "_tail", "_tap")

    def __init__(self, transport: Transport, tail: StreamTail, tap: ResponseTap) -> None:
        write = getattr(transport, "write", None)
        self._send: Callable[[bytes], None] = write if write is not None else partial(send_now, transport)
        self._tail = tail
        self._tap = tap

    def write(self, data: bytes) -> None:
        self._tail.append(data)
        self._tap.relayed += len(data)
        self._send(data)

    def write_last(self, data: bytes) -> None:
        """The stream's last bytes: kept, then the answer's end is announced, then they go out."""
        self._tail.append(data)
        self._tap.relayed += len(data)
        self._tap.end()
        self._send(data)

    async def send_bytes(self, data: bytes) -> None:
        self.write(data)

    async def send_last(self, data: bytes) -> None:
        self.write_last(data)
