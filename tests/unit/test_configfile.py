"""The TOML config file: parsing, defaults, one row per validation error, the example file, dump/parse."""

from __future__ import annotations

import copy
import math
import tomllib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.controlplane.config.parser import load_config, parse_config
from gateway.controlplane.config.specs import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_BYTE_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    BackendSpec,
    BudgetSpec,
    ConfigDoc,
    KeySpec,
    LimitsSpec,
    ModelSpec,
    PriceSpec,
    PrincipalSpec,
    ProviderBackend,
    ProviderModelSpec,
    RoleSpec,
)
from gateway.controlplane.config.values import MAX_BUDGET_COST, MAX_LIMIT, MAX_PRICE, parse_timestamp
from gateway.controlplane.config.writer import dump_config
from gateway.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "gateway.toml"

BASE: dict[str, Any] = {
    "backends": [
        {"name": "a", "url": "http://127.0.0.1:8001"},
        {"name": "b", "url": "https://b.example/v1/", "protocol": "anthropic", "api_key": "k"},
    ],
    "provider_models": [
        {"name": "llama", "backends": [{"backend": "a", "model": "meta/llama"}, "b"]},
        {"name": "qwen", "backends": [{"backend": "b"}]},
    ],
    "models": [{"name": "chat", "chain": ["llama", "qwen"], "aliases": ["gpt-4o-mini"]}],
    "roles": [{"name": "user", "permissions": ["model/chat", "usage:read"]}],
    "principals": [{"name": "alice", "roles": ["user"]}],
    "keys": [{"name": "alice-dev", "principal": "alice", "secret": "sk-gw-0123456789abcdef"}],
}


def test_base_document_parses_with_defaults() -> None:
    doc = parse_config(BASE, "base")
    assert doc.backends[0] == BackendSpec(
        "a",
        "http://127.0.0.1:8001",
        "openai",
        None,
        None,
        DEFAULT_CONNECT_TIMEOUT,
        DEFAULT_FIRST_BYTE_TIMEOUT,
        DEFAULT_READ_TIMEOUT,
    )
    assert doc.backends[1].url == "https://b.example/v1"  # trailing slash dropped
    assert doc.backends[1].api_key == "k"
    assert doc.provider_models[0].backends == (
        ProviderBackend("a", "meta/llama"),
        ProviderBackend("b", "llama"),
    )
    assert doc.provider_models[1].backends == (ProviderBackend("b", "qwen"),)
    assert doc.models == (ModelSpec("chat", ("llama", "qwen"), ("gpt-4o-mini",)),)
    assert doc.roles == (RoleSpec("user", ("model/chat", "usage:read")),)
    assert doc.principals == (PrincipalSpec("alice", ("user",)),)
    assert doc.keys == (KeySpec("alice-dev", "alice", "sk-gw-0123456789abcdef", None),)


def test_empty_document_is_valid() -> None:
    assert parse_config({}, "empty") == ConfigDoc()


def test_secrets_are_not_in_repr() -> None:
    doc = parse_config(BASE, "base")
    assert "sk-gw-0123456789abcdef" not in repr(doc)
    assert "api_key='k'" not in repr(doc)


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    """A mutation setting ``section[i].field`` (or a top-level key) on a copy of BASE."""

    def mutate(doc: dict[str, Any]) -> None:
        target: Any = doc
        parts = path.replace("]", "").replace("[", ".").split(".")
        for part in parts[:-1]:
            target = target[int(part)] if part.isdigit() else target[part]
        last = parts[-1]
        if value is _DELETE:
            del target[int(last) if last.isdigit() else last]
        elif last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


