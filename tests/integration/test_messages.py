"""The Anthropic Messages frontend and the native Anthropic and Gemini backends, end to end with the
official SDKs: translated both ways (streams and tool calls included), native passthrough byte for byte,
usage recorded with the numbers the backends reported, and Anthropic-shaped errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, wait_until

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
OPENAI_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": WEATHER_TOOL["input_schema"],
    },
}


def config(vllm: str, claude: str, gem: str) -> str:
    lines = []
    for name, url, protocol, key in (
        ("vllm", vllm, "openai", None),
        ("claude", claude, "anthropic", "sk-ant-upstream"),
        ("gem", gem, "gemini", "g-upstream"),
    ):
        lines += [
            "[[backends]]",
            f'name = "{name}"',
            f'url = "{url}"',
            f'protocol = "{protocol}"',
            *([f'api_key = "{key}"'] if key else []),
            "",
            "[[provider_models]]",
            f'name = "pm-{name}"',
            f'backends = [{{ backend = "{name}", model = "upstream-{name}" }}]',
            "",
        ]
    lines += [
        '[[models]]\nname = "chat"\nchain = ["pm-vllm"]\n',
        '[[models]]\nname = "claude"\nchain = ["pm-claude"]\n',
        '[[models]]\nname = "gem"\nchain = ["pm-gem"]\n',
        '[[models]]\nname = "mixed"\nchain = ["pm-claude", "pm-vllm"]\n',
        '[[roles]]\nname = "user"\npermissions = ["model/*"]\n',
        '[[principals]]\nname = "alice"\nroles = ["user"]\n',
    ]
    return "\n".join(lines)


class Env:
    def __init__(self, tmp: Path) -> None:
        self.vllm, self.claude, self.gem = MockEngine(tmp), MockEngine(tmp), MockEngine(tmp)
        self.gw = Gateway(tmp, config(self.vllm.url, self.claude.url, self.gem.url))
        self.key = self.gw.create_key("alice")
        self.gw.wait_key_live(self.key)  # in every worker: one answer says only that its worker has it
        self.anthropic = anthropic.Anthropic(base_url=self.gw.url, api_key=self.key, max_retries=0)
        self.openai = openai.OpenAI(base_url=self.gw.url + "/v1", api_key=self.key, max_retries=0)

    def stop(self) -> None:
        self.gw.stop()
        for m in (self.vllm, self.claude, self.gem):
            m.stop()

    def records(self) -> list[UsageRecord]:
        with open_store(Settings(data_dir=self.gw.data_dir)) as store:
            return store.usage.records(limit=10_000)

    def settled(self) -> int:
        """How many records there are once earlier requests' records have all arrived."""
        count = -1
        while (now := len(self.records())) != count:
            count = now
            time.sleep(0.3)
        return count

    def record_of(self, count_before: int) -> UsageRecord:
        """The one usage record a request made (records arrive within a drain interval)."""
        wait_until(lambda: len(self.records()) > count_before, timeout=20, what="usage record")
        time.sleep(0.2)
        recs = self.records()
        assert len(recs) == count_before + 1
        return max(recs, key=lambda r: r.ts)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("messages"))
    yield e
    e.stop()


def last_request(mock: MockEngine) -> dict[str, Any]:
    recs = mock.requests()
    assert recs, "the backend received nothing"
    return recs[-1]


# -- the anthropic SDK against an OpenAI-speaking engine ---------------------------------------------------


