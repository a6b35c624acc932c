"""Responses API client, chat-completions backend: requests, answers and streams, table-driven against
transcripts in tests/data (a real Codex 0.171.0 request among them), every answer and event checked
against the official openai SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pydantic
import pytest

from gateway.errors import BadRequest, BadUpstreamResponse
from gateway.protocol import openai_anthropic, openai_gemini
from gateway.protocol.responses_openai import (
    Echo,
    StreamToResponses,
    echo_of,
    inspect_request,
    request_to_chat,
    response_from_chat,
)
from tests.fixtures.transcripts import DATA, halves, load, names

REQUESTS = load("responses_openai_requests")
ERRORS = load("responses_request_errors")
CODEX = json.loads((DATA / "responses_codex_request.json").read_text())
EVENT = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)
RESPONSE = openai.types.responses.Response
NO_ECHO = echo_of({})


@pytest.mark.parametrize("case", REQUESTS, ids=names(REQUESTS))
def test_request_to_chat(case: dict[str, Any]) -> None:
    info, doc = inspect_request(orjson.dumps(case["in"]))
    assert info.model == "m" and doc == case["in"]
    assert orjson.loads(request_to_chat(doc, "up")) == case["out"]


@pytest.mark.parametrize("case", ERRORS, ids=names(ERRORS))
def test_refused_requests_name_the_field(case: dict[str, Any]) -> None:
    _, doc = inspect_request(orjson.dumps(case["in"]))
    with pytest.raises(BadRequest) as info:
        request_to_chat(doc, "up")
    assert info.value.param == case["param"]
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"", None, "empty"),
        (b"{", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'{"input":"hi"}', "model", "model parameter"),
        (b'{"model":"","input":"hi"}', "model", "non-empty"),
        (b'{"model":3,"input":"hi"}', "model", "non-empty"),
        (b'{"model":"m","max_output_tokens":"9"}', "max_output_tokens", "must be an integer"),
        (b'{"model":"m","max_output_tokens":0}', "max_output_tokens", "between 1 and 2147483647"),
        (b'{"model":"m","max_output_tokens":true}', "max_output_tokens", "must be an integer"),
        (b'{"model":"m","max_output_tokens":9223372036854775807}', "max_output_tokens", "between 1"),
        (b'{"model":"m","max_output_tokens":-9223372036854775808}', "max_output_tokens", "between 1"),
        (b'{"model":"m","stream":"yes"}', "stream", "must be a boolean"),
        (b'{"model":"m","model":"n"}', None, "more than once"),
        (b'{"model":"m","metadata":' + b'{"a":' * 300 + b"1" + b"}" * 301, None, "deeper than 128"),
    ],
)
def test_inspect_refuses_what_routing_cannot_read(body: bytes, param: str | None, words: str) -> None:
    with pytest.raises(BadRequest) as info:
        inspect_request(body)
    assert info.value.param == param and words in info.value.message


@pytest.mark.parametrize(
    ("body", "stream", "cap", "user"),
    [
        ({"model": "m", "input": "x"}, False, None, None),
        ({"model": "m", "input": "x", "stream": True, "max_output_tokens": 9}, True, 9, None),
        ({"model": "m", "input": "x", "stream": False, "user": "u"}, False, None, "u"),
        ({"model": "m", "input": "x", "user": "u", "safety_identifier": "s"}, False, None, "s"),
    ],
)
def test_inspect_reads_routing_facts(
    body: dict[str, Any], stream: bool, cap: int | None, user: str | None
) -> None:
    info, _ = inspect_request(orjson.dumps(body))
    assert (info.model, info.stream, info.max_tokens, info.user) == ("m", stream, cap, user)
    assert info.include_usage  # the Responses API always reports usage: nothing to inject


def test_a_recorded_codex_request_translates() -> None:
    """Codex 0.171.0's second turn (after running a command), as it reached the mock engine."""
    info, doc = inspect_request(orjson.dumps(CODEX))
    assert info.stream
    out = orjson.loads(request_to_chat(doc, "up"))
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["system", "user", "user", "assistant", "tool"]  # two developer messages joined
    (call,) = out["messages"][3]["tool_calls"]
    assert call["function"] == {"name": "exec_command", "arguments": '{"cmd":"echo mock-engine"}'}
    assert out["messages"][4]["tool_call_id"] == call["id"] and "mock-engine" in out["messages"][4]["content"]
    sent = {t["function"]["name"] for t in out["tools"]}
    offered = {t["name"] for t in CODEX["tools"] if t["type"] == "function"}
    assert sent == offered and "exec_command" in sent  # namespace groups and web_search dropped
    assert out["tool_choice"] == "auto" and out["parallel_tool_calls"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert not {"store", "include", "reasoning", "prompt_cache_key", "client_metadata"} & out.keys()


# -- whole answers -----------------------------------------------------------------------------------------

CHAT = {
    "id": "chatcmpl-9",
    "object": "chat.completion",
    "created": 1735689600,
    "model": "llama",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
}
CALLS = {
    **CHAT,
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"a":1}'},
                    },
                    {"type": "function", "function": {"name": "apply_patch", "arguments": '{"input":"P"}'}},
                    {"type": "function", "function": {"arguments": "{}"}},  # no name: skipped
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 20,
        "completion_tokens": 5,
        "total_tokens": 25,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"reasoning_tokens": 2},
    },
}
CUSTOM = Echo(
    echo_of({"tools": [{"type": "custom", "name": "apply_patch"}]}).fields, frozenset({"apply_patch"})
)

