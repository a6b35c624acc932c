"""Translator for an OpenAI Responses API client (``/v1/responses``) in front of a backend that serves only
chat completions. Sans-I/O.

``inspect_request`` reads what routing needs from a Responses body (model, stream, ``max_output_tokens``)
and keeps the parsed document; ``request_to_chat`` turns it into a chat completion body,
``response_from_chat`` a chat completion into a Response object, and ``StreamToResponses`` chat completion
chunks into the Responses API's stream events (``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta``, ``response.completed``, …) as
they arrive. Anthropic and Gemini backends are reached through this translator and theirs, with the chat
shape in between (``gateway.dataplane.dialects``).

The mapping, where it is not one to one:

- ``instructions`` and ``system`` / ``developer`` messages become ``system`` messages; adjacent ones are
  joined with a blank line, since many chat templates take a single system message.
- ``function_call`` items become an assistant message's ``tool_calls`` (consecutive calls, and the text
  right before them, share one assistant message), ``function_call_output`` items ``tool`` messages.
  ``custom`` tools (free-form input, as Codex's ``apply_patch``) become functions taking one string
  ``input``, and their calls come back as ``custom_tool_call`` items.
- ``max_output_tokens`` -> ``max_tokens``; ``text.format`` json_schema / json_object -> ``response_format``;
  ``safety_identifier`` (else ``user``) -> ``user``; ``temperature``, ``top_p``, ``parallel_tool_calls``
  as they are.
- Dropped on purpose, because a chat backend has no equivalent and they do not change what is asked:
  ``reasoning`` (the backend reasons, or not, as it is served), ``reasoning`` items in the history (their
  encrypted content means nothing to another model), ``store``, ``include``, ``metadata``,
  ``prompt_cache_key``, ``client_metadata``, ``truncation``, ``service_tier``; and tools the backend
  cannot run: hosted tools (``web_search``, ``file_search``, ``code_interpreter``, ``image_generation``,
  ``mcp``, ``computer_use``, …) and Codex's ``namespace`` tool groups. Codex sends some of these with
  every request; refusing them would make it unusable.
- Refused with ``BadRequest`` naming the field: ``previous_response_id``, ``conversation``,
  ``background`` and ``item_reference`` items (they need a store of responses, which the gateway does not
  keep), ``input_file`` parts and images given by ``file_id``, and any item or part type not named here.

Answers: ``reasoning_content`` (vLLM's reasoning parsers) becomes a ``reasoning`` item; ``length`` ends a
response as ``incomplete`` (``max_output_tokens``). Usage: ``input_tokens`` = ``prompt_tokens`` (cached
ones included, as OpenAI counts them), ``cached_tokens`` from ``prompt_tokens_details``.
"""

from __future__ import annotations

import time
from typing import Any, Final, NamedTuple

import orjson

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.protocol.bounds import boolean, token_allowance
from gateway.protocol.json_members import MemberCounter, count_top_members, decode_object
from gateway.protocol.openai_request import RequestInfo
from gateway.protocol.sse import EventTranslator, SSEDecoder, encode_event
from gateway.protocol.usage import Usage

__all__ = [
    "Echo",
    "StreamToResponses",
    "echo_of",
    "inspect_request",
    "request_to_chat",
    "response_from_chat",
]

_SYSTEM_ROLES: Final = frozenset({"system", "developer"})
_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text", "summary_text", "refusal"})
_DROPPED_ITEMS: Final = frozenset({"reasoning", "compaction"})
# Tools a chat backend cannot run (hosted by OpenAI, or groups only Codex's own server-side logic reads).
_DROPPED_TOOLS: Final = frozenset(
    {
        "namespace",
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "mcp",
        "computer_use_preview",
        "computer_use",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
    }
)
_NEEDS_STORE: Final = ("previous_response_id", "conversation")
_CUSTOM_PARAMETERS: Final = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
    "required": ["input"],
}
# Fields of the request a Response object repeats, with their defaults (the SDK requires some of them).
_ECHOED: Final[tuple[tuple[str, Any], ...]] = (
    ("instructions", None),
    ("max_output_tokens", None),
    ("metadata", {}),
    ("parallel_tool_calls", True),
    ("temperature", None),
    ("text", {"format": {"type": "text"}}),
    ("tool_choice", "auto"),
    ("tools", []),
    ("top_p", None),
    ("truncation", "disabled"),
)


