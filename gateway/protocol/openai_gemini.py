"""Translator for an OpenAI client in front of a Gemini backend (``generateContent``). Sans-I/O.

``request_to_gemini`` turns a chat completion body into the path suffix and body of a Gemini call (the
caller builds ``/v1beta/models/{upstream_model}`` + suffix; the model is not in a Gemini body),
``response_to_openai`` a ``GenerateContentResponse`` into a chat completion, ``GeminiStreamToOpenAI`` the
``streamGenerateContent?alt=sse`` events into ``chat.completion.chunk`` events; ``error_to_openai``
rewraps Gemini's error body. Bad fields raise ``BadRequest`` naming them (``messages[2].tool_call_id``).

The mapping, where it is not one to one:

- ``system`` / ``developer`` messages -> ``systemInstruction``; ``assistant`` -> role ``model``; a
  ``tool`` message -> a ``functionResponse`` part in a user turn, named after the call its
  ``tool_call_id`` answers (looked up in the earlier assistant tool calls). Its ``response`` is the
  content when that is a JSON object, else ``{"output": content}`` (Gemini wants an object; ``output``
  is its documented key). Consecutive turns of one role merge.
- Images must be ``data:`` URLs (-> ``inlineData``): Gemini takes no arbitrary http URLs and the gateway
  never fetches. ``input_audio`` -> ``inlineData`` with ``audio/<format>``.
- Tools -> ``functionDeclarations`` with the schema as ``parametersJsonSchema`` (full JSON Schema; the
  older ``parameters`` takes only an OpenAPI subset). ``tool_choice`` -> ``functionCallingConfig``
  (auto AUTO, required ANY, none NONE, a named function ANY + ``allowedFunctionNames``).
- ``generationConfig``: temperature, top_p, top_k, max(_completion)_tokens, stop, n (``candidateCount``;
  choices come back by candidate index), seed, presence / frequency penalties; ``response_format``
  json_object -> ``responseMimeType: application/json``, json_schema -> that plus ``responseJsonSchema``.
- Dropped: ``user``, ``parallel_tool_calls``, ``logit_bias``, ``reasoning_effort``, ``stream_options``
  (the caller passes ``include_usage`` to ``GeminiStreamToOpenAI``) and message ``name``s. Refused:
  ``logprobs``, legacy ``functions``, http image URLs, file parts, non-function tools.

Answers: thought parts are dropped, and so are thought signatures (a Gemini 3 model that requires them
back on function calls in later turns will refuse those turns). Tool call ids are Gemini's when it sends
one, else ``call_<responseId>_<candidate>_<n>``. Usage: prompt = promptTokenCount, completion =
candidatesTokenCount + thoughtsTokenCount (OpenAI counts reasoning as completion), cached =
cachedContentTokenCount.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Final

import orjson

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.protocol.sse import EventTranslator, SSEDecoder, encode_event
from gateway.protocol.usage import Usage

__all__ = ["GeminiStreamToOpenAI", "error_to_openai", "request_to_gemini", "response_to_openai"]

GENERATE: Final = ":generateContent"
STREAM: Final = ":streamGenerateContent?alt=sse"
_MODES: Final = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
_FINISH: Final = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
_CONFIG: Final = (
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("top_k", "topK"),
    ("seed", "seed"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
)
_DONE: Final = b"data: [DONE]\n\n"


def request_to_gemini(body: bytes) -> tuple[str, bytes]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    for key in ("logprobs", "functions", "function_call"):
        if doc.get(key) not in (None, False):
            raise BadRequest(f"{key} is not supported by this backend", param=key)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if role in ("system", "developer"):
            system.extend(_parts(m.get("content"), i, text_only=True))
            continue
        if role == "user":
            parts = _parts(m.get("content"), i, text_only=False)
        elif role == "assistant":
            parts = _assistant(m, i, names)
            role = "model"
        elif role == "tool":
            parts = [_function_response(m, i, names)]
            role = "user"
        else:
            raise BadRequest(f"messages[{i}].role: unknown role {role!r}", param=f"messages[{i}].role")
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    if not contents:
        raise BadRequest("messages must hold at least one non-system message with content", param="messages")
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    tools = doc.get("tools")
    config = _tool_config(doc.get("tool_choice"))  # checked with or without tools: refused, not dropped
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("tools must be a list", param="tools")
        out["tools"] = [{"functionDeclarations": [_declaration(t, i) for i, t in enumerate(tools)]}]
        if config is not None:
            out["toolConfig"] = {"functionCallingConfig": config}
    generation = _generation_config(doc)
    if generation:
        out["generationConfig"] = generation
    return (STREAM if doc.get("stream") is True else GENERATE), orjson.dumps(out)


def _parts(content: Any, i: int, *, text_only: bool) -> list[dict[str, Any]]:
    path = f"messages[{i}].content"
    if content is None or isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise BadRequest(f"{path} must be a string or a list of parts", param=path)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if part["text"]:
                parts.append({"text": part["text"]})
        elif kind == "image_url" and not text_only:
            parts.append(_image(part.get("image_url"), f"{path}[{j}].image_url"))
        elif kind == "input_audio" and not text_only:
            audio = part.get("input_audio")
            if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
                raise BadRequest(
                    f"{path}[{j}].input_audio.data must be a string", param=f"{path}[{j}].input_audio.data"
                )
            fmt = audio.get("format") if isinstance(audio.get("format"), str) else "wav"
            parts.append({"inlineData": {"mimeType": f"audio/{fmt}", "data": audio["data"]}})
        else:
            raise BadRequest(
                f"{path}[{j}]: {kind!r} parts cannot be sent to this backend", param=f"{path}[{j}].type"
            )
    return parts


def _image(value: Any, path: str) -> dict[str, Any]:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadRequest(f"{path}.url: this backend takes images as data: URLs only", param=f"{path}.url")
    head, comma, data = url[5:].partition(",")
    mime, _, encoding = head.partition(";")
    if not comma or encoding != "base64" or not mime:
        raise BadRequest(f"{path}.url: expected data:<type>;base64,...", param=f"{path}.url")
    return {"inlineData": {"mimeType": mime, "data": data}}


def _assistant(m: dict[str, Any], i: int, names: dict[str, str]) -> list[dict[str, Any]]:
    parts = _parts(m.get("content"), i, text_only=True)
    calls = m.get("tool_calls")
    if calls is None:
        return parts
    if not isinstance(calls, list):
        raise BadRequest(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
    for j, call in enumerate(calls):
        path = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{path}.function.name must be a string", param=f"{path}.function.name")
        try:
            args = orjson.loads(function.get("arguments") or "{}")
        except (orjson.JSONDecodeError, TypeError):
            args = None
        if not isinstance(args, dict):
            raise BadRequest(
                f"{path}.function.arguments must be a JSON object", param=f"{path}.function.arguments"
            )
        if isinstance(call.get("id"), str):
            names[call["id"]] = function["name"]
        parts.append({"functionCall": {"name": function["name"], "args": args}})
    return parts


def _function_response(m: dict[str, Any], i: int, names: dict[str, str]) -> dict[str, Any]:
    call_id = m.get("tool_call_id")
    name = names.get(call_id) if isinstance(call_id, str) else None
    if name is None:
        raise BadRequest(
            f"messages[{i}].tool_call_id: no earlier assistant tool call has this id",
            param=f"messages[{i}].tool_call_id",
        )
    text = "".join(p["text"] for p in _parts(m.get("content"), i, text_only=True))
    try:
        response = orjson.loads(text)
    except orjson.JSONDecodeError:
        response = None
    if not isinstance(response, dict):
        response = {"output": text}
    return {"functionResponse": {"name": name, "response": response}}


def _declaration(tool: Any, i: int) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
        raise BadRequest(
            f"tools[{i}]: only function tools can be sent to this backend", param=f"tools[{i}].type"
        )
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise BadRequest(
            f"tools[{i}].function.name must be a non-empty string", param=f"tools[{i}].function.name"
        )
    out: dict[str, Any] = {"name": function["name"]}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    schema = function.get("parameters")
    if schema is not None:
        if not isinstance(schema, dict):
            raise BadRequest(
                f"tools[{i}].function.parameters must be an object", param=f"tools[{i}].function.parameters"
            )
        out["parametersJsonSchema"] = schema
    return out


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in _MODES:
        return {"mode": _MODES[choice]}
    function = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return {"mode": "ANY", "allowedFunctionNames": [function["name"]]}
    raise BadRequest("tool_choice must be auto, required, none or a named function", param="tool_choice")


def _generation_config(doc: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for ours, theirs in _CONFIG:
        value = doc.get(ours)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest(f"{ours} must be a number", param=ours)
            config[theirs] = value
    for key in ("max_completion_tokens", "max_tokens", "n"):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise BadRequest(f"{key} must be a positive integer", param=key)
    limit = doc.get("max_completion_tokens", doc.get("max_tokens"))
    if limit is not None:
        config["maxOutputTokens"] = limit
    if doc.get("n") is not None:
        config["candidateCount"] = doc["n"]
    stop = doc.get("stop")
    if isinstance(stop, str):
        config["stopSequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        config["stopSequences"] = stop
    elif stop is not None:
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    fmt = doc.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        config["responseMimeType"] = "application/json"
    elif kind == "json_schema":
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be an object",
                param="response_format.json_schema.schema",
            )
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = schema
    elif fmt is not None and kind != "text":
        raise BadRequest(
            "response_format.type must be text, json_object or json_schema", param="response_format.type"
        )
    return config


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _openai_usage(meta: dict[str, Any]) -> dict[str, Any]:
    prompt = _int(meta.get("promptTokenCount"))
    thoughts = _int(meta.get("thoughtsTokenCount"))
    completion = _int(meta.get("candidatesTokenCount")) + thoughts
    total = meta.get("totalTokenCount")
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": _int(total) if total is not None else prompt + completion,
        "prompt_tokens_details": {"cached_tokens": _int(meta.get("cachedContentTokenCount"))},
    }
    if thoughts:
        out["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return out


def _candidate_parts(candidate: dict[str, Any]) -> list[dict[str, Any]]:
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return (
        [p for p in parts if isinstance(p, dict) and not p.get("thought")] if isinstance(parts, list) else []
    )


def _call(part: dict[str, Any], call_id: str) -> dict[str, Any] | None:
    fc = part.get("functionCall")
    if not isinstance(fc, dict):
        return None
    arguments = orjson.dumps(fc.get("args") if isinstance(fc.get("args"), dict) else {}).decode()
    cid = fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else call_id
    return {"id": cid, "type": "function", "function": {"name": fc.get("name"), "arguments": arguments}}


def _finish(reason: Any, has_calls: bool) -> str:
    finish = _FINISH.get(reason, "stop") if isinstance(reason, str) else "stop"
    return "tool_calls" if has_calls and finish == "stop" else finish


def _load(body: bytes | str) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def response_to_openai(body: bytes, model: str, *, created: int | None = None) -> bytes:
    doc = _load(body)
    if doc is None:
        raise BadUpstreamResponse("the backend's answer is not a JSON object")
    rid = doc["responseId"] if isinstance(doc.get("responseId"), str) else secrets.token_hex(12)
    candidates = doc.get("candidates")
    choices: list[dict[str, Any]] = []
    for n, candidate in enumerate(candidates if isinstance(candidates, list) else []):
        if not isinstance(candidate, dict):
            continue
        index = candidate.get("index", n) if isinstance(candidate.get("index", n), int) else n
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for part in _candidate_parts(candidate):
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            call = _call(part, f"call_{rid}_{index}_{len(calls)}")
            if call is not None:
                calls.append(call)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(texts) if texts else None,
            "refusal": None,
        }
        if calls:
            message["tool_calls"] = calls
        finish = _finish(candidate.get("finishReason"), bool(calls))
        choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": finish})
    if not choices:
        # The prompt itself was blocked (promptFeedback.blockReason): nothing was generated, and the client
        # is told so (content_filter). An answer with neither is not one Gemini gives: 502, as the other
        # translators answer a body their protocol does not allow.
        feedback = doc.get("promptFeedback")
        if not (isinstance(feedback, dict) and feedback.get("blockReason")):
            raise BadUpstreamResponse("the backend's answer has no candidates and no prompt feedback")
        message = {"role": "assistant", "content": None, "refusal": None}
        choices.append({"index": 0, "message": message, "logprobs": None, "finish_reason": "content_filter"})
    meta = doc.get("usageMetadata")
    out = {
        "id": "chatcmpl-" + rid,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": choices,
        "usage": _openai_usage(meta if isinstance(meta, dict) else {}),
    }
    return orjson.dumps(out)


def _error_body(error: Any, status: int) -> bytes:
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("status") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = f"the backend answered with status {status}"
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code or status}})


def error_to_openai(status: int, body: bytes) -> bytes:
    """Gemini's ``{"error": {"code", "message", "status"}}`` in OpenAI's envelope (code: Gemini's status)."""
    doc = _load(body)
    return _error_body(doc.get("error") if doc is not None else None, status)


class GeminiStreamToOpenAI(EventTranslator):
    """Gemini SSE events in, ``chat.completion.chunk`` events out.

    Gemini's stream has no end marker: every event is a whole ``GenerateContentResponse`` and the body
    just ends, so ``finish`` (at the upstream end) sends the usage chunk (when ``include_usage``) and
    ``[DONE]`` -- or an error event when a candidate never got its ``finishReason`` (a cut stream).
    Function calls arrive whole and go out as one tool call delta each. Usage is the last
    ``usageMetadata`` seen; ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` and ``usage()``
    expose it (``None`` before any).
    """

    def __init__(self, model: str, *, include_usage: bool, created: int | None = None) -> None:
        self.model = model
        self._include_usage = include_usage
        self._created = int(time.time()) if created is None else created
        self._sse = SSEDecoder()
        self._id: str | None = None
        self._usage: dict[str, Any] | None = None
        self._calls: dict[int, int] = {}  # candidate index -> tool calls sent
        self._open: set[int] = set()  # candidates started and not finished
        self._done = False

    @property
    def prompt_tokens(self) -> int | None:
        return None if self._usage is None else int(self._usage["prompt_tokens"])

    @property
    def completion_tokens(self) -> int | None:
        return None if self._usage is None else int(self._usage["completion_tokens"])

    @property
    def cached_tokens(self) -> int | None:
        return None if self._usage is None else int(self._usage["prompt_tokens_details"]["cached_tokens"])

    def usage(self) -> Usage | None:
        u = self._usage
        if u is None:
            return None
        return Usage(
            u["prompt_tokens"],
            u["completion_tokens"],
            u["total_tokens"],
            u["prompt_tokens_details"]["cached_tokens"],
        )

    def _ended(self, out: list[bytes]) -> None:
        if self._open or not self._calls:
            self._error(out, {"message": "the backend's stream ended before the answer was complete"}, 502)
            return
        if self._include_usage and self._usage is not None:
            out.append(self._encode([], self._usage))
        out.append(_DONE)
        self._done = True

    def _error(self, out: list[bytes], error: Any, status: int) -> None:
        out.append(encode_event(None, _error_body(error, status)))
        self._done = True

    def _encode(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        obj: dict[str, Any] = {
            "id": "chatcmpl-" + (self._id or ""),
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self.model,
            "choices": choices,
        }
        if self._include_usage:
            obj["usage"] = usage
        return encode_event(None, orjson.dumps(obj))

    def _chunk(self, out: list[bytes], index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        out.append(
            self._encode([{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}], None)
        )

    def _event(self, data: str, out: list[bytes]) -> None:
        doc = _load(data)
        if doc is None:
            self._error(out, {"message": "the backend sent a stream event that is not a JSON object"}, 502)
            return
        if "error" in doc:
            error = doc["error"]
            code = error.get("code") if isinstance(error, dict) else None
            self._error(out, error, code if isinstance(code, int) and 400 <= code <= 599 else 500)
            return
        if self._id is None:
            rid = doc.get("responseId")
            self._id = rid if isinstance(rid, str) else secrets.token_hex(12)
        meta = doc.get("usageMetadata")
        if isinstance(meta, dict):
            self._usage = _openai_usage(meta)
        candidates = doc.get("candidates")
        for n, candidate in enumerate(candidates if isinstance(candidates, list) else []):
            if isinstance(candidate, dict):
                index = candidate.get("index", n)
                self._candidate(candidate, index if isinstance(index, int) else n, out)
        feedback = doc.get("promptFeedback")
        if not candidates and isinstance(feedback, dict) and feedback.get("blockReason") and not self._calls:
            # The prompt was blocked: one empty choice, finished by the filter.
            self._calls[0] = 0
            self._chunk(out, 0, {"role": "assistant", "content": ""})
            self._chunk(out, 0, {}, "content_filter")

    def _candidate(self, candidate: dict[str, Any], index: int, out: list[bytes]) -> None:
        if index not in self._calls:
            self._calls[index] = 0
            self._open.add(index)
            self._chunk(out, index, {"role": "assistant", "content": ""})
        for part in _candidate_parts(candidate):
            if isinstance(part.get("text"), str) and part["text"]:
                self._chunk(out, index, {"content": part["text"]})
            call = _call(part, f"call_{self._id}_{index}_{self._calls[index]}")
            if call is not None:
                self._chunk(out, index, {"tool_calls": [{"index": self._calls[index], **call}]})
                self._calls[index] += 1
        reason = candidate.get("finishReason")
        if reason is not None and index in self._open:
            self._open.discard(index)
            self._chunk(out, index, {}, _finish(reason, self._calls[index] > 0))
