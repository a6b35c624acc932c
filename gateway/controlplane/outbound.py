"""Outbound HTTP calls off the request path (the OTLP exporter, the budget-alert webhook, the engine
scraper, a proxy-role host's calls to its control plane), each under a *total* deadline and a cap on the
answer's size.

httpx's timeouts are per operation: a read that brings one byte resets the read timer, so a peer that
sends its status line and then a byte a second holds a call for as long as it likes (28 s for a 2 s
"timeout", or forever). Here the whole call — pool wait, connect, TLS, sending the request, the answer's
head and its whole body — runs inside ``asyncio.timeout``: when the deadline passes, the task is cancelled
wherever it is waiting, httpcore closes the connection (its clean-up is shielded from the cancellation,
so the pool is left consistent and the half-read connection is never reused), and the caller gets
``DeadlineExceeded``, an ``httpx.TimeoutException``, so the ``except httpx.HTTPError`` each call site
already has counts and logs it as before. Cancellation was chosen over a timer closing the client from
another thread (httpx's clients are not thread-safe, and a closed client must be rebuilt) and over
checking the clock between body chunks (that bounds neither the connect nor a head sent a byte at a
time). The body is read in pieces and the call fails with ``AnswerTooLarge`` past ``limit`` bytes, so a
peer that answers fast but without end cannot grow the process either.

``BlockingCaller`` is the same for a process without an event loop (the proxy-role control slot): it owns
a private loop and an ``httpx.AsyncClient`` and runs each call to completion on it.

I/O: HTTP to whatever URL a caller names.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

__all__ = ["AnswerTooLarge", "BlockingCaller", "DeadlineExceeded", "call"]

_DEFAULT_LIMIT = 1 << 20
# Headers that described the body as it came over the wire, not the decoded bytes handed back.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class DeadlineExceeded(httpx.TimeoutException):
    """The whole call (connect, send, the answer's head and body) took longer than its deadline."""


class AnswerTooLarge(httpx.RequestError):
    """The answer's body was longer than the call allows."""


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    deadline: float,
    limit: int = _DEFAULT_LIMIT,
    **kwargs: Any,
) -> httpx.Response:
    """``client.request(method, url, **kwargs)``, over within ``deadline`` seconds from now, its body
    (decoded) at most ``limit`` bytes; a read ``httpx.Response`` or an ``httpx.HTTPError``."""
    try:
        async with asyncio.timeout(deadline):
            async with client.stream(method, url, **kwargs) as streamed:
                body = bytearray()
                async for chunk in streamed.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise AnswerTooLarge(
                            f"answer to {method} {url} longer than {limit} bytes", request=streamed.request
                        )
    except TimeoutError:
        raise DeadlineExceeded(f"no whole answer to {method} {url} within {deadline:g} s") from None
    headers = [(k, v) for k, v in streamed.headers.multi_items() if k not in _WIRE_HEADERS]
    return httpx.Response(
        streamed.status_code, headers=headers, content=bytes(body), request=streamed.request
    )


class BlockingCaller:
    """``call`` for synchronous code: one private event loop and one pooled ``httpx.AsyncClient`` (built
    from ``client_options``), each call run to its end on that loop. Not thread-safe: one thread uses it."""

    def __init__(self, **client_options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(**client_options)

    def request(
        self, method: str, url: str, *, deadline: float, limit: int = _DEFAULT_LIMIT, **kwargs: Any
    ) -> httpx.Response:
        return self._loop.run_until_complete(
            call(self._client, method, url, deadline=deadline, limit=limit, **kwargs)
        )

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._client.aclose())
        finally:
            self._loop.close()