ANSWERS: list[tuple[str, dict[str, Any], Echo, list[dict[str, Any]], str, dict[str, Any]]] = [
    (
        "text",
        CHAT,
        NO_ECHO,
        [
            {
                "id": "msg_chatcmpl-9",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}],
            }
        ],
        "completed",
        {"input_tokens": 12, "cached": 0, "output_tokens": 3, "total_tokens": 15, "reasoning": 0},
    ),
    (
        "reasoning, a function call and a custom tool call",
        CALLS,
        CUSTOM,
        [
            {
                "id": "rs_chatcmpl-9",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
                "status": "completed",
            },
            {
                "id": "fc_chatcmpl-9_0",
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"a":1}',
                "status": "completed",
            },
            {
                "id": "ctc_chatcmpl-9_1",
                "type": "custom_tool_call",
                "call_id": "call_chatcmpl-9_1",
                "name": "apply_patch",
                "input": "P",
                "status": "completed",
            },
        ],
        "completed",
        {"input_tokens": 20, "cached": 16, "output_tokens": 5, "total_tokens": 25, "reasoning": 2},
    ),
    (
        "cut by the cap",
        {**CHAT, "choices": [{**CHAT["choices"][0], "finish_reason": "length"}], "usage": None},
        NO_ECHO,
        [
            {
                "id": "msg_chatcmpl-9",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}],
            }
        ],
        "incomplete",
        {"input_tokens": 0, "cached": 0, "output_tokens": 0, "total_tokens": 0, "reasoning": 0},
    ),
]


@pytest.mark.parametrize(
    ("name", "chat", "echo", "output", "status", "usage"), ANSWERS, ids=[a[0] for a in ANSWERS]
)
def test_response_from_chat(
    name: str,
    chat: dict[str, Any],
    echo: Echo,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, int],
) -> None:
    body = response_from_chat(orjson.dumps(chat), "gpt-x", echo)
    doc = orjson.loads(body)
    assert doc["output"] == output
    assert (doc["id"], doc["object"], doc["model"], doc["status"]) == (
        "resp_chatcmpl-9",
        "response",
        "gpt-x",
        status,
    )
    assert doc["created_at"] == 1735689600 and doc["store"] is False
    parsed = RESPONSE.model_validate(doc)
    assert parsed.usage is not None
    got = parsed.usage
    assert {
        "input_tokens": got.input_tokens,
        "cached": got.input_tokens_details.cached_tokens,
        "output_tokens": got.output_tokens,
        "total_tokens": got.total_tokens,
        "reasoning": got.output_tokens_details.reasoning_tokens,
    } == usage
    if status == "incomplete":
        assert (
            parsed.incomplete_details is not None and parsed.incomplete_details.reason == "max_output_tokens"
        )


def test_a_response_repeats_the_request() -> None:
    request = {"model": "m", "input": "x", "instructions": "be brief", "tools": [{"type": "web_search"}]}
    request |= {"tool_choice": "required", "temperature": 0.5, "max_output_tokens": 9, "metadata": {"k": "v"}}
    doc = orjson.loads(response_from_chat(orjson.dumps(CHAT), "m", echo_of(request)))
    for key in ("instructions", "tools", "tool_choice", "temperature", "max_output_tokens", "metadata"):
        assert doc[key] == request[key]
    assert doc["parallel_tool_calls"] is True and doc["truncation"] == "disabled"


@pytest.mark.parametrize(
    "body", [b"not json", b"[]", b'{"choices":[]}', b'{"choices":"x"}', b'{"choices":[3]}'], ids=repr
)
def test_unreadable_answers_are_bad_upstream_responses(body: bytes) -> None:
    with pytest.raises(BadUpstreamResponse):
        response_from_chat(body, "m", NO_ECHO)


