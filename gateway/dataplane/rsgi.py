"""What the request path uses of granian's RSGI objects, as typed Protocols: the request's ``Scope`` and its
``Headers``, the ``HTTPProtocol`` object an answer goes out through, and the ``Transport`` of a streamed
answer.

Exactly the members the data plane calls, so that anything implementing them can stand in: the tap
(``tap.ResponseTap``) wraps the protocol object, ``usage_withhold`` wraps the transport, and the unit tests
drive ``ProxyApp`` with an in-process fake. Granian's own classes match them structurally; nothing here
imports granian (its ``_granian`` stubs lack ``get_all``, which its headers have: a unit test checks the
real classes have every member named here). No I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Protocol

__all__ = ["HTTPProtocol", "Headers", "Scope", "Transport", "WrappedProtocol"]


class Headers(Protocol):
    """The request's headers, names lowercase (granian's ``RSGIHeaders``)."""

    def get(self, key: str, default: None = None, /) -> str | None: ...

    def get_all(self, key: str, /) -> list[str]: ...

    def items(self) -> list[tuple[str, str]]: ...


class Scope(Protocol):
    """One request's scope. ``client`` and ``server`` are ``"host:port"`` (``"[::1]:5678"`` for IPv6)."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...  # percent-decoded (``gateway.protocol.paths``)

    @property
    def query_string(self) -> str: ...

    @property
    def client(self) -> str: ...

    @property
    def server(self) -> str: ...

    @property
    def headers(self) -> Headers: ...


class Transport(Protocol):
    """A streamed answer's way to the client. granian ends the response when the object is freed."""

    async def send_bytes(self, data: bytes, /) -> None: ...


class HTTPProtocol(Protocol):
    """The request's body in (whole or in chunks), its answer out (whole or streamed), and a notice when
    the client goes away."""

    def __call__(self) -> Awaitable[bytes]: ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    def client_disconnect(self) -> Awaitable[None]: ...

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes, /) -> None: ...

    def response_stream(self, status: int, headers: list[tuple[str, str]], /) -> Transport: ...


class WrappedProtocol:
    """An RSGI protocol object around another (``_proto``) that passes the request's side through as it
    is: its body, and the notice that the client went away. Subclasses change how the answer goes out
    (``response_bytes``, ``response_stream``): the tap that meters it, the drain's ``Connection: close``."""

    __slots__ = ("_proto",)

    def __init__(self, proto: HTTPProtocol) -> None:
        self._proto = proto

    def __call__(self) -> Awaitable[bytes]:
        return self._proto()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._proto.__aiter__()

    def client_disconnect(self) -> Awaitable[None]:
        return self._proto.client_disconnect()
