"""``gateway mock-engine --sim`` as a real process, over real HTTP: prefix hits and the answer's own blocks
reported as ``cached_tokens``, one SSE event per token with the usage chunk, continuous batching seen on
``/metrics``, and clients that go away freeing their sequences."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import MockEngine, wait_until

SYSTEM = "You are a careful assistant who answers questions about the history of castles. " * 4


def rendered(*messages: tuple[str, str]) -> bytes:
    """The spec's chat rendering, written out here rather than taken from the engine."""
    return ("".join(f"<|{role}|>\n{text}\n" for role, text in messages) + "<|assistant|>\n").encode()


def stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append({"done": True} if line == "data: [DONE]" else orjson.loads(line[6:]))
    return events


def gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
    }


def test_prefix_hits_streamed_tokens_and_the_answer_coming_back(tmp_path: Path) -> None:
    engine = MockEngine(tmp_path, "--sim", "--sim-step-ms", "1", "--sim-output-tokens", "24")
    try:
        turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Who built Harlech?"}]
        events = stream(
            engine.url, {"model": "m", "messages": turn1, "stream_options": {"include_usage": True}}
        )
        assert events[-1] == {"done": True}
        usage = events[-2]["usage"]
        assert events[-2]["choices"] == []
        pieces = [e["choices"][0]["delta"].get("content") for e in events[:-2]]
        tokens = [p for p in pieces if p]  # one event per token, after vLLM's role event and before finish
        assert len(tokens) == usage["completion_tokens"] == 24 and all(len(p) == 4 for p in tokens)
        prompt1 = rendered(("system", SYSTEM), ("user", "Who built Harlech?"))
        assert usage["prompt_tokens"] == -(-len(prompt1) // 4)
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        assert usage["total_tokens"] == usage["prompt_tokens"] + 24

        # Another question after the same system prompt: its full 16-token (64-byte) blocks are hits.
        other = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "And Conwy?"}]
        body = httpx.post(engine.url + "/v1/chat/completions", json={"messages": other}, timeout=30).json()
        shared = len(f"<|system|>\n{SYSTEM}\n<|user|>\n".encode())
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == shared // 64 * 16

        # The answer sent back as the assistant's turn: prompt and answer are one cached prefix.
        answer = "".join(tokens)
        turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "When?"}]
        body = httpx.post(engine.url + "/v1/chat/completions", json={"messages": turn2}, timeout=30).json()
        assert body["choices"][0]["message"]["content"]
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == (len(prompt1) + 96) // 64 * 16
        stats = engine.stats()["sim"]
        assert stats["requests"] == 3 and stats["success"] == 3
        assert stats["cached_tokens"] == shared // 64 * 16 + (len(prompt1) + 96) // 64 * 16
    finally:
        engine.stop()


def test_batching_shows_waiting_requests_and_disconnects_free_sequences(tmp_path: Path) -> None:
    # Slow steps and long answers, so the three requests are still in the engine while we look.
    engine = MockEngine(
        tmp_path, "--sim", "--sim-batch", "2", "--sim-step-ms", "50", "--sim-output-tokens", "400"
    )
    clients = [httpx.Client(timeout=30) for _ in range(3)]
    started = threading.Barrier(4)
    stop = threading.Event()

    def consume(client: httpx.Client, i: int) -> None:
        body = {"messages": [{"role": "user", "content": f"question {i}"}], "stream": True}
        with client.stream("POST", engine.url + "/v1/chat/completions", json=body) as r:
            started.wait()
            for _ in r.iter_bytes():
                if stop.is_set():
                    break
        client.close()

    threads = [threading.Thread(target=consume, args=(c, i)) for i, c in enumerate(clients)]
    try:
        for t in threads:
            t.start()
        started.wait(timeout=10)
        wanted = {"vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 1.0}
        wait_until(lambda: gauges(engine.url) == wanted, what="2 running, 1 waiting")
        # At least the one seen; two if both later requests arrived during the first one's step.
        assert engine.stats()["sim"]["max_waiting"] in (1, 2)
        stop.set()
        for t in threads:
            t.join(timeout=10)
        # Every sequence is freed once its client is gone: the waiting one too, when its turn comes.
        idle = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
        wait_until(lambda: gauges(engine.url) == idle, what="the engine idle again")
        sim = engine.stats()["sim"]
        assert sim["cancelled"] == 3 and sim["success"] == 0 and sim["cache_blocks_pinned"] == 0
    finally:
        stop.set()
        engine.stop()
