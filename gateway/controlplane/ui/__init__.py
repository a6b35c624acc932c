"""The admin web UI's static files, served on the admin port under ``/ui/``.

The UI is a handful of plain ES modules, one stylesheet and one HTML page shipped inside this package (no
build step, nothing fetched from elsewhere). It holds no data and needs no login to load: every figure it
shows comes from the admin API, with the session cookie and the permissions of whoever signed in, so the
UI can do nothing the API would refuse.

Only the names in ``ASSETS`` are served, matched exactly (no path is ever joined onto a directory). Every
answer carries a strict Content-Security-Policy (scripts, styles, images and connections from this origin
only; no inline script or style; no framing), ``nosniff``, and an ETag with ``Cache-Control: no-cache`` so
browsers revalidate cheaply and never run a stale script after an upgrade.
I/O: reads the package's files once, on first use.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from functools import cache

__all__ = ["ASSETS", "CSP", "asset", "serve"]

Reply = tuple[int, list[tuple[str, str]], bytes]

_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}

# Every file under static/, by the name it is served as (``/ui/<name>``); a test checks the two agree.
ASSETS = (
    "index.html",
    "app.css",
    "favicon.svg",
    "app.js",
    "api.js",
    "dom.js",
    "chart.js",
    "login.js",
    "fleet.js",
    "models.js",
    "keys.js",
    "usage.js",
    "audit.js",
    "requests.js",
)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

_HEADERS = [
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-cache"),
]


@cache
def asset(name: str) -> tuple[bytes, str, str]:
    """One shipped file: its bytes, content type and ETag. ``name`` must be one of ``ASSETS``."""
    if name not in ASSETS:
        raise KeyError(name)
    data = importlib.resources.files(__name__).joinpath("static", name).read_bytes()
    etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
    return data, _TYPES[name.rsplit(".", 1)[1]], etag


def serve(method: str, path: str, if_none_match: str | None) -> Reply:
    """Answer ``GET``/``HEAD /ui/<name>``; ``/ui/`` is the page itself. 404 for anything not shipped."""
    name = path.removeprefix("/ui/") or "index.html"
    if name not in ASSETS:
        return 404, [*_HEADERS, ("content-type", "text/plain; charset=utf-8")], b"not found\n"
    if method not in ("GET", "HEAD"):
        return 405, [*_HEADERS, ("allow", "GET, HEAD")], b""
    data, content_type, etag = asset(name)
    headers = [*_HEADERS, ("content-type", content_type), ("etag", etag)]
    if if_none_match is not None and etag in (t.strip() for t in if_none_match.split(",")):
        return 304, headers, b""
    return 200, headers, b"" if method == "HEAD" else data