def _append(section: str, item: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        doc.setdefault(section, []).append(item)

    return mutate


_DELETE = object()

ERRORS: list[tuple[str, Mutation, str]] = [
    ("unknown section", _set("backend", []), "backend: unknown field"),
    ("section not array", _set("backends", {"name": "a"}), "backends: must be an array of tables"),
    ("entry not table", _set("roles[0]", "user"), "roles[0]: must be a table"),
    ("unknown field", _set("backends[0].urll", "x"), "backends[0].urll: unknown field"),
    ("missing name", _set("backends[0].name", _DELETE), "backends[0].name: is required"),
    ("name with space", _set("backends[0].name", "a b"), "backends[0].name: must be 1-200 characters"),
    ("name not string", _set("roles[0].name", 3), "roles[0].name: must be a string"),
    ("missing url", _set("backends[0].url", _DELETE), "backends[0].url: is required"),
    (
        "bad url scheme",
        _set("backends[1].url", "ftp://x"),
        "backends[1].url: must be an http:// or https:// URL",
    ),
    (
        "url without host",
        _set("backends[1].url", "http://"),
        "backends[1].url: must be an http:// or https:// URL",
    ),
    ("bad protocol", _set("backends[0].protocol", "grpc"), "backends[0].protocol: must be one of openai"),
    ("key and env", _set("backends[1].api_key_env", "X"), "backends[1].api_key_env: give either api_key"),
    (
        "bad env name",
        _set("backends[0].api_key_env", "1-X"),
        "backends[0].api_key_env: must be an environment",
    ),
    ("empty api key", _set("backends[1].api_key", ""), "backends[1].api_key: must be a non-empty string"),
    (
        "zero timeout",
        _set("backends[0].connect_timeout", 0),
        "backends[0].connect_timeout: must be a positive",
    ),
    ("bool timeout", _set("backends[0].read_timeout", True), "backends[0].read_timeout: must be a positive"),
    ("str timeout", _set("backends[0].first_byte_timeout", "5"), "backends[0].first_byte_timeout: must be"),
    ("inf timeout", _set("backends[0].read_timeout", float("inf")), "backends[0].read_timeout: must be"),
    ("duplicate backend", _set("backends[1].name", "a"), "backends[1].name: duplicate backend name 'a'"),
    (
        "pm no backends",
        _set("provider_models[0].backends", []),
        "provider_models[0].backends: must be a non-empty",
    ),
    (
        "pm missing backends",
        _set("provider_models[0].backends", _DELETE),
        "provider_models[0].backends: is required",
    ),
    (
        "pm entry bad",
        _set("provider_models[0].backends[0]", 5),
        "provider_models[0].backends[0]: must be a backend",
    ),
    (
        "pm entry unknown field",
        _set("provider_models[0].backends[0].weight", 2),
        "provider_models[0].backends[0].weight: unknown field",
    ),
    (
        "pm unknown backend",
        _set("provider_models[1].backends[0].backend", "zz"),
        "provider_models[1].backends[0].backend: unknown backend 'zz'",
    ),
    (
        "pm duplicate entry",
        _set("provider_models[0].backends[1]", {"backend": "a", "model": "meta/llama"}),
        "provider_models[0].backends[1]: duplicate entry",
    ),
    ("chain missing", _set("models[0].chain", _DELETE), "models[0].chain: is required"),
    ("chain empty", _set("models[0].chain", []), "models[0].chain: must not be empty"),
    ("chain not list", _set("models[0].chain", "llama"), "models[0].chain: must be an array of strings"),
    ("chain unknown", _set("models[0].chain[1]", "gpt"), "models[0].chain[1]: unknown provider model 'gpt'"),
    ("chain duplicate", _set("models[0].chain[1]", "llama"), "models[0].chain[1]: duplicate entry 'llama'"),
    (
        "alias collides model",
        _set("models[0].aliases[0]", "chat"),
        "models[0].aliases[0]: duplicate model name",
    ),
    (
        "alias collides provider",
        _set("models[0].aliases[0]", "qwen"),
        "models[0].aliases[0]: duplicate model name",
    ),
    (
        "model collides provider",
        _append("models", {"name": "llama", "chain": ["llama"]}),
        "models[1].name: duplicate model name or alias 'llama'",
    ),
    (
        "alias used twice",
        _append("models", {"name": "chat2", "chain": ["qwen"], "aliases": ["gpt-4o-mini"]}),
        "models[1].aliases[0]: duplicate model name or alias 'gpt-4o-mini'",
    ),
    (
        "permission empty model",
        _set("roles[0].permissions[0]", "model/"),
        "roles[0].permissions[0]: model/ needs",
    ),
    (
        "permission with space",
        _set("roles[0].permissions[0]", "model/a b"),
        "roles[0].permissions[0]: must be",
    ),
    ("duplicate role", _append("roles", {"name": "user"}), "roles[1].name: duplicate role name 'user'"),
    ("unknown role", _set("principals[0].roles[0]", "root"), "principals[0].roles[0]: unknown role 'root'"),
    (
        "duplicate principal",
        _append("principals", {"name": "alice"}),
        "principals[1].name: duplicate principal",
    ),
    ("key unknown principal", _set("keys[0].principal", "bob"), "keys[0].principal: unknown principal 'bob'"),
    ("key missing principal", _set("keys[0].principal", _DELETE), "keys[0].principal: is required"),
    ("key short secret", _set("keys[0].secret", "short"), "keys[0].secret: must be a string of at least 16"),
    (
        "duplicate key name",
        _append("keys", {"name": "alice-dev", "principal": "alice"}),
        "keys[1].name: duplicate key name 'alice-dev'",
    ),
    (
        "duplicate key secret",
        _append("keys", {"name": "k2", "principal": "alice", "secret": "sk-gw-0123456789abcdef"}),
        "keys[1].secret: duplicate key secret",
    ),
    ("bad expiry text", _set("keys[0].expires_at", "next week"), "keys[0].expires_at: must be an RFC 3339"),
    (
        "naive expiry",
        _set("keys[0].expires_at", "2027-01-01T00:00:00"),
        "keys[0].expires_at: must carry a UTC",
    ),
    ("negative expiry", _set("keys[0].expires_at", -5), "keys[0].expires_at: must be a non-negative"),
    ("bool expiry", _set("keys[0].expires_at", True), "keys[0].expires_at: must be an RFC 3339"),
    (
        "zero limit",
        _set("principals[0].limits", {"requests_per_minute": 0}),
        "principals[0].limits.requests_per_minute: must be a positive integer",
    ),
    (
        "negative limit",
        _set("principals[0].limits", {"tokens_per_minute": -5}),
        "principals[0].limits.tokens_per_minute: must be a positive integer",
    ),
    (
        "float limit",
        _set("keys[0].limits", {"concurrent_requests": 2.5}),
        "keys[0].limits.concurrent_requests: must be a positive integer",
    ),
    (
        "bool limit",
        _set("keys[0].limits", {"requests_per_minute": True}),
        "keys[0].limits.requests_per_minute: must be a positive integer",
    ),
    (
        "string limit",
        _set("keys[0].limits", {"requests_per_minute": "100"}),
        "keys[0].limits.requests_per_minute: must be a positive integer",
    ),
    (
        "huge limit",
        _set("principals[0].limits", {"tokens_per_minute": 10**13}),
        "principals[0].limits.tokens_per_minute: must be at most 1000000000000",
    ),
    (
        "unknown limit field",
        _set("principals[0].limits", {"rpm": 5}),
        "principals[0].limits.rpm: unknown field (expected one of: concurrent_requests, requests_per_minute",
    ),
    ("limits not table", _set("keys[0].limits", 100), "keys[0].limits: must be a table"),
    (
        "model limits not table",
        _set("principals[0].model_limits", ["chat"]),
        "principals[0].model_limits: must be a table of model names",
    ),
    (
        "model limit bad value",
        _set("principals[0].model_limits", {"chat": {"requests_per_minute": 0}}),
        "principals[0].model_limits.chat.requests_per_minute: must be a positive integer",
    ),
    (
        "model limit unknown field",
        _set("principals[0].model_limits", {"chat": {"burst": 3}}),
        "principals[0].model_limits.chat.burst: unknown field",
    ),
    (
        "model limit not table",
        _set("principals[0].model_limits", {"chat": 10}),
        "principals[0].model_limits.chat: must be a table",
    ),
    (
        "model limit unknown model",
        _set("principals[0].model_limits", {"meta/llama": {"requests_per_minute": 1}}),
        "principals[0].model_limits.\"meta/llama\": unknown model name 'meta/llama'",
    ),
    (
        "model limit bad name",
        _set("principals[0].model_limits", {"a b": {"requests_per_minute": 1}}),
        'principals[0].model_limits."a b": model name must be 1-200 characters',
    ),
    # --- prices ---
    ("price not table", _set("models[0].price", 0.15), "models[0].price: must be a table such as"),
    (
        "price missing output",
        _set("models[0].price", {"input": 0.15}),
        "models[0].price.output: is required",
    ),
    (
        "pm price missing input",
        _set("provider_models[1].price", {"output": 0.6}),
        "provider_models[1].price.input: is required",
    ),
    (
        "negative price",
        _set("models[0].price", {"input": -0.01, "output": 0.6}),
        "models[0].price.input: must be a non-negative number (currency units per million tokens)",
    ),
    (
        "nan price",
        _set("provider_models[0].price", {"input": 0.1, "output": math.nan}),
        "provider_models[0].price.output: must be a non-negative number",
    ),
    (
        "inf cached price",
        _set("models[0].price", {"input": 0.1, "output": 0.2, "cached_input": math.inf}),
        "models[0].price.cached_input: must be a non-negative number",
    ),
    (
        "negative cached price",
        _set("models[0].price", {"input": 0.1, "output": 0.2, "cached_input": -1}),
        "models[0].price.cached_input: must be a non-negative number",
    ),
    (
        "price too large",
        _set("models[0].price", {"input": MAX_PRICE + 0.5, "output": 0.6}),
        "models[0].price.input: must be at most 1000000",
    ),
    (
        "bool price",
        _set("models[0].price", {"input": True, "output": 0.6}),
        "models[0].price.input: must be a non-negative number",
    ),
    (
        "string price",
        _set("provider_models[1].price", {"input": 0.1, "output": "0.6"}),
        "provider_models[1].price.output: must be a non-negative number",
    ),
    (
        "unknown price field",
        _set("models[0].price", {"input": 0.1, "output": 0.2, "cached": 0.05}),
        "models[0].price.cached: unknown field (expected one of: cached_input, input, output)",
    ),
    # --- budgets ---
    ("budget not table", _set("principals[0].budget", 100), "principals[0].budget: must be a table such as"),
    (
        "budget unknown period",
        _set("principals[0].budget", {"period": "week", "tokens": 1}),
        'principals[0].budget.period: must be "day", "month", or a fixed window such as "6h" or "7d"',
    ),
    (
        "budget zero period",
        _set("principals[0].budget", {"period": "0h", "tokens": 1}),
        'principals[0].budget.period: must be "day", "month"',
    ),
    (
        "budget period too short",
        _set("principals[0].budget", {"period": "30s", "tokens": 1}),
        "principals[0].budget.period: a fixed window must be at least 60 seconds long",
    ),
    (
        "budget period not string",
        _set("principals[0].budget", {"period": 30, "cost": 1.0}),
        'principals[0].budget.period: must be "day", "month"',
    ),
    (
        "budget without limits",
        _set("principals[0].budget", {"period": "day"}),
        "principals[0].budget: needs tokens, cost, or both",
    ),
    ("budget empty", _set("principals[0].budget", {}), "principals[0].budget: needs tokens, cost, or both"),
    (
        "budget zero cost",
        _set("principals[0].budget", {"cost": 0}),
        "principals[0].budget.cost: must be a positive number (currency units)",
    ),
    (
        "budget negative cost",
        _set("principals[0].budget", {"cost": -5.0}),
        "principals[0].budget.cost: must be a positive number",
    ),
    (
        "budget bool cost",
        _set("principals[0].budget", {"cost": True}),
        "principals[0].budget.cost: must be a positive number",
    ),
    (
        "budget nan cost",
        _set("principals[0].budget", {"cost": math.nan}),
        "principals[0].budget.cost: must be a positive number",
    ),
    (
        "budget string cost",
        _set("principals[0].budget", {"cost": "50"}),
        "principals[0].budget.cost: must be a positive number",
    ),
    (
        "budget cost too large",
        _set("principals[0].budget", {"cost": MAX_BUDGET_COST + 1}),
        "principals[0].budget.cost: must be at most 1000000000",
    ),
    (
        "budget zero tokens",
        _set("principals[0].budget", {"tokens": 0}),
        "principals[0].budget.tokens: must be a positive integer",
    ),
    (
        "budget fractional tokens",
        _set("principals[0].budget", {"tokens": 1.5}),
        "principals[0].budget.tokens: must be a positive integer",
    ),
    (
        "budget bool tokens",
        _set("principals[0].budget", {"tokens": True}),
        "principals[0].budget.tokens: must be a positive integer",
    ),
    (
        "budget tokens too large",
        _set("principals[0].budget", {"tokens": MAX_LIMIT + 1}),
        "principals[0].budget.tokens: must be at most 1000000000000",
    ),
    (
        "responses_api not a bool",
        _set("backends[0].responses_api", "yes"),
        "backends[0].responses_api: must be true or false",
    ),
    (
        "responses_api on an anthropic backend",
        _set("backends[1].responses_api", True),
        "backends[1].responses_api: only an openai backend can serve the Responses API itself",
    ),
    (
        "kv_events not an endpoint",
        _set("backends[0].kv_events", "http://127.0.0.1:5557"),
        "backends[0].kv_events: must be a ZeroMQ endpoint to connect to, tcp://HOST:PORT",
    ),
    (
        "kv_events a wildcard to bind",
        _set("backends[0].kv_events", "tcp://*:5557"),
        "backends[0].kv_events: must be a ZeroMQ endpoint to connect to",
    ),
    (
        "kv_events port out of range",
        _set("backends[0].kv_events", "tcp://127.0.0.1:70000"),
        "backends[0].kv_events: must be a ZeroMQ endpoint to connect to",
    ),
    (
        "kv_events on an anthropic backend",
        _set("backends[1].kv_events", "tcp://10.0.0.1:5557"),
        "backends[1].kv_events: only an openai backend (a vLLM engine) publishes KV events",
    ),
    (
        "budget unknown field",
        _set("principals[0].budget", {"tokens": 1, "requests": 5}),
        "principals[0].budget.requests: unknown field (expected one of: alerts, cost, period, tokens)",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [row[1:] for row in ERRORS], ids=[row[0] for row in ERRORS])
def test_validation_error(mutate: Mutation, expected: str) -> None:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    lines = info.value.message.splitlines()
    assert any(line.startswith(f"cfg.toml: {expected}") for line in lines), lines


LIMITS_100 = {"requests_per_minute": 100, "tokens_per_minute": 20000, "concurrent_requests": 8}


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("principals[0].limits", LIMITS_100, PrincipalSpec("alice", ("user",), LimitsSpec(100, 20000, 8))),
        (
            "principals[0].limits",
            {"tokens_per_minute": 5},
            PrincipalSpec("alice", ("user",), LimitsSpec(None, 5)),
        ),
        ("principals[0].limits", {}, PrincipalSpec("alice", ("user",))),  # an empty table sets nothing
        (
            # Any name a client calls: frontend model, alias, provider model; ordered by name.
            "principals[0].model_limits",
            {"qwen": {"concurrent_requests": 2}, "chat": {"requests_per_minute": 10}, "gpt-4o-mini": {}},
            PrincipalSpec(
                "alice", ("user",), None, (("chat", LimitsSpec(10)), ("qwen", LimitsSpec(None, None, 2)))
            ),
        ),
        (
            "keys[0].limits",
            {"concurrent_requests": 1},
            KeySpec("alice-dev", "alice", "sk-gw-0123456789abcdef", None, LimitsSpec(None, None, 1)),
        ),
    ],
)
def test_limits(path: str, value: dict[str, Any], expected: PrincipalSpec | KeySpec) -> None:
    data = copy.deepcopy(BASE)
    _set(path, value)(data)
    doc = parse_config(data, "cfg.toml")
    assert (doc.principals[0] if isinstance(expected, PrincipalSpec) else doc.keys[0]) == expected


