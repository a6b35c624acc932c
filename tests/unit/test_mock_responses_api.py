"""The mock engine's Responses API (gateway.mockengine.responses_api): answers and events valid for the
openai SDK, a tool call before the tool result and text after it, and the store of responses."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pydantic
import pytest

from gateway.mockengine.responses import MockRequestError, Reply, StreamReply
from gateway.mockengine.responses_api import STORE_LIMIT, ResponseStore, create

EVENT = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)
RESPONSE = openai.types.responses.Response
SHELL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "yield_time_ms": {"type": "number"},
            "tty": {"type": "boolean"},
        },
        "required": ["cmd", "yield_time_ms", "tty"],
    },
}
OTHER = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


def whole(req: dict[str, Any], store: ResponseStore | None = None, tokens: int = 4) -> dict[str, Any]:
    reply = create(req, "m", tokens, "r1", 5, store if store is not None else ResponseStore())
    assert isinstance(reply, Reply) and reply.status == 200
    doc: dict[str, Any] = orjson.loads(reply.body)
    RESPONSE.model_validate(doc)
    return doc


@pytest.mark.parametrize(
    ("req", "kind"),
    [
        ({"input": "hi"}, "message"),
        ({"input": "hi", "tools": [SHELL]}, "function_call"),
        ({"input": "hi", "tools": [SHELL], "tool_choice": "none"}, "message"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "message"),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                ],
                "tools": [SHELL],
            },
            "message",
        ),
        (
            {
                "input": [
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                    {"role": "user", "content": "and now?"},
                ],
                "tools": [SHELL],
            },
            "function_call",
        ),
    ],
    ids=["text", "tool", "none", "hosted only", "after the result", "the user spoke again"],
)
def test_a_tool_call_until_the_tool_has_answered(req: dict[str, Any], kind: str) -> None:
    (item,) = whole(req)["output"]
    assert item["type"] == kind


def test_call_arguments_fill_the_required_parameters() -> None:
    """The mock's agent rules (gateway.mockengine.agent): the harmless shell tool before another, values
    for the required parameters only."""
    (item,) = whole({"input": "hi", "tools": [OTHER, SHELL]})["output"]
    assert item["name"] == "exec_command"
    assert orjson.loads(item["arguments"]) == {"cmd": "ls", "yield_time_ms": 1, "tty": False}
    (named,) = whole(
        {"input": "hi", "tools": [OTHER, SHELL], "tool_choice": {"type": "function", "name": "lookup"}}
    )["output"]
    assert named["name"] == "lookup" and named["arguments"] == "{}"


@pytest.mark.parametrize(
    "choice", [{"type": "function", "name": "exec_command"}, "required"], ids=["named", "required"]
)
def test_a_forced_choice_calls_even_after_a_tool_result(choice: Any) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ]
    (item,) = whole({"input": history, "tools": [SHELL], "tool_choice": choice})["output"]
    assert item["type"] == "function_call"


def test_text_usage_and_the_cap() -> None:
    doc = whole({"input": "one two three", "instructions": "be brief"})
    assert doc["output"][0]["content"][0]["text"] == "tok tok tok tok"
    assert doc["usage"]["input_tokens"] == 5 and doc["usage"]["output_tokens"] == 4
    capped = whole({"input": "x", "max_output_tokens": 2})
    assert capped["status"] == "incomplete" and capped["usage"]["output_tokens"] == 2
    with pytest.raises(MockRequestError):
        whole({"input": "x", "max_output_tokens": 0})
    with pytest.raises(MockRequestError):
        whole({"input": []})


@pytest.mark.parametrize("tools", [[], [SHELL]], ids=["text", "tool"])
def test_streams_are_valid_event_sequences(tools: list[dict[str, Any]]) -> None:
    reply = create({"input": "hi", "stream": True, "tools": tools}, "m", 3, "r1", 5, ResponseStore())
    assert isinstance(reply, StreamReply)
    docs = []
    for chunk in reply.chunks:
        name, data = chunk.rstrip(b"\n").split(b"\n")
        doc = json.loads(data[6:])
        assert name == b"event: " + doc["type"].encode()
        EVENT.validate_python(doc)
        docs.append(doc)
    assert [d["sequence_number"] for d in docs] == list(range(len(docs)))
    assert docs[0]["type"] == "response.created" and docs[-1]["type"] == "response.completed"
    final = docs[-1]["response"]["output"][0]
    if tools:
        pieces = "".join(d["delta"] for d in docs if d["type"] == "response.function_call_arguments.delta")
        assert pieces == final["arguments"]
    else:
        assert "".join(d["delta"] for d in docs if d["type"] == "response.output_text.delta") == "tok tok tok"


def test_the_store() -> None:
    store = ResponseStore()
    doc = whole({"input": "remember"}, store)
    got = store.answer("GET", doc["id"], "")
    assert orjson.loads(got.body) == doc
    items = orjson.loads(store.answer("GET", doc["id"], "input_items").body)
    assert items["data"][0]["content"][0]["text"] == "remember" and items["has_more"] is False
    follow = create({"input": "more", "previous_response_id": doc["id"]}, "m", 2, "r2", 6, store)
    assert isinstance(follow, Reply) and orjson.loads(follow.body)["previous_response_id"] == doc["id"]
    assert orjson.loads(store.answer("DELETE", doc["id"], "").body)["deleted"] is True
    with pytest.raises(MockRequestError) as info:
        store.answer("GET", doc["id"], "")
    assert info.value.status == 404
    with pytest.raises(MockRequestError) as info:
        create({"input": "more", "previous_response_id": doc["id"]}, "m", 2, "r3", 6, store)
    assert info.value.status == 404
    whole({"input": "forget", "store": False}, store)
    assert "resp_r1" not in store.items


def test_the_store_is_bounded() -> None:
    store = ResponseStore()
    for i in range(STORE_LIMIT + 5):
        store.put({"id": f"resp_{i}", "output": []}, [])
    assert (
        len(store.items) == STORE_LIMIT
        and "resp_0" not in store.items
        and f"resp_{STORE_LIMIT + 4}" in store.items
    )
