"""Duplicate top-level members are refused, however spelled; the C counter agrees with the reference."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import BadRequest
from gateway.native import HAVE_NATIVE, top_members_c
from gateway.protocol.anthropic import parse_messages_request
from gateway.protocol.bounds import MAX_DEPTH
from gateway.protocol.json_members import count_top_members
from gateway.protocol.openai_request import inspect_json

DUPLICATES = [
    b'{"model":"a","model":"b"}',
    b'{"model":"allowed","\\u006dodel":"other"}',
    b'{"\\u006d\\u006f\\u0064\\u0065\\u006c":"x","messages":[],"model":"y"}',
    b'{"model":"a","stream":false,"stream":true}',
    b'{"model":"a","max_tokens":1,"max_tokens":100000}',
    b'{"model":"a","stream_options":{"include_usage":true},"stream_\\u006fptions":null}',
    b'{"model":"a","user":"u1","user":"u2"}',
    b'{ "model" : "a" ,\n "model" : "b" }',
]

UNIQUE = [
    b'{"model":"a"}',
    b'{"model":"a","messages":[{"role":"user","content":"x: {\\"model\\": 1}, [:]"}]}',
    b'{"model":"a","stream_options":{"include_usage":true,"x":{"y":1}},"extra":[1,{"a":2}]}',
    b'{"model":"a\\\\","b":"\\"","c":":"}',
    b"{}",
    b'{"model":"caf\xc3\xa9","k":"\\u00e9"}',
]


@pytest.mark.parametrize("body", DUPLICATES + UNIQUE)
def test_counters_agree_with_the_parser(body: bytes) -> None:
    doc = orjson.loads(body)
    written = count_top_members(body)
    assert (written != len(doc)) == (body in DUPLICATES)
    if HAVE_NATIVE:
        assert top_members_c(body) == written


@pytest.mark.parametrize(
    ("body", "members"),
    [
        (b'{"a":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}", 1),
        (b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", -1),
        (b'{"a":' + b'{"b":' * MAX_DEPTH + b"1" + b"}" * (MAX_DEPTH + 1), -1),
        (b'{"a":"' + b"[" * 500 + b'","b":2}', 2),  # brackets inside strings are not structure
    ],
)
def test_counters_bound_the_depth(body: bytes, members: int) -> None:
    """One depth limit for every path, found in the same pass that counts the members: -1 past it."""
    orjson.loads(body)
    assert count_top_members(body) == members
    if HAVE_NATIVE:
        assert top_members_c(body) == members


@pytest.mark.parametrize("body", DUPLICATES)
def test_openai_bodies_with_a_duplicate_member_are_refused(body: bytes) -> None:
    with pytest.raises(BadRequest, match="more than once"):
        inspect_json(body)
    if HAVE_NATIVE:
        with pytest.raises(BadRequest, match="more than once"):
            inspect_json(body, top_members_c)


def test_anthropic_bodies_with_a_duplicate_member_are_refused() -> None:
    body = b'{"model":"a","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"\\u006dodel":"b"}'
    with pytest.raises(BadRequest, match="more than once"):
        parse_messages_request(body)
    assert parse_messages_request(body.replace(b',"\\u006dodel":"b"', b"")).model == "a"


@pytest.mark.parametrize("body", [b for b in UNIQUE if b"model" in b])
def test_unique_members_pass(body: bytes) -> None:
    assert inspect_json(body).model == orjson.loads(body)["model"]