def test_messages_create_translated_to_a_chat_completion(env: Env) -> None:
    before = env.settled()
    msg = env.anthropic.messages.create(
        model="chat",
        max_tokens=8,
        system=[{"type": "text", "text": "be brief"}],
        messages=[{"role": "user", "content": "hello there"}],
        stop_sequences=["END"],
        metadata={"user_id": "u-42"},
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "chat"
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens")
    sent = orjson.loads(last_request(env.vllm)["body"])
    assert last_request(env.vllm)["path"] == "/v1/chat/completions"
    assert sent["model"] == "upstream-vllm" and sent["max_tokens"] == 8 and sent["stop"] == ["END"]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["user"] == "u-42"
    rec = env.record_of(before)
    assert (rec.model, rec.backend, rec.status) == ("chat", "vllm", 200)
    assert rec.prompt_tokens == msg.usage.input_tokens and rec.completion_tokens == msg.usage.output_tokens
    assert rec.usage_source == "reported"


def test_messages_stream_text(env: Env) -> None:
    before = env.settled()
    with env.anthropic.messages.stream(
        model="chat", max_tokens=6, messages=[{"role": "user", "content": "count"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.usage.output_tokens > 0
    rec = env.record_of(before)
    assert rec.completion_tokens == final.usage.output_tokens and rec.usage_source == "reported"
    assert rec.prompt_tokens == final.usage.input_tokens


def test_messages_stream_tool_use(env: Env) -> None:
    with env.anthropic.messages.stream(
        model="chat",
        max_tokens=64,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.name == "get_weather" and isinstance(block.input, dict)
    assert final.stop_reason == "tool_use"
    sent = orjson.loads(last_request(env.vllm)["body"])
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    # The tool result goes back as a tool message.
    msg = env.anthropic.messages.create(
        model="chat",
        max_tokens=8,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": block.id, "name": block.name, "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}],
            },
        ],
    )
    assert msg.content[0].type == "text"
    sent = orjson.loads(last_request(env.vllm)["body"])
    assert {"role": "tool", "tool_call_id": block.id, "content": "sunny"} in sent["messages"]


def test_count_tokens_is_an_estimate_for_ordinary_keys(env: Env) -> None:
    short = env.anthropic.messages.count_tokens(model="chat", messages=[{"role": "user", "content": "hi"}])
    long = env.anthropic.messages.count_tokens(
        model="chat", messages=[{"role": "user", "content": "hi " * 400}]
    )
    assert 0 < short.input_tokens < long.input_tokens
    assert not env.vllm.requests() or last_request(env.vllm)["path"] != "/v1/messages/count_tokens"


def test_count_tokens_goes_to_a_native_backend_untouched(env: Env) -> None:
    """Claude Code's count_tokens calls: an Anthropic backend counts them itself, from the body as sent."""
    before = env.settled()
    body = orjson.dumps(
        {
            "model": "claude",
            "messages": [{"role": "user", "content": "one two three"}, {"role": "system", "content": "four"}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}, "defer_loading": True}],
        }
    )
    r = httpx.post(
        env.gw.url + "/v1/messages/count_tokens?beta=true",
        content=body,
        headers={"x-api-key": env.key, "anthropic-beta": "token-counting-2024-11-01"},
    )
    assert (r.status_code, r.json()) == (200, {"input_tokens": 4})  # the mock counts words
    sent = last_request(env.claude)
    assert (sent["path"], sent["query"]) == ("/v1/messages/count_tokens", "beta=true")
    assert sent["body"] == body.replace(b'"claude"', b'"upstream-claude"')
    assert sent["headers"]["anthropic-beta"] == "token-counting-2024-11-01"
    assert sent["headers"]["x-api-key"] == "sk-ant-upstream"
    time.sleep(0.3)
    assert env.settled() == before  # no usage record, nothing reserved


# -- the openai SDK against Anthropic- and Gemini-speaking backends ----------------------------------------


