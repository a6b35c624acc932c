"""Usage parsing from a response tail: recorded transcripts, edge cases, the C parser against the Python
reference on arbitrary and mutated input, and the tail buffers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.protocol import usage as ref
from gateway.protocol.usage import MAX_DEPTH, MAX_OBJECT_ATTEMPTS, TOKEN_LIMIT, Usage

DATA = Path(__file__).resolve().parent.parent / "data" / "usage"
EXPECTED: dict[str, dict[str, int] | None] = json.loads((DATA / "expected.json").read_text())
TRANSCRIPTS = {name: (DATA / name).read_bytes() for name in sorted(EXPECTED)}
TAIL = native.DEFAULT_TAIL_CAPACITY

needs_c = pytest.mark.skipif(not native.HAVE_NATIVE, reason="gateway._gateway_native is not built")
Parser = Callable[[bytes], Usage | None]
PARSERS = [
    pytest.param(ref.parse_usage, id="python"),
    pytest.param(native.parse_usage_c, id="c", marks=needs_c),
]
PURE = [pytest.param(True, id="python"), pytest.param(False, id="c", marks=needs_c)]
QUICK = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def as_usage(expected: dict[str, int] | None) -> Usage | None:
    return None if expected is None else Usage(**expected)


# ---- recorded transcripts ---------------------------------------------------------------------------------


def test_every_transcript_has_an_expectation() -> None:
    files = {p.name for p in DATA.iterdir()} - {"expected.json", "README.md"}
    assert files == set(EXPECTED)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_transcript_tail(parse: Parser, name: str) -> None:
    assert parse(TRANSCRIPTS[name][-TAIL:]) == as_usage(EXPECTED[name])


@pytest.mark.parametrize("pure", PURE)
@pytest.mark.parametrize("chunk", [7, 200, TAIL, 100_000])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_transcript_through_tail_buffer(pure: bool, chunk: int, name: str) -> None:
    data = TRANSCRIPTS[name]
    tail = native.TailBuffer(pure=pure)
    for i in range(0, len(data), chunk):
        tail.append(data[i : i + chunk])
    assert tail.getvalue() == data[-TAIL:]
    assert tail.usage() == as_usage(EXPECTED[name])


# ---- the rules, one by one --------------------------------------------------------------------------------


def U(prompt: int, completion: int, total: int | None = None, cached: int = 0) -> Usage:
    return Usage(prompt, completion, prompt + completion if total is None else total, cached)


NESTED_OK = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
NESTED_TOO_DEEP = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
BROKEN = b'"usage":{"prompt_tokens":1,}'

EDGE_CASES: list[tuple[str, bytes, Usage | None]] = [
    ("plain", b'{"usage":{"prompt_tokens":12,"completion_tokens":40,"total_tokens":52}}', U(12, 40)),
    (
        "key order and whitespace",
        b'{"usage" :\r\n\t{ "total_tokens" : 9 ,"completion_tokens":4,"prompt_tokens":5 } }',
        U(5, 4),
    ),
    (
        "cached",
        b'"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8}}',
        U(12, 0, cached=8),
    ),
    (
        "details null",
        b'"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":null}',
        U(3, 1),
    ),
    (
        "details not an object",
        b'"usage":{"prompt_tokens":3,"prompt_tokens_details":[{"cached_tokens":2}]}',
        U(3, 0),
    ),
    (
        "cached in other details ignored",
        b'"usage":{"prompt_tokens":3,"completion_tokens_details":{"cached_tokens":2}}',
        U(3, 0),
    ),
    (
        "nested cached ignored",
        b'"usage":{"prompt_tokens":3,"prompt_tokens_details":{"x":{"cached_tokens":2}}}',
        U(3, 0),
    ),
    (
        "unknown members",
        b'"usage":{"a":[1,{"b":"c\\"d"},true,false,null,-1.5e-3],"prompt_tokens":2}',
        U(2, 0),
    ),
    ("total only", b'"usage":{"total_tokens":7}', U(0, 0, 7)),
    ("total given wins", b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":5}', U(1, 1, 5)),
    ("duplicate key: last wins", b'"usage":{"prompt_tokens":1,"prompt_tokens":2}', U(2, 0)),
    (
        "duplicate key: last invalid",
        b'"usage":{"prompt_tokens":1,"prompt_tokens":null,"completion_tokens":3}',
        U(0, 3),
    ),
    (
        "duplicate details reset",
        b'"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens_details":{}}',
        U(9, 0),
    ),
    ("last of several", b'"usage":{"prompt_tokens":1} "usage":{"prompt_tokens":2} "usage":null', U(2, 0)),
    (
        "null after valid",
        b'data: {"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\ndata: {"usage":null}\n\n',
        U(4, 1),
    ),
    ("empty object skipped", b'"usage":{"prompt_tokens":4} "usage":{}', U(4, 0)),
    ("unrelated members only skipped", b'"usage":{"prompt_tokens":4} "usage":{"cached_tokens":3}', U(4, 0)),
    ("broken later object skipped", b'"usage":{"prompt_tokens":4} ' + BROKEN, U(4, 0)),
    ("incomplete object", b'"usage":{"prompt_tokens":4', None),
    ("no colon", b'"usage" {"prompt_tokens":4}', None),
    ("array value", b'"usage":[{"prompt_tokens":4}]', None),
    ("escaped key", b'"usage":{"prompt_tokens":4} \\"usage\\":{\\"prompt_tokens\\":5}', U(4, 0)),
    ("three backslashes before key", b'\\\\\\"usage":{"prompt_tokens":5}', None),
    ("odd backslashes before key", b'\\"usage":{"prompt_tokens":5}', None),
    ("even backslashes before key", b'\\\\"usage":{"prompt_tokens":5}', U(5, 0)),
    ("overlapping keys", b'"usage"usage":{"prompt_tokens":6}', U(6, 0)),
    ("limit", b'"usage":{"prompt_tokens":9007199254740992}', U(TOKEN_LIMIT, 0)),
    ("beyond limit is absent", b'"usage":{"prompt_tokens":9007199254740993,"completion_tokens":1}', U(0, 1)),
    ("huge is absent", b'"usage":{"prompt_tokens":' + b"9" * 5000 + b',"completion_tokens":1}', U(0, 1)),
    (
        "sum saturates",
        b'"usage":{"prompt_tokens":9007199254740992,"completion_tokens":5}',
        U(TOKEN_LIMIT, 5, TOKEN_LIMIT),
    ),
    (
        "limit with a digit more",
        b'"usage":{"prompt_tokens":90071992547409920,"completion_tokens":1}',
        U(0, 1),
    ),
    ("seventeen digits", b'"usage":{"prompt_tokens":10000000000000000,"completion_tokens":1}', U(0, 1)),
    ("negative is absent", b'"usage":{"prompt_tokens":-1,"completion_tokens":1}', U(0, 1)),
    ("fraction is absent", b'"usage":{"prompt_tokens":1.0,"completion_tokens":1}', U(0, 1)),
    ("exponent is absent", b'"usage":{"prompt_tokens":1e2,"completion_tokens":1}', U(0, 1)),
    ("string is absent", b'"usage":{"prompt_tokens":"12","completion_tokens":1}', U(0, 1)),
    ("all absent", b'"usage":{"prompt_tokens":null,"completion_tokens":-2}', None),
    ("leading zero is invalid JSON", b'"usage":{"prompt_tokens":012}', None),
    ("bad escape is invalid JSON", b'"usage":{"x":"\\q","prompt_tokens":1}', None),
    ("unit separator is invalid JSON", b'"usage":{"x":"a\x1fb","prompt_tokens":1}', None),
    ("DEL is fine", b'"usage":{"x":"a\x7fb","prompt_tokens":1}', U(1, 0)),
    ("control char is invalid JSON", b'"usage":{"x":"a\nb","prompt_tokens":1}', None),
    ("unicode escape", b'"usage":{"x\\u00e9":"\\ud83d\\ude00","prompt_tokens":1}', U(1, 0)),
    ("escaped member name not matched", b'"usage":{"prompt\\u005ftokens":5,"completion_tokens":1}', U(0, 1)),
    ("raw UTF-8 and high bytes", '"usage":{"note":"café 🙂\x7f","prompt_tokens":1}'.encode() + b"", U(1, 0)),
    ("nesting at the limit", b'"usage":{"a":' + NESTED_OK + b',"prompt_tokens":1}', U(1, 0)),
    ("nesting beyond the limit", b'"usage":{"a":' + NESTED_TOO_DEEP + b',"prompt_tokens":1}', None),
    (
        "anthropic",
        b'"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":100,'
        b'"cache_creation_input_tokens":3}',
        U(113, 5, cached=100),
    ),
    ("anthropic without cache fields", b'"usage":{"input_tokens":10,"output_tokens":5}', U(10, 5)),
    (
        "responses api",
        b'"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":6},"output_tokens":5,'
        b'"total_tokens":15}',
        U(10, 5, cached=6),
    ),
    (
        "prompt details win over input details",
        b'"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1},'
        b'"input_tokens_details":{"cached_tokens":2}}',
        U(10, 0, cached=1),
    ),
    ("cache fields alone are not usage", b'"usage":{"cache_read_input_tokens":10}', None),
    (
        f"{MAX_OBJECT_ATTEMPTS - 1} broken then valid",
        b'"usage":{"prompt_tokens":4}' + BROKEN * (MAX_OBJECT_ATTEMPTS - 1),
        U(4, 0),
    ),
    (
        f"{MAX_OBJECT_ATTEMPTS} broken then valid: gives up",
        b'"usage":{"prompt_tokens":4}' + BROKEN * MAX_OBJECT_ATTEMPTS,
        None,
    ),
    ("nulls do not count as attempts", b'"usage":{"prompt_tokens":4}' + b'"usage":null' * 100, U(4, 0)),
    ("cut in a unicode escape", b'"usage":{"\\u00', None),
    ("cut after a backslash", b'"usage":{"\\', None),
    ("cut in an exponent", b'"usage":{"prompt_tokens":1e', None),
    ("cut in a literal", b'"usage":{"a":tru', None),
    ("empty", b"", None),
    ("key at the very end", b'"usage"', None),
    ("key cut", b'"usag', None),
]


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=i) for i, d, e in EDGE_CASES])
def test_rules(parse: Parser, data: bytes, expected: Usage | None) -> None:
    assert parse(data) == expected


@pytest.mark.parametrize("parse", PARSERS)
def test_buffer_types_agree(parse: Callable[[Any], Usage | None]) -> None:
    body = TRANSCRIPTS["openai_chat_stream_cached.sse"]
    expected = as_usage(EXPECTED["openai_chat_stream_cached.sse"])
    assert parse(memoryview(body)[-TAIL:]) == expected
    assert parse(bytearray(body[-TAIL:])) == expected


def test_parse_usage_follows_the_environment() -> None:
    assert native.parse_usage is (ref.parse_usage if native.PURE_PYTHON else native.parse_usage_c)
    assert isinstance(native.TailBuffer(), native.TailBuffer)


# ---- generated usage objects against an oracle built from the same dict ------------------------------------

COUNT_KEYS = ["prompt_tokens", "completion_tokens", "total_tokens", "input_tokens", "output_tokens",
              "cache_read_input_tokens", "cache_creation_input_tokens"]  # fmt: skip
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_value = st.recursive(
    json_leaf | st.text(max_size=8),
    # Nested member names never contain "usage": a nested usage key would rightly win over the outer one.
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6).filter(lambda k: "usage" not in k), inner, max_size=3)
    ),
    max_leaves=8,
)
boundary = st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, 10 * 2**53, 10**16, 10**16 - 1, 2**64, 0])
count_value = st.integers(0, 2**53 + 2) | boundary | st.integers(-5, -1) | json_value


@st.composite
def usage_dicts(draw: st.DrawFn) -> dict[str, Any]:
    usage: dict[str, Any] = draw(
        st.dictionaries(st.sampled_from(["id", "note", "x"]), json_value, max_size=2)
    )
    for key in draw(st.lists(st.sampled_from(COUNT_KEYS), unique=True)):
        usage[key] = draw(count_value)
    for key in draw(
        st.lists(st.sampled_from(["prompt_tokens_details", "input_tokens_details"]), unique=True)
    ):
        usage[key] = draw(
            st.none() | st.fixed_dictionaries({}, optional={"cached_tokens": count_value, "y": json_value})
        )
    keys = draw(st.permutations(list(usage)))
    return {k: usage[k] for k in keys}


def oracle(usage: dict[str, Any]) -> Usage | None:
    """The mapping rules, applied to a Python dict instead of bytes."""

    def count(container: Any, key: str) -> int | None:
        v = container.get(key) if isinstance(container, dict) else None
        ok = type(v) is int and 0 <= v <= TOKEN_LIMIT
        return v if ok else None

    c = {k: count(usage, k) for k in COUNT_KEYS}
    if all(c[k] is None for k in COUNT_KEYS[:5]):
        return None
    prompt = c["prompt_tokens"]
    if prompt is None:
        parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        prompt = min(sum(c[k] or 0 for k in parts), TOKEN_LIMIT)
    completion = c["completion_tokens"] if c["completion_tokens"] is not None else c["output_tokens"] or 0
    total = c["total_tokens"] if c["total_tokens"] is not None else min(prompt + completion, TOKEN_LIMIT)
    cached_options = (
        count(usage.get("prompt_tokens_details"), "cached_tokens"),
        count(usage.get("input_tokens_details"), "cached_tokens"),
        c["cache_read_input_tokens"],
    )
    cached = next((v for v in cached_options if v is not None), 0)
    return Usage(prompt, completion, total, cached)


@QUICK
@given(usage=usage_dicts(), indent=st.sampled_from([None, 0, 2]), stream=st.booleans(), crlf=st.booleans())
def test_generated_usage_matches_oracle(
    usage: dict[str, Any], indent: int | None, stream: bool, crlf: bool
) -> None:
    body = json.dumps({"id": "x", "choices": [], "usage": usage}, indent=indent).encode()
    if stream:
        nl = b"\r\n" if crlf else b"\n"
        body = (
            b"data: "
            + body.replace(b"\n", b"")
            + nl * 2
            + b'data: {"usage": null}'
            + nl * 2
            + b"data: [DONE]"
            + nl * 2
        )
    expected = oracle(usage)
    assert ref.parse_usage(body) == expected
    if native.HAVE_NATIVE:
        assert native.parse_usage_c(body) == expected


# ---- C against the reference on arbitrary and mutated bytes ------------------------------------------------

MEMBER_NAMES = [
    f'"{k}"'.encode() for k in [*COUNT_KEYS, "prompt_tokens_details", "input_tokens_details", "cached_tokens"]
]
FRAGMENTS = [b'"usage"', b'"usage":', b"{", b"}", b"[", b"]", b",", b":", b" ", b"\r\n", b'"', b"\\", b"null",
             b"true", b"0", b"12", b"-3", b"1.5", b"1e9", b"9007199254740993", b'"x"', b'"\\u00e9"', b"\xff",
             b"data: ", b"\n\n", b"\x1f", b"\x7f", b"\\\\\\", b"90071992547409920",
             *MEMBER_NAMES]  # fmt: skip
soup = st.lists(st.sampled_from(FRAGMENTS), max_size=80).map(b"".join)
NONEMPTY = sorted(name for name, data in TRANSCRIPTS.items() if data)


@st.composite
def mutated_transcripts(draw: st.DrawFn) -> bytes:
    data = bytearray(TRANSCRIPTS[draw(st.sampled_from(NONEMPTY))][-TAIL:])
    for _ in range(draw(st.integers(1, 4))):
        anchor = data.rfind(b'"usage"')
        if anchor >= 0 and draw(st.booleans()):  # aim most edits at the usage object itself
            pos = min(max(anchor + draw(st.integers(-8, 260)), 0), len(data))
        else:
            pos = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "cut_head", "cut_tail"]))
        if op == "delete":
            del data[pos : pos + draw(st.integers(1, 12))]
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from(FRAGMENTS) | st.binary(min_size=1, max_size=6))
        elif op == "replace" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut_head":
            del data[:pos]
        elif op == "cut_tail":
            del data[pos:]
    return bytes(data)


def check_agree(data: bytes) -> None:
    py = ref.parse_usage(data)
    assert native.parse_usage_c(data) == py
    if py is not None:
        values = (py.prompt_tokens, py.completion_tokens, py.total_tokens, py.cached_tokens)
        assert all(0 <= v <= TOKEN_LIMIT for v in values)


@needs_c
@QUICK
@given(st.binary(max_size=600))
def test_c_matches_reference_on_random_bytes(data: bytes) -> None:
    check_agree(data)


@needs_c
@QUICK
@given(soup)
def test_c_matches_reference_on_json_soup(data: bytes) -> None:
    check_agree(data)


@needs_c
@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_transcripts())
def test_c_matches_reference_on_mutated_transcripts(data: bytes) -> None:
    check_agree(data)


@needs_c
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=TAIL) | soup | mutated_transcripts(), st.integers(0, 64))
def test_fuzz_slices_of_arbitrary_input(data: bytes, cut: int) -> None:
    # Every suffix and prefix of an input is another tail the parser may see; slices via memoryview too.
    check_agree(data[cut:])
    check_agree(data[: len(data) - cut])
    assert native.parse_usage_c(memoryview(data)[cut:]) == ref.parse_usage(data[cut:])


# ---- tail buffers ------------------------------------------------------------------------------------------


@needs_c
@QUICK
@given(st.integers(1, 64), st.lists(st.binary(max_size=150) | soup, max_size=12), st.integers(0, 12))
def test_tail_buffers_agree(capacity: int, chunks: list[bytes], clear_at: int) -> None:
    c, py = native.TailBuffer(capacity, pure=False), native.TailBuffer(capacity, pure=True)
    seen = b""
    for i, chunk in enumerate(chunks):
        if i == clear_at:
            c.clear()
            py.clear()
            seen = b""
        c.append(chunk)
        py.append(bytearray(chunk))
        seen += chunk
        assert c.getvalue() == py.getvalue() == seen[-capacity:]
        assert len(c) == len(py) == len(seen[-capacity:])
    assert c.usage() == py.usage() == ref.parse_usage(seen[-capacity:])


@pytest.mark.parametrize("pure", PURE)
def test_tail_buffer_basics(pure: bool) -> None:
    tail = native.TailBuffer(8, pure=pure)
    assert (tail.capacity, len(tail), tail.getvalue(), tail.usage()) == (8, 0, b"", None)
    tail.append(b"abc")
    tail.append(memoryview(b"defghij"))
    assert tail.getvalue() == b"cdefghij"
    tail.append(b"0123456789")
    assert tail.getvalue() == b"23456789"
    tail.clear()
    assert tail.getvalue() == b""
    with pytest.raises(ValueError):
        native.TailBuffer(0, pure=pure)


@pytest.mark.parametrize("pure", PURE)
def test_tail_buffer_finds_usage_split_across_appends(pure: bool) -> None:
    tail = native.TailBuffer(pure=pure)
    body = TRANSCRIPTS["vllm_chat_stream_include_usage.sse"]
    split = body.rindex(b'"usage":{') + 4
    tail.append(body[:split])
    assert tail.usage() is None  # the last usage so far is "usage":null
    tail.append(body[split:])
    assert tail.usage() == as_usage(EXPECTED["vllm_chat_stream_include_usage.sse"])