def test_prices_and_budgets_parse_with_defaults() -> None:
    data = copy.deepcopy(BASE)
    data["provider_models"][0]["price"] = {"input": 1, "output": 2}
    data["models"][0]["price"] = {"input": 0.15, "output": 0.6, "cached_input": 0.075}
    data["principals"][0]["budget"] = {"tokens": 1_000_000}
    data["principals"].append({"name": "bob", "budget": {"period": "7d", "cost": 50}})
    data["principals"].append({"name": "carol", "budget": {"period": "day", "tokens": 5, "cost": 0.5}})
    doc = parse_config(data, "cfg.toml")
    assert [pm.price for pm in doc.provider_models] == [PriceSpec(1.0, 2.0, None), None]
    assert doc.models[0].price == PriceSpec(0.15, 0.6, 0.075)
    assert [pr.budgets for pr in doc.principals] == [
        (BudgetSpec("month", 1_000_000, None),),  # the period defaults to a calendar month
        (BudgetSpec("7d", None, 50.0),),
        (BudgetSpec("day", 5, 0.5),),
    ]
    # Integers in the file become floats (prices, costs); tokens stay integers.
    pm_price = doc.provider_models[0].price
    assert pm_price is not None and type(pm_price.input) is float and type(pm_price.output) is float
    assert type(doc.principals[1].budgets[0].cost) is float
    # Without a price or budget, nothing is set.
    assert parse_config(BASE, "base").models[0].price is None
    assert parse_config(BASE, "base").principals[0].budgets == ()


