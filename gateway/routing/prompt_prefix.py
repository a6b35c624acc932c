"""A request's prompt as an engine's prefix cache sees it: the conversation's turns in order, each its role
and its content, rendered to one byte string whose prefixes are the prefixes an engine caches.

Two requests of one conversation share the bytes of every turn they share, whatever else differs in their
bodies (the order of members, sampling parameters, ``stream``, the model's name). Every protocol renders
alike — OpenAI chat, Anthropic messages, OpenAI Responses, text completions — so a system prompt shared by
clients of two APIs is one prefix, as it is on the engine once translated. Tools come first, as a chat
template puts them in the system prompt. Content that is not text (images, tool calls and results) is
rendered as its JSON, which keeps two different images apart. No I/O here.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["rendered_prompt"]


def rendered_prompt(body: bytes) -> bytes:
    """The prompt of a request body, rendered; empty when the body holds no prompt this module reads."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return b""
    if not isinstance(doc, dict):
        return b""
    parts: list[str] = []
    tools = doc.get("tools")
    if tools:
        _turn(parts, "tools", orjson.dumps(tools).decode())
    system = doc.get("system")  # Anthropic
    if system is not None:
        _turn(parts, "system", _text(system))
    instructions = doc.get("instructions")  # Responses
    if isinstance(instructions, str):
        _turn(parts, "system", instructions)
    turns = doc.get("messages")
    if turns is None:
        turns = doc.get("input")  # Responses: a string or a list of items
        if isinstance(turns, str):
            turns = [{"role": "user", "content": turns}]
    if isinstance(turns, list):
        for turn in turns:
            if not isinstance(turn, dict):
                continue
            role = turn.get("role")
            if not isinstance(role, str):  # a Responses item that is no message: a call, a call's output
                _turn(parts, str(turn.get("type", "item")), orjson.dumps(turn).decode())
                continue
            text = _text(turn.get("content"))
            calls = turn.get("tool_calls")
            if calls:
                text += orjson.dumps(calls).decode()
            _turn(parts, role, text)
    else:
        prompt = doc.get("prompt")  # text completions
        if isinstance(prompt, str):
            parts.append(prompt)
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            parts.append("\n".join(prompt))
    return "".join(parts).encode("utf-8", "surrogatepass")


def _turn(parts: list[str], role: str, text: str) -> None:
    parts.append(f"<|{role}|>\n")
    parts.append(text)
    parts.append("\n")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts, Anthropic content blocks, Responses content
        out = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
            else:
                out.append(orjson.dumps(part).decode())
        return "\n".join(out)
    if content is None:
        return ""
    return orjson.dumps(content).decode()
