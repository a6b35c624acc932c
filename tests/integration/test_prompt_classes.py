"""Prompt classes through a running gateway: rules that name a class send code questions and maths
questions to their own engines and everything else along the chain, every worker agreeing; the dry run
shows the class and its score. Three mock engines stand for the classes' backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, free_port, wait_until

KEY = {"authorization": "Bearer sk-test-classes-0000001"}


def config(code: str, maths: str, general: str) -> str:
    out = [
        f'[[backends]]\nname = "{n}"\nurl = "{u}"\n\n[[provider_models]]\nname = "pm-{n}"\n'
        f'backends = [{{ backend = "{n}", model = "m" }}]\n'
        for n, u in (("code", code), ("maths", maths), ("general", general))
    ]
    out.append(
        """
[[prompt_classes]]
name = "code"
examples = [
  "write a python function that sorts a list of dictionaries",
  "fix this bug in my javascript code",
  "why does my SQL query return duplicate rows",
  "refactor this class to use dependency injection",
]
keywords = ["stack trace", "segfault"]

[[prompt_classes]]
name = "maths"
examples = [
  "solve the equation 3x + 5 = 20",
  "what is the integral of x squared",
  "prove that the square root of two is irrational",
  "compute the derivative of sin x",
]

[[models]]
name = "chat"
chain = ["pm-general"]

[[models.rules]]
name = "code questions"
when = { prompt_class = "code" }
route = ["pm-code"]
tag = "code"

[[models.rules]]
when = { prompt_class = ["maths"] }
route = ["pm-maths"]

[[roles]]
name = "user"
permissions = ["model/*", "config:read"]

[[principals]]
name = "alice"
roles = ["user"]

[[keys]]
name = "alice"
principal = "alice"
secret = "sk-test-classes-0000001"
"""
    )
    return "\n".join(out)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, list[MockEngine], int]]:
    tmp = tmp_path_factory.mktemp("classes")
    engines = [MockEngine(tmp) for _ in range(3)]
    admin_port = free_port()
    gw = Gateway(tmp, config(*(e.url for e in engines)), extra=("--admin-port", str(admin_port)))
    gw.wait_key_live(KEY["authorization"][7:])
    yield gw, engines, admin_port
    gw.stop()
    for e in engines:
        e.stop()


def served(engines: list[MockEngine]) -> list[int]:
    return [sum(r["path"] == "/v1/chat/completions" for r in e.requests()) for e in engines]


QUESTIONS = [
    ("can you write a python function to merge two sorted lists", [1, 0, 0]),
    ("what is the derivative of x cubed", [0, 1, 0]),
    ("my C program gives a segfault when it starts", [1, 0, 0]),
    ("recommend a good restaurant in Lisbon", [0, 0, 1]),
]


def test_rules_route_by_class_on_every_worker(env: tuple[Gateway, list[MockEngine], int]) -> None:
    gw, engines, _ = env
    for text, expected in QUESTIONS:
        for e in engines:
            e.reset()
        for _ in range(6):  # fresh connections: both workers answer, and agree
            with httpx.Client() as client:
                body = {"model": "chat", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
                resp = client.post(gw.url + "/v1/chat/completions", headers=KEY, json=body, timeout=10)
            assert resp.status_code == 200
        assert served(engines) == [6 * n for n in expected], text


def test_dry_run_shows_the_class_and_its_score(env: tuple[Gateway, list[MockEngine], int]) -> None:
    admin_port = env[2]

    def dry(text: str) -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": text}]}
        resp = httpx.post(
            f"http://127.0.0.1:{admin_port}/admin/routing/dry-run",
            headers=KEY,
            json={"model": "chat", "body": body},
            timeout=10,
        )
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    wait_until(
        lambda: httpx.get(f"http://127.0.0.1:{admin_port}/admin/whoami", headers=KEY).status_code == 200,
        what="admin API up",
    )
    answer = dry("can you write a python function to merge two sorted lists")
    assert answer["prompt_class"]["name"] == "code"
    assert 0 < answer["prompt_class"]["score"] <= 1
    assert set(answer["prompt_class"]["scores"]) == {"code", "maths"}
    assert answer["rule"]["name"] == "code questions" and answer["targets"][0]["backend"] == "code"
    answer = dry("recommend a good restaurant in Lisbon")
    assert answer["prompt_class"]["name"] is None and answer["rule"] is None
    assert dry("my program gives a segfault")["prompt_class"] == {
        "name": "code",
        "score": 1.0,
        "scores": {"code": 1.0, "maths": 0.0},
    }
