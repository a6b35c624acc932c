"""The Messages request model: what it accepts, every bad field named, the estimate and error envelopes."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.errors import BadRequest
from gateway.protocol.anthropic import (
    IMAGE_TOKENS,
    Message,
    anthropic_error_body,
    anthropic_error_type,
    count_tokens_estimate,
    estimate_input_tokens,
    parse_messages_request,
    read_messages_head,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "translate"
ERRORS = json.loads((DATA / "anthropic_request_errors.json").read_text())


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def test_every_field_is_read() -> None:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        ],
        "stop_sequences": ["END"],
        "temperature": 1,
        "top_p": 0.5,
        "top_k": 0,
        "stream": True,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": "u-1"},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }
    req = parse_messages_request(orjson.dumps(body))
    assert (req.model, req.max_tokens, req.stream) == ("claude-sonnet-4-5", 1024, True)
    assert req.system == tuple(body["system"])
    assert req.messages[0] == Message("user", "Hi")
    assert req.messages[1] == Message("assistant", ({"type": "text", "text": "Hello"},))
    assert req.stop_sequences == ("END",)
    assert (req.temperature, req.top_p, req.top_k) == (1.0, 0.5, 0)
    assert req.tools == tuple(body["tools"])
    assert req.tool_choice == {"type": "auto"}
    assert req.user_id == "u-1"
    assert req.thinking == {"type": "enabled", "budget_tokens": 2048}


def test_defaults() -> None:
    req = parse_messages_request(b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]}')
    assert req.system is None and req.stop_sequences is None and req.tools is None and req.tool_choice is None
    assert (req.temperature, req.top_p, req.top_k, req.stream, req.user_id, req.thinking) == (
        None,
        None,
        None,
        False,
        None,
        None,
    )


def test_nulls_count_as_absent() -> None:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "metadata": None}
    body |= {"temperature": None, "stream": None, "system": None, "metadata": {"user_id": None}}
    assert parse_messages_request(orjson.dumps(body)).user_id is None


def test_what_a_passthrough_must_not_refuse() -> None:
    """Block types and fields the translators do not know still parse: the API grows faster than we do."""
    body = {
        "model": "m",
        "max_tokens": 5,
        "container": "container_011",
        "messages": [
            {"role": "user", "content": [{"type": "container_upload", "file_id": "file_1"}]},
            {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search"}]},
            {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]},
            {"role": "assistant", "content": ""},  # an empty final assistant turn: a prefill
        ],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "thinking": {"type": "disabled"},
    }
    req = parse_messages_request(orjson.dumps(body))
    assert req.messages[-1] == Message("assistant", "")


@pytest.mark.parametrize(
    "case",
    [c for c in ERRORS["cases"] if c["stage"] == "parse"],
    ids=lambda c: f"{c['param']}:{json.dumps(c['set'])[:60]}",
)
def test_bad_fields_are_named(case: dict[str, Any]) -> None:
    body = orjson.dumps(merged(ERRORS["base"], case["set"]))
    with pytest.raises(BadRequest) as info:
        parse_messages_request(body)
    assert info.value.param == case["param"]
    assert info.value.message.startswith(case["param"])
    envelope = orjson.loads(info.value.anthropic_body())
    assert envelope["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"", b"{nope", b"[1]", b'"x"', b"null"])
def test_not_an_object(body: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_messages_request(body)
    assert info.value.param is None


TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
# A request with every kind of content the estimate counts, and the characters it counts in each.
RICH = {
    "model": "m",
    "system": "12345678",  # 8
    "messages": [
        {"role": "user", "content": "abcd"},  # 4
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},  # 2
                {"type": "tool_use", "id": "t", "name": "get_weather", "input": {"a": 1}},  # 11 + 7
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {"type": "text", "text": "and?"},  # 4
            ],
        },
    ],
    "tools": [TOOL],
}
RICH_CHARS = 8 + 4 + 2 + len("get_weather") + len('{"a":1}') + len("sunny") + 4 + len(orjson.dumps(TOOL))


def test_count_tokens_estimate_follows_its_rule() -> None:
    assert count_tokens_estimate(orjson.dumps(RICH)) == math.ceil(RICH_CHARS / 4) + IMAGE_TOKENS


def test_parsing_and_estimating_leave_no_reference_cycle() -> None:
    """The request path runs these for every translated request: garbage only the cyclic collector can
    free would be left behind by each one (a nested function that called itself once was)."""
    body = orjson.dumps(RICH)
    request = orjson.dumps({**RICH, "max_tokens": 16})
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            estimate_input_tokens(parse_messages_request(request))
            count_tokens_estimate(body)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_count_tokens_estimate_is_at_least_one_and_checks_only_the_head() -> None:
    assert count_tokens_estimate(b'{"model":"m","messages":[{"role":"assistant","content":""}]}') == 1
    # Roles and blocks are the backend's business: counted where the rule knows them, never refused.
    assert count_tokens_estimate(b'{"model":"m","messages":[{"role":"robot","content":"abcd"}]}') == 1
    odd = b'{"model":"m","messages":[5,{"content":[{"type":"text","text":7},"x"]}],"tools":"none"}'
    assert count_tokens_estimate(odd) == 1
    with pytest.raises(BadRequest) as info:
        count_tokens_estimate(b'{"messages":[]}')
    assert info.value.param == "model"


def test_a_system_message_inside_messages_is_a_message() -> None:
    """Claude Code sends one for model names it does not know as an older Claude."""
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        ],
    }
    req = parse_messages_request(orjson.dumps(body))
    assert req.messages[1] == Message("system", ({"type": "text", "text": "# Environment"},))


HEAD_FIELDS = ("model", "max_tokens", "stream", "metadata", "metadata.user_id")


@pytest.mark.parametrize(
    "case",
    [c for c in ERRORS["cases"] if c["stage"] == "parse"],
    ids=lambda c: f"{c['param']}:{json.dumps(c['set'])[:60]}",
)
def test_the_head_refuses_only_what_the_gateway_reads(case: dict[str, Any]) -> None:
    """The request path checks model, max_tokens, stream and metadata.user_id; every other bad field
    is left to the backend (refused by the translators only, through the full parse above)."""
    body = orjson.dumps(merged(ERRORS["base"], case["set"]))
    if case["param"] in HEAD_FIELDS:
        with pytest.raises(BadRequest) as info:
            read_messages_head(body)
        assert info.value.param == case["param"]
        assert info.value.message.startswith(case["param"] + ": ")
    else:
        head = read_messages_head(body)
        assert head.doc == orjson.loads(body)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": None}, "model: Field required"),
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"max_tokens": "10"}, "max_tokens: Input should be a valid integer"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": 2**63 - 1}, "max_tokens: Input should be less than or equal to 2147483647"),
        ({"max_tokens": -(2**63)}, "max_tokens: Input should be greater than or equal to 1"),
        ({"stream": "yes"}, "stream: Input should be a valid boolean"),
    ],
)
def test_the_head_speaks_the_apis_wording(changes: dict[str, Any], message: str) -> None:
    """Clients match on Anthropic's own messages (pydantic's wording) to decide what to do next."""
    with pytest.raises(BadRequest) as info:
        read_messages_head(orjson.dumps(merged(ERRORS["base"], changes)))
    assert info.value.message == message
    assert orjson.loads(info.value.anthropic_body())["error"]["type"] == "invalid_request_error"


def test_the_head_of_what_claude_code_sends() -> None:
    """A request as Claude Code 2.1 sends it (recorded, prompts shortened): it passes the head, and the
    full parse accepts it too (a system turn inside messages, adaptive thinking, unknown fields)."""
    body = (DATA / "claude_code_request.json").read_bytes()
    head = read_messages_head(body)
    assert (head.model, head.max_tokens, head.stream) == ("claude-opus-4-5", 32000, True)
    req = parse_messages_request(body)
    assert [m.role for m in req.messages] == ["user", "system"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_types(status: int, kind: str) -> None:
    assert anthropic_error_type(status) == kind
    assert orjson.loads(anthropic_error_body(status, "nope")) == {
        "type": "error",
        "error": {"type": kind, "message": "nope"},
    }
