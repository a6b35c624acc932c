"""The bodies a vLLM server would send, built from parsed requests. Sans-I/O: takes values, returns bytes.

Shapes follow vLLM's OpenAI-compatible server closely enough for the official ``openai`` SDK to parse
them: chat and text completions (whole or as SSE chunk lists, with tool calls as ``agent`` picks them
and the include_usage chunk), embeddings (float or base64), the model list, transcriptions, Prometheus
metrics and errors.
Generated text is always ``tok tok …``; prompt token counts are whitespace-separated words, so tests can
predict every number.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from gateway.mockengine.agent import arguments_for, choose_tool

__all__ = [
    "DONE",
    "EMBEDDING_DIM",
    "JSON_HEADERS",
    "MockRequestError",
    "Reply",
    "StreamReply",
    "budget",
    "chat_completion",
    "completion",
    "count_words",
    "embeddings",
    "error_body",
    "metrics_text",
    "models_list",
    "parse_multipart",
    "transcription",
]

JSON_HEADERS = [("content-type", "application/json")]
DONE = b"data: [DONE]\n\n"
EMBEDDING_DIM = 8


class MockRequestError(Exception):
    """A request the mock refuses; carries the status and OpenAI error type it becomes."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.kind)


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole response."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True, slots=True)
class StreamReply:
    """An SSE response: every element is one whole ``data: …\\n\\n`` event, the last is ``[DONE]``."""

    chunks: list[bytes]


def error_body(status: int, message: str, kind: str = "BadRequestError") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})


def count_words(value: object) -> int:
    """Whitespace-separated words in strings, one per token id, recursing through lists and text parts."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 1
    if isinstance(value, list):
        return sum(count_words(v) for v in value)
    if isinstance(value, dict):
        return count_words(value.get("text"))
    return 0


@lru_cache(maxsize=256)
def _text(n: int) -> str:
    return " ".join(["tok"] * n)


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def _sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(head: Mapping[str, Any], choice: Mapping[str, Any], usage: bool) -> bytes:
    # With include_usage, vLLM and OpenAI put an explicit "usage": null on every chunk but the last.
    return _sse({**head, "choices": [choice], "usage": None} if usage else {**head, "choices": [choice]})


def budget(req: Mapping[str, Any], tokens: int, *keys: str) -> tuple[int, str]:
    """How many tokens to generate and why generation ends: the request's cap wins if it is lower."""
    for key in keys:
        cap = req.get(key)
        if cap is None:
            continue
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise MockRequestError(400, f"{key} must be a non-negative integer")
        if cap <= tokens:
            return cap, "length"
    return tokens, "stop"


