"""Byte identity: the request body reaches the engine as sent (alias splice aside) and the answer reaches
the client exactly as the engine wrote it, streamed or not."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config

ODD_RESPONSE = (
    '{\n  "zeta" :1,"id":"cmpl-odd",   "choices":[{"index":0,"message":{"role":"assistant",'
    '"content":"caf\\u00e9 \\ud83d\\ude00","x-unknown":{"nested":[1,2.50,-0e0]}},"finish_reason":"stop"}],'
    '"object":"chat.completion",\t"usage":{"total_tokens":3,"prompt_tokens":1,"completion_tokens":2}}\n\n'
)
ODD_STREAM = [
    'data: {"choices":[{"delta":{"role":"assistant"},"index":0}],  "id":"s1"}\r\n\r\n',
    ": a comment line\r\n\r\n",
    'data:{"choices":[{"delta":{"content":"h\\u00e9"},"index":0}],"id":"s1","weird":true}\n\n',
    'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n',
    "data: [DONE]\n\n",
]
ODD_REQUEST = (
    b'{\n "messages":[{"role":"user","content":"\\u00e9\\n \\"model\\":\\"x\\""}],\t"model" :  "chat",'
    b'"temperature":0.10, "unknown_field":{"a":[1,2,{}]} , "max_tokens":3}'
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, MockEngine, str]]:
    tmp = tmp_path_factory.mktemp("passthrough")
    engine = MockEngine(tmp)
    gw = Gateway(tmp, basic_config({"a": engine.url}, upstream="upstream/Model-Name"), workers=2)
    key = gw.create_key("root")
    gw.wait_key_live(key)  # in both workers: one answer says only that the worker it reached has it
    yield gw, engine, key
    gw.stop()
    engine.stop()


def test_request_body_identical_except_alias(env: tuple[Gateway, MockEngine, str]) -> None:
    gw, engine, key = env
    engine.reset()
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        content=ODD_REQUEST,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert r.status_code == 200
    (rec,) = engine.requests()
    assert rec["body"] == ODD_REQUEST.replace(b'"chat"', b'"upstream/Model-Name"')


def test_odd_json_response_is_byte_identical(env: tuple[Gateway, MockEngine, str]) -> None:
    gw, engine, key = env
    engine.reset()
    engine.configure(raw_response=ODD_RESPONSE)
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        content=ODD_REQUEST,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert r.status_code == 200
    assert r.content == ODD_RESPONSE.encode()


def test_odd_stream_is_byte_identical(env: tuple[Gateway, MockEngine, str]) -> None:
    gw, engine, key = env
    engine.reset()
    engine.configure(raw_stream=ODD_STREAM, raw_chunk_delay=0.01)
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": "chat",
            "messages": [{"role": "user", "content": "q"}],
            "stream": True,
            # Asked for by the client, so the usage chunk is its own (the gateway adds nothing to take out).
            "stream_options": {"include_usage": True},
        },
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = b"".join(r.iter_raw())
    assert body == "".join(ODD_STREAM).encode()