@pytest.mark.parametrize(
    ("model", "path_part", "key_header"),
    [("claude", "/v1/messages", "x-api-key"), ("gem", ":generateContent", "x-goog-api-key")],
)
def test_openai_sdk_against_native_backends(env: Env, model: str, path_part: str, key_header: str) -> None:
    mock = env.claude if model == "claude" else env.gem
    before = env.settled()
    done = env.openai.chat.completions.create(
        model=model,
        max_tokens=8,
        messages=[{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"}],
    )
    assert done.choices[0].message.content and done.choices[0].finish_reason in ("stop", "length")
    assert done.model == model
    sent = last_request(mock)
    assert path_part in sent["path"]
    assert sent["headers"][key_header] in ("sk-ant-upstream", "g-upstream")
    assert "authorization" not in sent["headers"]  # the client's key never reaches the provider
    rec = env.record_of(before)
    assert done.usage is not None
    assert (rec.prompt_tokens, rec.completion_tokens) == (
        done.usage.prompt_tokens,
        done.usage.completion_tokens,
    )
    assert rec.backend == ("claude" if model == "claude" else "gem")

    before = env.settled()
    chunks = list(
        env.openai.chat.completions.create(
            model=model,
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
            tools=[OPENAI_WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "weather in Paris?"}],
        )
    )
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert calls and calls[0].function is not None and calls[0].function.name == "get_weather"
    assert any(ch.finish_reason == "tool_calls" for c in chunks for ch in c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    rec = env.record_of(before)
    assert (rec.prompt_tokens, rec.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)


# -- Anthropic client, Anthropic backend: not translated -------------------------------------------------

ODD_REQUEST = (
    b'{\n  "max_tokens" : 20, "messages":[{"role":"user","content":[{"type":"text","text":"hi \\u00e9",'
    b'"cache_control":{"type":"ephemeral"}}]}],\n "model":"claude","x_vendor_field":{"keep":[1,2,3]},'
    b'"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral","ttl":"1h"}}]}'
)
ODD_ANSWER = (
    '{"usage":{"output_tokens":3,"input_tokens":11,"cache_read_input_tokens":5,"cache_creation_input_tokens":2},'
    '"type":"message","id":"msg_odd","role":"assistant","model":"upstream-claude","stop_reason":"end_turn",'
    '"content":[{"type":"text","text":"ok","citations":null,"x_extra":true}],"stop_sequence":null,"container":null}'
)
ODD_STREAM = [
    'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_s","type":"message",'
    '"role":"assistant",'
    '"model":"upstream-claude","content":[],"stop_reason":null,"usage":{"input_tokens":9,"output_tokens":1,'
    '"cache_read_input_tokens":4}}}\n\n',
    'event: ping\ndata: {"type": "ping"}\n\n',
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    '"content_block":{"type":"text","text":""}}\n\n',
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"yo"}}\n\n',
    'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    '"usage":{"output_tokens":7}}\n\n',
    'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def test_native_passthrough_is_byte_identical(env: Env) -> None:
    env.claude.configure(raw_response=ODD_ANSWER, raw_stream=ODD_STREAM)
    try:
        before = env.settled()
        resp = httpx.post(
            env.gw.url + "/v1/messages",
            content=ODD_REQUEST,
            headers={"x-api-key": env.key, "anthropic-version": "2023-06-01", "anthropic-beta": "odd-2026"},
            timeout=30,
        )
        assert resp.status_code == 200 and resp.content == ODD_ANSWER.encode()
        sent = last_request(env.claude)
        assert sent["body"] == ODD_REQUEST.replace(b'"model":"claude"', b'"model":"upstream-claude"')
        assert (
            sent["headers"]["anthropic-beta"] == "odd-2026"
            and sent["headers"]["x-api-key"] == "sk-ant-upstream"
        )
        rec = env.record_of(before)
        # Anthropic's input_tokens excludes the cache: the record's prompt is all of it.
        assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (11 + 5 + 2, 3, 5)

        before = env.settled()
        streamed = ODD_REQUEST.replace(b'"max_tokens" : 20', b'"max_tokens" : 20, "stream": true')
        with httpx.stream(
            "POST", env.gw.url + "/v1/messages", content=streamed, headers={"x-api-key": env.key}, timeout=30
        ) as r:
            body = r.read()
        assert body == "".join(ODD_STREAM).encode()
        rec = env.record_of(before)
        assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (9 + 4, 7, 4)
    finally:
        env.claude.reset()


