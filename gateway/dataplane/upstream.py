"""How a proxy worker talks to backends: its upstream client, the TLS roots it trusts, and the headers
that never cross the proxy.

The client is ``http_client.UpstreamClient``, a lean HTTP/1.1 client of our own (aiohttp's cost about
four times the CPU per request, httpx's pool was ~18x slower again: perf/client_micro.py,
perf/client_compare.py); one per worker keeps connections alive to every backend. Responses are never
decompressed or parsed: ``Accept-Encoding`` is not sent, so bytes arrive as the engine wrote them.
I/O: none at import or construction; ``make_ssl_context`` reads the CA bundle.
"""

from __future__ import annotations

import ssl

from gateway.dataplane.http_client import UpstreamClient

__all__ = ["HOP_BY_HOP", "make_client", "make_ssl_context"]

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


def make_ssl_context(cafile: str | None = None) -> ssl.SSLContext:
    """Verification against ``cafile`` when given; else system roots first, and the bundled Mozilla set
    (certifi) when the system has none."""
    if cafile is not None:
        return ssl.create_default_context(cafile=cafile)
    ctx = ssl.create_default_context()
    if not ctx.get_ca_certs():
        try:
            import certifi

            ctx.load_verify_locations(certifi.where())
        except ImportError:
            pass
    return ctx


def make_client() -> UpstreamClient:
    """The worker's client. No pool-wide cap: admission control is the gateway's job, not the pool's."""
    return UpstreamClient(keepalive_timeout=60.0, max_idle_per_host=256)
