"""The bodies an Anthropic Messages backend would send, for the mock engine. Sans-I/O: values in, bytes out.

``messages`` answers ``POST /v1/messages`` (whole or as a stream of events), ``count_tokens`` answers
``POST /v1/messages/count_tokens``, ``error_body`` renders Anthropic's error envelope. Requests are checked
with the gateway's own ``parse_messages_request``, so a translator that emits a malformed body fails here.

As in the OpenAI mock (``responses``): the text is ``tok tok …``; prompt tokens are the words of the
system prompt and of the text blocks; tools are called as ``agent`` says (a call while the conversation
waits for one, a text answer once the last turn carries a tool result). ``cache_read`` of
the prompt tokens (at most all of them) are reported as ``cache_read_input_tokens`` and the rest as
``input_tokens``, so input + cache read is the prompt, as in the OpenAI mock's ``prompt_tokens``. A stream
reports input and cache tokens in ``message_start`` and only ``output_tokens`` in ``message_delta``, the
shape that the tail parser cannot meter alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import BadRequest
from gateway.mockengine.agent import arguments_for, choose_tool
from gateway.mockengine.responses import JSON_HEADERS, MockRequestError, Reply, StreamReply, count_words
from gateway.protocol.anthropic import MessagesRequest, anthropic_error_body, parse_messages_request
from gateway.protocol.sse import encode_event

__all__ = ["count_tokens", "error_body", "messages"]


def error_body(status: int, message: str) -> bytes:
    return anthropic_error_body(status, message)


def _parse(body: bytes, *, counting: bool) -> MessagesRequest:
    if counting:
        # count_tokens bodies have no max_tokens; the parser wants one, which changes nothing else.
        doc = _object(body)
        body = orjson.dumps({**doc, "max_tokens": 1})
    try:
        return parse_messages_request(body)
    except BadRequest as exc:
        raise MockRequestError(400, exc.message, "invalid_request_error") from None


def _object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MockRequestError(400, "the body is not valid JSON", "invalid_request_error") from None
    if not isinstance(doc, dict):
        raise MockRequestError(400, "the body must be a JSON object", "invalid_request_error")
    return doc


def _prompt(req: MessagesRequest) -> int:
    words = count_words(list(req.system) if isinstance(req.system, tuple) else req.system)
    for m in req.messages:
        words += count_words(m.content if isinstance(m.content, str) else list(m.content))
    return max(1, words)


def _tool(req: MessagesRequest) -> tuple[str, dict[str, Any]] | None:
    """The tool call to answer with (name, input), or None for a text answer."""
    custom = [
        (t["name"], t.get("input_schema")) for t in req.tools or () if t.get("type") in (None, "custom")
    ]
    choice = req.tool_choice or {}
    kind = choice.get("type", "auto")
    if not custom or kind == "none":
        return None
    if kind == "tool":
        schema = next((s for n, s in custom if n == choice["name"]), None)
        return str(choice["name"]), arguments_for(schema)
    if kind == "auto" and _answered(req):
        return None  # the tool's result is in: time to say something
    return choose_tool(custom)


def _answered(req: MessagesRequest) -> bool:
    """The last turn hands back a tool result."""
    last = req.messages[-1]
    return not isinstance(last.content, str) and any(b.get("type") == "tool_result" for b in last.content)


def count_tokens(body: bytes) -> Reply:
    req = _parse(body, counting=True)
    return Reply(200, JSON_HEADERS, orjson.dumps({"input_tokens": _prompt(req)}))


def messages(body: bytes, model: str, tokens: int, rid: str, cache_read: int) -> Reply | StreamReply:
    """``rid`` (``msg_…``) comes from the caller so this stays pure; ``model`` is the name to report."""
    req = _parse(body, counting=False)
    prompt = _prompt(req)
    cached = min(cache_read, prompt)
    n, stop = (req.max_tokens, "max_tokens") if req.max_tokens <= tokens else (tokens, "end_turn")
    tool = _tool(req)
    call_id = "toolu_" + rid.removeprefix("msg_")
    usage: dict[str, Any] = {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": n,
    }
    if req.stream:
        return StreamReply(_events(model, n, stop, usage, tool, rid, call_id))
    if tool is None:
        content: list[dict[str, Any]] = [{"type": "text", "text": " ".join(["tok"] * n)}]
    else:
        content = [{"type": "tool_use", "id": call_id, "name": tool[0], "input": tool[1]}]
        stop = "tool_use"
    answer = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    return Reply(200, JSON_HEADERS, orjson.dumps(answer))


def _event(obj: Mapping[str, Any]) -> bytes:
    return encode_event(str(obj["type"]), orjson.dumps(obj))


def _events(
    model: str,
    n: int,
    stop: str,
    usage: dict[str, Any],
    tool: tuple[str, dict[str, Any]] | None,
    rid: str,
    call_id: str,
) -> list[bytes]:
    message: dict[str, Any] = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},  # Anthropic's message_start says 1 before any output
    }
    out = [_event({"type": "message_start", "message": message})]
    if tool is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": "tok" if i == 0 else " tok"} for i in range(n)]
    else:
        block = {"type": "tool_use", "id": call_id, "name": tool[0], "input": {}}
        arguments = orjson.dumps(tool[1]).decode()
        # As Anthropic streams them: an empty fragment first, then the JSON in pieces.
        pieces = ("", arguments[:1], arguments[1:])
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        stop = "tool_use"
    out.append(_event({"type": "content_block_start", "index": 0, "content_block": block}))
    out.append(_event({"type": "ping"}))
    out.extend(_event({"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas)
    out.append(_event({"type": "content_block_stop", "index": 0}))
    delta = {"stop_reason": stop, "stop_sequence": None}
    out.append(
        _event({"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage["output_tokens"]}})
    )
    out.append(_event({"type": "message_stop"}))
    return out
