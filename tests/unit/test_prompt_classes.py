"""The prompt classes' fast tier: classes from examples and keywords, deterministic across processes,
the text a request is classified by, and the config checks of classes and the rules that name them."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from typing import Any

import orjson
import pytest

from gateway.controlplane.config.parser import parse_config
from gateway.errors import ConfigError
from gateway.routing.prompt_classes import Classifier, PromptClass, prompt_text

CLASSES = (
    PromptClass(
        "code",
        (
            "write a python function that sorts a list",
            "fix this bug in my javascript code",
            "why does my SQL query return duplicate rows",
        ),
        ("stack trace",),
    ),
    PromptClass(
        "math",
        ("solve the equation 3x + 5 = 20", "what is the integral of x squared", "compute the derivative"),
    ),
    PromptClass("chat", ("tell me a joke about cats", "recommend a good movie for tonight"), min_score=0.5),
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("can you write a function in python to merge two sorted lists", "code"),
        ("what's the derivative of x cubed", "math"),
        ("I got this Stack  Trace from my app", "code"),  # a keyword, whatever its case and spacing
        ("hello", None),  # nothing in common with any example
        ("any good movies this weekend?", None),  # chat's min_score is 0.5
    ],
)
def test_classes_from_examples_and_keywords(text: str, expected: str | None) -> None:
    assert Classifier(CLASSES).classify(text)[0] == expected


def test_the_same_prompt_gets_the_same_class_and_score_in_every_process() -> None:
    text = "please fix the bug in this python function that sorts"
    here = Classifier(CLASSES).classify(text)
    code = (
        "from tests.unit.test_prompt_classes import CLASSES; from gateway.routing.prompt_classes import "
        f"Classifier; print(Classifier(CLASSES).classify({text!r}))"
    )
    for seed in ("1", "2"):  # string hashing differs between these processes: the answer must not
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert out.stdout.strip() == repr(here)


def test_prompt_text_is_the_last_user_turn() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "solve"}, {"type": "image_url"}]},
        ]
    }
    assert prompt_text(orjson.dumps(chat)) == "solve"
    assert prompt_text(orjson.dumps({"prompt": "complete me"})) == "complete me"
    assert prompt_text(b"not json") == ""


BASE: dict[str, Any] = {
    "backends": [{"name": "a", "url": "http://127.0.0.1:1"}],
    "provider_models": [{"name": "pm", "backends": ["a"]}],
    "models": [
        {"name": "chat", "chain": ["pm"], "rules": [{"when": {"prompt_class": "code"}, "route": ["pm"]}]}
    ],
    "prompt_classes": [{"name": "code", "examples": ["fix my code"], "keywords": ["traceback"]}],
}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"models": [{**BASE["models"][0], "rules": [{"when": {"prompt_class": "x"}, "route": ["pm"]}]}]},
            "models[0].rules[0].when.prompt_class: unknown prompt class 'x'",
        ),
        ({"prompt_classes": [{"name": "code", "examples": []}]}, "prompt_classes[0].examples: must be"),
        (
            {"prompt_classes": [{"name": "code", "examples": ["a"], "min_score": 2}]},
            "prompt_classes[0].min_score: must be a number between 0 and 1",
        ),
        (
            {"prompt_classes": [{"name": "code", "examples": ["a"]}, {"name": "code", "examples": ["b"]}]},
            "prompt_classes[1].name: duplicate prompt class 'code'",
        ),
    ],
)
def test_class_config_is_checked(change: dict[str, Any], expected: str) -> None:
    data = {**copy.deepcopy(BASE), **change}
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    assert any(line.startswith(f"cfg.toml: {expected}") for line in info.value.message.splitlines())


def test_classes_round_trip_through_the_file_form() -> None:
    import tomllib

    from gateway.controlplane.config.writer import dump_config

    doc = parse_config(copy.deepcopy(BASE), "base")
    assert doc.prompt_classes[0].keywords == ("traceback",)
    assert parse_config(tomllib.loads(dump_config(doc)), "dumped") == doc
