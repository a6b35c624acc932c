"""The Anthropic Messages API: the request model, a token estimate, and the error envelope. Sans-I/O.

Two depths of checking, because a request relayed verbatim to an Anthropic backend must not be refused
for what only that backend reads:

- ``read_messages_head`` is what every ``POST /v1/messages`` (and count_tokens) body goes through on the
  request path: a JSON object, ``model``, ``max_tokens``, ``stream`` and ``metadata.user_id``, the fields
  the gateway itself routes, admits and meters by. Everything else (roles, content blocks, unknown
  fields) is left to the backend that reads it.
- ``parse_messages_request`` (or ``parse_messages_doc`` on the head's document) checks the whole shape and
  returns a ``MessagesRequest``, for the translators: only a request that is about to be translated for an
  OpenAI or Gemini backend goes through it.

Every problem raises ``BadRequest`` whose ``param`` is the path of the bad field, in Anthropic's dotted
style (``messages.2.content.0.type``), so an Anthropic client gets an ``invalid_request_error`` that
names it; the head's messages use the API's own wording (``max_tokens: Field required``), which clients
match on.

What the full parse checks: the fields the gateway or a translator reads. A ``system`` message inside
``messages`` (Claude Code sends one for model names it does not know) is a message like the others, its
content text. Content blocks of the types translators
know (text, image, tool_use, tool_result, thinking, redacted_thinking, document, search_result) are
checked field by field; blocks of other types need only a string ``type`` and are kept as they are, so a
verbatim passthrough to an Anthropic backend does not lag behind the API, while a translator refuses
them by name. Unknown top-level fields are ignored for the same reason. ``metadata.user_id`` is the
field's real name (the brief's "metadata.user").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.errors import BadRequest, anthropic_error_type
from gateway.protocol.bounds import MAX_TOKENS
from gateway.protocol.json_members import MemberCounter, count_top_members, decode_object

__all__ = [
    "IMAGE_TOKENS",
    "Message",
    "MessagesHead",
    "MessagesRequest",
    "anthropic_error_body",
    "anthropic_error_type",
    "count_tokens_estimate",
    "estimate_input_tokens",
    "parse_count_tokens_request",
    "parse_messages_doc",
    "parse_messages_request",
    "read_messages_head",
]

IMAGE_TOKENS: Final = 1600
"""Estimated tokens per image or document block: Anthropic's figure for a full-size (1092x1092) image."""

_ROLES: Final = ("user", "assistant", "system")
_TOOL_CHOICES: Final = ("auto", "any", "tool", "none")
_MEDIA_TYPES: Final = ("image/jpeg", "image/png", "image/gif", "image/webp")


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    """``user``, ``assistant`` or ``system`` (a system turn inside the conversation)."""
    content: str | tuple[dict[str, Any], ...]
    """The string as sent, or the checked content blocks as JSON objects."""


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    model: str
    max_tokens: int
    """0 only for a count_tokens body, which has no max_tokens."""
    messages: tuple[Message, ...]
    system: str | tuple[dict[str, Any], ...] | None = None
    stop_sequences: tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: dict[str, Any] | None = None
    user_id: str | None = None
    """``metadata.user_id``."""
    thinking: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class MessagesHead:
    """What the gateway itself reads of a Messages body; ``doc`` is the whole decoded body."""

    model: str
    max_tokens: int
    """0 only for a count_tokens body, which has no max_tokens."""
    stream: bool
    user_id: str | None
    doc: dict[str, Any]


def read_messages_head(
    body: bytes, *, count_tokens: bool = False, members: MemberCounter = count_top_members
) -> MessagesHead:
    """The fields the gateway routes, admits and meters by, checked; nothing else is looked at.
    ``members`` counts the body's top-level members as written: a member named twice is refused."""
    return _check_head(decode_object(body, members), count_tokens)


