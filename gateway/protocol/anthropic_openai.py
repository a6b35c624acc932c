"""Translator for an Anthropic client in front of an OpenAI-speaking backend (vLLM, SGLang). Sans-I/O.

``request_to_openai`` turns a checked ``MessagesRequest`` into a chat completion body,
``response_from_openai`` a chat completion into a Messages object, and ``StreamToAnthropic`` the chat
completion chunks of a stream into Anthropic's stream events as they arrive; ``error_to_anthropic``
rewraps an upstream error body.

The mapping, where it is not one to one:

- ``system`` blocks are joined with ``\\n`` into one system message, and so are the text blocks of a
  ``system`` message inside ``messages`` (kept in its place, as Claude Code sends it); several text
  blocks in a user turn become text parts, one text block a plain string; assistant text blocks are
  concatenated.
- ``tool_result`` blocks become ``role: tool`` messages placed before the rest of their user turn (OpenAI
  wants them right after the assistant's tool calls). Their text blocks are joined with ``\\n``; an error
  result (``is_error: true``) is prefixed ``"Error: "``, the only way to tell the model. Images inside a
  tool_result are refused: tool messages carry text only.
- Images: base64 sources become ``data:`` URLs; ``url`` sources are passed as URLs, never fetched.
- A final assistant turn (a prefill) sets vLLM's ``continue_final_message`` and clears
  ``add_generation_prompt``, so the model continues that text as Anthropic's would. ``top_k`` is vLLM's
  extra parameter too.
- Dropped on purpose: ``thinking`` (the backend reasons, or not, as it is served; no thinking blocks come
  back) and thinking / redacted_thinking blocks in the history (their signatures mean nothing to another
  model); ``cache_control`` everywhere (OpenAI backends cache prefixes on their own and have no marker);
  ``reasoning_content`` in answers; unknown top-level fields.
- Refused with ``BadRequest`` naming the field: document, search_result, file-sourced images and any
  other block type, server tools (``tools.N.type`` other than custom).

Streams: OpenAI reports usage only in the last chunk, so ``message_start`` carries the estimate given to
the constructor as ``input_tokens`` (0 by default) and the final ``message_delta`` the real input, cached
and output tokens. Tool arguments stream as ``input_json_delta`` fragments. A fragment for a tool call
whose block is already closed (backends that interleave parallel calls) is sent to that block's index.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.protocol.anthropic import (
    Message,
    MessagesRequest,
    anthropic_error_body,
    anthropic_error_type,
)
from gateway.protocol.sse import EventTranslator, SSEDecoder, encode_event
from gateway.protocol.usage import Usage

__all__ = ["StreamToAnthropic", "error_to_anthropic", "request_to_openai", "response_from_openai"]

_TOOL_CHOICE: Final = {"auto": "auto", "any": "required", "none": "none"}
_STOP_REASON: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_DROPPED_BLOCKS: Final = ("thinking", "redacted_thinking")


def request_to_openai(req: MessagesRequest, upstream_model: str) -> bytes:
    messages: list[dict[str, Any]] = []
    if req.system is not None:
        text = req.system if isinstance(req.system, str) else "\n".join(b["text"] for b in req.system)
        messages.append({"role": "system", "content": text})
    for i, m in enumerate(req.messages):
        if m.role == "user":
            messages.extend(_user(m, i))
        elif m.role == "system":
            messages.append(_system_turn(m, i))
        else:
            messages.append(_assistant(m, i))
    out: dict[str, Any] = {"model": upstream_model, "messages": messages, "max_tokens": req.max_tokens}
    if req.messages[-1].role == "assistant":
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    if req.stop_sequences is not None:
        out["stop"] = list(req.stop_sequences)
    for key in ("temperature", "top_p", "top_k"):
        value = getattr(req, key)
        if value is not None:
            out[key] = value
    if req.user_id is not None:
        out["user"] = req.user_id
    if req.tools:
        out["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        choice = req.tool_choice
        kind = choice["type"]
        out["tool_choice"] = (
            {"type": "function", "function": {"name": choice["name"]}}
            if kind == "tool"
            else _TOOL_CHOICE[kind]
        )
        if choice.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    if req.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return orjson.dumps(out)


def _system_turn(m: Message, i: int) -> dict[str, Any]:
    """A system message inside the conversation stays where it is, as an OpenAI system message."""
    if isinstance(m.content, str):
        return {"role": "system", "content": m.content}
    texts = []
    for j, block in enumerate(m.content):
        if block["type"] != "text":
            raise _refuse(block, f"messages.{i}.content.{j}")
        texts.append(block["text"])
    return {"role": "system", "content": "\n".join(texts)}


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise BadRequest(
            f"tools.{i}.type: {tool['type']} is a server tool; this backend takes custom tools only",
            param=f"tools.{i}.type",
        )
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _refuse(block: dict[str, Any], path: str) -> BadRequest:
    return BadRequest(
        f"{path}.type: {block['type']} blocks cannot be translated for this backend", param=f"{path}.type"
    )


def _image_url(block: dict[str, Any], path: str) -> dict[str, Any]:
    source = block["source"]
    if source["type"] == "base64":
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif source["type"] == "url":
        url = source["url"]
    else:
        raise BadRequest(
            f"{path}.source.type: file sources cannot be translated for this backend",
            param=f"{path}.source.type",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _user(m: Message, i: int) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(m.content):
        path = f"messages.{i}.content.{j}"
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image_url(block, path))
        elif kind == "tool_result":
            tools.append(
                {"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result(block, path)}
            )
        else:
            raise _refuse(block, path)
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*tools, {"role": "user", "content": parts[0]["text"]}]
    return [*tools, {"role": "user", "content": parts}] if parts else tools


def _result(block: dict[str, Any], path: str) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts = []
        for k, inner in enumerate(content):
            if inner["type"] != "text":
                raise _refuse(inner, f"{path}.content.{k}")
            texts.append(inner["text"])
        text = "\n".join(texts)
    return "Error: " + text if block.get("is_error") is True else text


def _assistant(m: Message, i: int) -> dict[str, Any]:
    if isinstance(m.content, str):
        return {"role": "assistant", "content": m.content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(m.content):
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            arguments = orjson.dumps(block["input"]).decode()
            function = {"name": block["name"], "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": function})
        elif kind not in _DROPPED_BLOCKS:
            raise _refuse(block, f"messages.{i}.content.{j}")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _load(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise BadUpstreamResponse("the backend's answer is not a JSON object")
    return doc


def _stop(finish: Any, matched: Any) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence. vLLM's ``stop_reason`` names the stop string that ended
    the text (a token id, an int, when a stop token did)."""
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return _STOP_REASON.get(finish, "end_turn"), None


