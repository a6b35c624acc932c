"""The OpenAI-compatible data plane through the real gateway, driven by the official openai SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, MockEngine, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("dataplane")
    engine = MockEngine(tmp)
    gw = Gateway(tmp, basic_config({"a": engine.url}), workers=2, extra=("--max-body-bytes", "100000"))
    keys = {p: gw.create_key(p) for p in ("alice", "bob", "root")}
    gw.wait_ready()
    yield gw, engine, keys
    gw.stop()
    engine.stop()


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def wait_for_key(gw: Gateway, key: str) -> None:
    from tests.fixtures.processes import wait_until

    wait_until(
        lambda: all(
            httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
            for _ in range(8)
        ),
        what="key published",
    )


def test_chat_plain_and_streamed(env: tuple[Gateway, MockEngine, dict[str, str]]) -> None:
    gw, _, keys = env
    wait_for_key(gw, keys["alice"])
    c = client(gw, keys["alice"])
    resp = c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi there"}], max_tokens=5
    )
    assert resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 5
    chunks = list(
        c.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_completions_embeddings_models(env: tuple[Gateway, MockEngine, dict[str, str]]) -> None:
    gw, _, keys = env
    wait_for_key(gw, keys["root"])
    c = client(gw, keys["root"])
    comp = c.completions.create(model="chat", prompt="once upon", max_tokens=3)
    assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 3
    emb = c.embeddings.create(model="pm-a", input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) > 0
    assert sorted(m.id for m in c.models.list()) == ["chat", "gpt-4o-mini", "pm-a"]
    wait_for_key(gw, keys["alice"])
    assert sorted(m.id for m in client(gw, keys["alice"]).models.list()) == ["chat", "gpt-4o-mini"]
    wait_for_key(gw, keys["bob"])
    assert sorted(m.id for m in client(gw, keys["bob"]).models.list()) == ["pm-a"]


@pytest.mark.parametrize(
    ("key_name", "model", "status", "code"),
    [
        (None, "chat", 401, "invalid_api_key"),
        ("bogus", "chat", 401, "invalid_api_key"),
        ("alice", "no-such-model", 404, "model_not_found"),
        ("root", "no-such-model", 404, "model_not_found"),
        ("bob", "chat", 403, "model_not_allowed"),
        ("bob", "gpt-4o-mini", 403, "model_not_allowed"),
        ("alice", "pm-a", 403, "model_not_allowed"),
        ("alice", "chat", 200, None),
        ("bob", "pm-a", 200, None),
    ],
)
def test_auth_statuses(
    env: tuple[Gateway, MockEngine, dict[str, str]],
    key_name: str | None,
    model: str,
    status: int,
    code: str | None,
) -> None:
    gw, _, keys = env
    headers = {}
    if key_name == "bogus":
        headers["authorization"] = "Bearer sk-gw-not-a-real-key"
    elif key_name is not None:
        wait_for_key(gw, keys[key_name])
        headers["authorization"] = f"Bearer {keys[key_name]}"
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers=headers,
        json={"model": model, "messages": [{"role": "user", "content": "q"}], "max_tokens": 1},
    )
    assert r.status_code == status, r.text
    if code is not None:
        err = r.json()["error"]
        assert err["code"] == code and err["message"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "fragment"),
    [
        (b"{not json", {"content-type": "application/json"}, 400, "not valid JSON"),
        (b'{"messages": []}', {"content-type": "application/json"}, 400, "model parameter"),
        (
            b'{"model": "chat", "pad": "' + b"x" * 100_001 + b'"}',
            {"content-type": "application/json"},
            413,
            "exceeds",
        ),
    ],
)
def test_bad_requests_get_openai_envelopes(
    env: tuple[Gateway, MockEngine, dict[str, str]],
    body: bytes,
    headers: dict[str, str],
    status: int,
    fragment: str,
) -> None:
    gw, _, keys = env
    wait_for_key(gw, keys["alice"])
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        content=body,
        headers={**headers, "authorization": f"Bearer {keys['alice']}"},
    )
    assert r.status_code == status
    assert fragment in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_expired_key_is_401(env: tuple[Gateway, MockEngine, dict[str, str]]) -> None:
    gw, _, _ = env
    # Far enough ahead that the command has started and checked it before it passes (a Python start can
    # take seconds on a busy machine, and an expiry in the past is refused with exit status 2).
    expires = time.time() + 8.0
    key = gw.cli("keys", "create", "--principal", "alice", "--expires", f"{expires:.3f}").stdout.strip()
    # On a busy machine the key may be published only after it expired: "expired" (not "Incorrect API
    # key") says both that the workers know the key and that they refuse it for its expiry.
    seen: list[httpx.Response] = []

    def refused_as_expired() -> bool:
        r = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"})
        seen.append(r)
        return r.status_code == 401 and "expired" in r.json()["error"]["message"]

    wait_until(refused_as_expired, timeout=30.0, what="the key refused as expired")
    assert time.time() >= expires
    assert all(r.status_code in (200, 401) for r in seen)


def test_client_authorization_never_reaches_upstream(env: tuple[Gateway, MockEngine, dict[str, str]]) -> None:
    gw, engine, keys = env
    wait_for_key(gw, keys["alice"])
    engine.reset()
    httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {keys['alice']}"},
        json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 1},
    ).raise_for_status()
    (rec,) = engine.requests()
    assert "authorization" not in rec["headers"]
    assert keys["alice"] not in str(rec)


def test_audio_transcription_multipart_forwarded(env: tuple[Gateway, MockEngine, dict[str, str]]) -> None:
    gw, engine, keys = env
    wait_for_key(gw, keys["alice"])
    engine.reset()
    audio = bytes(range(256)) * 40
    c = client(gw, keys["alice"])
    out = c.audio.transcriptions.create(model="chat", file=("a.wav", audio, "audio/wav"))
    assert out.text
    (rec,) = engine.requests()
    assert audio in rec["body"]
    assert b'name="model"\r\n\r\nmock-model\r\n' in rec["body"]


def test_other_v1_suffix_forwarded(env: tuple[Gateway, MockEngine, dict[str, str]], tmp_path: Path) -> None:
    gw, engine, keys = env
    wait_for_key(gw, keys["alice"])
    engine.reset()
    r = httpx.post(
        gw.url + "/v1/some/new/endpoint?x=1",
        headers={"authorization": f"Bearer {keys['alice']}"},
        json={"model": "chat", "input": "y"},
    )
    assert r.status_code == 404  # the mock does not know the path: its own answer comes back
    (rec,) = engine.requests()
    assert rec["path"] == "/v1/some/new/endpoint" and rec["query"] == "x=1"


def test_client_disconnect_cancels_the_upstream_stream(
    env: tuple[Gateway, MockEngine, dict[str, str]],
) -> None:
    gw, engine, keys = env
    wait_for_key(gw, keys["alice"])
    engine.reset()
    engine.configure(token_delay=0.1, tokens=200)
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {keys['alice']}"},
        json={
            "model": "chat",
            "messages": [{"role": "user", "content": "q"}],
            "stream": True,
            "max_tokens": 200,
        },
        timeout=30,
    ) as r:
        it = r.iter_raw()
        next(it)
        next(it)
    # The engine would stream for 20 s; the gateway must hang up on it soon after the client left.
    wait_until(
        lambda: httpx.get(engine.url + "/mock/stats").json()["disconnects"] >= 1,
        timeout=5,
        what="engine saw the gateway hang up",
    )
    stats = httpx.get(engine.url + "/mock/stats").json()
    assert stats["in_flight"] == 0


def test_asyncio_event_loop_still_serves(tmp_path: Path, mock_engine: MockEngine) -> None:
    """uvloop is the default; ``--event-loop asyncio`` runs the same request path on asyncio's loop."""
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1, extra=("--event-loop", "asyncio"))
    try:
        key = gw.create_key("alice")
        wait_for_key(gw, key)
        for stream in (False, True):
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": stream},
                timeout=30,
            )
            assert r.status_code == 200 and ("[DONE]" in r.text) is stream
    finally:
        gw.stop()