class Echo(NamedTuple):
    """What a translated answer needs from its request: the fields a Response repeats, and which tool
    names were ``custom`` tools (their calls come back as ``custom_tool_call`` items)."""

    fields: dict[str, Any]
    custom_tools: frozenset[str]


def inspect_request(
    body: bytes, members: MemberCounter = count_top_members
) -> tuple[RequestInfo, dict[str, Any]]:
    """Routing facts of a ``POST /v1/responses`` body, and the parsed body (translators reuse it).
    ``members`` counts the body's top-level members (the C counter on the request path): a member named
    twice, or nesting past the one depth limit, is refused as on every other path."""
    doc = decode_object(body, members)
    model = doc.get("model")
    if model is None:
        raise BadRequest("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", param="model")
    cap = token_allowance(doc, "max_output_tokens", minimum=1)
    user = doc.get("safety_identifier", doc.get("user"))
    info = RequestInfo(
        model, boolean(doc, "stream"), True, cap, None, user=user if isinstance(user, str) else None
    )
    return info, doc


def echo_of(doc: dict[str, Any]) -> Echo:
    custom = frozenset(
        t["name"]
        for t in doc.get("tools") or ()
        if isinstance(t, dict) and t.get("type") == "custom" and isinstance(t.get("name"), str)
    )
    return Echo({k: doc.get(k, default) for k, default in _ECHOED}, custom)


# -- the request ------------------------------------------------------------------------------------------


