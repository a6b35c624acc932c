"""The mock engine in a tool-using conversation: a call for a tool the request offers, with arguments its
schema accepts, then a text answer once the tool's result is in; Anthropic, OpenAI and Gemini shapes,
whole and streamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.mockengine import anthropic as mock_anthropic
from gateway.mockengine import gemini as mock_gemini
from gateway.mockengine.agent import arguments_for, choose_tool
from gateway.mockengine.responses import Reply, StreamReply, chat_completion

CLAUDE_CODE = json.loads(
    (Path(__file__).parents[1] / "data" / "translate" / "claude_code_request.json").read_text()
)
SHELL = {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}


def test_claude_codes_tools_get_a_harmless_shell_listing() -> None:
    tools = [(t["name"], t["input_schema"]) for t in CLAUDE_CODE["tools"]]
    assert choose_tool(tools) == ("Bash", {"command": "ls"})


def test_a_codex_style_shell_gets_an_argv() -> None:
    schema = {**SHELL, "required": ["command"]}
    assert choose_tool([("apply_patch", {"type": "object"}), ("shell", schema)]) == (
        "shell",
        {"command": ["ls"]},
    )


def test_without_a_known_tool_the_first_is_called() -> None:
    assert choose_tool([("get_weather", {"type": "object"}), ("get_time", None)]) == ("get_weather", {})


def test_required_properties_get_values_of_their_type() -> None:
    schema = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "limit": {"type": "integer", "minimum": 5},
            "mode": {"enum": ["fast", "slow"]},
            "flag": {"type": ["boolean", "null"]},
            "where": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unused": {"type": "string"}},
                "required": ["city"],
            },
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "optional": {"type": "string"},
        },
        "required": ["file_path", "limit", "mode", "flag", "where", "tags"],
    }
    assert arguments_for(schema) == {
        "file_path": ".",
        "limit": 5,
        "mode": "fast",
        "flag": False,
        "where": {"city": "mock"},
        "tags": ["mock"],
    }


def anthropic_answer(messages: list[dict[str, Any]], stream: bool, **extra: Any) -> list[dict[str, Any]]:
    """The content blocks of the mock's Anthropic answer, rebuilt from the stream when streamed."""
    body = orjson.dumps({"model": "m", "max_tokens": 50, "messages": messages, "stream": stream, **extra})
    reply = mock_anthropic.messages(body, "m", 3, "msg_1", 0)
    if isinstance(reply, Reply):
        content: list[dict[str, Any]] = orjson.loads(reply.body)["content"]
        return content
    assert isinstance(reply, StreamReply)
    blocks: list[dict[str, Any]] = []
    for event in reply.chunks:
        data = orjson.loads(event.split(b"data: ", 1)[1])
        if data["type"] == "content_block_start":
            blocks.append({**data["content_block"], "_json": ""})
        elif data["type"] == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[-1]["text"] += delta["text"]
            else:
                blocks[-1]["_json"] += delta["partial_json"]
    for block in blocks:
        raw = block.pop("_json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(raw)
    return blocks


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_conversation_calls_then_answers(stream: bool) -> None:
    tools = CLAUDE_CODE["tools"]
    ask = [{"role": "user", "content": "list the files"}, {"role": "system", "content": "# Environment"}]
    (call,) = anthropic_answer(ask, stream, tools=tools)
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "Bash", {"command": "ls"})
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "a.txt\nb.txt"}
    history = [*ask, {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    (answer,) = anthropic_answer(history, stream, tools=tools)
    assert answer["type"] == "text" and answer["text"] == "tok tok tok"
    # A forced choice is obeyed even then; none never calls.
    forced = anthropic_answer(history, stream, tools=tools, tool_choice={"type": "tool", "name": "Read"})
    assert (forced[0]["name"], forced[0]["input"]) == ("Read", {"file_path": "."})
    assert anthropic_answer(ask, stream, tools=tools, tool_choice={"type": "none"})[0]["type"] == "text"


def openai_answer(messages: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
    """The mock's chat message (content, tool_calls), rebuilt from the chunks when streamed."""
    req = {"model": "m", "messages": messages, "stream": stream, **extra}
    reply = chat_completion(req, "m", 3, "chatcmpl-1", 0)
    if isinstance(reply, Reply):
        message: dict[str, Any] = orjson.loads(reply.body)["choices"][0]["message"]
        return message
    assert isinstance(reply, StreamReply)
    content, calls = "", {}
    for chunk in reply.chunks:
        data = chunk.removeprefix(b"data: ").strip()
        if data == b"[DONE]":
            break
        delta = orjson.loads(data)["choices"][0]["delta"]
        content += delta.get("content") or ""
        for piece in delta.get("tool_calls") or []:
            call = calls.setdefault(piece["index"], {"id": piece.get("id"), "name": "", "arguments": ""})
            call["name"] += piece["function"].get("name") or ""
            call["arguments"] += piece["function"]["arguments"]
    tool_calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()
    ]
    return {"role": "assistant", "content": content or None, "tool_calls": tool_calls}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_conversation_calls_then_answers(stream: bool) -> None:
    tools = [
        {"type": "function", "function": {"name": "update_plan", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "shell", "parameters": {**SHELL, "required": ["command"]}}},
    ]
    ask = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files"}]
    message = openai_answer(ask, stream, tools=tools)
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "shell"
    assert json.loads(call["function"]["arguments"]) == {"command": ["ls"]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}
    history = [*ask, {"role": "assistant", "content": None, "tool_calls": [call]}, result]
    answer = openai_answer(history, stream, tools=tools)
    assert answer["content"] == "tok tok tok" and not answer["tool_calls"]
    again = openai_answer(history, stream, tools=tools, tool_choice="required")
    assert again["tool_calls"][0]["function"]["name"] == "shell"


def gemini_parts(contents: list[dict[str, Any]], stream: bool, **extra: Any) -> list[dict[str, Any]]:
    """The mock's Gemini answer parts, joined across the events when streamed."""
    req = {"contents": contents, **extra}
    reply = mock_gemini.generate(req, "m", 3, "r1", 0, stream=stream)
    bodies = [reply.body] if isinstance(reply, Reply) else [c.removeprefix(b"data: ") for c in reply.chunks]
    return [p for b in bodies for p in orjson.loads(b)["candidates"][0]["content"]["parts"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_gemini_conversation_calls_then_answers(stream: bool) -> None:
    declared = {"name": "exec_command", "parametersJsonSchema": {**SHELL, "required": ["command"]}}
    tools = [{"functionDeclarations": [{"name": "lookup"}, declared]}]
    ask = [{"role": "user", "parts": [{"text": "list the files"}]}]
    (call,) = gemini_parts(ask, stream, tools=tools)
    assert call["functionCall"] == {"name": "exec_command", "args": {"command": ["ls"]}}
    result = {"functionResponse": {"name": "exec_command", "response": {"output": "a.txt"}}}
    history = [*ask, {"role": "model", "parts": [call]}, {"role": "user", "parts": [result]}]
    text = "".join(p["text"] for p in gemini_parts(history, stream, tools=tools))
    assert text == "tok tok tok"
    # ANY and allowed names force a call even then; NONE never calls.
    forced = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["lookup"]}}
    assert (
        gemini_parts(history, stream, tools=tools, toolConfig=forced)[0]["functionCall"]["name"] == "lookup"
    )
    off = {"functionCallingConfig": {"mode": "NONE"}}
    assert "text" in gemini_parts(ask, stream, tools=tools, toolConfig=off)[0]
