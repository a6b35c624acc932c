"""Translator for an OpenAI client in front of an Anthropic-speaking backend (Messages API). Sans-I/O.

``request_to_anthropic`` turns a chat completion body into a Messages body, ``response_to_openai`` a
Messages object into a chat completion, ``AnthropicStreamToOpenAI`` Anthropic stream events into
``chat.completion.chunk`` events as they arrive; ``error_to_openai`` rewraps an upstream error body.
Bad fields raise ``BadRequest`` naming them the OpenAI way (``messages[2].content[0].type``).

The mapping, where it is not one to one:

- ``system`` and ``developer`` messages, wherever they stand, become ``system`` (a string, or text blocks
  when there are several); their position in the conversation is lost.
- ``tool`` messages become ``tool_result`` blocks in a user turn; consecutive messages of the same role
  merge into one turn (Anthropic wants turns to alternate), with tool results first in a merged user
  turn, as Anthropic requires. Empty text is left out (Anthropic refuses empty text blocks), and so is a
  message left with nothing.
- ``image_url``: ``data:`` URLs become base64 image blocks, http(s) URLs ``url`` sources (Anthropic
  fetches them; the gateway never does).
- ``max_completion_tokens``, else ``max_tokens``, else the caller's default (Anthropic requires one).
  ``stop`` -> ``stop_sequences``; ``user`` -> ``metadata.user_id``; ``parallel_tool_calls: false`` ->
  ``disable_parallel_tool_use``; ``temperature`` is passed as is (Anthropic's range is 0-1 and it
  answers 400 above that). ``top_k`` (a vLLM extension) is passed too.
- Dropped on purpose: ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``seed``,
  ``reasoning_effort``, ``service_tier``, ``store``, message ``name``s and any other field Anthropic has
  no equivalent for: they tune sampling or bookkeeping, not what the request means.
- Refused: ``n`` > 1, ``logprobs``, ``response_format`` json_object / json_schema (no equivalent that
  guarantees JSON), legacy ``functions`` / ``function_call``, audio and file parts, non-function tools.

Answers: thinking blocks (never asked for) are dropped; ``prompt_tokens`` = input + cache read + cache
creation tokens (Anthropic's ``input_tokens`` excludes both), ``cached_tokens`` = cache reads.
"""

from __future__ import annotations

import time
from typing import Any, Final

import orjson

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.protocol.sse import EventTranslator, SSEDecoder, encode_event
from gateway.protocol.usage import Usage

__all__ = ["AnthropicStreamToOpenAI", "error_to_openai", "request_to_anthropic", "response_to_openai"]

_FINISH: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_TOOL_CHOICE: Final = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}
_REFUSED: Final = ("functions", "function_call")
_DONE: Final = b"data: [DONE]\n\n"
_OPENAI_ERROR_TYPES: Final = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "rate_limit_error": "rate_limit_error",
    "billing_error": "insufficient_quota",
}


