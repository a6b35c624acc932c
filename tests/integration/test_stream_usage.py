"""A stream that did not ask for usage: the gateway asks the engine for it (stream_options.include_usage),
reads it, and the client gets the engine's own stream without usage, byte for byte, whatever the engine's
chunk boundaries (recorded transcripts in tests/data/streams, served by the mock engine in odd pieces)."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until

STREAMS = Path(__file__).resolve().parents[1] / "data" / "streams"
CASES = [
    ("mock_chat", "/v1/chat/completions", (4, 4)),
    ("mock_chat_tool_call", "/v1/chat/completions", (4, 4)),
    ("mock_completion", "/v1/completions", (2, 4)),
    ("vllm_chat", "/v1/chat/completions", (512, 64)),
    ("crlf_chat", "/v1/chat/completions", (4, 4)),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, MockEngine, str]]:
    tmp = tmp_path_factory.mktemp("stream-usage")
    engine = MockEngine(tmp)
    gw = Gateway(tmp, basic_config({"a": engine.url}), workers=1)
    key = gw.create_key("alice")
    gw.wait_key_live(key, probes=2)
    yield gw, engine, key
    gw.stop()
    engine.stop()


def odd_pieces(text: str, seed: str) -> list[str]:
    """Cut where it hurts: inside the first ``"usage":null``, inside the usage chunk, between it and
    ``[DONE]``, a byte at a time at the very end, and at random elsewhere."""
    rng = random.Random(seed)
    cuts = {rng.randrange(len(text)) for _ in range(12)}
    null = text.find('"usage":null')
    if null >= 0:
        cuts |= {null + 3, null + 9}
    usage_chunk = text.rfind('"choices":[]')
    cuts |= {usage_chunk + 5, text.rfind("data: [DONE]") - 1}
    cuts |= set(range(len(text) - 20, len(text)))
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def records(gw: Gateway) -> list[UsageRecord]:
    with open_store(Settings(data_dir=gw.data_dir)) as store:
        return store.usage.records(limit=1000)


def record(gw: Gateway, request_id: str) -> UsageRecord:
    def find() -> UsageRecord | None:
        return next((r for r in records(gw) if r.request_id == request_id), None)

    wait_until(lambda: find() is not None, timeout=20, what="usage record")
    found = find()
    assert found is not None
    return found


@pytest.mark.parametrize(("name", "path", "usage"), CASES, ids=[c[0] for c in CASES])
def test_the_client_gets_the_engines_stream_without_usage(
    env: tuple[Gateway, MockEngine, str], name: str, path: str, usage: tuple[int, int]
) -> None:
    gw, engine, key = env
    with_usage = (STREAMS / f"{name}.include_usage.sse").read_bytes().decode()  # CRLF kept
    without = (STREAMS / f"{name}.sse").read_bytes()
    engine.reset()
    engine.configure(raw_stream=odd_pieces(with_usage, name), raw_chunk_delay=0.002)
    body = {"model": "chat", "stream": True, "max_tokens": 64}
    body |= {"messages": [{"role": "user", "content": "q"}]} if "chat" in path else {"prompt": "q"}
    with httpx.stream(
        "POST", gw.url + path, headers={"authorization": f"Bearer {key}"}, json=body, timeout=10
    ) as r:
        assert r.status_code == 200
        got = b"".join(r.iter_raw())
        request_id = r.headers["x-request-id"]
    assert got == without
    (sent,) = engine.requests()
    assert orjson.loads(sent["body"])["stream_options"] == {"include_usage": True}
    rec = record(gw, request_id)
    assert (rec.usage_source, rec.prompt_tokens, rec.completion_tokens) == ("reported", *usage)


def test_a_client_that_asked_gets_the_usage_chunk(env: tuple[Gateway, MockEngine, str]) -> None:
    gw, engine, key = env
    with_usage = (STREAMS / "vllm_chat.include_usage.sse").read_bytes().decode()  # CRLF kept
    engine.reset()
    engine.configure(raw_stream=odd_pieces(with_usage, "asked"), raw_chunk_delay=0.002)
    body = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "q"}]}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body
    ) as r:
        assert b"".join(r.iter_raw()) == with_usage.encode()


def test_sdk_code_that_reads_choices_0_works(env: tuple[Gateway, MockEngine, str]) -> None:
    """The issue's symptom: ``chunk.choices[0]`` on every chunk of a stream that did not ask for usage."""
    gw, engine, key = env
    engine.reset()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text.startswith("tok") and time.monotonic() - started < 10
