"""How a proxy worker talks to backends: its upstream client and the headers that never cross the proxy.

The client is ``http_client.UpstreamClient``, a lean HTTP/1.1 client of our own (aiohttp's cost about
four times the CPU per request, httpx's pool was ~18x slower again: perf/client_micro.py,
perf/client_compare.py); one per worker keeps connections alive to every backend. Responses are never
decompressed or parsed: ``Accept-Encoding`` is not sent, so bytes arrive as the engine wrote them.
I/O: none at import or construction. The TLS roots are ``gateway.dataplane.tls``'s.
"""

from __future__ import annotations

from gateway.dataplane.http_client import UpstreamClient

__all__ = ["HOP_BY_HOP", "connection_named", "make_client", "without_hop_by_hop"]

# Headers that describe one connection, not the message, plus the ones we always set ourselves.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)


def connection_named(values: list[str]) -> frozenset[str]:
    """The header names (lowercased) that ``Connection`` header values list: RFC 9110 7.6.1 makes them
    hop-by-hop too, so a proxy drops them with the ``Connection`` header itself ("close" and
    "keep-alive" are options, and dropping a header of that name is right as well)."""
    return frozenset(t.strip(" \t").lower() for v in values for t in v.split(",") if t.strip(" \t"))


def without_hop_by_hop(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """An upstream answer's headers as the client gets them: hop-by-hop ones out, and those its
    ``Connection`` header names. Engines send ``Connection: keep-alive`` or nothing, so the common case is
    the one comprehension."""
    named = [v for k, v in headers if len(k) == 10 and k.lower() == "connection"]
    drop = HOP_BY_HOP | connection_named(named) if named and named != ["keep-alive"] else HOP_BY_HOP
    return [(k, v) for k, v in headers if k.lower() not in drop]


def make_client() -> UpstreamClient:
    """The worker's client. No pool-wide cap: admission control is the gateway's job, not the pool's."""
    return UpstreamClient(keepalive_timeout=60.0, max_idle_per_host=256)
