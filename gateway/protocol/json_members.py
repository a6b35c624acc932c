"""Refusing JSON bodies whose top-level object names a member twice. Sans-I/O.

JSON parsers disagree on duplicate names: orjson keeps the last, others the first or refuse. A body that
names ``model`` twice (also as ``"\\u006dodel"``, which is the same name once parsed) could be authorised
for one model by the gateway and served as another by an engine, so the proxy refuses any top-level
duplicate: every field it reads (``model``, ``stream``, ``max_tokens``, ``stream_options``, ``user``,
``metadata``, ...) is a top-level member. The check compares the parsed object's size with the number of
members the text has, which needs no decoding of names: ``native/json_member.c`` (``gw_json_top_members``)
counts them on the request path; ``count_top_members`` here is the reference it follows.

The same pass bounds nesting (``bounds.MAX_DEPTH``, one limit for every path): a counter answers -1 for
a body that opens an object or array deeper, and the body is refused before any translator walks it.
``decode_object`` is the one way a request body becomes a JSON object on every ``/v1/*`` path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from gateway.errors import BadRequest
from gateway.protocol.bounds import MAX_DEPTH

__all__ = ["MemberCounter", "count_top_members", "decode_object"]

MemberCounter = Callable[[bytes], int]

_STRUCTURE = re.compile(rb'["{}\[\]:]')


def count_top_members(body: bytes) -> int:
    """How many members the top-level object of ``body`` (already parsed as JSON) has as written: its
    colons at depth 1 outside strings; -1 when an object or array opens deeper than ``MAX_DEPTH``."""
    depth = members = pos = 0
    find, search = body.find, _STRUCTURE.search
    while (m := search(body, pos)) is not None:
        start = m.start()
        first = body[start]
        pos = start + 1
        if first == 0x3A:  # ":"
            members += depth == 1
        elif first != 0x22:  # { [ ] }
            depth += 1 if first in (0x7B, 0x5B) else -1
            if depth > MAX_DEPTH:
                return -1
        else:
            end = find(b'"', pos)
            while end > 0 and body[end - 1] == 0x5C:  # escaped if an odd number of backslashes precede
                slashes = end - 1
                while body[slashes - 1] == 0x5C:
                    slashes -= 1
                if (end - slashes) % 2 == 0:
                    break
                end = find(b'"', end + 1)
            if end < 0:
                return members
            pos = end + 1
    return members


def decode_object(body: bytes, count: MemberCounter) -> dict[str, Any]:
    """``body`` parsed as the JSON object a ``/v1/*`` request must be, its nesting bounded and each
    top-level member named once; BadRequest otherwise."""
    if not body:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    members = count(body)
    if members != len(doc):
        if members < 0:
            raise BadRequest(f"request body nests objects and arrays deeper than {MAX_DEPTH} levels")
        raise BadRequest(
            "request body names a top-level member more than once (names are compared after decoding "
            'escapes, so "\\u006dodel" is "model"); send each member once'
        )
    return doc