def _load(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


def request_to_anthropic(body: bytes, upstream_model: str, default_max_tokens: int) -> bytes:
    doc = _load(body)
    _refuse_unsupported(doc)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if role in ("system", "developer"):
            text = _text(m.get("content"), f"messages[{i}].content")
            if text:
                system.append(text)
            continue
        if role == "user":
            blocks = _user(m.get("content"), i)
        elif role == "assistant":
            blocks = _assistant(m, i)
        elif role == "tool":
            blocks = [_tool_result(m, i)]
            role = "user"
        else:
            raise BadRequest(f"messages[{i}].role: unknown role {role!r}", param=f"messages[{i}].role")
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns:
        raise BadRequest("messages must hold at least one non-system message with content", param="messages")
    for turn in turns:
        if turn["role"] == "user":
            turn["content"].sort(key=lambda b: b["type"] != "tool_result")  # stable: tool results first
    out: dict[str, Any] = {
        "model": upstream_model,
        "messages": turns,
        "max_tokens": _max_tokens(doc, default_max_tokens),
    }
    if system:
        out["system"] = system[0] if len(system) == 1 else [{"type": "text", "text": t} for t in system]
    stop = doc.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        out["stop_sequences"] = stop
    elif stop is not None:
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    for key in ("temperature", "top_p", "top_k"):
        value = doc.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest(f"{key} must be a number", param=key)
            out[key] = value
    user = doc.get("user")
    if isinstance(user, str):
        out["metadata"] = {"user_id": user}
    tools = doc.get("tools")
    choice = _tool_choice(doc.get("tool_choice"))  # checked with or without tools: refused, not dropped
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("tools must be a list", param="tools")
        out["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
        if doc.get("parallel_tool_calls") is False:
            choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
        if choice is not None:
            out["tool_choice"] = choice
    if doc.get("stream") is True:
        out["stream"] = True
    return orjson.dumps(out)


def _refuse_unsupported(doc: dict[str, Any]) -> None:
    n = doc.get("n")
    if n is not None and n != 1:
        raise BadRequest("n: this backend returns one choice per request; n must be 1", param="n")
    if doc.get("logprobs") is True:
        raise BadRequest("logprobs: this backend does not return log probabilities", param="logprobs")
    fmt = doc.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise BadRequest(
            "response_format: this backend cannot guarantee JSON output; only type 'text' is accepted",
            param="response_format",
        )
    for key in _REFUSED:
        if doc.get(key) is not None:
            raise BadRequest(f"{key}: legacy function calling is not supported; use tools", param=key)


def _max_tokens(doc: dict[str, Any], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadRequest(f"{key} must be a positive integer", param=key)
            return value
    return default


def _text(content: Any, path: str) -> str:
    """The text of string content or of a list of text (and refusal) parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(f"{path} must be a string or a list of parts", param=path)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if kind not in ("text", "refusal") or not isinstance(part.get(key), str):
            raise BadRequest(f"{path}[{j}] must be a text part", param=f"{path}[{j}].type")
        texts.append(part[key])
    return "".join(texts)


def _user(content: Any, i: int) -> list[dict[str, Any]]:
    path = f"messages[{i}].content"
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise BadRequest(f"{path} must be a string or a list of parts", param=path)
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if part["text"]:
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url"), f"{path}[{j}].image_url"))
        else:
            raise BadRequest(
                f"{path}[{j}]: {kind!r} parts cannot be sent to this backend", param=f"{path}[{j}].type"
            )
    return blocks


def _image(value: Any, path: str) -> dict[str, Any]:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise BadRequest(f"{path}.url must be a string", param=f"{path}.url")
    if url.startswith("data:"):
        head, comma, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        if not comma or encoding != "base64" or not media_type.startswith("image/"):
            raise BadRequest(f"{path}.url: expected data:image/...;base64,...", param=f"{path}.url")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise BadRequest(f"{path}.url: expected a data: or http(s) URL", param=f"{path}.url")


def _assistant(m: dict[str, Any], i: int) -> list[dict[str, Any]]:
    text = _text(m.get("content"), f"messages[{i}].content")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    calls = m.get("tool_calls")
    if calls is None:
        return blocks
    if not isinstance(calls, list):
        raise BadRequest(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
    for j, call in enumerate(calls):
        path = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{path}.function.name must be a string", param=f"{path}.function.name")
        if not isinstance(call.get("id"), str):
            raise BadRequest(f"{path}.id must be a string", param=f"{path}.id")
        arguments = function.get("arguments") or "{}"
        try:
            value = orjson.loads(arguments) if isinstance(arguments, str) else None
        except orjson.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise BadRequest(
                f"{path}.function.arguments must be a JSON object", param=f"{path}.function.arguments"
            )
        blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"], "input": value})
    return blocks


def _tool_result(m: dict[str, Any], i: int) -> dict[str, Any]:
    call_id = m.get("tool_call_id")
    if not isinstance(call_id, str):
        raise BadRequest(f"messages[{i}].tool_call_id must be a string", param=f"messages[{i}].tool_call_id")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    text = _text(m.get("content"), f"messages[{i}].content")
    if text:
        block["content"] = text
    return block


def _tool(tool: Any, i: int) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
        raise BadRequest(
            f"tools[{i}]: only function tools can be sent to this backend", param=f"tools[{i}].type"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"tools[{i}].function.name must be a non-empty string", param=f"tools[{i}].function.name"
        )
    schema = function.get("parameters")
    if schema is None:
        schema = {"type": "object", "properties": {}}
    elif not isinstance(schema, dict):
        raise BadRequest(
            f"tools[{i}].function.parameters must be an object", param=f"tools[{i}].function.parameters"
        )
    out: dict[str, Any] = {"name": name, "input_schema": schema}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in _TOOL_CHOICE:
        return dict(_TOOL_CHOICE[choice])
    function = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return {"type": "tool", "name": function["name"]}
    raise BadRequest("tool_choice must be auto, required, none or a named function", param="tool_choice")


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: upstream bodies are read defensively."""
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _openai_usage(usage: dict[str, int]) -> dict[str, Any]:
    prompt = usage["input"] + usage["cache_read"] + usage["cache_creation"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage["output"],
        "total_tokens": prompt + usage["output"],
        "prompt_tokens_details": {"cached_tokens": usage["cache_read"]},
    }


def _read_usage(usage: Any, into: dict[str, int]) -> None:
    """Anthropic usage fields present in ``usage`` overwrite ``into`` (stream usage is cumulative)."""
    if not isinstance(usage, dict):
        return
    for ours, theirs in (
        ("input", "input_tokens"),
        ("output", "output_tokens"),
        ("cache_read", "cache_read_input_tokens"),
        ("cache_creation", "cache_creation_input_tokens"),
    ):
        if usage.get(theirs) is not None:
            into[ours] = _int(usage[theirs])


def response_to_openai(body: bytes, model: str, *, created: int | None = None) -> bytes:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("content"), list):
        raise BadUpstreamResponse("the backend's answer is not an Anthropic message")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in doc["content"]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            arguments = orjson.dumps(block.get("input", {})).decode()
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    usage = {"input": 0, "output": 0, "cache_read": 0, "cache_creation": 0}
    _read_usage(doc.get("usage"), usage)
    out = {
        "id": "chatcmpl-" + str(doc.get("id", "")),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _FINISH.get(str(doc.get("stop_reason")), "stop"),
            }
        ],
        "usage": _openai_usage(usage),
    }
    return orjson.dumps(out)


