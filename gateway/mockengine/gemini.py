"""The bodies a Gemini backend would send, for the mock engine. Sans-I/O: values in, bytes out.

``generate`` answers ``POST /v1beta/models/{model}:generateContent`` and, streamed,
``:streamGenerateContent?alt=sse`` (events framed with CRLF, as Google's servers do); ``error_body`` renders
Gemini's error envelope. ``route`` splits such a path into the model and the method.

As in the OpenAI mock (``responses``): the text is ``tok tok …``; prompt tokens are the words of the
text parts and of ``systemInstruction``; as a model in a tool-using conversation (``agent``), a function
is called when the request declares functions, ``functionCallingConfig.mode`` is not ``NONE`` and the last
turn is not a function's response (``ANY`` and allowed names force a call; the first allowed name, else
the agent's choice), with args for its schema's required parameters. ``cache_read`` of the prompt tokens
(at most all of them) are reported as ``cachedContentTokenCount``, which Gemini counts inside
``promptTokenCount``. Every stream event carries ``usageMetadata``; only the last has the candidate
tokens and the ``finishReason``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from gateway.mockengine.agent import arguments_for, choose_tool
from gateway.mockengine.responses import JSON_HEADERS, MockRequestError, Reply, StreamReply, count_words

__all__ = ["PREFIX", "error_body", "generate", "route"]

PREFIX: Final = "/v1beta/models/"
_METHODS: Final = ("generateContent", "streamGenerateContent")
_STATUS: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(status: int, message: str) -> bytes:
    kind = _STATUS.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")
    return orjson.dumps({"error": {"code": status, "message": message, "status": kind}})


def route(path: str) -> tuple[str, str] | None:
    """``(model, method)`` for ``/v1beta/models/{model}:{method}``, else ``None``."""
    if not path.startswith(PREFIX):
        return None
    model, colon, method = path[len(PREFIX) :].rpartition(":")
    if not colon or not model or method not in _METHODS:
        return None
    return model, method


def _prompt(req: Mapping[str, Any]) -> int:
    words = 0
    system = req.get("systemInstruction")
    contents: list[Any] = req.get("contents") or []
    for content in [system, *contents] if isinstance(system, dict) else contents:
        parts = content.get("parts") if isinstance(content, dict) else None
        if isinstance(parts, list):
            words += count_words(parts)
    return max(1, words)


def _function(req: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The function to call and its args (see ``agent``), or None for text: no declarations, mode
    ``NONE``, or the last turn carries a function's response (unless mode ``ANY`` forces a call)."""
    declared: list[tuple[str, Mapping[str, Any] | None]] = []
    for tool in req.get("tools") or []:
        for d in (tool.get("functionDeclarations") or []) if isinstance(tool, dict) else []:
            if not isinstance(d, dict) or not isinstance(d.get("name"), str):
                raise MockRequestError(400, "functionDeclarations[].name is required", "INVALID_ARGUMENT")
            declared.append((d["name"], d.get("parametersJsonSchema", d.get("parameters"))))
    if not declared:
        return None
    config = (req.get("toolConfig") or {}).get("functionCallingConfig") or {}
    mode = config.get("mode")
    if mode == "NONE":
        return None
    allowed = config.get("allowedFunctionNames")
    if isinstance(allowed, list) and allowed:
        schema = next((s for n, s in declared if n == allowed[0]), None)
        return str(allowed[0]), arguments_for(schema)
    contents = req.get("contents")
    last = contents[-1] if isinstance(contents, list) and contents else None
    parts = last.get("parts") if isinstance(last, dict) else None
    answered = isinstance(parts, list) and any(isinstance(p, dict) and "functionResponse" in p for p in parts)
    if answered and mode != "ANY":
        return None  # the function's result is in: time to say something
    return choose_tool(declared)


def generate(
    req: Mapping[str, Any], model: str, tokens: int, rid: str, cache_read: int, *, stream: bool
) -> Reply | StreamReply:
    contents = req.get("contents")
    if not isinstance(contents, list) or not contents:
        raise MockRequestError(400, "contents must be a non-empty list", "INVALID_ARGUMENT")
    for content in contents:
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            raise MockRequestError(400, "every content needs role user or model", "INVALID_ARGUMENT")
    prompt = _prompt(req)
    config = req.get("generationConfig") or {}
    cap = config.get("maxOutputTokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise MockRequestError(400, "maxOutputTokens must be a positive integer", "INVALID_ARGUMENT")
    n, finish = (cap, "MAX_TOKENS") if cap is not None and cap <= tokens else (tokens, "STOP")
    function = _function(req)
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": n,
        "totalTokenCount": prompt + n,
    }
    cached = min(cache_read, prompt)
    if cached:
        usage["cachedContentTokenCount"] = cached
    head = {"modelVersion": model, "responseId": rid}
    if function is not None:
        name, args = function
        parts: list[list[dict[str, Any]]] = [[{"functionCall": {"name": name, "args": args}}]]
        finish = "STOP"
    elif stream:
        parts = [[{"text": "tok" if i == 0 else " tok"}] for i in range(n)] or [[{"text": ""}]]
    else:
        parts = [[{"text": " ".join(["tok"] * n)}]]
    if not stream:
        candidate = {"content": {"parts": parts[0], "role": "model"}, "finishReason": finish, "index": 0}
        return Reply(
            200, JSON_HEADERS, orjson.dumps({"candidates": [candidate], "usageMetadata": usage, **head})
        )
    running = {"promptTokenCount": prompt, "totalTokenCount": prompt}
    out = []
    for i, piece in enumerate(parts):
        candidate = {"content": {"parts": piece, "role": "model"}, "index": 0}
        last = i == len(parts) - 1
        if last:
            candidate["finishReason"] = finish
        event = {"candidates": [candidate], "usageMetadata": usage if last else running, **head}
        out.append(b"data: " + orjson.dumps(event) + b"\r\n\r\n")
    return StreamReply(out)