def test_anthropic_sdk_against_a_native_backend(env: Env) -> None:
    msg = env.anthropic.messages.create(
        model="claude", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.content[0].type == "text" and msg.usage.input_tokens > 0
    assert last_request(env.claude)["path"] == "/v1/messages"


# -- errors in Anthropic's envelope ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "chat", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "chat", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
            "messages.0.role",
        ),
        ({"model": "chat", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "chat", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "chat", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
        ),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_malformed_messages_get_anthropic_400s(env: Env, body: dict[str, Any], field: str) -> None:
    resp = httpx.post(env.gw.url + "/v1/messages", json=body, headers={"x-api-key": env.key}, timeout=10)
    assert resp.status_code == 400
    err = resp.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert field in err["error"]["message"]


def test_gateway_errors_on_messages_use_anthropic_types(env: Env) -> None:
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=env.gw.url, api_key="sk-wrong", max_retries=0).messages.create(
            model="chat", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.NotFoundError) as exc:
        env.anthropic.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["error"] == {"type": "not_found_error", "message": "model: nope"}
    # An upstream error status keeps its meaning: 429 is a rate_limit_error.
    env.vllm.configure(fail_status=429)
    try:
        with pytest.raises(anthropic.RateLimitError):
            env.anthropic.messages.create(
                model="chat", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
    finally:
        env.vllm.reset()


def test_a_request_one_protocol_cannot_carry_goes_to_the_next_target(env: Env) -> None:
    """n > 1 has no Anthropic equivalent: the Anthropic backend is passed over, the OpenAI one serves."""
    done = env.openai.chat.completions.create(
        model="mixed", n=2, max_tokens=4, messages=[{"role": "user", "content": "two answers"}]
    )
    assert done.choices
    assert orjson.loads(last_request(env.vllm)["body"])["n"] == 2
    # Where no target can carry it, the translator's refusal names the field.
    with pytest.raises(openai.BadRequestError) as exc:
        env.openai.chat.completions.create(
            model="claude", n=2, max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    assert exc.value.body["param"] == "n"  # type: ignore[index]


def test_other_messages_paths_are_refused_in_anthropic_terms(env: Env) -> None:
    resp = httpx.post(
        env.gw.url + "/v1/messages/batches", json={"requests": []}, headers={"x-api-key": env.key}, timeout=10
    )
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "not_found_error"
    assert "/v1/messages/batches" in resp.json()["error"]["message"]


def test_what_only_a_native_backend_reads_passes_untouched(env: Env) -> None:
    """Roles, block types and fields the gateway does not read go to an Anthropic backend as sent; a
    translated target checks them and refuses by name what it cannot carry."""
    body = {
        "model": "claude",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
            {"role": "user", "content": [{"type": "future_block", "payload": {"x": 1}}]},
        ],
        "some_beta_field": {"edits": []},
    }
    raw = orjson.dumps(body)
    headers = {
        "x-api-key": env.key,
        "anthropic-beta": "future-2030-01-01",
        "content-type": "application/json",
    }
    r = httpx.post(env.gw.url + "/v1/messages?beta=true", content=raw, headers=headers)
    assert r.status_code == 200, r.text
    sent = last_request(env.claude)
    assert sent["body"] == raw.replace(b'"claude"', b'"upstream-claude"')
    assert sent["query"] == "beta=true" and sent["headers"]["anthropic-beta"] == "future-2030-01-01"
    assert r.headers["request-id"] == r.headers["x-request-id"]
    r = httpx.post(
        env.gw.url + "/v1/messages", content=orjson.dumps({**body, "model": "chat"}), headers=headers
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("messages.2.content.0.type: future_block")
    r = httpx.post(
        env.gw.url + "/v1/messages", content=orjson.dumps({**body, "max_tokens": "8"}), headers=headers
    )
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "max_tokens: Input should be a valid integer",
    )