# -- streams -----------------------------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c9",
        "object": "chat.completion.chunk",
        "created": 1735689600,
        "model": "llama",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


USAGE = {"id": "c9", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}
TEXT_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
]
TEXT_STREAM += [chunk({}, "stop"), USAGE]
CALL_STREAM = [
    chunk({"role": "assistant", "content": "Let me check."}),
    chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
            ]
        }
    ),
    chunk(
        {
            "tool_calls": [
                {"index": 1, "id": "c2", "type": "function", "function": {"name": "g", "arguments": "{"}}
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}),
    chunk({}, "tool_calls"),
    USAGE,
]
REASONING_STREAM = [
    chunk({"reasoning_content": "hmm"}),
    chunk({"reasoning_content": "."}),
    chunk({"content": "ok"}),
]
REASONING_STREAM += [chunk({}, "length"), USAGE]


def sse(chunks: list[dict[str, Any]], done: bool = True) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def events(out: bytes) -> list[dict[str, Any]]:
    """Our output: one ``event:`` line naming the type and one ``data:`` line per event, each a valid
    event of the SDK's, numbered in order."""
    parsed = []
    for block in out.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        doc = json.loads(data[6:])
        assert name == b"event: " + doc["type"].encode()
        EVENT.validate_python(doc)
        parsed.append(doc)
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    return parsed


def run(
    body: bytes, echo: Echo = NO_ECHO, pieces: list[bytes] | None = None
) -> tuple[list[dict[str, Any]], StreamToResponses]:
    stream = StreamToResponses("gpt-x", echo, created=1)
    out = b"".join(stream.feed(p) for p in (pieces if pieces is not None else [body])) + stream.finish()
    return events(out), stream


def test_a_text_stream() -> None:
    got, stream = run(sse(TEXT_STREAM))
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["delta"] for e in got if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    final = RESPONSE.model_validate(got[-1]["response"])
    assert final.output_text == "Hello" and final.status == "completed" and final.id == "resp_c9"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (7, 2)
    usage = stream.usage()
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        7,
        2,
        9,
    )


def test_a_stream_with_interleaved_parallel_calls() -> None:
    got, _ = run(sse(CALL_STREAM))
    kinds = [e["type"] for e in got]
    assert kinds.count("response.output_item.added") == 3 and kinds.count("response.output_item.done") == 3
    deltas = [
        (e["output_index"], e["delta"]) for e in got if e["type"] == "response.function_call_arguments.delta"
    ]
    assert deltas == [(2, "{"), (1, '{"a":'), (1, "1}"), (2, "}")]  # each fragment to its own call
    done = {
        e["output_index"]: e["arguments"] for e in got if e["type"] == "response.function_call_arguments.done"
    }
    assert done == {1: '{"a":1}', 2: "{}"}
    final = RESPONSE.model_validate(got[-1]["response"])
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    calls = [
        (item.call_id, item.name, item.arguments) for item in final.output if item.type == "function_call"
    ]
    assert calls == [("c1", "f", '{"a":1}'), ("c2", "g", "{}")]
    # The text item closes before the first call opens.
    assert kinds.index("response.output_text.done") < kinds.index("response.output_item.added", 3)


def test_a_custom_tool_call_streams_its_input_whole() -> None:
    custom = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "k", "function": {"name": "apply_patch", "arguments": '{"inp'}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ut":"P1"}'}}]}),
        chunk({}, "tool_calls"),
    ]
    got, _ = run(sse(custom), CUSTOM)
    assert [e["delta"] for e in got if e["type"] == "response.custom_tool_call_input.delta"] == ["P1"]
    final = RESPONSE.model_validate(got[-1]["response"])
    (item,) = final.output
    assert item.type == "custom_tool_call" and item.input == "P1" and item.call_id == "k"


def test_reasoning_then_text_cut_by_the_cap() -> None:
    got, _ = run(sse(REASONING_STREAM))
    kinds = [e["type"] for e in got]
    assert kinds.count("response.reasoning_text.delta") == 2 and kinds[-1] == "response.incomplete"
    final = RESPONSE.model_validate(got[-1]["response"])
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == "ok"
    assert final.incomplete_details is not None