def _input(arguments: Any) -> Any:
    """Tool input from an arguments string: ``{}`` when the backend sent nothing or no JSON object (a model
    can emit malformed arguments; Anthropic clients expect an object)."""
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _usage(usage: Any) -> dict[str, int]:
    """Anthropic usage from OpenAI's: ``input_tokens`` excludes the cached prompt tokens, as Anthropic's."""
    if not isinstance(usage, dict):
        usage = {}
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = min(_int(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": _int(usage.get("completion_tokens")),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: upstream bodies are read defensively."""
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def response_from_openai(body: bytes, model: str) -> bytes:
    doc = _load(body)
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadUpstreamResponse("the backend's answer has no choices")
    choice = choices[0]
    message = _obj(choice.get("message"))
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    rid = str(doc.get("id", ""))
    for n, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"toolu_{rid}_{n}"
        name = function.get("name")
        content.append(
            {"type": "tool_use", "id": call_id, "name": name, "input": _input(function.get("arguments"))}
        )
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice.get("stop_reason"))
    if stop_reason == "end_turn" and any(b["type"] == "tool_use" for b in content):
        stop_reason = "tool_use"
    out = {
        "id": "msg_" + rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(doc.get("usage")),
    }
    return orjson.dumps(out)


def error_to_anthropic(status: int, body: bytes) -> bytes:
    """An upstream error answer in Anthropic's envelope: the OpenAI ``error.message`` when there is one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    error = doc.get("error", doc) if isinstance(doc, dict) else None  # older vLLM: the error unwrapped
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = body[:512].decode("utf-8", "replace") or f"upstream answered with status {status}"
    return anthropic_error_body(status, message)


class StreamToAnthropic(EventTranslator):
    """OpenAI chat completion chunks in, Anthropic stream events out; see the module docstring.

    ``feed`` each upstream piece and send what it returns; call ``finish`` when the upstream body ends
    (it reports a stream cut before ``[DONE]`` as an ``error`` event) and ``ping`` to keep a quiet
    connection open. ``prompt_tokens``, ``completion_tokens`` and ``cached_tokens`` are what the upstream
    reported (``None`` until its usage chunk), ``usage()`` the same as a ``Usage``.
    """

    def __init__(self, model: str, *, input_tokens_estimate: int = 0) -> None:
        self.model = model
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._estimate = input_tokens_estimate
        self._sse = SSEDecoder()
        self._started = False
        self._done = False
        self._id = ""
        self._next = 0  # index of the next content block
        self._open: int | None = None  # index of the open block
        self._text: int | None = None  # index of the open block when it is text
        self._tools: dict[int, int] = {}  # OpenAI tool call index -> block index
        self._stop: tuple[str, str | None] | None = None

    def usage(self) -> Usage | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        prompt, completion = self.prompt_tokens or 0, self.completion_tokens or 0
        return Usage(prompt, completion, prompt + completion, self.cached_tokens or 0)

    def ping(self) -> bytes:
        return encode_event("ping", b'{"type":"ping"}')

    def _ended(self, out: list[bytes]) -> None:
        if self._stop is not None:
            self._end(out)  # [DONE] never came, but the answer did
        else:
            self._error(out, 502, "the backend's stream ended before the answer was complete")

    def _emit(self, out: list[bytes], name: str, obj: dict[str, Any]) -> None:
        out.append(encode_event(name, orjson.dumps(obj)))

    def _error(self, out: list[bytes], status: int, message: str) -> None:
        error = {"type": anthropic_error_type(status), "message": message}
        self._emit(out, "error", {"type": "error", "error": error})
        self._done = True

    def _event(self, data: str, out: list[bytes]) -> None:
        if data == "[DONE]":
            self._end(out)
            return
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            self._error(out, 502, "the backend sent a stream event that is not a JSON object")
            return
        error = doc.get("error")
        if error is not None:
            self._upstream_error(error, out)
            return
        if not self._started:
            self._start(doc, out)
        usage = doc.get("usage")
        if isinstance(usage, dict):
            anthropic = _usage(usage)
            self.prompt_tokens = anthropic["input_tokens"] + anthropic["cache_read_input_tokens"]
            self.cached_tokens = anthropic["cache_read_input_tokens"]
            self.completion_tokens = anthropic["output_tokens"]
        choices = doc.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice, out)

    def _upstream_error(self, error: Any, out: list[bytes]) -> None:
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        self._error(out, status, message if isinstance(message, str) else "the backend reported an error")

    def _start(self, doc: dict[str, Any], out: list[bytes]) -> None:
        self._started = True
        self._id = str(doc.get("id", ""))
        message: dict[str, Any] = {
            "id": "msg_" + self._id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self._estimate,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        self._emit(out, "message_start", {"type": "message_start", "message": message})

    def _choice(self, choice: dict[str, Any], out: list[bytes]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._text is None:
                    self._open_block(out, {"type": "text", "text": ""})
                    self._text = self._open
                delta_obj = {"type": "text_delta", "text": text}
                self._emit(
                    out,
                    "content_block_delta",
                    {"type": "content_block_delta", "index": self._text, "delta": delta_obj},
                )
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    self._tool_delta(call, out)
        finish = choice.get("finish_reason")
        if finish is not None:
            self._stop = _stop(finish, choice.get("stop_reason"))
            if self._stop[0] == "end_turn" and self._tools:
                self._stop = ("tool_use", None)

    def _tool_delta(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index")
        if not isinstance(index, int):
            index = 0
        function = _obj(call.get("function"))
        block = self._tools.get(index)
        if block is None:
            call_id = call.get("id") if isinstance(call.get("id"), str) else f"toolu_{self._id}_{index}"
            name = function.get("name") if isinstance(function.get("name"), str) else ""
            self._open_block(out, {"type": "tool_use", "id": call_id, "name": name, "input": {}})
            block = self._tools[index] = self._next - 1
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            self._emit(
                out, "content_block_delta", {"type": "content_block_delta", "index": block, "delta": delta}
            )

    def _open_block(self, out: list[bytes], block: dict[str, Any]) -> None:
        self._close_block(out)
        self._open = self._next
        self._next += 1
        self._emit(
            out,
            "content_block_start",
            {"type": "content_block_start", "index": self._open, "content_block": block},
        )

    def _close_block(self, out: list[bytes]) -> None:
        if self._open is not None:
            self._emit(out, "content_block_stop", {"type": "content_block_stop", "index": self._open})
            self._open = self._text = None

    def _end(self, out: list[bytes]) -> None:
        if not self._started:
            self._start({}, out)
        self._close_block(out)
        stop_reason, stop_sequence = self._stop or ("end_turn", None)
        usage: dict[str, int] = {"output_tokens": self.completion_tokens or 0}
        if self.prompt_tokens is not None:
            cached = self.cached_tokens or 0
            usage = {
                "input_tokens": self.prompt_tokens - cached,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached,
                **usage,
            }
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        self._emit(out, "message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        self._emit(out, "message_stop", {"type": "message_stop"})
        self._done = True