def test_price_as_list_resolves_the_cached_price() -> None:
    assert PriceSpec(0.15, 0.6).as_list() == [0.15, 0.6, 0.15]
    assert PriceSpec(0.15, 0.6, 0.075).as_list() == [0.15, 0.6, 0.075]
    assert PriceSpec(0.15, 0.6, 0.0).as_list() == [0.15, 0.6, 0.0]  # free cached tokens are not "unset"


def test_price_and_budget_bounds_are_inclusive() -> None:
    data = copy.deepcopy(BASE)
    data["models"][0]["price"] = {"input": 0, "output": MAX_PRICE, "cached_input": 0.0}
    data["principals"][0]["budget"] = {"period": "60s", "tokens": MAX_LIMIT, "cost": MAX_BUDGET_COST}
    doc = parse_config(data, "cfg.toml")
    assert doc.models[0].price == PriceSpec(0.0, 1_000_000.0, 0.0)
    assert doc.principals[0].budgets == (BudgetSpec("60s", 10**12, 1e9),)


@pytest.mark.parametrize(
    ("path", "value", "place"),
    [
        # The provider model is dropped but stays declared: the chain naming it is not reported too.
        ("provider_models[1].price", {"input": -1, "output": 1}, "provider_models[1].price.input"),
        # The model is dropped but its name and aliases stay declared for the model limits naming them.
        ("models[0].price", {"input": 1}, "models[0].price.output"),
        # The principal is dropped but stays declared for the key naming it.
        ("principals[0].budget", {"period": "week", "tokens": 1}, "principals[0].budget.period"),
    ],
)
def test_bad_price_or_budget_is_reported_once(path: str, value: dict[str, Any], place: str) -> None:
    data = copy.deepcopy(BASE)
    data["principals"][0]["model_limits"] = {"gpt-4o-mini": {"requests_per_minute": 1}}
    _set(path, value)(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    assert info.value.param == place
    assert len(info.value.message.splitlines()) == 1, info.value.message


def test_every_problem_is_reported_and_first_place_is_param() -> None:
    data = copy.deepcopy(BASE)
    data["backends"][0]["url"] = "nope"
    data["principals"][0]["roles"] = ["root"]
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x")
    assert info.value.param == "backends[0].url"
    assert len(info.value.message.splitlines()) == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2027-01-01T00:00:00Z", 1798761600.0),
        ("2027-01-01T01:00:00+01:00", 1798761600.0),
        (1798761600, 1798761600.0),
        (1798761600.5, 1798761600.5),
    ],
)
def test_parse_timestamp(value: object, expected: float) -> None:
    assert parse_timestamp(value) == expected


