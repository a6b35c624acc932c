"""Just enough of an OpenAI-style request to route it: the model name, the stream flag, and where the
model's value sits in the raw bytes so an alias can be spliced in without re-encoding anything else.

Two edits are ever made to a body, each a splice that leaves every other byte as the client sent it: the
model's value (an alias or a provider's own name), and ``"stream_options":{"include_usage":true}`` put
first in a streamed completion request that has no ``stream_options`` at all, so that the engine reports
the usage the gateway accounts for (see docs/architecture.md, "Usage of streams").

Sans-I/O: bytes in, values out. JSON bodies are validated by a full parse (orjson); multipart bodies
(audio uploads) are scanned for the ``model`` field only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import orjson

from gateway.errors import BadRequest
from gateway.protocol.bounds import MAX_TOKENS, boolean, choices, token_allowance
from gateway.protocol.json_members import MemberCounter, count_top_members, decode_object

__all__ = [
    "RequestInfo",
    "find_model_span",
    "inject_stream_usage",
    "inspect_json",
    "inspect_multipart",
    "splice_model",
]

# Where a string or a bracket starts (see _find_model_span), and a key's string value after its colon,
# matched "unrolled" (runs of plain characters between escapes).
_STRUCTURE = re.compile(rb'["{}\[\]]')
_JSON_STRING = re.compile(rb'\s*:\s*("[^"\\]*(?:\\.[^"\\]*)*")')
_MODEL_KEY = b'"model"'
# From this size a splice joins views of the body rather than slicing it (small bodies: plain slices).
_SPLICE_IN_PLACE = 64 * 1024
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


class RequestInfo(NamedTuple):
    """Immutable, and a tuple: built once per request, where a frozen dataclass cost three times as much."""

    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    # Byte span of the model's value in a multipart body. JSON bodies leave it None: the span is only
    # looked for when a splice needs it (most requests call a backend by the name the client used).
    model_span: tuple[int, int] | None
    multipart: bool = False
    stream_options: bool = False  # the body has a stream_options member, whatever its value
    user: str | None = None  # the "user" member (Anthropic's metadata.user_id): routing rules test it
    choices: int = 1  # ``n``: each choice may use the whole completion allowance


def inspect_json(body: bytes, members: MemberCounter = count_top_members) -> RequestInfo:
    """The request's routing facts; ``members`` counts the body's top-level members as written (the C
    counter on the request path), so that a body naming a member twice is refused."""
    doc = decode_object(body, members)
    model = doc.get("model")
    if model is None:
        raise BadRequest("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", param="model")
    stream = doc.get("stream")
    if stream is not True and stream is not False:  # the usual values cost two identity tests
        stream = boolean(doc, "stream")
    opts = doc.get("stream_options")
    include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    # Both are read and bounded; the newer name wins when a client sends both, as OpenAI's does. A plain
    # integer in range passes with one type test and one comparison; anything else is judged (and
    # refused, naming the field) by ``token_allowance``.
    legacy = doc.get("max_tokens")
    if legacy is not None and not (type(legacy) is int and 0 <= legacy <= MAX_TOKENS):
        legacy = token_allowance(doc, "max_tokens")
    max_tokens = doc.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = legacy
    elif not (type(max_tokens) is int and 0 <= max_tokens <= MAX_TOKENS):
        max_tokens = token_allowance(doc, "max_completion_tokens")
    n = choices(doc) if "n" in doc else 1
    user = doc.get("user")
    return RequestInfo(
        model,
        stream,
        include_usage,
        max_tokens,
        None,
        False,
        "stream_options" in doc,
        user if isinstance(user, str) else None,
        n,
    )


def inject_stream_usage(body: bytes) -> bytes:
    """The body with ``"stream_options":{"include_usage":true}`` as its first member. Only for a JSON
    object without ``stream_options`` (``inspect_json`` says so): the key cannot end up duplicated."""
    start = body.index(b"{") + 1  # inspect_json parsed an object, so its first non-space byte is "{"
    return body[:start] + _INCLUDE_USAGE + body[start:]


def find_model_span(body: bytes) -> tuple[int, int] | None:
    """Span of the top-level "model" value. The last occurrence wins, as it does for the JSON parser.
    The reference for ``native/json_member.c``, which the request path uses (``gateway.native.model_span``).

    Only quotes and brackets are visited: a string is skipped with ``bytes.find`` to its closing quote
    (escaped quotes told apart by the backslashes before them), so a 100 KB prompt costs a few C-level
    searches rather than a step per character or per escape. The body already parsed as JSON."""
    depth = 0
    found: tuple[int, int] | None = None
    pos = 0
    find, search = body.find, _STRUCTURE.search
    while (m := search(body, pos)) is not None:
        start = m.start()
        first = body[start]
        if first != 0x22:  # { [ ] }
            depth += 1 if first in (0x7B, 0x5B) else -1
            pos = start + 1
            continue
        end = find(b'"', start + 1)
        while end > 0 and body[end - 1] == 0x5C:  # a quote after backslashes: escaped if they are odd
            slashes = end - 1
            while body[slashes - 1] == 0x5C:
                slashes -= 1
            if (end - slashes) % 2 == 0:
                break
            end = find(b'"', end + 1)
        if end < 0:
            return found
        pos = end + 1
        if depth == 1 and pos - start == 7 and body[start:pos] == _MODEL_KEY:
            value = _JSON_STRING.match(body, pos)
            if value is not None:
                found = value.span(1)
                pos = value.end()
    return found


def inspect_multipart(body: bytes, content_type: str) -> RequestInfo:
    """Find the ``model`` form field of a multipart/form-data body (audio transcriptions)."""
    boundary = _boundary(content_type)
    delimiter = b"--" + boundary
    pos = body.find(delimiter)
    while pos != -1:
        part_start = pos + len(delimiter)
        if body[part_start : part_start + 2] == b"--":
            break
        head_end = body.find(b"\r\n\r\n", part_start)
        if head_end == -1:
            break
        nxt = body.find(b"\r\n" + delimiter, head_end + 4)
        if nxt == -1:
            break
        head = body[part_start:head_end].lower()
        if re.search(rb'content-disposition:[^\r\n]*;\s*name="model"', head):
            value = body[head_end + 4 : nxt]
            try:
                model = value.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise BadRequest("model form field is not UTF-8", param="model") from None
            if not model:
                raise BadRequest("model must be a non-empty string", param="model")
            return RequestInfo(model, False, False, None, (head_end + 4, nxt), multipart=True)
        pos = nxt + 2
    raise BadRequest("you must provide a model form field", param="model")


def _boundary(content_type: str) -> bytes:
    for piece in content_type.split(";")[1:]:
        name, _, value = piece.strip().partition("=")
        if name.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise BadRequest("multipart/form-data body without a boundary")


def splice_model(
    body: bytes,
    info: RequestInfo,
    upstream_model: str,
    find_span: Callable[[bytes], tuple[int, int] | None] = find_model_span,
) -> bytes:
    """The body with only the model value replaced; every other byte stays as the client sent it.
    ``find_span`` locates the value (the C one on the request path)."""
    span = info.model_span if info.multipart else find_span(body)
    if span is None:
        doc = orjson.loads(body)
        doc["model"] = upstream_model
        return orjson.dumps(doc)
    start, end = span
    value = upstream_model.encode() if info.multipart else orjson.dumps(upstream_model)
    if len(body) > _SPLICE_IN_PLACE:
        # One copy of a large body (an upload), not three: slices of a memoryview copy nothing.
        view = memoryview(body)
        return b"".join((view[:start], value, view[end:]))
    return body[:start] + value + body[end:]
