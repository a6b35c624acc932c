"""Context-aware routing through a running gateway: a request whose estimated prompt plus max_tokens does
not fit a target's declared window skips it for the next that fits, a request that fits none is a 400
with the figures, and an upstream "context length exceeded" 400 fails over to a larger window only where
the model allows it. Three mock engines stand for a small, a medium and a large window."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, free_port, wait_until

# vLLM's own wording for a prompt over the window.
VLLM_TOO_LONG = (
    '{"object":"error","message":"This model\'s maximum context length is 1000 tokens. However, you '
    "requested 1200 tokens (1190 in the messages, 10 in the completion). Please reduce the length of the "
    'messages or completion.","type":"BadRequestError","param":null,"code":400}'
)


def config(small: str, medium: str, large: str) -> str:
    out = []
    for name, url, window in (("small", small, 1000), ("medium", medium, 4000), ("large", large, 100000)):
        out.append(
            f'[[backends]]\nname = "{name}"\nurl = "{url}"\nconnect_timeout = 1.0\n\n'
            f'[[provider_models]]\nname = "pm-{name}"\ncontext_window = {window}\n'
            f'backends = [{{ backend = "{name}", model = "m" }}]\n'
        )
    out.append(
        '[[models]]\nname = "chat"\nchain = ["pm-small", "pm-medium", "pm-large"]\ncontext_failover = true\n'
        '[[models]]\nname = "strict"\nchain = ["pm-small", "pm-large"]\n'
        '[[models]]\nname = "tiny"\nchain = ["pm-small"]\n'
        '[[roles]]\nname = "user"\npermissions = ["model/*", "config:read"]\n'
        '[[principals]]\nname = "alice"\nroles = ["user"]\n'
        '[[keys]]\nname = "alice"\nprincipal = "alice"\nsecret = "sk-test-context-000000001"\n'
    )
    return "\n".join(out)


KEY = {"authorization": "Bearer sk-test-context-000000001"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, list[MockEngine], int]]:
    tmp = tmp_path_factory.mktemp("context")
    engines = [MockEngine(tmp) for _ in range(3)]
    admin_port = free_port()
    gw = Gateway(
        tmp,
        config(*(e.url for e in engines)),
        extra=("--admin-port", str(admin_port), "--backend-cool-down", "0"),
    )
    gw.wait_key_live("sk-test-context-000000001")
    yield gw, engines, admin_port
    gw.stop()
    for e in engines:
        e.stop()


@pytest.fixture
def fresh(env: tuple[Gateway, list[MockEngine], int]) -> tuple[Gateway, list[MockEngine], int]:
    for e in env[1]:
        e.reset()
    return env


def body(model: str, prompt_chars: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "x" * prompt_chars}],
        "max_tokens": max_tokens,
    }


def served(engines: list[MockEngine]) -> list[int]:
    return [sum(r["path"] == "/v1/chat/completions" for r in e.requests()) for e in engines]


def test_a_request_skips_targets_it_cannot_fit(fresh: tuple[Gateway, list[MockEngine], int]) -> None:
    gw, engines, _ = fresh
    post = lambda b: httpx.post(gw.url + "/v1/chat/completions", headers=KEY, json=b, timeout=10)  # noqa: E731
    assert post(body("chat", 100, 10)).status_code == 200  # fits the small window
    assert served(engines) == [1, 0, 0]
    assert post(body("chat", 8000, 10)).status_code == 200  # ~2,000 prompt tokens: medium
    assert served(engines) == [1, 1, 0]
    assert post(body("chat", 100, 50000)).status_code == 200  # max_tokens alone is past medium: large
    assert served(engines) == [1, 1, 1]


def test_a_request_that_fits_nothing_is_a_400_with_the_figures(
    fresh: tuple[Gateway, list[MockEngine], int],
) -> None:
    gw, engines, _ = fresh
    resp = httpx.post(gw.url + "/v1/chat/completions", headers=KEY, json=body("tiny", 4000, 500), timeout=10)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("This request needs about 15")
    assert (
        "+ 500 max_tokens), more than the largest context window of model `tiny` (1000 tokens)"
        in (error["message"])
    )
    # Anthropic's envelope on /v1/messages: invalid_request_error.
    resp = httpx.post(gw.url + "/v1/messages", headers=KEY, json=body("tiny", 4000, 500), timeout=10)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert served(engines) == [0, 0, 0]


def test_an_upstream_context_400_fails_over_to_a_larger_window(
    fresh: tuple[Gateway, list[MockEngine], int],
) -> None:
    gw, engines, _ = fresh
    small = engines[0]
    small.configure(fail_status=400, fail_body=VLLM_TOO_LONG)
    # The gateway's estimate fits the small window; the engine's tokenizer disagrees.
    resp = httpx.post(gw.url + "/v1/chat/completions", headers=KEY, json=body("chat", 100, 10), timeout=10)
    assert resp.status_code == 200
    assert served(engines) == [1, 1, 0]  # asked the small one, answered by the medium one
    # Without context_failover on the model, the engine's 400 is the answer, verbatim.
    resp = httpx.post(gw.url + "/v1/chat/completions", headers=KEY, json=body("strict", 100, 10), timeout=10)
    assert resp.status_code == 400
    assert resp.text == VLLM_TOO_LONG
    # Any other 400 is never retried, even where failover is allowed.
    small.configure(fail_status=400, fail_body='{"error":{"message":"bad temperature"}}')
    resp = httpx.post(gw.url + "/v1/chat/completions", headers=KEY, json=body("chat", 100, 10), timeout=10)
    assert resp.status_code == 400
    assert resp.json() == {"error": {"message": "bad temperature"}}
    assert served(engines)[1:] == [1, 0]


def test_dry_run_shows_the_context_decision(fresh: tuple[Gateway, list[MockEngine], int]) -> None:
    admin_port = fresh[2]

    def dry(request: dict[str, Any]) -> dict[str, Any]:
        resp = httpx.post(
            f"http://127.0.0.1:{admin_port}/admin/routing/dry-run", headers=KEY, json=request, timeout=10
        )
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    wait_until(
        lambda: httpx.get(f"http://127.0.0.1:{admin_port}/admin/whoami", headers=KEY).status_code == 200,
        what="admin API up",
    )
    answer = dry({"model": "chat", "body": body("chat", 8000, 10)})
    context = answer["context"]
    assert context["needed_tokens"] == answer["prompt_tokens_estimate"] + 10
    assert context["skipped"] == [{"backend": "small", "provider_model": "pm-small", "context_window": 1000}]
    assert context["refusal"] is None and context["context_failover"] is True
    context = dry({"model": "tiny", "body": body("tiny", 4000, 500)})["context"]
    assert context["refusal"].startswith("This request needs about")