def test_toml_datetime_expiry(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[principals]]\nname = "p"\n'
        '[[keys]]\nname = "k"\nprincipal = "p"\nexpires_at = 2027-01-01T00:00:00Z\n'
    )
    assert load_config(path).keys[0].expires_at == 1798761600.0


def test_load_config_reports_toml_syntax_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[backends]\n")
    with pytest.raises(ConfigError, match=r"bad.toml:1:11: invalid TOML: Expected"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"missing.toml: cannot read"):
        load_config(tmp_path / "missing.toml")


def test_example_file_loads() -> None:
    doc = load_config(EXAMPLE)
    assert {b.name for b in doc.backends} == {"vllm-a", "vllm-b", "sglang-a", "anthropic"}
    assert doc.models[0].aliases == ("gpt-4o-mini", "default")
    assert next(b for b in doc.backends if b.name == "sglang-a").url == "http://10.0.0.21:30000"
    assert [k.name for k in doc.keys] == ["alice-laptop", "batch-nightly"]
    alice = next(p for p in doc.principals if p.name == "alice")
    assert alice.limits == LimitsSpec(60, 100_000, 4)
    assert alice.model_limits == (("chat", LimitsSpec(requests_per_minute=30)),)
    assert doc.keys[1].limits == LimitsSpec(concurrent_requests=8)


