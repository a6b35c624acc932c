"""The mock engine's OpenAI Responses API (``/v1/responses``), as vLLM serves it. Sans-I/O: parsed requests
in, ``Reply`` / ``StreamReply`` values out; the store of responses is an in-memory dict on the engine.

``create`` answers a ``POST /v1/responses``, whole or as the API's stream events (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta``, the matching ``.done``
events, ``response.completed``). Like a model driving an agent, it calls a tool when the request offers
function tools and the conversation has no tool result since the user last spoke, and answers with text
(``tok tok …``) once it has one — so an agent (Codex) ends its turn on its own. Which tool and its
arguments are the mock's agent rules (``agent``: a harmless listing or shell tool first, values for the
schema's required parameters); a named ``tool_choice`` or ``required`` forces a call.

Responses with ``store`` (the API's default) are kept, at most ``STORE_LIMIT`` of them, for
``GET`` / ``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``; ``previous_response_id``
continues from a stored one. Prompt tokens are whitespace-separated words, as everywhere in the mock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.mockengine.agent import arguments_for, choose_tool
from gateway.mockengine.responses import JSON_HEADERS, MockRequestError, Reply, StreamReply, count_words

__all__ = ["STORE_LIMIT", "ResponseStore", "create"]

STORE_LIMIT = 1000
_TOOL_RESULTS = frozenset({"function_call_output", "custom_tool_call_output"})


class ResponseStore:
    """Stored responses by id, with the input items each was created from; the oldest go first."""

    def __init__(self) -> None:
        self.items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def put(self, response: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
        self.items[response["id"]] = (response, inputs)
        while len(self.items) > STORE_LIMIT:
            self.items.popitem(last=False)

    def answer(self, method: str, rid: str, sub: str) -> Reply:
        """``GET``/``DELETE /v1/responses/{rid}`` (``sub`` empty) or ``GET …/{rid}/input_items``."""
        stored = self.items.get(rid)
        if stored is None:
            raise MockRequestError(404, f"Response with id '{rid}' not found.", "NotFoundError")
        response, inputs = stored
        if sub == "input_items" and method == "GET":
            items = list(reversed(inputs))  # the API lists them newest first by default
            body = {
                "object": "list",
                "data": items,
                "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None,
                "has_more": False,
            }
            return Reply(200, JSON_HEADERS, orjson.dumps(body))
        if sub:
            raise MockRequestError(404, f"no route for /v1/responses/{rid}/{sub}", "NotFoundError")
        if method == "GET":
            return Reply(200, JSON_HEADERS, orjson.dumps(response))
        if method == "DELETE":
            del self.items[rid]
            return Reply(200, JSON_HEADERS, orjson.dumps({"id": rid, "object": "response", "deleted": True}))
        raise MockRequestError(405, f"/v1/responses/{rid} takes GET or DELETE", "MethodNotAllowed")


def _input_items(req: Mapping[str, Any], rid: str) -> list[dict[str, Any]]:
    raw = req.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list) or not raw:
        raise MockRequestError(400, "input must be a string or a non-empty list of items")
    items = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise MockRequestError(400, f"input[{i}] must be an object")
        items.append({"id": f"in_{rid}_{i}", **item} if "id" not in item else item)
    return items


def _words(items: list[dict[str, Any]]) -> int:
    n = 0
    for item in items:
        content = item.get("content", item.get("output", item.get("arguments")))
        n += count_words(content)
    return n


def _wants_tool(req: Mapping[str, Any], history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The tool to call now, or None for a text answer: no function tools, ``none``, or a tool result
    after the user's last message — unless the choice forces a call (a named tool, ``required``), which a
    model obeys even then."""
    tools = [t for t in req.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"]
    choice = req.get("tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        named = [t for t in tools if t.get("name") == choice["name"]]
        if named:
            return named[0]
    if choice != "required":
        for item in reversed(history):
            if item.get("type") in _TOOL_RESULTS:
                return None
            if item.get("role") == "user":
                break
    name, _ = choose_tool([(t.get("name") or "", t.get("parameters")) for t in tools])
    return next(t for t in tools if t.get("name") == name)


def _budget(req: Mapping[str, Any], tokens: int) -> tuple[int, bool]:
    cap = req.get("max_output_tokens")
    if cap is None:
        return tokens, False
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise MockRequestError(400, "max_output_tokens must be a positive integer")
    return (cap, True) if cap < tokens else (tokens, False)


def create(
    req: Mapping[str, Any], model: str, tokens: int, rid: str, created: int, store: ResponseStore
) -> Reply | StreamReply:
    """``POST /v1/responses``; ``rid`` and ``created`` come from the caller so this stays pure."""
    inputs = _input_items(req, rid)
    history = list(inputs)
    previous = req.get("previous_response_id")
    if previous is not None:
        stored = store.items.get(previous) if isinstance(previous, str) else None
        if stored is None:
            raise MockRequestError(404, f"Previous response with id '{previous}' not found.", "NotFoundError")
        history = [*stored[1], *stored[0]["output"], *inputs]
    instructions = req.get("instructions")
    prompt = max(1, _words(history) + count_words(instructions))
    n, capped = _budget(req, tokens)
    tool = _wants_tool(req, history)
    if tool is not None:
        call_id = f"call_{rid}"
        item: dict[str, Any] = {
            "id": f"fc_{rid}",
            "type": "function_call",
            "call_id": call_id,
            "name": tool.get("name"),
            "arguments": orjson.dumps(arguments_for(tool.get("parameters"))).decode(),
            "status": "completed",
        }
        capped = False
    else:
        text = " ".join(["tok"] * n)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = {
            "id": f"msg_{rid}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": n if tool is None else 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + (n if tool is None else 8),
    }
    response: dict[str, Any] = {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": created,
        "status": "incomplete" if capped else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if capped else None,
        "instructions": instructions,
        "max_output_tokens": req.get("max_output_tokens"),
        "metadata": req.get("metadata") or {},
        "model": model,
        "output": [item],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": previous,
        "temperature": req.get("temperature"),
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p"),
        "usage": usage,
    }
    if req.get("store") is not False:
        store.put(response, inputs)
    if req.get("stream") is True:
        return StreamReply(_events(response, item, n))
    return Reply(200, JSON_HEADERS, orjson.dumps(response))


def _events(response: dict[str, Any], item: dict[str, Any], n: int) -> list[bytes]:
    out: list[bytes] = []

    def emit(obj: dict[str, Any]) -> None:
        obj["sequence_number"] = len(out)
        out.append(b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n")

    start = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit({"type": "response.created", "response": start})
    emit({"type": "response.in_progress", "response": start})
    where = {"item_id": item["id"], "output_index": 0}
    if item["type"] == "function_call":
        emit(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
        )
        arguments = item["arguments"]
        for piece in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
            emit({"type": "response.function_call_arguments.delta", **where, "delta": piece})
        emit(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": item["name"],
                "arguments": arguments,
            }
        )
    else:
        added = {**item, "status": "in_progress", "content": []}
        emit({"type": "response.output_item.added", "output_index": 0, "item": added})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        emit({"type": "response.content_part.added", **where, "content_index": 0, "part": part})
        for i in range(n):
            delta = "tok" if i == 0 else " tok"
            emit(
                {
                    "type": "response.output_text.delta",
                    **where,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                }
            )
        text = item["content"][0]["text"]
        emit({"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []})
        emit({"type": "response.content_part.done", **where, "content_index": 0, "part": item["content"][0]})
    emit({"type": "response.output_item.done", "output_index": 0, "item": item})
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    emit({"type": final, "response": response})
    return out
