"""Routing by engines' KV-cache events, with real processes: two simulated engines tokenizing with a tiny
model and publishing vLLM's KV events over ZeroMQ; a gateway whose ``cache_aware`` pool has that model's
``tokenizer`` and whose backends have ``kv_events`` (the exact index), and a second gateway without either
(the approximate index alone). The exact gateway follows a conversation to the engine that holds it, even
when another host's traffic put it there; after ``/mock/reset-cache`` on that engine it stops preferring
it, while the approximate gateway still sends the conversation there and the engine reports a miss."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import MockEngine, free_port, wait_until
from tests.fixtures.tiny_tokenizer import write_tiny_model
from tests.integration.test_routing import Env, backend

SYSTEM = "You are a careful assistant who answers questions about the history of castles. " * 10


def pool(name: str, tokenizer: Path | None) -> str:
    return (
        f'[[pools]]\nname = "{name}"\npolicy = "cache_aware"\nmembers = ["pm-a", "pm-b"]\nload_cost = 64\n'
        + (f'tokenizer = "{tokenizer}"\n' if tokenizer else "")
        + f'\n[[models]]\nname = "chat"\nchain = ["pm-a"]\n\n[[models.rules]]\nroute = ["{name}"]\n\n'
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, MockEngine], Env, Env]]:
    tmp = tmp_path_factory.mktemp("kv-events")
    model = write_tiny_model(tmp / "tiny")
    endpoints = {n: f"tcp://127.0.0.1:{free_port()}" for n in "ab"}
    engines = {
        n: MockEngine(
            tmp,
            *("--sim", "--sim-step-ms", "1", "--sim-output-tokens", "12"),
            *("--sim-tokenizer", str(model), "--sim-kv-events", endpoints[n]),
        )
        for n in "ab"
    }
    exact_config = "".join(
        backend(n, e.url, f'kv_events = "{endpoints[n]}"') for n, e in engines.items()
    ) + pool("kv", model)
    approx_config = "".join(backend(n, e.url) for n, e in engines.items()) + pool("kv", None)
    exact = approx = None
    try:
        exact = Env(tmp, exact_config, workers=1)
        approx = Env(tmp, approx_config, workers=1)
        yield engines, exact, approx
    finally:
        for env in (exact, approx):
            if env is not None:
                env.gw.stop()
        for e in engines.values():
            e.stop()


def metric(env: Env, name: str, backend: str | None = None) -> float:
    label = f'{name}{{backend="{backend}"}} ' if backend else f"{name} "
    for line in env.admin("GET", "/metrics").text.splitlines():
        if line.startswith(label):
            return float(line.split()[-1])
    return 0.0


def ask(env: Env, messages: list[dict[str, str]]) -> dict[str, Any]:
    resp = env.post(messages=messages, max_tokens=12)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def served(engines: dict[str, MockEngine]) -> dict[str, int]:
    return {n: e.stats()["sim"]["requests"] for n, e in engines.items()}


def test_the_exact_index_follows_the_engines_cache_and_the_approximate_one_does_not(
    setup: tuple[dict[str, MockEngine], Env, Env],
) -> None:
    engines, exact, approx = setup
    for n in "ab":
        wait_until(
            lambda n=n: metric(exact, "gateway_backend_kv_events_connected", n) == 1, what="subscribed"
        )
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Who built Harlech?"}]

    # The approximate gateway sends the first turn somewhere: x. The exact gateway never saw it, but x's
    # events tell it that x holds the conversation, so the next turn goes there too, as a hit.
    before = served(engines)
    answer = ask(approx, turn1)["choices"][0]["message"]["content"]
    x = next(n for n, count in served(engines).items() if count > before[n])
    y = "b" if x == "a" else "a"
    wait_until(lambda: metric(exact, "gateway_backend_kv_blocks", x) > 0, what="x's events mirrored")
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "When?"}]
    before = served(engines)
    second = ask(exact, turn2)
    assert served(engines)[x] == before[x] + 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert metric(exact, "gateway_prefix_exact_matches_total") >= 1

    # Another host's traffic puts the conversation on y as well (sent to y directly).
    direct = httpx.post(engines[y].url + "/v1/chat/completions", json={"messages": turn2}, timeout=30)
    assert direct.status_code == 200
    wait_until(lambda: metric(exact, "gateway_backend_kv_blocks", y) > 0, what="y's events mirrored")

    # x restarts: its cache is gone, and its AllBlocksCleared clears its exact pairs.
    httpx.post(engines[x].url + "/mock/reset-cache", timeout=5).raise_for_status()
    wait_until(lambda: metric(exact, "gateway_backend_kv_blocks", x) == 0, what="x's pairs cleared")
    turn3 = [*turn2, {"role": "assistant", "content": second["choices"][0]["message"]["content"]}]
    turn3.append({"role": "user", "content": "And Conwy?"})
    before = served(engines)
    hit = ask(exact, turn3)
    assert served(engines)[y] == before[y] + 1  # not x any more: y holds the conversation
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    # The approximate index still says x was sent it: x gets the turn, and misses.
    before = served(engines)
    miss = ask(approx, turn3)
    assert served(engines)[x] == before[x] + 1
    assert miss["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metric(exact, "gateway_backend_kv_event_gaps_total", x) == 0
    assert metric(exact, "gateway_backend_kv_events_total", x) > 0
    families = {f.name for f in text_string_to_metric_families(exact.admin("GET", "/metrics").text)}
    assert {"gateway_backend_kv_blocks", "gateway_prefix_exact_matches"} <= families

    # x goes away: the disconnect forgets what its events had said (the miss just cached turn 3 there).
    wait_until(lambda: metric(exact, "gateway_backend_kv_blocks", x) > 0, what="x's events mirrored again")
    engines[x].stop()
    wait_until(lambda: metric(exact, "gateway_backend_kv_events_connected", x) == 0, what="x disconnected")
    assert metric(exact, "gateway_backend_kv_blocks", x) == 0