def test_dump_then_parse_round_trips() -> None:
    doc = load_config(EXAMPLE)
    weird = BackendSpec('q"uo\\te', "http://h", api_key="line\nbreak\x01\x7f", read_timeout=0.5)
    native = BackendSpec("native", "http://n", responses_api=True, kv_events="tcp://[::1]:5557")
    # Model names that need quoting as TOML keys, and every combination of limit fields.
    limited = PrincipalSpec(
        "limited",
        (),
        LimitsSpec(1, 2, 3),
        (("claude-haiku", LimitsSpec(None, 7)), ("default", LimitsSpec(None, None, 1))),
    )
    odd = ModelSpec("meta/llama.3", ("qwen2.5-7b",), ('q"x',))
    quoted = PrincipalSpec("quoted", (), None, (("meta/llama.3", LimitsSpec(5)), ('q"x', LimitsSpec(6))))
    key = KeySpec("limited-key", "limited", "sk-gw-limited-0000000", None, LimitsSpec(tokens_per_minute=9))
    doc = ConfigDoc(
        backends=(*doc.backends, weird, native),
        provider_models=doc.provider_models,
        models=(*doc.models, odd),
        roles=doc.roles,
        principals=(*doc.principals, limited, quoted),
        keys=(*doc.keys, key),
        pools=doc.pools,
        fallback=doc.fallback,
    )
    text = dump_config(doc, "header line\nsecond")
    assert text.startswith("# header line\n# second\n")
    assert parse_config(tomllib.loads(text), "dumped") == doc


