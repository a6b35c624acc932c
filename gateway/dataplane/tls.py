"""The TLS roots the gateway trusts when it calls out: backends over https and, on proxy hosts, the
control plane. I/O: ``make_ssl_context`` reads the CA bundle.
"""

from __future__ import annotations

import ssl

__all__ = ["make_ssl_context"]


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
