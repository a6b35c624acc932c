"""The client's transport for a stream whose usage the gateway asked for and the client did not: what
goes out passes through ``gateway.protocol.stream_usage.UsageWithholder`` first. The tap mirrors the
engine's bytes into its tail buffer before they get here, so usage is read from the chunk the client is
not sent. I/O: the client's transport, nothing else.
"""

from __future__ import annotations

from gateway.dataplane.rsgi import Transport
from gateway.protocol.stream_usage import UsageWithholder

__all__ = ["WithheldUsage"]


class WithheldUsage:
    # One object and one extra call per piece, only on streams the gateway injected include_usage into.
    __slots__ = ("_transport", "_withholder")

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._withholder = UsageWithholder()

    async def send_bytes(self, data: bytes) -> None:
        out = self._withholder.feed(data)
        if out:
            await self._transport.send_bytes(out)