def test_dump_then_parse_round_trips_prices_and_budgets() -> None:
    data = copy.deepcopy(BASE)
    data["principals"].append({"name": "bob"})
    base = parse_config(data, "base")
    llama, qwen = base.provider_models
    doc = ConfigDoc(
        backends=base.backends,
        provider_models=(
            ProviderModelSpec(llama.name, llama.backends, PriceSpec(1e-07, MAX_PRICE, 0.0)),
            ProviderModelSpec(qwen.name, qwen.backends, PriceSpec(0.1 + 0.2, 3.0)),
        ),
        models=(replace(base.models[0], price=PriceSpec(0.15, 0.6, 0.075)),),
        roles=base.roles,
        principals=(
            replace(base.principals[0], budgets=(BudgetSpec("month", 1_000_000),)),
            PrincipalSpec("bob", (), LimitsSpec(5), (), (BudgetSpec("90s", 7, 0.1 + 0.2),)),
        ),
        keys=base.keys,
    )
    text = dump_config(doc)
    lines = text.splitlines()
    assert "price = { input = 0.15, output = 0.6, cached_input = 0.075 }" in lines
    assert "price = { input = 0.30000000000000004, output = 3.0 }" in lines  # no cached_input: unset
    assert 'budget = { period = "month", tokens = 1000000 }' in lines
    assert 'budget = { period = "90s", tokens = 7, cost = 0.30000000000000004 }' in lines
    assert parse_config(tomllib.loads(text), "dumped") == doc


KEY_RULE_ERRORS = [
    ({"allow_ips": "10.0.0.0/8"}, "keys[0].allow_ips: must be a non-empty array of at most 256 CIDRs"),
    ({"allow_ips": ["10.0.0.300/8"]}, "keys[0].allow_ips[0]: not a network"),
    ({"allow_ips": ["10.1.2.3/8"]}, "keys[0].allow_ips[0]: not a network: 10.1.2.3/8 has host bits set"),
    ({"allow_ips": [7]}, 'keys[0].allow_ips[0]: must be a string such as "192.0.2.0/24"'),
    ({"models": []}, "keys[0].models: must not be empty"),
    ({"models": ["ghost"]}, "keys[0].models[0]: unknown model name 'ghost'"),
]


@pytest.mark.parametrize(("fields", "expected"), KEY_RULE_ERRORS)
def test_key_rules_are_checked(fields: dict[str, Any], expected: str) -> None:
    data = copy.deepcopy(BASE)
    data["keys"][0].update(fields)
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    assert any(line.startswith(f"cfg.toml: {expected}") for line in info.value.message.splitlines())


