"""The client's transport for a stream whose usage the gateway asked for and the client did not: what
goes out passes through ``gateway.protocol.stream_usage.UsageWithholder`` first, which takes the nulls out
in C (``gateway.native.strip_usage_nulls``). The tap mirrors the engine's bytes into its tail buffer before
they get here, so usage is read from the chunk the client is not sent. I/O: the client's transport, nothing
else.
"""

from __future__ import annotations

from gateway.dataplane.relay import send_now
from gateway.dataplane.rsgi import Transport
from gateway.native import strip_usage_nulls
from gateway.protocol.stream_usage import UsageWithholder

__all__ = ["WithheldUsage"]


class WithheldUsage:
    # One object and one extra call per piece, only on streams the gateway injected include_usage into.
    __slots__ = ("_transport", "_withholder")

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._withholder = UsageWithholder(strip_usage_nulls)

    def write(self, data: bytes) -> None:
        """What of ``data`` the client is to get, sent at once (raises what the send raises)."""
        out = self._withholder.feed(data)
        if out:
            send_now(self._transport, out)

    async def send_bytes(self, data: bytes) -> None:
        self.write(data)
