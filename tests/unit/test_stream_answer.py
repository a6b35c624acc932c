"""Streams rebuilt into the answer the same API gives without streaming (``gateway.protocol.stream_answer``),
from recorded streams: vLLM's and the mock engine's OpenAI chunks, Anthropic's events, a Responses
stream; and streams cut short."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.protocol.sse import encode_event
from gateway.protocol.stream_answer import rebuild

DATA = Path(__file__).resolve().parents[1] / "data"


def stream(name: str) -> bytes:
    return (DATA / "streams" / name).read_bytes()


def anthropic_stream(name: str) -> bytes:
    cases = json.loads((DATA / "translate" / "openai_anthropic_streams.json").read_text())
    case = next(c for c in cases if c["name"].startswith(name))
    return b"".join(encode_event(e["event"], orjson.dumps(e["data"])) for e in case["in"])


def deltas(raw: bytes) -> str:
    """The content deltas of an OpenAI chat stream, joined: what the rebuilt answer must hold."""
    out = []
    for line in raw.splitlines():
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                out.append(choice.get("delta", {}).get("content") or "")
    return "".join(out)


def test_a_vllm_chat_stream_becomes_a_chat_completion() -> None:
    raw = stream("vllm_chat.include_usage.sse")
    answer, events = rebuild("openai", "/v1/chat/completions", raw, complete=True)
    assert answer is not None
    assert answer["object"] == "chat.completion" and answer["model"] == "Qwen/Qwen2.5-7B-Instruct"
    (choice,) = answer["choices"]
    assert choice["message"] == {"role": "assistant", "content": deltas(raw)}
    assert choice["finish_reason"] == "length" and choice["index"] == 0  # as the recording ends
    assert answer["usage"]["completion_tokens"] > 0
    assert events == raw.count(b"data: ")  # [DONE] counted as an event read, not as a chunk


def test_a_tool_call_is_joined() -> None:
    answer, _ = rebuild("openai", "/v1/chat/completions", stream("mock_chat_tool_call.sse"), complete=True)
    assert answer is not None
    message = answer["choices"][0]["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "shell" and json.loads(call["function"]["arguments"]) == {
        "command": ["ls"]
    }
    assert call["id"] == "chatcmpl-tool-0a1b2c3d00000001" and call["type"] == "function"
    assert answer["choices"][0]["finish_reason"] == "tool_calls"


def test_a_completions_stream_becomes_a_text_completion() -> None:
    raw = stream("mock_completion.sse")
    answer, _ = rebuild("openai", "/v1/completions", raw, complete=True)
    assert answer is not None and answer["object"] == "text_completion"
    text = "".join(
        orjson.loads(line[6:])["choices"][0]["text"]
        for line in raw.splitlines()
        if line.startswith(b"data: {") and orjson.loads(line[6:])["choices"]
    )
    assert answer["choices"][0]["text"] == text and text


def test_anthropic_text_and_tool_use() -> None:
    answer, _ = rebuild("anthropic", "/v1/messages", anthropic_stream("text then a tool call"), complete=True)
    assert answer is not None and answer["type"] == "message" and answer["role"] == "assistant"
    kinds = [b["type"] for b in answer["content"]]
    assert kinds[0] == "text" and "tool_use" in kinds
    tool = next(b for b in answer["content"] if b["type"] == "tool_use")
    assert isinstance(tool["input"], dict) and tool["input"]  # the input_json_delta pieces, parsed
    assert answer["stop_reason"] == "tool_use"


def test_anthropic_usage_is_message_start_updated_by_message_delta() -> None:
    answer, _ = rebuild(
        "anthropic", "/v1/messages", anthropic_stream("text stream with a ping"), complete=True
    )
    assert answer is not None
    assert answer["content"] == [{"type": "text", "text": "Hello!"}]
    assert answer["usage"]["input_tokens"] == 25 and answer["usage"]["output_tokens"] == 15
    assert answer["stop_reason"] == "end_turn"


def test_anthropic_thinking_and_an_error_event() -> None:
    thinking, _ = rebuild("anthropic", "/v1/messages", anthropic_stream("thinking blocks"), complete=True)
    assert thinking is not None and thinking["content"][0]["type"] == "thinking"
    assert thinking["content"][0]["thinking"]
    failed, _ = rebuild(
        "anthropic", "/v1/messages", anthropic_stream("an Anthropic error event"), complete=True
    )
    assert failed is not None and failed["error"]["type"]


def test_a_responses_stream_is_its_last_response() -> None:
    created = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    done = {**created, "status": "completed", "output": [{"type": "message", "content": [{"text": "Hi"}]}]}
    raw = b"".join(
        [
            encode_event("response.created", orjson.dumps({"type": "response.created", "response": created})),
            encode_event("response.output_text.delta", b'{"type":"response.output_text.delta","delta":"H"}'),
            encode_event("response.output_text.delta", b'{"type":"response.output_text.delta","delta":"i"}'),
            encode_event(
                "response.completed", orjson.dumps({"type": "response.completed", "response": done})
            ),
        ]
    )
    answer, events = rebuild("responses", "/v1/responses", raw, complete=True)
    assert answer == done and events == 4
    # Cut before response.completed: the response as created, and the text deltas joined beside it.
    cut, _ = rebuild(
        "responses", "/v1/responses", raw[: raw.index(b"event: response.completed")], complete=False
    )
    assert cut == {**created, "output_text": "Hi"}


def test_a_stream_cut_short_keeps_its_whole_events_only() -> None:
    raw = stream("vllm_chat.include_usage.sse")
    cut = raw[: len(raw) // 2]
    answer, events = rebuild("openai", "/v1/chat/completions", cut, complete=False)
    assert answer is not None
    whole = cut[: cut.rindex(b"\n\n") + 2]  # the events that were complete when it was cut
    assert answer["choices"][0]["message"]["content"] == deltas(whole)
    assert events == whole.count(b"data: ")
    assert "usage" not in answer


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b'{"id": "not a stream"}',
        b"data: not json\n\n",
        b"data: [1, 2]\n\n",
        b"data: [DONE]\n\n",
    ],
)
def test_what_is_not_a_stream_of_objects_is_not_rebuilt(raw: bytes) -> None:
    answer: Any
    answer, _ = rebuild("openai", "/v1/chat/completions", raw, complete=True)
    assert answer is None