def test_key_rules_parse_normalised_and_round_trip() -> None:
    data = copy.deepcopy(BASE)
    data["keys"][0].update({"allow_ips": ["10.0.0.0/8", "2001:DB8::/32", "192.0.2.1"], "models": ["llama"]})
    doc = parse_config(data, "base")
    assert doc.keys[0].allow_ips == ("10.0.0.0/8", "2001:db8::/32", "192.0.2.1/32")
    assert doc.keys[0].models == ("llama",)
    assert parse_config(tomllib.loads(dump_config(doc)), "dumped") == doc


def test_budget_alerts_parse_sorted_and_round_trip() -> None:
    data = copy.deepcopy(BASE)
    data["principals"][0]["budget"] = {"period": "day", "tokens": 10, "alerts": [1.0, 0.5]}
    doc = parse_config(data, "base")
    assert doc.principals[0].budgets == (BudgetSpec("day", 10, None, (0.5, 1.0)),)
    assert parse_config(tomllib.loads(dump_config(doc)), "dumped") == doc
    for bad, why in (([0], "must be an array of fractions"), ([0.5, 0.5], "lists a threshold twice")):
        data["principals"][0]["budget"]["alerts"] = bad
        with pytest.raises(ConfigError, match=why):
            parse_config(data, "cfg.toml")


def test_several_budgets_of_principals_and_keys_parse_in_order_and_round_trip() -> None:
    data = copy.deepcopy(BASE)
    # The single form is one of them, and comes first.
    data["principals"][0]["budget"] = {"period": "month", "cost": 300, "alerts": [0.8, 1.0]}
    data["principals"][0]["budgets"] = [{"period": "day", "cost": 20}, {"period": "6h", "tokens": 5000}]
    data["keys"][0]["budgets"] = [{"period": "day", "tokens": 1000, "alerts": [0.5]}]
    doc = parse_config(data, "cfg.toml")
    assert doc.principals[0].budgets == (
        BudgetSpec("month", None, 300.0, (0.8, 1.0)),
        BudgetSpec("day", None, 20.0),
        BudgetSpec("6h", 5000, None),
    )
    assert doc.keys[0].budgets == (BudgetSpec("day", 1000, None, (0.5,)),)
    text = dump_config(doc)
    assert (
        'budgets = [{ period = "month", cost = 300.0, alerts = [0.8, 1.0] }, '
        '{ period = "day", cost = 20.0 }, { period = "6h", tokens = 5000 }]'
    ) in text.splitlines()
    assert 'budget = { period = "day", tokens = 1000, alerts = [0.5] }' in text.splitlines()  # one: as before
    assert parse_config(tomllib.loads(text), "dumped") == doc


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"budget": {"period": "day", "tokens": 1}, "budgets": [{"period": "day", "cost": 2}]},
            "principals[0].budgets[0].period: another budget has the period 'day' (principals[0].budget)",
        ),
        (
            {"budgets": [{"period": p, "tokens": 1} for p in ("day", "month", "1h", "2h", "3h")]},
            "principals[0].budgets: at most 4 budgets (one per period)",
        ),
        ({"budgets": {"period": "day"}}, "principals[0].budgets: must be an array of budget tables"),
        ({"budgets": [{"period": "day"}]}, "principals[0].budgets[0]: needs tokens, cost, or both"),
        ({"budgets": [{"period": "week", "cost": 1}]}, "principals[0].budgets[0].period: must be"),
    ],
)
def test_bad_budgets_are_reported_by_place(fields: dict[str, Any], expected: str) -> None:
    data = copy.deepcopy(BASE)
    data["principals"][0].update(fields)
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    assert any(line.startswith(f"cfg.toml: {expected}") for line in info.value.message.splitlines())
    data = copy.deepcopy(BASE)
    data["keys"][0].update(fields)  # a key's budgets obey the same rules
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    assert any(
        line.startswith(f"cfg.toml: {expected.replace('principals[0]', 'keys[0]')}")
        for line in info.value.message.splitlines()
    )


def test_a_credentials_row_fields_are_not_backend_fields() -> None:
    data = copy.deepcopy(BASE)
    data["backends"][0]["credential_of"] = "b"
    with pytest.raises(ConfigError, match=r"backends\[0\]\.credential_of: unknown field"):
        parse_config(data, "cfg.toml")
    data = copy.deepcopy(BASE)
    data["backends"][1]["credentials"] = [{"name": "k", "api_key": "x"}]  # b has its own api_key
    with pytest.raises(ConfigError, match="give either the backend's own api_key"):
        parse_config(data, "cfg.toml")
