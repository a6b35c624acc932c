"""The proxy worker's end of body logging: keep what a logged request sent and was answered, at most an
entry's ``max_bytes`` of each, and hand it to the control worker through this worker's body ring.

Only a request that a ``[[body_logs]]`` entry picked (``gateway.body_rules``) gets a ``BodyCapture``, and
its tap is a ``CapturingTap``: the answer's bytes are noted as they go to the client (a whole answer by
reference, a stream's pieces until the cap), nothing is parsed or copied beyond the cap. When the request
has ended, ``BodyLog.push`` copies one frame (``gateway.body_record``) into the ring with one C call; a
ring without room for it drops it, and the ring counts the drop in shared memory. Nothing waits, and
nothing is redacted here: the control worker redacts before it stores. Every other request pays one test
of the snapshot (no entry at all) or one ``pick`` (entries, none for it), and one test of its exchange at
its end. I/O: none (shared memory only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.body_record import BodyRecord, encode_body_record
from gateway.body_rules import BodyLogRule
from gateway.dataplane.tap import ResponseTap, TapTransport
from gateway.native import SpanRing

__all__ = ["BodyCapture", "BodyLog", "CapturingTap"]


class BodyCapture:
    __slots__ = ("chunks", "dialect", "kept", "limit", "path", "request", "request_size", "rule", "size",
                 "source", "stream", "streamed")  # fmt: skip

    def __init__(self, rule: BodyLogRule, request: bytes, dialect: str, path: str, stream: bool) -> None:
        self.rule = rule
        limit = self.limit = rule.max_bytes
        self.request_size = len(request)
        self.request = request if len(request) <= limit else request[:limit]
        self.dialect = dialect
        self.path = path
        self.stream = stream  # the client asked for a stream
        self.streamed = False  # the answer went out as a stream
        self.chunks: list[bytes] = []
        self.kept = 0  # bytes of the answer in chunks
        self.size = 0  # bytes of the answer relayed
        self.source = "backend"

    def whole(self, body: bytes) -> None:
        """A whole answer: kept by reference, cut only when the frame is made."""
        self.chunks = [body]
        self.kept = self.size = len(body)

    def add(self, data: bytes) -> None:
        """A piece of a streamed answer, as it goes to the client."""
        self.size += len(data)
        room = self.limit - self.kept
        if room > 0:
            piece = data if len(data) <= room else data[:room]
            self.chunks.append(piece)
            self.kept += len(piece)

    def gateway_answer(self, body: bytes) -> None:
        """The gateway answered itself (an error after the request was admitted): that is the answer."""
        self.source = "gateway"
        self.streamed = False
        self.whole(body)

    def frame(self, request_id: str, principal_id: str, key_id: str, model: str, status: int) -> bytes:
        answer = b"".join(self.chunks)
        if len(answer) > self.limit:
            answer = answer[: self.limit]
        rule = self.rule
        return encode_body_record(
            BodyRecord(
                request_id,
                time.time(),
                principal_id,
                key_id,
                model,
                status,
                rule.name,
                rule.id,
                self.dialect,
                self.path,
                self.stream and self.streamed,
                self.request_size,
                self.size,
                self.source,
                self.request,
                answer,
            )
        )


class CapturingTap(ResponseTap):
    """A ``ResponseTap`` that also notes the answer for a ``BodyCapture``."""

    __slots__ = ("capture",)

    def __init__(
        self,
        proto: Any,
        extra_headers: list[tuple[str, str]],
        on_end: Callable[[ResponseTap, int], None] | None,
        capture: BodyCapture,
    ) -> None:
        super().__init__(proto, extra_headers, on_end)
        self.capture = capture

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.capture.whole(body)
        super().response_bytes(status, headers, body)

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Any:
        self.capture.streamed = True
        return _CapturingTransport(super().response_stream(status, headers), self.capture)


class _CapturingTransport:
    """The tap's transport with each piece also kept for the body log: ``write`` and ``write_last`` for
    the relay that pours a stream (``dataplane.relay``), the awaitable sends for the translators."""

    __slots__ = ("_capture", "_transport")

    def __init__(self, transport: TapTransport, capture: BodyCapture) -> None:
        self._transport = transport
        self._capture = capture

    def write(self, data: bytes) -> None:
        self._capture.add(data)
        self._transport.write(data)

    def write_last(self, data: bytes) -> None:
        self._capture.add(data)
        self._transport.write_last(data)

    async def send_bytes(self, data: bytes) -> None:
        self.write(data)

    async def send_last(self, data: bytes) -> None:
        self.write_last(data)


class BodyLog:
    """This worker's body ring (``index`` of the host's body rings)."""

    def __init__(self, ring: SpanRing, index: int) -> None:
        self.ring = ring
        self.index = index

    def push(self, frame: bytes) -> bool:
        """Copy ``frame`` into the ring; False (and counted by the ring) when it has no room for it."""
        return self.ring.push(self.index, frame)

    def dropped(self) -> int:
        """Frames the host's workers had no room for in their rings, since the host started (respawned
        workers' included: the counts live in the rings)."""
        ring = self.ring
        return sum(ring.dropped(i) for i in range(ring.rings))