def _error_body(kind: Any, message: str, code: Any = None) -> bytes:
    openai_type = _OPENAI_ERROR_TYPES.get(kind, "server_error") if isinstance(kind, str) else "server_error"
    return orjson.dumps({"error": {"message": message, "type": openai_type, "param": None, "code": code}})


def error_to_openai(status: int, body: bytes) -> bytes:
    """An upstream Anthropic error answer in OpenAI's envelope, keeping Anthropic's type as the code."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    error = doc.get("error") if isinstance(doc, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = body[:512].decode("utf-8", "replace") or f"upstream answered with status {status}"
    return _error_body(kind, message, kind if isinstance(kind, str) else status)


class AnthropicStreamToOpenAI(EventTranslator):
    """Anthropic stream events in, ``chat.completion.chunk`` events out.

    ``include_usage``: the client asked for ``stream_options.include_usage`` (the caller knows from the
    request); then every chunk has ``"usage": null`` and a usage chunk precedes ``[DONE]``. ``finish``
    reports a stream cut before ``message_stop`` as an error event. ``prompt_tokens`` (input + cache read
    + cache creation), ``completion_tokens`` and ``cached_tokens`` are what the upstream reported so far
    (``None`` before ``message_start``), ``usage()`` the same as a ``Usage``.
    """

    def __init__(self, model: str, *, include_usage: bool, created: int | None = None) -> None:
        self.model = model
        self._include_usage = include_usage
        self._created = int(time.time()) if created is None else created
        self._sse = SSEDecoder()
        self._usage: dict[str, int] | None = None
        self._id = "chatcmpl-"
        self._started = False
        self._done = False
        self._tools: dict[int, int] = {}  # Anthropic block index -> OpenAI tool call index
        self._finish: str | None = None

    @property
    def prompt_tokens(self) -> int | None:
        u = self._usage
        return None if u is None else u["input"] + u["cache_read"] + u["cache_creation"]

    @property
    def completion_tokens(self) -> int | None:
        return None if self._usage is None else self._usage["output"]

    @property
    def cached_tokens(self) -> int | None:
        return None if self._usage is None else self._usage["cache_read"]

    def usage(self) -> Usage | None:
        if self._usage is None:
            return None
        o = _openai_usage(self._usage)
        return Usage(o["prompt_tokens"], o["completion_tokens"], o["total_tokens"], self._usage["cache_read"])

    def _ended(self, out: list[bytes]) -> None:
        self._error(out, "api_error", "the backend's stream ended before the answer was complete")

    def _error(self, out: list[bytes], kind: Any, message: str) -> None:
        out.append(encode_event(None, _error_body(kind, message, kind)))
        self._done = True

    def _chunk(self, out: list[bytes], delta: dict[str, Any], finish: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self.model,
            "choices": [choice],
        }
        if self._include_usage:
            obj["usage"] = None
        out.append(encode_event(None, orjson.dumps(obj)))

    def _event(self, data: str, out: list[bytes]) -> None:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            self._error(out, "api_error", "the backend sent a stream event that is not a JSON object")
            return
        kind = doc.get("type")
        if kind == "message_start":
            message = _obj(doc.get("message"))
            self._id = "chatcmpl-" + str(message.get("id", ""))
            self._usage = {"input": 0, "output": 0, "cache_read": 0, "cache_creation": 0}
            _read_usage(message.get("usage"), self._usage)
            self._started = True
            self._chunk(out, {"role": "assistant", "content": ""})
        elif kind == "error":
            error = _obj(doc.get("error"))
            text = error.get("message")
            self._error(out, error.get("type"), text if isinstance(text, str) else "the backend failed")
        elif not self._started:
            if kind != "ping":
                self._error(out, "api_error", f"the backend's stream began with {kind!r}, not message_start")
        elif kind == "content_block_start":
            self._block_start(doc, out)
        elif kind == "content_block_delta":
            self._block_delta(doc, out)
        elif kind == "message_delta":
            delta = _obj(doc.get("delta"))
            assert self._usage is not None
            _read_usage(doc.get("usage"), self._usage)
            self._finish = _FINISH.get(str(delta.get("stop_reason")), "stop")
        elif kind == "message_stop":
            self._chunk(out, {}, self._finish or "stop")
            if self._include_usage and self._usage is not None:
                obj = {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self.model,
                    "choices": [],
                    "usage": _openai_usage(self._usage),
                }
                out.append(encode_event(None, orjson.dumps(obj)))
            out.append(_DONE)
            self._done = True
        # ping, content_block_stop and event types added later carry nothing to translate

    def _block_start(self, doc: dict[str, Any], out: list[bytes]) -> None:
        block = doc.get("content_block")
        if not isinstance(block, dict):
            return
        if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"]:
            self._chunk(out, {"content": block["text"]})
        elif block.get("type") == "tool_use":
            index = self._tools[_index(doc)] = len(self._tools)
            function = {"name": block.get("name"), "arguments": ""}
            self._chunk(
                out,
                {
                    "tool_calls": [
                        {"index": index, "id": block.get("id"), "type": "function", "function": function}
                    ]
                },
            )

    def _block_delta(self, doc: dict[str, Any], out: list[bytes]) -> None:
        delta = doc.get("delta")
        if not isinstance(delta, dict):
            return
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            self._chunk(out, {"content": delta["text"]})
        elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            index = self._tools.get(_index(doc))
            if index is not None and delta["partial_json"]:
                call = {"index": index, "function": {"arguments": delta["partial_json"]}}
                self._chunk(out, {"tool_calls": [call]})


def _index(doc: dict[str, Any]) -> int:
    index = doc.get("index")
    return index if isinstance(index, int) else 0
