"""The mock engine as a real subprocess, driven with the official ``openai`` SDK and with httpx.

One engine serves the module (reset before every test); tests about startup and shutdown start their own.
The engine is started through ``gateway.commands.mock_engine.main`` rather than ``python -m gateway`` so
these tests do not depend on the rest of the CLI.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.commands import mock_engine
from gateway.mockengine.behaviour import Behaviour
from gateway.mockengine.responses import MockRequestError, parse_multipart
from tests.fixtures.processes import terminate

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("mock-model", "other-model")
DEFAULT_TOKENS = 7  # the module's engine runs with --tokens 7, so reset must come back to 7, not 16
CHAT: Any = [{"role": "user", "content": "say   hello\nto me"}]  # four words
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what} not reached within {timeout}s")


class MockProcess:
    """``mock-engine`` in a subprocess on a free loopback port."""

    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        code = "import sys; from gateway.commands.mock_engine import main; sys.exit(main(sys.argv[1:]))"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--port", str(self.port), *flags],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        # The line comes once the socket is bound; a process that dies prints nothing and readline ends.
        line = self.proc.stdout.readline().strip()
        if line != f"mock-engine listening on {self.url}":
            self.proc.kill()
            raise AssertionError(f"unexpected first line {line!r}; stderr: {self.proc.communicate()[1]}")
        self.http = httpx.Client(base_url=self.url, timeout=10)
        self.sdk = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=10)

    def configure(self, **fields: Any) -> dict[str, Any]:
        response = self.http.post("/mock/config", json=fields)
        assert response.status_code == 200, response.text
        config: dict[str, Any] = response.json()
        return config

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        recs: list[dict[str, Any]] = self.http.get(
            "/mock/requests", params={"path": path} if path else {}
        ).json()
        return recs

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.http.get("/mock/stats").json()
        return stats

    def metrics(self) -> dict[tuple[str, str], float]:
        text = self.http.get("/metrics").text
        return {
            (s.name, s.labels.get("model_name", "")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def stop(self) -> int:
        self.http.close()
        self.sdk.close()
        return terminate(self.proc)


@pytest.fixture(scope="module")
def module_engine() -> Iterator[MockProcess]:
    engine = MockProcess("--model", MODELS[0], "--model", MODELS[1], "--tokens", str(DEFAULT_TOKENS))
    yield engine
    assert engine.stop() == 0


@pytest.fixture
def engine(module_engine: MockProcess) -> MockProcess:
    module_engine.http.post("/mock/reset").raise_for_status()
    return module_engine


def sse_events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n"), body[-40:]
    events = body[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events), events
    return [e[6:] for e in events]


# --- the OpenAI-compatible API, through the official SDK ---------------------------------------------


def test_chat_completion_is_capped_by_max_tokens(engine: MockProcess) -> None:
    reply = engine.sdk.chat.completions.create(model="other-model", messages=CHAT, max_tokens=3)
    assert reply.model == "other-model"
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "tok tok tok"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (4, 3, 7)


def test_chat_completion_uses_the_cli_token_count(engine: MockProcess) -> None:
    reply = engine.sdk.chat.completions.create(model="mock-model", messages=CHAT)
    assert reply.choices[0].message.content == " ".join(["tok"] * DEFAULT_TOKENS)
    assert reply.choices[0].finish_reason == "stop"


def test_chat_stream_with_include_usage(engine: MockProcess) -> None:
    stream = engine.sdk.chat.completions.create(
        model="mock-model",
        messages=CHAT,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" and c.model == "mock-model" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok tok tok tok"
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (4, 4, 8)


def test_chat_stream_wire_format(engine: MockProcess) -> None:
    body = {"model": "mock-model", "messages": CHAT, "max_tokens": 2, "stream": True}
    response = engine.http.post("/v1/chat/completions", json=body)
    assert response.headers["content-type"] == "text/event-stream"
    events = sse_events(response.content)
    # role chunk, two tokens, finish chunk, [DONE]; without include_usage there is no usage key at all
    assert len(events) == 5
    assert events[-1] == b"[DONE]"
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_completions_plain_and_streamed(engine: MockProcess) -> None:
    reply = engine.sdk.completions.create(model="mock-model", prompt="one two three", max_tokens=2)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == "tok tok"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 2)

    stream = engine.sdk.completions.create(
        model="mock-model", prompt=["a b", "c"], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " ".join(["tok"] * DEFAULT_TOKENS)
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 3


def test_embeddings_are_deterministic_in_both_encodings(engine: MockProcess) -> None:
    first = engine.sdk.embeddings.create(
        model="mock-model", input=["hello world", "bye"]
    )  # SDK asks for base64
    again = engine.sdk.embeddings.create(model="mock-model", input="hello world", encoding_format="float")
    assert [d.index for d in first.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in first.data)
    assert first.data[0].embedding != first.data[1].embedding
    assert again.data[0].embedding == pytest.approx(first.data[0].embedding, abs=1e-6)
    assert all(-1 <= x <= 1 for x in again.data[0].embedding)
    assert first.model == "mock-model"
    assert (first.usage.prompt_tokens, first.usage.total_tokens) == (3, 3)


def test_models_lists_every_configured_model(engine: MockProcess) -> None:
    assert [m.id for m in engine.sdk.models.list()] == list(MODELS)


def test_tool_call_plain(engine: MockProcess) -> None:
    reply = engine.sdk.chat.completions.create(model="mock-model", messages=CHAT, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {})


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("auto", "get_weather"),
        ("required", "get_weather"),
        ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
    ],
)
def test_tool_call_streamed(engine: MockProcess, tool_choice: Any, expected: str) -> None:
    stream = engine.sdk.chat.completions.create(
        model="mock-model",
        messages=CHAT,
        tools=TOOLS,
        tool_choice=tool_choice,
        stream=True,
    )
    name, arguments, ids, finish = "", "", set(), None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            assert delta.index == 0
            if delta.id:
                ids.add(delta.id)
            if delta.function and delta.function.name:
                name += delta.function.name
            if delta.function and delta.function.arguments:
                arguments += delta.function.arguments
    assert (name, json.loads(arguments), len(ids), finish) == (expected, {}, 1, "tool_calls")


def test_tool_choice_none_answers_with_text(engine: MockProcess) -> None:
    reply = engine.sdk.chat.completions.create(
        model="mock-model",
        messages=CHAT,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=1,
    )
    assert reply.choices[0].message.content == "tok"
    assert not reply.choices[0].message.tool_calls


@pytest.mark.parametrize("endpoint", ["transcriptions", "translations"])
def test_audio_multipart(engine: MockProcess, endpoint: str) -> None:
    audio = getattr(engine.sdk.audio, endpoint)
    upload = b"RIFF" + bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"
    result = audio.create(model="whisper-large", file=("clip.wav", upload))
    assert "whisper-large" in result.text
    assert f"{len(upload)} bytes" in result.text
    plain = audio.create(model="whisper-large", file=("clip.wav", upload), response_format="text")
    assert isinstance(plain, str) and f"{len(upload)} bytes" in plain


# --- plain HTTP behaviour -----------------------------------------------------------------------------


def test_health_unknown_paths_and_methods(engine: MockProcess) -> None:
    assert engine.http.get("/health").status_code == 200
    for path in ("/nope", "/v1/nope"):
        response = engine.http.get(path)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == 404
    assert engine.http.get("/v1/chat/completions").status_code == 405
    bad = engine.http.post("/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics_gauges_follow_config_and_running_requests(engine: MockProcess) -> None:
    engine.configure(waiting={"other-model": 5}, kv_cache_usage=0.25, token_delay=0.05, tokens=40)
    body = {"model": "mock-model", "prompt": "x", "stream": True}
    with engine.http.stream("POST", "/v1/completions", json=body) as stream:
        next(stream.iter_raw())  # the request is being served once its first chunk arrives
        metrics = engine.metrics()
        assert metrics[("vllm:num_requests_running", "mock-model")] == 1
        assert metrics[("vllm:num_requests_running", "other-model")] == 0
    assert metrics[("vllm:num_requests_waiting", "mock-model")] == 0
    assert metrics[("vllm:num_requests_waiting", "other-model")] == 5
    assert metrics[("vllm:kv_cache_usage_perc", "mock-model")] == 0.25
    # The client left mid-stream: the mock notices at its next chunk and stops counting the request.
    wait_for(lambda: engine.metrics()[("vllm:num_requests_running", "mock-model")] == 0, what="running 0")
    wait_for(lambda: engine.stats()["disconnects"] == 1, what="disconnect counted")

    engine.configure(waiting=2)
    assert engine.metrics()[("vllm:num_requests_waiting", "other-model")] == 2
    engine.configure(metrics_enabled=False)
    assert engine.http.get("/metrics").status_code == 404


# --- control surface ----------------------------------------------------------------------------------


def test_fail_status_with_fail_count(engine: MockProcess) -> None:
    engine.configure(fail_status=503, fail_count=2)
    body = {"model": "mock-model", "messages": CHAT}
    statuses = [engine.http.post("/v1/chat/completions", json=body) for _ in range(3)]
    assert [r.status_code for r in statuses] == [503, 503, 200]
    assert statuses[0].json()["error"]["code"] == 503
    assert engine.http.get("/mock/config").json()["fail_count"] == 0
    assert engine.stats()["failed"] == 2
    # /health and /metrics stay up while the API fails, so a test can fail requests without failing probes.
    engine.configure(fail_status=500, fail_count=None)
    assert engine.http.get("/health").status_code == 200
    with pytest.raises(openai.InternalServerError):
        engine.sdk.models.list()


def test_fail_body_is_verbatim_and_headers_override(engine: MockProcess) -> None:
    engine.configure(fail_status=429, fail_body='{"error" : "slow down"}')
    response = engine.http.post("/v1/completions", json={"prompt": "x"})
    assert (response.status_code, response.content) == (429, b'{"error" : "slow down"}')
    engine.configure(fail_status=None)
    headers = {"x-mock-fail-status": "502"}
    assert engine.http.post("/v1/completions", json={"prompt": "x"}, headers=headers).status_code == 502
    reply = engine.http.post("/v1/completions", json={"prompt": "x"}, headers={"x-mock-tokens": "2"})
    assert reply.json()["choices"][0]["text"] == "tok tok"
    assert engine.http.post("/v1/completions", json={}, headers={"x-mock-delay": "soon"}).status_code == 400


def test_delay_from_config_and_header(engine: MockProcess) -> None:
    started = time.monotonic()
    engine.http.get("/v1/models", headers={"x-mock-delay": "0.2"})
    assert time.monotonic() - started >= 0.2
    engine.configure(delay=0.15)
    started = time.monotonic()
    engine.http.get("/v1/models")
    assert time.monotonic() - started >= 0.15


def test_raw_response_is_returned_byte_for_byte(engine: MockProcess) -> None:
    raw = '{"id":"x",  "choices" : [ ], "extra":"h\\u00e9 \u2603",\n"n":1.50}'
    engine.configure(raw_response=raw, raw_content_type="application/json; charset=weird")
    response = engine.http.post("/v1/chat/completions", json={"model": "mock-model", "messages": CHAT})
    assert response.content == raw.encode()
    assert response.headers["content-type"] == "application/json; charset=weird"
    # raw_response is for whole answers; a streamed request still gets a generated stream.
    streamed = engine.http.post("/v1/chat/completions", json={"messages": CHAT, "stream": True})
    assert sse_events(streamed.content)[-1] == b"[DONE]"


def test_raw_stream_chunks_are_sent_in_order(engine: MockProcess) -> None:
    chunks = ['data: {"a":1}\n\n', ": comment\n\n", 'data: {"b" :  2}\n\n', "data: [DONE]\n\n"]
    engine.configure(raw_stream=chunks, raw_chunk_delay=0.01)
    with engine.http.stream("POST", "/v1/chat/completions", json={"messages": CHAT, "stream": True}) as r:
        assert r.headers["content-type"] == "text/event-stream"
        assert r.read() == "".join(chunks).encode()


@pytest.mark.parametrize("drop_after", [0, 2])
def test_drop_after_chunks_aborts_the_connection(engine: MockProcess, drop_after: int) -> None:
    engine.configure(drop_after_chunks=drop_after)
    body = {"model": "mock-model", "messages": CHAT, "stream": True}
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        engine.http.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        for piece in r.iter_raw():
            received += piece
    assert b"[DONE]" not in received
    assert received.count(b"data: ") == drop_after
    assert engine.stats()["dropped"] == 1
    # The SDK sees a failed stream, not a short answer.
    with pytest.raises(openai.APIConnectionError):
        list(engine.sdk.chat.completions.create(model="mock-model", messages=CHAT, stream=True))


def test_drop_after_chunks_also_cuts_raw_streams(engine: MockProcess) -> None:
    engine.configure(raw_stream=["data: 1\n\n", "data: 2\n\n"], drop_after_chunks=5)
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        engine.http.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as r,
    ):
        for piece in r.iter_raw():
            received += piece
    assert received == b"data: 1\n\n"  # never the last chunk, however large K is


def test_recordings_keep_bytes_headers_and_query(engine: MockProcess) -> None:
    body = b'{ "model" : "mock-model",\n  "messages": [{"role":"user","content":"h\\u00e9"}] }'
    engine.http.post(
        "/v1/chat/completions?a=1&b=two",
        content=body,
        headers={"X-Custom-Thing": "Value", "content-type": "application/json"},
    )
    engine.http.get("/health")  # monitoring is counted, not recorded
    engine.http.get("/v1/models")
    recs = engine.requests()
    assert [r["path"] for r in recs] == ["/v1/chat/completions", "/v1/models"]
    rec = recs[0]
    assert (rec["method"], rec["query"]) == ("POST", "a=1&b=two")
    assert base64.b64decode(rec["body_b64"]) == body
    assert rec["headers"]["x-custom-thing"] == "Value"
    assert all(k == k.lower() for k in rec["headers"])
    assert [r["path"] for r in engine.requests(path="/v1/models")] == ["/v1/models"]


def test_recordings_keep_the_last_thousand(engine: MockProcess) -> None:
    for i in range(1005):
        engine.http.get("/v1/models", params={"i": i})
    recs = engine.requests()
    assert len(recs) == 1000
    assert (recs[0]["query"], recs[-1]["query"]) == ("i=5", "i=1004")
    engine.configure(record=False)
    engine.http.get("/v1/models")
    assert len(engine.requests()) == 1000


def test_stats_count_paths_and_concurrency(engine: MockProcess) -> None:
    def slow(_: int) -> int:
        with httpx.Client(base_url=engine.url) as client:
            return client.get("/v1/models", headers={"x-mock-delay": "0.3"}).status_code

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(slow, range(3))) == [200, 200, 200]
    stats = engine.stats()
    assert stats["total"] == 3
    assert stats["by_path"] == {"/v1/models": 3}
    assert stats["in_flight"] == 0
    assert stats["max_in_flight"] == 3


def test_config_updates_are_validated_and_atomic(engine: MockProcess) -> None:
    before = engine.http.get("/mock/config").json()
    for update in ({"tokens": 3, "bogus": 1}, {"tokens": 3, "delay": "slow"}, {"fail_status": 99}, [1]):
        response = engine.http.post("/mock/config", json=update)
        assert response.status_code == 400, update
        assert "error" in response.json()
    assert engine.http.get("/mock/config").json() == before
    assert engine.configure(tokens=3)["tokens"] == 3
    assert engine.http.post("/mock/reset").json()["tokens"] == DEFAULT_TOKENS


# --- process lifecycle ----------------------------------------------------------------------------------


def test_sigterm_ends_slow_streams_and_exits_zero() -> None:
    engine = MockProcess("--token-delay", "2", "--tokens", "50")
    try:
        done = threading.Event()
        received: list[bytes] = []

        def read() -> None:
            body = {"prompt": "x", "stream": True}
            with httpx.stream("POST", engine.url + "/v1/completions", json=body, timeout=10) as r:
                for piece in r.iter_raw():
                    received.append(piece)
                    done.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert done.wait(5)
        started = time.monotonic()
        engine.proc.send_signal(signal.SIGTERM)
        assert engine.proc.wait(5) == 0
        assert time.monotonic() - started < 1.5  # not the 100 s the stream would take
        reader.join(5)
        assert b"[DONE]" not in b"".join(received)
    finally:
        engine.stop()


def test_bad_flags_exit_2_without_serving(capsys: pytest.CaptureFixture[str]) -> None:
    assert mock_engine.main(["--port", str(free_port()), "--fail-status", "42"]) == 2
    assert "fail_status" in capsys.readouterr().err


def test_register_adds_the_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="gateway")
    mock_engine.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["mock-engine", "--model", "a", "--model", "b", "--token-delay", "0.5"])
    assert args.handler is mock_engine.run
    assert (args.host, args.port, args.models, args.tokens, args.token_delay) == (
        "127.0.0.1",
        8001,
        ["a", "b"],
        16,
        0.5,
    )
    assert parser.parse_args(["mock-engine"]).models is None  # run() falls back to mock-model


# --- sans-I/O pieces ------------------------------------------------------------------------------------


def test_multipart_parser_is_exact() -> None:
    body = (
        b"--XyZ\r\n"
        b'Content-Disposition: form-data; name="model"\r\n\r\n'
        b"whisper\r\n"
        b"--XyZ\r\n"
        b'Content-Disposition: form-data; name="file"; filename="a b.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n"
        b"a --XyZ inside\r\n\r\n\r\n"
        b"--XyZ--\r\n"
    )
    parts = parse_multipart(body, 'multipart/form-data; boundary="XyZ"')
    assert parts["model"].data == b"whisper"
    assert (parts["file"].data, parts["file"].filename) == (b"a --XyZ inside\r\n\r\n", "a b.wav")
    with pytest.raises(MockRequestError):
        parse_multipart(body[:-9], "multipart/form-data; boundary=XyZ")
    with pytest.raises(MockRequestError):
        parse_multipart(body, "application/json")


def test_behaviour_merge_rejects_bools_as_numbers() -> None:
    with pytest.raises(ValueError, match="tokens"):
        Behaviour().merged({"tokens": True})
    assert Behaviour().merged({"waiting": {"m": 2}}).waiting == {"m": 2}


def test_sigterm_after_serving_kept_alive_connections_does_not_panic() -> None:
    """Every SDK keeps its connection open after a request; granian's runtime thread still held them when
    the interpreter finalised, and pyo3 aborted ("panic in a function that cannot unwind")."""
    for _ in range(3):
        engine = MockProcess()
        try:
            with httpx.Client(base_url=engine.url, timeout=5) as client:
                chat = {"model": "mock-model", "messages": CHAT}
                assert client.post("/v1/chat/completions", json=chat).status_code == 200
                assert client.post("/v1/chat/completions", json={**chat, "stream": True}).status_code == 200
                engine.proc.send_signal(signal.SIGTERM)
                assert engine.proc.wait(5) == 0
        finally:
            engine.stop()
        assert engine.proc.stderr is not None
        errors = engine.proc.stderr.read()
        assert "panic" not in errors, errors
