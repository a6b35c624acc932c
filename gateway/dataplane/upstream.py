"""The upstream HTTP client of one proxy worker.

aiohttp's client is used on the request path (httpx's pool measured ~18x slower here, see
perf/client_compare.py); one session per worker keeps connections alive to every backend. Responses are
never decompressed or parsed: ``Accept-Encoding`` is not sent, so bytes arrive as the engine wrote them.
I/O: TCP/TLS connections to backends.
"""

from __future__ import annotations

import ssl

import aiohttp

__all__ = ["HOP_BY_HOP", "make_session", "make_ssl_context"]

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


def make_ssl_context() -> ssl.SSLContext:
    """System roots first; the bundled Mozilla set (certifi) when the system has none."""
    ctx = ssl.create_default_context()
    if not ctx.get_ca_certs():
        try:
            import certifi

            ctx.load_verify_locations(certifi.where())
        except ImportError:
            pass
    return ctx


def make_session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=0,  # no pool-wide cap: admission control is the gateway's job, not the pool's
        limit_per_host=0,
        ssl=make_ssl_context(),
        ttl_dns_cache=60,
        keepalive_timeout=60,
        enable_cleanup_closed=False,
    )
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
