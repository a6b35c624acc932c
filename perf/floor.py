"""The floor under the gateway's shape: two stripped-down RSGI apps that ``perf.bench`` runs under granian's
own CLI (``granian --interface rsgi --workers 2 --loop uvloop --no-ws``) as rows of every run.

- ``perf.floor:null_app`` reads the request body and answers a fixed chat completion from memory: what
  granian and the RSGI hand-over cost before any proxying (the ``null-app`` target).
- ``perf.floor:minimal_proxy`` reads the body, sends it through the gateway's own upstream client
  (``gateway/dataplane/http_client.py``) to ``$PERF_FLOOR_UPSTREAM`` and answers what came back: whole when
  the answer is sized, poured into the client's transport as it arrives otherwise (a stream, as the
  gateway's ``relay`` does it, less the backpressure). No authentication,
  routing, accounting or header filtering: the least a proxy on this stack can do (``minimal-proxy``).

The gateway's ratio to ``minimal-proxy`` is what its own work costs on top of the shape.
I/O: the minimal proxy's upstream connections (loopback); nothing else.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from gateway.dataplane.http_client import UpstreamClient, UpstreamError
from gateway.dataplane.relay import Pace, StreamSink

__all__ = ["MinimalProxy", "NullApp", "minimal_proxy", "null_app"]

# The same shape and size as the nginx mock's answer, so both floors send what the proxies send.
NULL_ANSWER = (
    b'{"id":"chatcmpl-null","object":"chat.completion","created":1700000000,"model":"mock-model",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}'
)
_JSON = [("content-type", "application/json")]
# Hop-by-hop and framing headers, which each side's HTTP layer sets itself (our client writes Host and
# Content-Length, granian its framing); everything else is passed on both ways.
_DROP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length"})


class NullApp:
    """Answers every request with ``NULL_ANSWER`` after reading its body."""

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        await proto()
        proto.response_bytes(200, _JSON, NULL_ANSWER)


class MinimalProxy:
    """Forwards the method, path, body and headers (``Host`` aside) to one upstream on a per-worker pool."""

    def __init__(self) -> None:
        self.upstream = os.environ.get("PERF_FLOOR_UPSTREAM", "http://127.0.0.1:8000")
        self.client: UpstreamClient | None = None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.client = UpstreamClient()  # one pool per forked worker, made on its own loop

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.client is not None:
            loop.run_until_complete(self.client.close())

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if self.client is None:  # granian's CLI calls __rsgi_init__; this covers a server that does not
            self.client = UpstreamClient()
        body = await proto()
        path = scope.path + (f"?{scope.query_string}" if scope.query_string else "")
        headers = [(k, v) for k, v in scope.headers.items() if k.lower() not in _DROP]
        try:
            resp = await self.client.request(
                self.upstream,
                scope.method,
                path,
                headers,
                body,
                connect_timeout=5.0,
                first_byte_timeout=60.0,
                read_timeout=60.0,
            )
        except UpstreamError as exc:
            proto.response_bytes(502, _JSON, b'{"error":"%s"}' % type(exc).__name__.encode())
            return
        out = [(k, v) for k, v in resp.headers if k.lower() not in _DROP]
        try:
            if resp.content_length is not None and resp.content_type != "text/event-stream":
                proto.response_bytes(resp.status, out, await resp.read())
            else:
                transport = proto.response_stream(resp.status, out)
                # As the gateway relays a stream: poured from the connection's callback, no backpressure.
                await resp.pour(StreamSink(transport, Pace(None, 60.0)))
        except (UpstreamError, OSError):
            resp.close()  # the client sees its answer cut short, as from any proxy
            return
        resp.release()


null_app = NullApp()
minimal_proxy = MinimalProxy()
