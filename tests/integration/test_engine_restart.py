"""An engine that restarts comes back with an empty prefix cache. Through real processes (two simulated
vLLM engines, a gateway with one proxy worker whose scraper reads them every 0.2 s): a conversation held
by one engine is matched there until that engine is stopped and started again on its port; the scraper
sees its prompt-token counter go down, and from then on the prefix index's expectation for it is nothing,
as the engine's own ``cached_tokens`` says."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import Gateway, MockEngine, free_port, wait_until

SIM = ("--sim", "--sim-step-ms", "1", "--sim-output-tokens", "8")
SYSTEM = "You are a careful assistant who answers questions about lighthouses. " * 20


def config(urls: list[str]) -> str:
    out = ""
    for name, url in zip("ab", urls, strict=True):
        out += (
            f'[[backends]]\nname = "{name}"\nurl = "{url}"\n\n'
            f'[[provider_models]]\nname = "pm-{name}"\nbackends = [{{ backend = "{name}", model = "m" }}]\n\n'
        )
    return out + (
        '[[models]]\nname = "chat"\nchain = ["pm-a"]\n\n[[models.rules]]\nroute = ["kv"]\n\n'
        '[[pools]]\nname = "kv"\npolicy = "cache_aware"\nmembers = ["pm-a", "pm-b"]\n\n'
        '[[roles]]\nname = "user"\npermissions = ["model/*"]\n\n'
        '[[roles]]\nname = "ops"\npermissions = ["config:read"]\n\n'
        '[[principals]]\nname = "alice"\nroles = ["user"]\n\n'
        '[[principals]]\nname = "ops"\nroles = ["ops"]\n'
    )


def counts(admin: str) -> tuple[float, dict[str, float]]:
    """Answers relayed, and per backend the prompt bytes the index expected it to hold, as the worker last
    published them (it counts a request's expectation before its answer)."""
    text = httpx.get(admin + "/metrics", timeout=5).text
    answers, matched = 0.0, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gateway_backend_answers_total":
                answers += s.value
            elif s.name == "gateway_backend_prefix_matched_bytes_total":
                matched[s.labels["backend"]] = s.value
    return answers, matched


def published(admin: str, answers: int) -> dict[str, float]:
    wait_until(lambda: counts(admin)[0] >= answers, what=f"{answers} answers in /metrics")
    return counts(admin)[1]


def test_a_restarted_engine_holds_nothing_of_what_it_was_sent(tmp_path: Path) -> None:
    engines = [MockEngine(tmp_path, *SIM), MockEngine(tmp_path, *SIM)]
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    gw = Gateway(
        tmp_path,
        config([e.url for e in engines]),
        workers=1,
        extra=("--admin-port", str(admin_port), "--engine-scrape-interval", "0.2"),
    )
    try:
        key, ops = gw.create_key("alice"), gw.create_key("ops")
        gw.wait_key_live(key)
        history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]

        def ask(question: str) -> dict[str, Any]:
            history.append({"role": "user", "content": question})
            resp = httpx.post(
                gw.url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": "chat", "messages": history, "max_tokens": 8},
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
            answer: dict[str, Any] = resp.json()
            history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            return answer

        def served() -> list[int]:
            return [e.stats()["sim"]["requests"] for e in engines]

        ask("Which is the oldest lighthouse still working?")
        held = served().index(1)
        second = ask("And the tallest?")
        assert served()[held] == 2  # the conversation stayed where its history is
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        before = published(admin, 2)
        assert before["ab"[held]] > 0  # the second turn was expected to hit

        # The engine's process ends and a new one starts on its port, its counters at zero.
        engines[held].stop()
        engines[held] = MockEngine(tmp_path, *SIM, port=engines[held].port)
        wait_until(lambda: "restarted" in gw.log.read_text(), what="the scraper seeing the restart")
        # The scraper logs the restart as it reads the engine and publishes its document at the end of
        # the round; the dry run reads that document, the worker its copy every 0.1 s.
        follow_up = {"messages": [*history, {"role": "user", "content": "Who keeps them lit today?"}]}

        def expected_now() -> int:
            resp = httpx.post(
                admin + "/admin/routing/dry-run",
                headers={"authorization": f"Bearer {ops}"},
                json={"model": "chat", "body": follow_up},
                timeout=5,
            )
            return int(resp.json()["prefix"]["matched_bytes"])

        wait_until(lambda: expected_now() == 0, what="the engine document's new epoch")
        time.sleep(0.5)  # five of the worker's polls of the engine document

        third = ask("Who keeps them lit today?")
        after = published(admin, 3)
        # Whichever engine took it, nothing was expected to be held: the restarted one holds nothing now,
        # the other never had the conversation; and the engine agrees.
        assert after == before, (before, after)
        assert third["usage"]["prompt_tokens_details"]["cached_tokens"] < len(SYSTEM) // 4 // 2
    finally:
        gw.stop()
        for e in engines:
            e.stop()
