"""OpenAI's Responses API through the gateway with the official SDK's ``client.responses``: passed through
to a backend that serves it (the mock engine's ``/v1/responses``, as vLLM), and translated for a
chat-completions backend, an Anthropic one and a Gemini one — plain, streamed and with a tool, usage
recorded with the numbers the backend reported, stored responses where the backend keeps them and a clear
refusal where the gateway translates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, wait_until

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# (model, backend, the path the backend is asked on)
NATIVE = ("native", "vllm", "/v1/responses")
TRANSLATED = [
    ("chat", "chatonly", "/v1/chat/completions"),
    ("claude", "claude", "/v1/messages"),
    ("gem", "gem", "/v1beta/models/upstream-gem:streamGenerateContent"),
]
EVERY = [NATIVE, *TRANSLATED]


def config(urls: dict[str, str]) -> str:
    lines = []
    for name, protocol, native in (
        ("vllm", "openai", True),
        ("chatonly", "openai", False),
        ("claude", "anthropic", False),
        ("gem", "gemini", False),
    ):
        lines += [
            "[[backends]]",
            f'name = "{name}"',
            f'url = "{urls[name]}"',
            f'protocol = "{protocol}"',
            *(["responses_api = true"] if native else []),
            "",
            "[[provider_models]]",
            f'name = "pm-{name}"',
            f'backends = [{{ backend = "{name}", model = "upstream-{name}" }}]',
            "",
        ]
    lines += [
        '[[models]]\nname = "native"\nchain = ["pm-vllm"]\n',
        '[[models]]\nname = "chat"\nchain = ["pm-chatonly"]\n',
        '[[models]]\nname = "claude"\nchain = ["pm-claude"]\n',
        '[[models]]\nname = "gem"\nchain = ["pm-gem"]\n',
        '[[models]]\nname = "mixed"\nchain = ["pm-chatonly", "pm-vllm"]\n',
        '[[roles]]\nname = "user"\npermissions = ["model/*"]\n',
        '[[principals]]\nname = "alice"\nroles = ["user"]\n',
    ]
    return "\n".join(lines)


class Env:
    def __init__(self, tmp: Path) -> None:
        self.engines = {name: MockEngine(tmp) for name in ("vllm", "chatonly", "claude", "gem")}
        self.gw = Gateway(tmp, config({n: e.url for n, e in self.engines.items()}))
        self.key = self.gw.create_key("alice")
        self.gw.wait_key_live(self.key)
        self.client = openai.OpenAI(base_url=self.gw.url + "/v1", api_key=self.key, max_retries=0)

    def stop(self) -> None:
        self.gw.stop()
        for e in self.engines.values():
            e.stop()

    def records(self) -> list[UsageRecord]:
        with open_store(Settings(data_dir=self.gw.data_dir)) as store:
            return store.usage.records(limit=10_000)

    def settled(self) -> int:
        count = -1
        while (now := len(self.records())) != count:
            count = now
            time.sleep(0.3)
        return count

    def record_of(self, count_before: int) -> UsageRecord:
        wait_until(lambda: len(self.records()) > count_before, timeout=20, what="usage record")
        time.sleep(0.2)
        recs = self.records()
        assert len(recs) == count_before + 1
        return max(recs, key=lambda r: r.ts)

    def last_request(self, backend: str) -> dict[str, Any]:
        recs = self.engines[backend].requests()
        assert recs, f"backend {backend} received nothing"
        return recs[-1]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("responses"))
    yield e
    e.stop()


@pytest.mark.parametrize(("model", "backend", "path"), EVERY, ids=[m for m, _, _ in EVERY])
def test_responses_create(env: Env, model: str, backend: str, path: str) -> None:
    before = env.settled()
    resp = env.client.responses.create(
        model=model, instructions="be brief", input="say hello to the world", max_output_tokens=5
    )
    assert resp.object == "response" and resp.model in (model, "upstream-vllm")
    assert resp.output_text == "tok tok tok tok tok"
    assert resp.usage is not None and resp.usage.output_tokens == 5 and resp.usage.input_tokens > 0
    asked = env.last_request(backend)
    assert asked["path"] == path.replace("streamGenerateContent", "generateContent")
    sent = orjson.loads(asked["body"])
    if model == "native":  # verbatim, the model's name aside
        assert sent["input"] == "say hello to the world" and sent["model"] == "upstream-vllm"
    rec = env.record_of(before)
    assert (rec.model, rec.backend, rec.status, rec.usage_source) == (model, backend, 200, "reported")
    assert (rec.prompt_tokens, rec.completion_tokens) == (resp.usage.input_tokens, resp.usage.output_tokens)


@pytest.mark.parametrize(("model", "backend", "path"), EVERY, ids=[m for m, _, _ in EVERY])
def test_responses_stream(env: Env, model: str, backend: str, path: str) -> None:
    before = env.settled()
    with env.client.responses.stream(model=model, input="count for me", max_output_tokens=64) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 16  # the mock's default answer
    assert {"response.output_item.added", "response.output_text.done", "response.output_item.done"} <= set(
        kinds
    )
    assert final.output_text == " ".join(["tok"] * 16)
    assert final.usage is not None and final.usage.output_tokens == 16
    assert env.last_request(backend)["path"] == path
    rec = env.record_of(before)
    assert (rec.model, rec.backend, rec.status, rec.usage_source) == (model, backend, 200, "reported")
    assert (rec.prompt_tokens, rec.completion_tokens) == (final.usage.input_tokens, final.usage.output_tokens)


@pytest.mark.parametrize(("model", "backend", "path"), EVERY, ids=[m for m, _, _ in EVERY])
def test_responses_tool_call_then_its_output(env: Env, model: str, backend: str, path: str) -> None:
    first = env.client.responses.create(
        model=model,
        input="weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        store=False,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(orjson.loads(call.arguments), dict)
    # The tool's output goes back with the conversation (store=False, as Codex sends it).
    history: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    with env.client.responses.stream(
        model=model,
        input=history,
        tools=[WEATHER],
        tool_choice="none",
        store=False,  # type: ignore[list-item]
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text.startswith("tok")
    sent = orjson.loads(env.last_request(backend)["body"])
    if model == "chat":
        tool_message = {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
        assert tool_message in sent["messages"]
        assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    elif model == "native":
        assert sent["input"][2] == history[2]


def test_streamed_tool_call_events(env: Env) -> None:
    with env.client.responses.stream(model="chat", input="weather?", tools=[WEATHER]) as stream:  # type: ignore[list-item]
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"


def test_stored_responses_pass_through_to_a_native_backend(env: Env) -> None:
    resp = env.client.responses.create(model="native", input="remember me")
    query = {"model": "native"}
    got = env.client.responses.retrieve(resp.id, extra_query=query)
    assert got.id == resp.id and got.output_text == resp.output_text
    items = env.client.responses.input_items.list(resp.id, extra_query=query)
    assert items.data[0].type == "message"
    follow = env.client.responses.create(model="native", input="and then?", previous_response_id=resp.id)
    assert follow.previous_response_id == resp.id
    env.client.responses.delete(resp.id, extra_query=query)
    with pytest.raises(openai.NotFoundError):
        env.client.responses.retrieve(resp.id, extra_query=query)


def test_stored_responses_are_refused_where_the_gateway_translates(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client.responses.retrieve("resp_123", extra_query={"model": "chat"})
    assert "does not store responses" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        env.client.responses.create(model="chat", input="hi", previous_response_id="resp_123")
    assert info.value.param == "previous_response_id"
    # Without a model the gateway cannot route a bodiless call.
    r = httpx.get(env.gw.url + "/v1/responses/resp_123", headers={"authorization": f"Bearer {env.key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_bad_responses_requests_get_openai_errors(env: Env) -> None:
    headers = {"authorization": f"Bearer {env.key}"}
    for body, param in (
        ({"input": "hi"}, "model"),
        ({"model": "chat", "input": "hi", "max_output_tokens": "many"}, "max_output_tokens"),
        ({"model": "chat", "input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        ({"model": "chat", "input": "hi", "tools": [{"type": "mystery"}]}, "tools.0.type"),
    ):
        r = httpx.post(env.gw.url + "/v1/responses", json=body, headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    r = httpx.get(env.gw.url + "/v1/responses", headers=headers)
    assert r.status_code == 405


def test_a_request_a_translation_refuses_goes_to_a_native_target(env: Env) -> None:
    """previous_response_id cannot be translated: failover passes the chat backend over (not a try) and
    the native one, which stores responses, serves it."""
    first = env.client.responses.create(model="native", input="remember me")
    follow = env.client.responses.create(model="mixed", input="and then?", previous_response_id=first.id)
    assert follow.previous_response_id == first.id
    plain = env.client.responses.create(model="mixed", input="hi")
    assert plain.id.startswith("resp_chatcmpl-")  # translated: the chat backend came first


@pytest.mark.parametrize("model", ["chat", "claude", "gem"])
def test_backend_errors_reach_the_client_in_the_openai_envelope(env: Env, model: str) -> None:
    backend = {"chat": "chatonly", "claude": "claude", "gem": "gem"}[model]
    engine = env.engines[backend]
    engine.configure(fail_status=400, fail_count=1)
    try:
        with pytest.raises(openai.BadRequestError) as info:
            env.client.responses.create(model=model, input="hi")
    finally:
        engine.reset()
    assert "injected failure with status 400" in info.value.message


def test_retrieving_a_stored_response_bills_nothing(env: Env) -> None:
    """The stored response repeats its usage; the retrieval generated nothing and is recorded at zero."""
    resp = env.client.responses.create(model="native", input="count me once")
    assert resp.usage is not None and resp.usage.total_tokens > 0
    before = env.settled()
    got = env.client.responses.retrieve(resp.id, extra_query={"model": "native"})
    assert got.usage is not None and got.usage.total_tokens == resp.usage.total_tokens
    rec = env.record_of(before)
    assert (rec.model, rec.status, rec.usage_source) == ("native", 200, "reported")
    assert (rec.prompt_tokens, rec.completion_tokens, rec.total_tokens) == (0, 0, 0)


def test_a_gemini_answer_without_candidates(env: Env) -> None:
    """Issue 29: Gemini JSON with no candidates became a 200 ``completed`` Response with empty output, where
    the other translators answer 502. A prompt Gemini blocked is an ``incomplete`` Response (and a chat
    completion ended by ``content_filter``); an answer with neither candidates nor a block is 502."""
    engine = env.engines["gem"]
    headers = {"authorization": f"Bearer {env.key}"}
    chat = {"model": "gem", "messages": [{"role": "user", "content": "hi"}]}
    try:
        engine.configure(raw_response='{"usageMetadata": {"promptTokenCount": 3, "totalTokenCount": 3}}')
        resp = httpx.post(env.gw.url + "/v1/responses", json={"model": "gem", "input": "hi"}, headers=headers)
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "bad_upstream_response"
        resp = httpx.post(env.gw.url + "/v1/chat/completions", json=chat, headers=headers)
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "bad_upstream_response"
        engine.configure(raw_response='{"promptFeedback": {"blockReason": "SAFETY"}}')
        got = env.client.responses.create(model="gem", input="hi")
        assert got.status == "incomplete" and got.output == []
        assert got.incomplete_details is not None and got.incomplete_details.reason == "content_filter"
        resp = httpx.post(env.gw.url + "/v1/chat/completions", json=chat, headers=headers)
        assert resp.status_code == 200 and resp.json()["choices"][0]["finish_reason"] == "content_filter"
    finally:
        engine.reset()