@pytest.mark.parametrize(
    "chunks", [TEXT_STREAM, CALL_STREAM, REASONING_STREAM], ids=["text", "calls", "reasoning"]
)
def test_streams_do_not_care_where_pieces_end(chunks: list[dict[str, Any]]) -> None:
    body = sse(chunks)
    whole, _ = run(body)
    for i, pieces in halves(body):
        if i % 7 == 0:  # every seventh cut keeps the test fast; the pieces' ends vary across all positions
            assert run(body, pieces=pieces)[0] == whole


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (sse(TEXT_STREAM[:3], done=False), "ended before the answer was complete"),
        (b"", "ended before the answer was complete"),
        (sse(TEXT_STREAM[:2], done=False) + b"data: nope\n\n", "not a JSON object"),
        (sse(TEXT_STREAM[:2], done=False) + b'data: {"error":{"message":"engine died"}}\n\n', "engine died"),
    ],
    ids=["cut", "empty", "garbage", "upstream error"],
)
def test_a_broken_stream_ends_as_failed(body: bytes, why: str) -> None:
    got, _ = run(body)
    assert got[0]["type"] == "response.created" and got[-1]["type"] == "response.failed"
    assert why in got[-1]["response"]["error"]["message"]
    assert sum(e["type"] == "response.failed" for e in got) == 1


def test_a_stream_whose_done_never_came_still_completes() -> None:
    got, stream = run(sse(TEXT_STREAM, done=False))
    assert got[-1]["type"] == "response.completed"
    assert stream.usage() is not None


def test_nothing_follows_the_end() -> None:
    got, _ = run(sse(TEXT_STREAM) + sse(TEXT_STREAM))
    assert [e["type"] for e in got].count("response.completed") == 1


def test_no_usage_reported_means_none() -> None:
    got, stream = run(sse(TEXT_STREAM[:-1]))
    assert stream.usage() is None
    assert got[-1]["response"]["usage"]["total_tokens"] == 0


def test_the_recorded_codex_turn_goes_on_to_anthropic_and_gemini() -> None:
    """Through both translators, as the dialects chain them for those backends."""
    _, doc = inspect_request(orjson.dumps(CODEX))
    chat = request_to_chat(doc, "up")
    messages = orjson.loads(openai_anthropic.request_to_anthropic(chat, "claude", 4096))
    assert [m["role"] for m in messages["messages"]] == ["user", "assistant", "user"]
    assert messages["messages"][1]["content"][0]["type"] == "tool_use"
    assert messages["messages"][2]["content"][0]["type"] == "tool_result"
    assert isinstance(messages["system"], str) and messages["stream"] is True
    suffix, body = openai_gemini.request_to_gemini(chat)
    gemini = orjson.loads(body)
    assert suffix == ":streamGenerateContent?alt=sse"
    assert [c["role"] for c in gemini["contents"]] == ["user", "model", "user"]
    names = {f["name"] for f in gemini["tools"][0]["functionDeclarations"]}
    assert names == {t["function"]["name"] for t in orjson.loads(chat)["tools"]}


def test_a_filtered_answer_is_an_incomplete_response() -> None:
    """A chat completion ended by the content filter (a Gemini prompt blocked for safety, an engine's own
    filter) is an ``incomplete`` Response whose reason says so, whole or streamed, never an empty
    ``completed`` one."""
    chat = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "content_filter"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5},
    }
    whole = orjson.loads(response_from_chat(orjson.dumps(chat), "m", NO_ECHO))
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "content_filter"}
    RESPONSE.model_validate(whole)
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    stream = StreamToResponses("m", NO_ECHO)
    events = (
        stream.feed(
            b"data: "
            + orjson.dumps(
                {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}
            )
            + b"\n\ndata: [DONE]\n\n"
        )
        + stream.finish()
    )
    last = orjson.loads(events.rstrip().rsplit(b"\ndata: ", 1)[1])
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "content_filter"}
    EVENT.validate_python(last)


def test_a_long_stream_holds_about_its_text() -> None:
    """The text a streamed Response gathers for its closing events is held at about its own size: kept as
    one string object per delta, a 4 MB answer of four-character deltas held 15 times that (issue 29, case
    5: "peak ~10x the answer"), before the closing events even began."""
    import tracemalloc

    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    delta = b"data: " + orjson.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": " tok"}}]})
    piece = (delta + b"\n\n") * 1000
    stream = StreamToResponses("m", NO_ECHO)
    tracemalloc.start()
    try:
        for _ in range(100):  # 100,000 deltas: 400 KB of text
            stream.feed(piece)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 3 * 400_000
    end = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events = stream.feed(b"data: " + orjson.dumps(end) + b"\n\ndata: [DONE]\n\n") + stream.finish()
    last = orjson.loads(events.rstrip().rsplit(b"\ndata: ", 1)[1])
    assert last["response"]["output"][0]["content"][0]["text"] == " tok" * 100_000