def _check_head(doc: dict[str, Any], count_tokens: bool) -> MessagesHead:
    model = doc.get("model")
    if model is None:
        raise BadRequest("model: Field required", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Input should be a non-empty string", param="model")
    max_tokens = 0
    if not count_tokens:
        value = doc.get("max_tokens")
        if value is None:
            raise BadRequest("max_tokens: Field required", param="max_tokens")
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest("max_tokens: Input should be a valid integer", param="max_tokens")
        if value < 1:
            raise BadRequest("max_tokens: Input should be greater than or equal to 1", param="max_tokens")
        if value > MAX_TOKENS:
            raise BadRequest(
                f"max_tokens: Input should be less than or equal to {MAX_TOKENS}", param="max_tokens"
            )
        max_tokens = value
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream: Input should be a valid boolean", param="stream")
    return MessagesHead(model, max_tokens, stream is True, _user_id(doc.get("metadata")), doc)


def _user_id(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise BadRequest("metadata: Input should be a valid dictionary", param="metadata")
    user_id = metadata.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise BadRequest("metadata.user_id: Input should be a valid string", param="metadata.user_id")
    return user_id


def parse_messages_request(body: bytes, members: MemberCounter = count_top_members) -> MessagesRequest:
    return parse_messages_doc(decode_object(body, members))


def parse_messages_doc(doc: dict[str, Any], *, count_tokens: bool = False) -> MessagesRequest:
    """The whole request checked, from its decoded body (``MessagesHead.doc``): what a translator needs."""
    head = _check_head(doc, count_tokens)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list of messages is required", param="messages")
    parsed = tuple(_message(m, i, i == len(messages) - 1) for i, m in enumerate(messages))
    return MessagesRequest(
        model=head.model,
        max_tokens=head.max_tokens,
        messages=parsed,
        system=_system(doc.get("system")),
        stop_sequences=_stop_sequences(doc.get("stop_sequences")),
        temperature=_number(doc.get("temperature"), "temperature", 0.0, 1.0),
        top_p=_number(doc.get("top_p"), "top_p", 0.0, 1.0),
        top_k=_integer(doc.get("top_k"), "top_k", low=0),
        stream=head.stream,
        tools=_tools(doc.get("tools")),
        tool_choice=_tool_choice(doc.get("tool_choice")),
        user_id=head.user_id,
        thinking=_thinking(doc.get("thinking")),
    )


def _integer(value: Any, param: str, *, low: int, required: bool = False) -> int | None:
    if value is None:
        if required:
            raise BadRequest(f"{param}: field required", param=param)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequest(f"{param}: expected an integer >= {low}", param=param)
    return value


def _number(value: Any, param: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequest(f"{param}: expected a number between {low:g} and {high:g}", param=param)
    return float(value)


def _boolean(value: Any, param: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{param}: expected true or false", param=param)
    return value


def _string(block: dict[str, Any], key: str, path: str, *, required: bool = True) -> str | None:
    value = block.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{path}.{key}: expected a string", param=f"{path}.{key}")
    return value


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{path}: expected an object", param=path)
    return value


def _message(value: Any, i: int, last: bool) -> Message:
    path = f"messages.{i}"
    m = _object(value, path)
    role = m.get("role")
    if role not in _ROLES:
        raise BadRequest(
            f"{path}.role: Input should be 'user', 'assistant' or 'system'", param=f"{path}.role"
        )
    content = m.get("content")
    if isinstance(content, str):
        blocks: str | tuple[dict[str, Any], ...] = content
    elif isinstance(content, list):
        blocks = tuple(_block(b, f"{path}.content.{j}", role) for j, b in enumerate(content))
    else:
        raise BadRequest(f"{path}.content: expected a string or a list of blocks", param=f"{path}.content")
    if not content and not (last and role == "assistant"):
        # Anthropic's rule: only a final assistant turn (a prefill) may be empty.
        raise BadRequest(f"{path}.content: must not be empty", param=f"{path}.content")
    return Message(role, blocks)


def _block(value: Any, path: str, role: str) -> dict[str, Any]:
    b = _object(value, path)
    kind = b.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadRequest(f"{path}.type: expected a content block type", param=f"{path}.type")
    if kind in ("tool_use", "thinking", "redacted_thinking") and role != "assistant":
        raise BadRequest(f"{path}.type: {kind} blocks belong in assistant messages", param=f"{path}.type")
    if kind == "tool_result" and role != "user":
        raise BadRequest(f"{path}.type: tool_result blocks belong in user messages", param=f"{path}.type")
    if kind == "text":
        _string(b, "text", path)
    elif kind == "image":
        _source(b.get("source"), f"{path}.source", image=True)
    elif kind == "document":
        _source(b.get("source"), f"{path}.source", image=False)
    elif kind == "tool_use":
        _string(b, "id", path)
        _string(b, "name", path)
        _object(b.get("input"), f"{path}.input")
    elif kind == "tool_result":
        _string(b, "tool_use_id", path)
        _boolean(b.get("is_error"), f"{path}.is_error")
        inner = b.get("content")
        if isinstance(inner, list):
            for k, item in enumerate(inner):
                _block(item, f"{path}.content.{k}", "tool_result")
        elif inner is not None and not isinstance(inner, str):
            raise BadRequest(
                f"{path}.content: expected a string or a list of blocks", param=f"{path}.content"
            )
    elif kind == "thinking":
        _string(b, "thinking", path)
        _string(b, "signature", path)
    elif kind == "redacted_thinking":
        _string(b, "data", path)
    elif kind == "search_result":
        _string(b, "source", path)
        _string(b, "title", path)
        if not isinstance(b.get("content"), list):
            raise BadRequest(f"{path}.content: expected a list of text blocks", param=f"{path}.content")
    return b


def _source(value: Any, path: str, *, image: bool) -> None:
    s = _object(value, path)
    kind = s.get("type")
    if kind == "base64":
        media = _string(s, "media_type", path)
        if image and media not in _MEDIA_TYPES:
            allowed = ", ".join(_MEDIA_TYPES)
            raise BadRequest(f"{path}.media_type: expected one of {allowed}", param=f"{path}.media_type")
        _string(s, "data", path)
    elif kind == "url":
        _string(s, "url", path)
    elif kind == "file":
        _string(s, "file_id", path)
    elif kind in ("text", "content") and not image:
        pass  # plain-text and content-block documents: the translators refuse documents anyway
    else:
        raise BadRequest(f"{path}.type: expected 'base64', 'url' or 'file'", param=f"{path}.type")


def _system(value: Any) -> str | tuple[dict[str, Any], ...] | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise BadRequest("system: expected a string or a list of text blocks", param="system")
    for i, b in enumerate(value):
        block = _object(b, f"system.{i}")
        if block.get("type") != "text":
            raise BadRequest(f"system.{i}.type: system blocks must be text blocks", param=f"system.{i}.type")
        _string(block, "text", f"system.{i}")
    return tuple(value)


def _stop_sequences(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("stop_sequences: expected a list of strings", param="stop_sequences")
    for i, s in enumerate(value):
        if not isinstance(s, str) or not s:
            raise BadRequest(f"stop_sequences.{i}: expected a non-empty string", param=f"stop_sequences.{i}")
    return tuple(value)


def _tools(value: Any) -> tuple[dict[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("tools: expected a list of tools", param="tools")
    for i, t in enumerate(value):
        tool = _object(t, f"tools.{i}")
        name = _string(tool, "name", f"tools.{i}")
        if not name:
            raise BadRequest(f"tools.{i}.name: must not be empty", param=f"tools.{i}.name")
        _string(tool, "description", f"tools.{i}", required=False)
        if tool.get("type") in (None, "custom"):
            schema = _object(tool.get("input_schema"), f"tools.{i}.input_schema")
            if schema.get("type") != "object":
                raise BadRequest(
                    f"tools.{i}.input_schema.type: the schema must describe an object",
                    param=f"tools.{i}.input_schema.type",
                )
        elif not isinstance(tool["type"], str):
            raise BadRequest(f"tools.{i}.type: expected a string", param=f"tools.{i}.type")
    return tuple(value)


def _tool_choice(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    if kind not in _TOOL_CHOICES:
        allowed = ", ".join(_TOOL_CHOICES)
        raise BadRequest(f"tool_choice.type: expected one of {allowed}", param="tool_choice.type")
    if kind == "tool":
        _string(choice, "name", "tool_choice")
    _boolean(choice.get("disable_parallel_tool_use"), "tool_choice.disable_parallel_tool_use")
    return choice


def _thinking(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    thinking = _object(value, "thinking")
    if not isinstance(thinking.get("type"), str):
        raise BadRequest("thinking.type: expected a string such as 'enabled'", param="thinking.type")
    if thinking["type"] == "enabled":
        _integer(thinking.get("budget_tokens"), "thinking.budget_tokens", low=1, required=True)
    return thinking


def estimate_input_tokens(req: MessagesRequest | MessagesHead) -> int:
    """The estimate ``count_tokens_estimate`` documents, for a request already parsed or only read (its
    head: then whatever the body holds is counted as far as it has the known shapes, never refused)."""
    counts = [0, 0]  # characters, media blocks
    if isinstance(req, MessagesHead):
        doc = req.doc
        _count(doc.get("system"), counts)
        messages = doc.get("messages")
        for m in messages if isinstance(messages, list) else ():
            if isinstance(m, dict):
                _count(m.get("content"), counts)
        tools = doc.get("tools")
        tools = tools if isinstance(tools, list) else ()
    else:
        _count(req.system, counts)
        for m in req.messages:
            _count(m.content, counts)
        tools = req.tools or ()
    chars, media = counts
    for tool in tools:
        chars += len(orjson.dumps(tool))
    return max(1, math.ceil(chars / 4) + media * IMAGE_TOKENS)


def _count(value: Any, counts: list[int]) -> None:
    """Add a content value's characters and media blocks to ``counts``. A module-level function: a nested
    one that calls itself is a reference cycle (the function holds its own cell), left behind by every
    request for the cyclic collector."""
    if isinstance(value, str):
        counts[0] += len(value)
    elif isinstance(value, list | tuple):
        for item in value:
            _count(item, counts)
    elif isinstance(value, dict):
        kind = value.get("type")
        if kind in ("image", "document"):
            counts[1] += 1
        elif kind == "text":
            counts[0] += _length(value.get("text"))
        elif kind == "tool_use":
            counts[0] += _length(value.get("name")) + len(orjson.dumps(value.get("input")))
        elif kind == "tool_result":
            _count(value.get("content"), counts)
        elif kind == "thinking":
            counts[0] += _length(value.get("thinking"))


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str) else 0


def parse_count_tokens_request(body: bytes, members: MemberCounter = count_top_members) -> MessagesRequest:
    """A ``count_tokens`` body, checked like a Messages request except that it has no ``max_tokens``."""
    return parse_messages_doc(decode_object(body, members), count_tokens=True)


def count_tokens_estimate(body: bytes) -> int:
    """An *estimate* of a request's input tokens, for ``POST /v1/messages/count_tokens`` and admission.

    The rule: ``ceil(characters / 4)`` over the system prompt, every text block (and string content),
    tool_use names and JSON inputs, tool_result text, thinking text and the whole JSON of every tool
    definition, plus ``IMAGE_TOKENS`` (1600) per image or document block, and at least 1. Backends
    tokenise differently; this is neither an upper nor a lower bound. Only the head is checked (``model``;
    count_tokens bodies have no ``max_tokens``): content of shapes the rule does not know counts nothing."""
    return estimate_input_tokens(read_messages_head(body, count_tokens=True))


def anthropic_error_body(status: int, message: str) -> bytes:
    return orjson.dumps(
        {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
    )