def _include_usage(req: Mapping[str, Any]) -> bool:
    options = req.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _tool_to_call(req: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The function to call and its arguments (see ``agent``), or None for a plain text answer."""
    tools = req.get("tools")
    choice = req.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    if not isinstance(tools, list):
        raise MockRequestError(400, "tools must be a list")
    functions: list[tuple[str, Mapping[str, Any] | None]] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise MockRequestError(400, f"tools[{i}].function.name is required")
        functions.append((function["name"], function.get("parameters")))
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if isinstance(name, str):
            schema = next((s for n, s in functions if n == name), None)
            return name, arguments_for(schema)
    messages = req.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if choice != "required" and isinstance(last, dict) and last.get("role") in ("tool", "function"):
        return None  # the tool's result is in: time to say something
    return choose_tool(functions)


def _call_id(rid: str) -> str:
    return "chatcmpl-tool-" + rid.removeprefix("chatcmpl-")


def chat_completion(
    req: Mapping[str, Any], model: str, tokens: int, rid: str, created: int
) -> Reply | StreamReply:
    """``/v1/chat/completions``: ``rid`` and ``created`` come from the caller so this stays pure."""
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MockRequestError(400, "messages must be a non-empty list")
    prompt = max(1, sum(count_words(m.get("content")) for m in messages if isinstance(m, dict)))
    n, finish = budget(req, tokens, "max_completion_tokens", "max_tokens")
    tool = _tool_to_call(req)
    if req.get("stream") is True:
        return StreamReply(_chat_chunks(model, n, finish, prompt, tool, _include_usage(req), rid, created))
    if tool is None:
        message: dict[str, Any] = {"role": "assistant", "content": _text(n), "tool_calls": []}
    else:
        function = {"name": tool[0], "arguments": orjson.dumps(tool[1]).decode()}
        call = {"id": _call_id(rid), "type": "function", "function": function}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        ],
        "usage": _usage(prompt, n),
        "prompt_logprobs": None,
    }
    return Reply(200, JSON_HEADERS, orjson.dumps(body))


def _chat_chunks(
    model: str,
    n: int,
    finish: str,
    prompt: int,
    tool: tuple[str, dict[str, Any]] | None,
    usage: bool,
    rid: str,
    created: int,
) -> list[bytes]:
    head: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        return _chunk(head, {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}, usage)

    out = [chunk({"role": "assistant", "content": ""})]
    if tool is None:
        out.extend(chunk({"content": "tok" if i == 0 else " tok"}) for i in range(n))
    else:
        # vLLM announces the call with its name, then streams the arguments in pieces.
        start = {"index": 0, "id": _call_id(rid), "type": "function"}
        out.append(chunk({"tool_calls": [{**start, "function": {"name": tool[0], "arguments": ""}}]}))
        arguments = orjson.dumps(tool[1]).decode()
        for piece in (arguments[:1], arguments[1:]):
            out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        finish = "tool_calls"
    out.append(chunk({}, finish))
    if usage:
        out.append(_sse({**head, "choices": [], "usage": _usage(prompt, n)}))
    out.append(DONE)
    return out


def completion(
    req: Mapping[str, Any], model: str, tokens: int, rid: str, created: int
) -> Reply | StreamReply:
    """``/v1/completions``."""
    if "prompt" not in req:
        raise MockRequestError(400, "prompt is required")
    prompt = max(1, count_words(req["prompt"]))
    n, finish = budget(req, tokens, "max_tokens")
    head: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model}
    if req.get("stream") is True:
        usage = _include_usage(req)

        def chunk(text: str, reason: str | None = None) -> bytes:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            return _chunk(head, {**choice, "stop_reason": None}, usage)

        out = [chunk("tok" if i == 0 else " tok") for i in range(n)]
        out.append(chunk("", finish))
        if usage:
            out.append(_sse({**head, "choices": [], "usage": _usage(prompt, n)}))
        out.append(DONE)
        return StreamReply(out)
    choice = {
        "index": 0,
        "text": _text(n),
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    body = {**head, "choices": [choice], "usage": _usage(prompt, n)}
    return Reply(200, JSON_HEADERS, orjson.dumps(body))


def _vector(item: object) -> list[float]:
    """Eight numbers in [-1, 1] that depend only on the input."""
    key = item.encode() if isinstance(item, str) else orjson.dumps(item)
    digest = hashlib.blake2b(key, digest_size=EMBEDDING_DIM).digest()
    return [round(b / 127.5 - 1.0, 6) for b in digest]


def embeddings(req: Mapping[str, Any], model: str, rid: str, created: int) -> Reply:
    """``/v1/embeddings``: input is a string, a list of strings, a token list or a list of token lists."""
    raw = req.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)):
        items: list[object] = [raw]
    elif isinstance(raw, list) and raw:
        items = list(raw)
    else:
        raise MockRequestError(400, "input must be a string or a non-empty list")
    as_base64 = req.get("encoding_format") == "base64"
    data = []
    for index, item in enumerate(items):
        vector = _vector(item)
        encoded: object = (
            base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *vector)).decode() if as_base64 else vector
        )
        data.append({"index": index, "object": "embedding", "embedding": encoded})
    body = {
        "id": rid,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": _usage(max(1, count_words(items)), 0),
    }
    return Reply(200, JSON_HEADERS, orjson.dumps(body))


def models_list(models: Sequence[str], created: int) -> bytes:
    data = [
        {
            "id": m,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": m,
            "parent": None,
            "max_model_len": 8192,
        }
        for m in models
    ]
    return orjson.dumps({"object": "list", "data": data})


def metrics_text(
    models: Iterable[str], running: Mapping[str, int], waiting: int | Mapping[str, int], kv_usage: float
) -> bytes:
    """Prometheus exposition text with the three vLLM gauges a router reads, one series per model."""
    names = list(dict.fromkeys([*models, *running]))
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        *(f'vllm:num_requests_running{{model_name="{m}"}} {float(running.get(m, 0))}' for m in names),
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
    ]
    for m in names:
        value = waiting.get(m, 0) if isinstance(waiting, Mapping) else waiting
        lines.append(f'vllm:num_requests_waiting{{model_name="{m}"}} {float(value)}')
    lines += [
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        *(f'vllm:kv_cache_usage_perc{{model_name="{m}"}} {kv_usage}' for m in names),
    ]
    return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True, slots=True)
class FormPart:
    data: bytes
    filename: str | None


def _param(header: str, name: str) -> str | None:
    """The value of ``name=`` in a header such as ``form-data; name="file"; filename="a.wav"``."""
    for piece in header.split(";")[1:]:
        key, _, value = piece.strip().partition("=")
        if key.lower() == name:
            return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return None


def parse_multipart(body: bytes, content_type: str) -> dict[str, FormPart]:
    """The named parts of a ``multipart/form-data`` body. Raises ``MockRequestError`` when it is malformed."""
    boundary = _param(content_type, "boundary")
    if not content_type.lower().startswith("multipart/form-data") or not boundary:
        raise MockRequestError(400, "expected multipart/form-data with a boundary")
    # Delimiters are CRLF + "--" + boundary; prefixing a CRLF makes the first one look like the others, so
    # a file that merely contains "--boundary" mid-line is not split.
    pieces = (b"\r\n" + body).split(b"\r\n--" + boundary.encode())
    if len(pieces) < 2 or not pieces[-1].startswith(b"--"):
        raise MockRequestError(400, "multipart body is not terminated")
    parts: dict[str, FormPart] = {}
    for piece in pieces[1:-1]:
        head, sep, data = piece.partition(b"\r\n\r\n")
        if not sep:
            raise MockRequestError(400, "multipart part has no header block")
        disposition = ""
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-disposition":
                disposition = value.strip()
        name = _param(disposition, "name")
        if name is None:
            raise MockRequestError(400, "multipart part has no name")
        parts[name] = FormPart(data, _param(disposition, "filename"))
    return parts


def transcription(parts: Mapping[str, FormPart], default_model: str, task: str) -> Reply:
    """``/v1/audio/transcriptions`` and ``/translations``: the text names the model and the upload size."""
    upload = parts.get("file")
    if upload is None:
        raise MockRequestError(400, "the form has no file part")
    model_part = parts.get("model")
    model = model_part.data.decode() if model_part else default_model
    text = f"mock {task} by {model} of {len(upload.data)} bytes"
    fmt = parts["response_format"].data.decode() if "response_format" in parts else "json"
    if fmt in ("text", "srt", "vtt"):
        return Reply(200, [("content-type", "text/plain; charset=utf-8")], text.encode())
    return Reply(200, JSON_HEADERS, orjson.dumps({"text": text}))