def request_to_chat(doc: dict[str, Any], upstream_model: str) -> bytes:
    for key in _NEEDS_STORE:
        if doc.get(key) is not None:
            raise BadRequest(
                f"{key}: this backend is reached through the gateway's translation to chat completions, "
                "and the gateway stores no responses; send the whole conversation in `input`",
                param=key,
            )
    if doc.get("background") is True:
        raise BadRequest(
            "background: this backend cannot run responses in the background", param="background"
        )
    messages: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string", param="instructions")
    items = doc.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            _item(item, f"input.{i}", messages)
    else:
        raise BadRequest("input must be a string or a list of items", param="input")
    if not messages:
        raise BadRequest("input must not be empty", param="input")
    out: dict[str, Any] = {"model": upstream_model, "messages": messages}
    cap = doc.get("max_output_tokens")
    if cap is not None:
        out["max_tokens"] = cap
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if doc.get(key) is not None:
            out[key] = doc[key]
    user = doc.get("safety_identifier", doc.get("user"))
    if isinstance(user, str):
        out["user"] = user
    tools = [t for t in (_tool(t, i) for i, t in enumerate(doc.get("tools") or ())) if t is not None]
    # Checked with or without tools: a tool_choice that cannot translate is refused, not dropped.
    choice = _tool_choice(doc.get("tool_choice"))
    if tools:
        out["tools"] = tools
        if choice is not None:
            out["tool_choice"] = choice
    response_format = _response_format(doc.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    if doc.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return orjson.dumps(out)


def _item(item: Any, path: str, messages: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise BadRequest(f"{path} must be an object", param=path)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _message(item, path, messages)
    elif kind in ("function_call", "custom_tool_call"):
        if kind == "function_call":
            arguments = item.get("arguments")
            if not isinstance(arguments, str):
                raise BadRequest(f"{path}.arguments must be a string", param=f"{path}.arguments")
        else:
            arguments = orjson.dumps({"input": _str(item, "input", path)}).decode()
        call = {
            "id": _str(item, "call_id", path),
            "type": "function",
            "function": {"name": _str(item, "name", path), "arguments": arguments},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else _joined(output, f"{path}.output")
        messages.append({"role": "tool", "tool_call_id": _str(item, "call_id", path), "content": text})
    elif kind in _DROPPED_ITEMS:
        return
    elif kind == "item_reference":
        raise BadRequest(
            f"{path}.type: item_reference needs stored responses, which this backend's translation has not",
            param=f"{path}.type",
        )
    else:
        raise BadRequest(
            f"{path}.type: {kind!r} items cannot be translated for this backend", param=f"{path}.type"
        )


def _message(item: dict[str, Any], path: str, messages: list[dict[str, Any]]) -> None:
    role = item.get("role")
    content = item.get("content")
    if role in _SYSTEM_ROLES:
        text = content if isinstance(content, str) else _joined(content, f"{path}.content")
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "system":
            last["content"] += "\n\n" + text
        else:
            messages.append({"role": "system", "content": text})
    elif role == "assistant":
        text = content if isinstance(content, str) else _joined(content, f"{path}.content")
        messages.append({"role": "assistant", "content": text})
    elif role == "user":
        messages.append({"role": "user", "content": _user_content(content, f"{path}.content")})
    else:
        raise BadRequest(f"{path}.role: {role!r} is not a message role", param=f"{path}.role")


def _user_content(content: Any, path: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{path} must be a string or a list of parts", param=path)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": _part_text(part, f"{path}.{j}")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise BadRequest(
                    f"{path}.{j}: images given by file_id cannot be translated for this backend",
                    param=f"{path}.{j}.file_id",
                )
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise BadRequest(
                f"{path}.{j}.type: {kind!r} parts cannot be translated for this backend",
                param=f"{path}.{j}.type",
            )
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _joined(content: Any, path: str) -> str:
    """The text parts of ``content`` joined: system, assistant and tool messages carry text only."""
    if not isinstance(content, list):
        raise BadRequest(f"{path} must be a string or a list of parts", param=path)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise BadRequest(
                f"{path}.{j}.type: {kind!r} parts cannot be translated here; text only",
                param=f"{path}.{j}.type",
            )
        texts.append(_part_text(part, f"{path}.{j}"))
    return "\n".join(texts)


def _part_text(part: dict[str, Any], path: str) -> str:
    """A text part's text; a refusal part (an earlier answer's) carries it under ``refusal``."""
    return _str(part, "refusal" if part.get("type") == "refusal" else "text", path)


def _str(obj: dict[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{path}.{key} must be a string", param=f"{path}.{key}")
    return value


def _tool(tool: Any, i: int) -> dict[str, Any] | None:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind in _DROPPED_TOOLS:
        return None
    if kind not in ("function", "custom"):
        raise BadRequest(
            f"tools.{i}.type: {kind!r} tools cannot be translated for this backend", param=f"tools.{i}.type"
        )
    function: dict[str, Any] = {"name": _str(tool, "name", f"tools.{i}")}
    description = tool.get("description")
    if kind == "function":
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool.get("strict") is True:
            function["strict"] = True
    else:
        function["parameters"] = _CUSTOM_PARAMETERS
        fmt = tool.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "grammar":
            # The backend cannot enforce the grammar; the model can still read it.
            grammar = f"Input grammar ({fmt.get('syntax')}):\n{fmt.get('definition')}"
            description = f"{description}\n\n{grammar}" if description else grammar
    if isinstance(description, str):
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": _str(choice, "name", "tool_choice")}}
    raise BadRequest(
        "tool_choice: only auto, none, required and a named function translate", param="tool_choice"
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind is None or kind == "text":
        return None
    assert isinstance(fmt, dict)
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest(
        f"text.format.type: {kind!r} cannot be translated for this backend", param="text.format.type"
    )


# -- the answer -------------------------------------------------------------------------------------------


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _usage(usage: Any) -> dict[str, Any]:
    usage = _obj(usage)
    prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    cached = _int(_obj(usage.get("prompt_tokens_details")).get("cached_tokens"))
    reasoning = _int(_obj(usage.get("completion_tokens_details")).get("reasoning_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": min(cached, prompt), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


# Chat completions' finish reasons that end a Response short, with the reason its incomplete_details give.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _response(
    rid: str,
    model: str,
    created: int,
    echo: Echo,
    output: list[dict[str, Any]],
    status: str,
    incomplete: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "resp_" + rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
        "model": model,
        "output": output,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        **echo.fields,
    }
    return out


def _message_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": "msg_" + rid, "type": "message", "role": "assistant", "status": status, "content": [part]}


def _reasoning_item(rid: str, text: str) -> dict[str, Any]:
    return {
        "id": "rs_" + rid,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, custom: bool) -> dict[str, Any]:
    if custom:
        value: Any = None
        try:
            value = orjson.loads(arguments) if arguments else None
        except orjson.JSONDecodeError:
            pass
        text = value.get("input") if isinstance(value, dict) else None
        return {
            "id": "ctc_" + item_id,
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": text if isinstance(text, str) else arguments,
            "status": "completed",
        }
    return {
        "id": "fc_" + item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def _reasoning_text(message: dict[str, Any]) -> str | None:
    value = message.get("reasoning_content", message.get("reasoning"))
    return value if isinstance(value, str) and value else None


def response_from_chat(body: bytes, model: str, echo: Echo, *, created: int | None = None) -> bytes:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise BadUpstreamResponse("the backend's answer is not a JSON object")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadUpstreamResponse("the backend's answer has no choices")
    choice = choices[0]
    message = _obj(choice.get("message"))
    rid = str(doc.get("id", ""))
    output: list[dict[str, Any]] = []
    reasoning = _reasoning_text(message)
    if reasoning is not None:
        output.append(_reasoning_item(rid, reasoning))
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(_message_item(rid, text))
    calls = message.get("tool_calls")
    for n, call in enumerate(calls if isinstance(calls, list) else []):
        function = _obj(call.get("function") if isinstance(call, dict) else None)
        name = function.get("name")
        if not isinstance(name, str):
            continue
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{rid}_{n}"
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "{}"
        output.append(_call_item(f"{rid}_{n}", call_id, name, arguments, name in echo.custom_tools))
    incomplete = _INCOMPLETE.get(choice.get("finish_reason"))  # type: ignore[arg-type]
    when = created if created is not None else _int(doc.get("created")) or int(time.time())
    out = _response(rid, model, when, echo, output, "incomplete" if incomplete else "completed", incomplete)
    out["usage"] = _usage(doc.get("usage"))
    return orjson.dumps(out)


class _Gathered:
    """The text of an item being streamed, gathered for its ``done`` events. Deltas are a few characters
    each, and a list of them holds about 15 times the text (a string object and a pointer per delta); the
    list is folded into one string every ``_FOLD`` deltas, so a long answer costs about its own size."""

    __slots__ = ("_parts",)

    _FOLD = 512

    def __init__(self) -> None:
        self._parts: list[str] = []

    def append(self, delta: str) -> None:
        parts = self._parts
        parts.append(delta)
        if len(parts) > self._FOLD:
            self._parts = ["".join(parts)]

    def value(self) -> str:
        return "".join(self._parts)


class _Open:
    """One output item being streamed: its index in ``output``, its kind and what it has gathered."""

    __slots__ = ("call_id", "custom", "index", "item_id", "kind", "name", "text")

    def __init__(self, index: int, kind: str, item_id: str) -> None:
        self.index = index
        self.kind = kind  # "message" | "reasoning" | "call"
        self.item_id = item_id
        self.text = _Gathered()
        self.call_id = ""
        self.name = ""
        self.custom = False


class StreamToResponses(EventTranslator):
    """Chat completion chunks in, Responses API events out; see the module docstring.

    ``feed`` each upstream piece and send what it returns; ``finish`` when the upstream body ends (a stream
    cut before the answer's end becomes ``response.failed``). ``usage()`` is what the backend reported.
    """

    def __init__(self, model: str, echo: Echo, *, created: int | None = None) -> None:
        self.model = model
        self.echo = echo
        self._created = created
        self._sse = SSEDecoder()
        self._done = False
        self._started = False
        self._seq = 0
        self._id = ""
        self._output: list[dict[str, Any] | None] = []  # finished items, None while an item is open
        self._open: _Open | None = None  # the text or reasoning item receiving deltas
        self._calls: dict[int, _Open] = {}  # chat tool call index -> its item
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    def usage(self) -> Usage | None:
        if self._usage is None:
            return None
        u = self._usage
        cached = u["input_tokens_details"]["cached_tokens"]
        return Usage(u["input_tokens"], u["output_tokens"], u["total_tokens"], cached)

    def _emit(self, out: list[bytes], obj: dict[str, Any]) -> None:
        obj["sequence_number"] = self._seq
        self._seq += 1
        out.append(encode_event(obj["type"], orjson.dumps(obj)))

    def _base(self, status: str, incomplete: str | None = None) -> dict[str, Any]:
        created = self._created if self._created is not None else int(time.time())
        self._created = created
        output = [item for item in self._output if item is not None]
        return _response(self._id, self.model, created, self.echo, output, status, incomplete)

    def _start(self, doc: dict[str, Any], out: list[bytes]) -> None:
        self._started = True
        self._id = str(doc.get("id", ""))
        if self._created is None and _int(doc.get("created")):
            self._created = _int(doc.get("created"))
        for kind in ("response.created", "response.in_progress"):
            response = self._base("in_progress")
            response["usage"] = None
            self._emit(out, {"type": kind, "response": response})

    def _event(self, data: str, out: list[bytes]) -> None:
        if data == "[DONE]":
            self._end(out)
            return
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            self._fail(out, "the backend sent a stream event that is not a JSON object")
            return
        error = doc.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            self._fail(out, message if isinstance(message, str) else "the backend reported an error")
            return
        if not self._started:
            self._start(doc, out)
        if isinstance(doc.get("usage"), dict):
            self._usage = _usage(doc["usage"])
        choices = doc.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice, out)

    def _choice(self, choice: dict[str, Any], out: list[bytes]) -> None:
        delta = _obj(choice.get("delta"))
        reasoning = _reasoning_text(delta)
        if reasoning is not None:
            item = self._text_item("reasoning", out)
            item.text.append(reasoning)
            self._emit(
                out,
                {
                    "type": "response.reasoning_text.delta",
                    "item_id": item.item_id,
                    "output_index": item.index,
                    "content_index": 0,
                    "delta": reasoning,
                },
            )
        text = delta.get("content")
        if isinstance(text, str) and text:
            item = self._text_item("message", out)
            item.text.append(text)
            self._emit(
                out,
                {
                    "type": "response.output_text.delta",
                    "item_id": item.item_id,
                    "output_index": item.index,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
            )
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._call_delta(call, out)
        if choice.get("finish_reason") is not None:
            self._finish = str(choice["finish_reason"])

    def _text_item(self, kind: str, out: list[bytes]) -> _Open:
        item = self._open
        if item is not None and item.kind == kind:
            return item
        self._close_text(out)
        index = len(self._output)
        item = self._open = _Open(
            index, kind, ("rs_" if kind == "reasoning" else "msg_") + f"{self._id}_{index}"
        )
        self._output.append(None)
        added = (
            {"id": item.item_id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            if kind == "reasoning"
            else {
                "id": item.item_id,
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        )
        self._emit(out, {"type": "response.output_item.added", "output_index": index, "item": added})
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._emit(
                out,
                {
                    "type": "response.content_part.added",
                    "item_id": item.item_id,
                    "output_index": index,
                    "content_index": 0,
                    "part": part,
                },
            )
        return item

    def _close_text(self, out: list[bytes]) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        text = item.text.value()
        base = {"item_id": item.item_id, "output_index": item.index, "content_index": 0}
        if item.kind == "reasoning":
            done = _reasoning_item(item.item_id[3:], text)
            self._emit(out, {"type": "response.reasoning_text.done", **base, "text": text})
        else:
            done = _message_item(item.item_id[4:], text)
            self._emit(out, {"type": "response.output_text.done", **base, "text": text, "logprobs": []})
            self._emit(out, {"type": "response.content_part.done", **base, "part": done["content"][0]})
        self._output[item.index] = done
        self._emit(out, {"type": "response.output_item.done", "output_index": item.index, "item": done})

    def _call_delta(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index")
        if not isinstance(index, int):
            index = 0
        function = _obj(call.get("function"))
        item = self._calls.get(index)
        if item is None:
            self._close_text(out)
            at = len(self._output)
            item = self._calls[index] = _Open(at, "call", f"{self._id}_{at}")
            item.call_id = call["id"] if isinstance(call.get("id"), str) else f"call_{self._id}_{index}"
            item.name = function["name"] if isinstance(function.get("name"), str) else ""
            item.custom = item.name in self.echo.custom_tools
            self._output.append(None)
            added = _call_item(item.item_id, item.call_id, item.name, "", item.custom)
            added["status"] = "in_progress"
            self._emit(out, {"type": "response.output_item.added", "output_index": at, "item": added})
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.text.append(arguments)
            if not item.custom:  # a custom tool's input is known only once its JSON wrapper is whole
                self._emit(
                    out,
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": "fc_" + item.item_id,
                        "output_index": item.index,
                        "delta": arguments,
                    },
                )

    def _close_calls(self, out: list[bytes]) -> None:
        for item in self._calls.values():
            done = _call_item(item.item_id, item.call_id, item.name, item.text.value(), item.custom)
            base = {"item_id": done["id"], "output_index": item.index}
            if item.custom:
                self._emit(
                    out, {"type": "response.custom_tool_call_input.delta", **base, "delta": done["input"]}
                )
                self._emit(
                    out, {"type": "response.custom_tool_call_input.done", **base, "input": done["input"]}
                )
            else:
                self._emit(
                    out,
                    {
                        "type": "response.function_call_arguments.done",
                        **base,
                        "name": item.name,
                        "arguments": done["arguments"],
                    },
                )
            self._output[item.index] = done
            self._emit(out, {"type": "response.output_item.done", "output_index": item.index, "item": done})
        self._calls = {}

    def _end(self, out: list[bytes]) -> None:
        if not self._started:
            self._start({}, out)
        self._close_text(out)
        self._close_calls(out)
        incomplete = _INCOMPLETE.get(self._finish) if self._finish is not None else None
        status = "incomplete" if incomplete else "completed"
        response = self._base(status, incomplete)
        response["usage"] = self._usage if self._usage is not None else _usage(None)
        self._emit(out, {"type": "response." + status, "response": response})
        self._done = True

    def _fail(self, out: list[bytes], message: str) -> None:
        if not self._started:
            self._start({}, out)
        response = self._base("failed")
        response["error"] = {"code": "server_error", "message": message}
        response["usage"] = self._usage
        self._emit(out, {"type": "response.failed", "response": response})
        self._done = True

    def _ended(self, out: list[bytes]) -> None:
        if self._finish is not None:
            self._end(out)  # [DONE] never came, but the answer did
        else:
            self._fail(out, "the backend's stream ended before the answer was complete")
