"""Which request paths the proxy forwards, and the check that an upstream target stays under its prefix.

granian hands the application ``scope.path`` already percent-decoded (``%2e%2e`` arrives as ``..``,
``%2F`` as ``/``, ``%00`` as a NUL, an invalid sequence as U+FFFD) and keeps no raw copy, so the rules
apply to the decoded path: what a backend would see once it decodes the path the gateway sends on. An
encoded ``/`` therefore cannot be told from a plain one; it is a plain one here, which is harmless because
the path that results is checked like any other. Sans-I/O: strings in, a reason or a bool out (it
remembers the safe paths it has seen).
"""

from __future__ import annotations

import re

__all__ = ["MESSAGES", "anthropic_envelope", "check_client_path", "target_is_safe"]

# Anthropic's Messages API: a request under it is answered, errors included, in Anthropic's envelope.
MESSAGES = "/v1/messages"


def anthropic_envelope(path: str) -> bool:
    """Whether the gateway's own error answer to a request on ``path`` uses Anthropic's envelope (else
    OpenAI's)."""
    return path.startswith(MESSAGES)


# One search per request: a character outside RFC 3986's pchar set (controls, space, NUL, backslash,
# quotes, "%" left over from a double encoding such as %252e, anything not ASCII), an empty segment, or a
# dot-segment. Backslash is refused because some servers treat it as "/", which would make "..\" a
# traversal the dot-segment rule does not see.
_UNSAFE = re.compile(r"[^A-Za-z0-9\-._~!$&'()*+,;=:@/]|//|/\.\.?(?:/|$)")
_WHAT = {
    " ": "a space",
    "\r": "a CR",
    "\n": "an LF",
    "\x00": "a NUL",
    "\\": "a backslash",
    "%": "a '%' (percent-encoded twice)",
}


# Paths already found safe: clients call a handful of them, and a set lookup costs a twentieth of the
# search. Bounded, so that a client making up paths cannot grow it without end.
_SAFE: set[str] = set()
_SAFE_MAX = 4096


def check_client_path(path: str) -> str | None:
    """None when ``path`` (decoded, starting with "/") may be forwarded; else why not, for a 400."""
    if path in _SAFE:
        return None
    m = _UNSAFE.search(path)
    if m is None:
        if len(_SAFE) < _SAFE_MAX:
            _SAFE.add(path)
        return None
    found = m.group()
    if found == "//":
        return "the request path has an empty segment"
    if found.startswith("/."):
        return "the request path has a dot-segment ('.' or '..'), also when percent-encoded"
    what = _WHAT.get(found, f"the character {found!r}")
    return f"the request path contains {what} (raw or percent-encoded), which is not forwarded"


def target_is_safe(target: str) -> bool:
    """Whether ``target`` (a path with its query), appended to a backend URL's path, stays under it: it
    starts with "/" and its path part has no dot-segment, empty segment or character outside pchar."""
    if not target.startswith("/"):
        return False
    path = target.partition("?")[0]
    return _UNSAFE.search(path) is None
