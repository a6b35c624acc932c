"""A streamed answer rebuilt as the answer the same API gives without streaming, from its events: what an
operator debugging a bad answer reads, rather than a few hundred ``data:`` lines of one token each.

- OpenAI chat completions: one ``chat.completion`` whose choices carry the joined ``content`` (and
  ``reasoning_content`` when the engine streamed one), each tool call with its joined ``arguments``, and
  the ``finish_reason``; ``/v1/completions`` streams: a ``text_completion`` with each choice's text.
- Anthropic messages: one ``message`` with its content blocks joined (text, thinking, and tool use with
  its ``input`` parsed from the joined JSON pieces, kept as the joined string when they do not parse),
  ``stop_reason``, and the usage of ``message_start`` updated by ``message_delta``.
- OpenAI responses: the ``response`` of the last ``response.*`` event that carries one (the whole answer
  when the stream reached ``response.completed``), and ``output_text``, the text deltas joined, when it
  did not.

An error event is kept as the answer's ``error``. Ids, model and usage come from the events. ``events``
counts the events read; no event, an event that is not JSON (``[DONE]`` aside) or not an object makes
``rebuild`` return None. Sans-I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.protocol.sse import SSEDecoder

__all__ = ["rebuild"]


def rebuild(dialect: str, path: str, raw: bytes, complete: bool) -> tuple[dict[str, Any] | None, int]:
    """``(answer, events)`` for the stream ``raw`` as relayed to a client of ``dialect``; ``complete``
    False when ``raw`` was cut short, so that its last, unfinished event is left out."""
    decoder = SSEDecoder()
    events = decoder.feed(raw)
    if complete:
        events += decoder.close()
    parsed: list[tuple[str | None, Any]] = []
    for event in events:
        if event.data.strip() == "[DONE]":
            continue
        try:
            parsed.append((event.event, orjson.loads(event.data)))
        except orjson.JSONDecodeError:
            return None, len(events)
    if not parsed or not all(isinstance(data, dict) for _, data in parsed):
        return None, len(events)  # no event, or events of no shape an API sends
    if dialect == "anthropic":
        return _anthropic(parsed), len(events)
    if dialect == "responses":
        return _responses(parsed), len(events)
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        return _completions(parsed), len(events)
    return _chat(parsed), len(events)


def _order(index: Any) -> tuple[int, int, str]:
    """Indexes in numeric order (an index that is not an integer, which no API sends, after them)."""
    return (0, index, "") if type(index) is int else (1, 0, str(index))


def _chat(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"object": "chat.completion"}
    choices: dict[int, dict[str, Any]] = {}
    for _, data in events:
        if "error" in data:
            out["error"] = data["error"]
            continue
        for field in ("id", "created", "model", "system_fingerprint"):
            if field in data and field not in out:
                out[field] = data[field]
        if data.get("usage"):
            out["usage"] = data["usage"]
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            into = choices.setdefault(index, {"role": None, "content": [], "reasoning": [], "tools": {}})
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if delta.get("role"):
                into["role"] = delta["role"]
            if isinstance(delta.get("content"), str):
                into["content"].append(delta["content"])
            reasoning = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(reasoning, str):
                into["reasoning"].append(reasoning)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    _tool_delta(into["tools"], call)
    out["choices"] = [
        _chat_choice(i, c) for i, c in sorted(choices.items(), key=lambda item: _order(item[0]))
    ]
    return out


def _tool_delta(tools: dict[Any, dict[str, Any]], call: dict[str, Any]) -> None:
    tool = tools.setdefault(call.get("index", len(tools)), {"type": "function", "name": [], "arguments": []})
    if call.get("id"):
        tool["id"] = call["id"]
    if call.get("type"):
        tool["type"] = call["type"]
    function = call.get("function")
    if isinstance(function, dict):
        if isinstance(function.get("name"), str):
            tool["name"].append(function["name"])
        if isinstance(function.get("arguments"), str):
            tool["arguments"].append(function["arguments"])


def _chat_choice(index: Any, c: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": c["role"] or "assistant", "content": "".join(c["content"]) or None}
    if c["reasoning"]:
        message["reasoning_content"] = "".join(c["reasoning"])
    if c["tools"]:
        message["tool_calls"] = [
            {
                **({"id": t["id"]} if "id" in t else {}),
                "type": t["type"],
                "function": {"name": "".join(t["name"]), "arguments": "".join(t["arguments"])},
            }
            for _, t in sorted(c["tools"].items(), key=lambda item: _order(item[0]))
        ]
    return {"index": index, "message": message, "finish_reason": c.get("finish_reason")}


def _completions(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"object": "text_completion"}
    texts: dict[Any, list[str]] = {}
    reasons: dict[Any, Any] = {}
    for _, data in events:
        if "error" in data:
            out["error"] = data["error"]
            continue
        for field in ("id", "created", "model"):
            if field in data and field not in out:
                out[field] = data[field]
        if data.get("usage"):
            out["usage"] = data["usage"]
        for choice in data.get("choices") or ():
            if isinstance(choice, dict):
                index = choice.get("index", 0)
                if isinstance(choice.get("text"), str):
                    texts.setdefault(index, []).append(choice["text"])
                if choice.get("finish_reason") is not None:
                    reasons[index] = choice["finish_reason"]
    indexes = sorted(texts.keys() | reasons.keys(), key=_order)
    out["choices"] = [
        {"index": i, "text": "".join(texts.get(i, [])), "finish_reason": reasons.get(i)} for i in indexes
    ]
    return out


def _anthropic(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "message"}
    blocks: dict[Any, dict[str, Any]] = {}
    pieces: dict[Any, list[str]] = {}
    for name, data in events:
        kind = data.get("type", name)
        if kind == "error":
            out["error"] = data.get("error", data)
        elif kind == "message_start" and isinstance(data.get("message"), dict):
            message = data["message"]
            for field in ("id", "role", "model", "usage", "stop_reason", "stop_sequence"):
                if field in message:
                    out[field] = message[field]
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            index = data.get("index", len(blocks))
            blocks[index] = dict(data["content_block"])
            pieces[index] = []
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            index = data.get("index", 0)
            delta = data["delta"]
            block = blocks.setdefault(index, {"type": "text", "text": ""})
            part = pieces.setdefault(index, [])
            for field in ("text", "thinking", "partial_json"):
                if isinstance(delta.get(field), str):
                    part.append(delta[field])
            if isinstance(delta.get("signature"), str):
                block["signature"] = delta["signature"]
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                for field in ("stop_reason", "stop_sequence"):
                    if field in delta:
                        out[field] = delta[field]
            usage = data.get("usage")
            if isinstance(usage, dict):
                out["usage"] = {**(out.get("usage") or {}), **usage}
    content = []
    for index in sorted(blocks, key=_order):
        block, joined = blocks[index], "".join(pieces.get(index, []))
        if block.get("type") == "tool_use":
            if joined:
                try:
                    block["input"] = orjson.loads(joined)
                except orjson.JSONDecodeError:
                    block["input_json"] = joined  # cut short, or not JSON: as the pieces joined
        elif block.get("type") == "thinking":
            block["thinking"] = block.get("thinking", "") + joined
        else:
            block["text"] = block.get("text", "") + joined
        content.append(block)
    out["content"] = content
    return out


def _responses(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    response: dict[str, Any] | None = None
    finished = False
    text: list[str] = []
    error: Any = None
    for name, data in events:
        kind = data.get("type", name)
        if isinstance(data.get("response"), dict):
            response = data["response"]
            finished = kind in ("response.completed", "response.failed", "response.incomplete")
        elif kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            text.append(data["delta"])
        elif kind == "error":
            error = data.get("error", data)
    out: dict[str, Any] = dict(response) if response is not None else {"object": "response"}
    if not finished and text:
        out["output_text"] = "".join(text)
    if error is not None:
        out["error"] = error
    return out
