"""Request inspection and the alias splice: only the model value may change, byte for byte."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.errors import BadRequest
from gateway.protocol.openai_request import (
    RequestInfo,
    find_model_span,
    inject_stream_usage,
    inspect_json,
    inspect_multipart,
    splice_model,
)

ODD = (
    b'{ "messages" : [ {"role":"user","content":"say \\"model\\": \\"x\\"", "model": "inner"} ],\n'
    b'\t"model"\n:\t"chat" , "stream":true,"stream_options":{"include_usage":true},"zzz":[1,{"model":"n"}] }'
)


@pytest.mark.parametrize(
    ("body", "model", "stream", "include_usage", "max_tokens"),
    [
        (b'{"model":"a"}', "a", False, False, None),
        (ODD, "chat", True, True, None),
        (b'{"max_tokens": 7, "model": "b", "stream": false}', "b", False, False, 7),
        (b'{"max_completion_tokens": 9, "model": "b"}', "b", False, False, 9),
        (b'{"max_completion_tokens": 9, "max_tokens": 3, "model": "b"}', "b", False, False, 9),
        (b'{"max_tokens": 2147483647, "model": "b", "stream": null}', "b", False, False, 2147483647),
        (b'{"model": "b", "x": ' + b"[" * 127 + b"]" * 127 + b"}", "b", False, False, None),
    ],
)
def test_inspect_json(
    body: bytes, model: str, stream: bool, include_usage: bool, max_tokens: int | None
) -> None:
    info = inspect_json(body)
    assert (info.model, info.stream, info.include_usage, info.max_tokens) == (
        model,
        stream,
        include_usage,
        max_tokens,
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "empty"),
        (b"{nope", "not valid JSON"),
        (b"[1,2]", "JSON object"),
        (b'{"messages":[]}', "model parameter"),
        (b'{"model": 3}', "non-empty string"),
        (b'{"model": ""}', "non-empty string"),
        (b'{"model": "a", "max_tokens": "many"}', "max_tokens"),
        # Every figure read from a body is bounded (gateway.protocol.bounds): 400, never a 500 or a record
        # whose numbers overflow the store.
        (b'{"model": "a", "max_tokens": 9223372036854775807}', "between 0 and 2147483647"),
        (b'{"model": "a", "max_tokens": -9223372036854775808}', "between 0 and 2147483647"),
        (b'{"model": "a", "max_tokens": -1}', "between 0"),
        (b'{"model": "a", "max_completion_tokens": 2147483648}', "max_completion_tokens"),
        (b'{"model": "a", "max_tokens": 1, "max_completion_tokens": 1e30}', "max_completion_tokens"),
        (b'{"model": "a", "n": 0}', "n must be"),
        (b'{"model": "a", "n": 129}', "n must be"),
        (b'{"model": "a", "n": 2.5}', "n must be"),
        (b'{"model": "a", "stream": "yes"}', "stream must be a boolean"),
        (b'{"model": "a", "stream": 1}', "stream must be a boolean"),
        (b'{"model": "a", "x": ' + b"[" * 128 + b"]" * 128 + b"}", "deeper than 128"),
    ],
)
def test_inspect_json_rejects(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        inspect_json(body)


def test_splice_changes_only_the_top_level_model() -> None:
    info = inspect_json(ODD)
    out = splice_model(ODD, info, "meta-llama/Llama-3.1-8B")
    assert out == ODD.replace(b'"chat"', b'"meta-llama/Llama-3.1-8B"')
    assert orjson.loads(out)["messages"][0]["model"] == "inner"


def test_splice_escapes_the_new_name() -> None:
    body = b'{"model":"a"}'
    out = splice_model(body, inspect_json(body), 'we"ird')
    assert orjson.loads(out)["model"] == 'we"ird'


def test_splice_last_duplicate_key() -> None:
    # The proxy refuses such a body (inspect_json); splicing on its own still follows the parser.
    body = b'{"model":"first","model":"last"}'
    with pytest.raises(BadRequest, match="more than once"):
        inspect_json(body)
    info = RequestInfo("last", False, False, None, None)
    assert splice_model(body, info, "z") == b'{"model":"first","model":"z"}'


def test_splice_escaped_key_falls_back_to_reencoding() -> None:
    body = b'{"mod\\u0065l":"a","x":1}'
    info = inspect_json(body)
    assert info.model == "a"
    assert orjson.loads(splice_model(body, info, "b")) == {"model": "b", "x": 1}


def test_inject_stream_usage_only_adds_one_member() -> None:
    body = b' \n{ "model" : "a", "stream": true, "messages": [{"role":"user","content":"{x}"}]}'
    info = inspect_json(body)
    assert info.stream and not info.include_usage and not info.stream_options
    out = inject_stream_usage(body)
    assert out == body.replace(b"{", b'{"stream_options":{"include_usage":true},', 1)
    doc = orjson.loads(out)
    assert doc["stream_options"] == {"include_usage": True}
    assert doc["messages"][0]["content"] == "{x}"
    after = inspect_json(out)
    assert after.include_usage and after.stream_options and after.model == "a"
    assert orjson.loads(splice_model(out, after, "b"))["model"] == "b"


def test_stream_options_presence_is_reported_whatever_its_value() -> None:
    for opts in (b"{}", b'{"include_usage":false}', b"null"):
        info = inspect_json(b'{"model":"a","stream":true,"stream_options":' + opts + b"}")
        assert info.stream_options and not info.include_usage


BOUNDARY = "----gwtest42"
MULTIPART = (
    b"------gwtest42\r\n"
    b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    b"Content-Type: audio/wav\r\n\r\n"
    b"RIFF\x00\x01model\r\n\xff\xfe"
    b"\r\n------gwtest42\r\n"
    b'Content-Disposition: form-data; name="model"\r\n\r\n'
    b"whisper"
    b"\r\n------gwtest42--\r\n"
)


def test_multipart_model_and_splice() -> None:
    ctype = f"multipart/form-data; boundary={BOUNDARY}"
    info = inspect_multipart(MULTIPART, ctype)
    assert info.model == "whisper"
    out = splice_model(MULTIPART, info, "openai/whisper-large-v3")
    assert out == MULTIPART.replace(b"\r\n\r\nwhisper\r\n", b"\r\n\r\nopenai/whisper-large-v3\r\n")


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        (MULTIPART, "multipart/form-data"),
        (MULTIPART.replace(b'name="model"', b'name="other"'), f"multipart/form-data; boundary={BOUNDARY}"),
    ],
)
def test_multipart_rejects(body: bytes, ctype: str) -> None:
    with pytest.raises(BadRequest):
        inspect_multipart(body, ctype)


# -- the model's span, found without parsing: differential against the JSON parser ------------------------

_TEXT = st.lists(
    st.sampled_from(["a", '"', "\\", '"model"', "{", "}", "[", "]", ":", ",", "é", "\n", " "])
).map("".join)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["model", "x"]) | _TEXT, inner)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(
    before=st.dictionaries(st.sampled_from(["messages", "model", 'a\\"b', "x"]), _JSON_VALUES, max_size=3),
    after=st.dictionaries(st.sampled_from(["messages", "tools", "y"]), _JSON_VALUES, max_size=3),
    model=_TEXT.filter(bool),
    indent=st.booleans(),
)
def test_splice_agrees_with_the_parser(
    before: dict[str, object], after: dict[str, object], model: str, indent: bool
) -> None:
    doc = {**before, "model": model, **after}  # "model" last among duplicates wins either way
    body = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    info = inspect_json(body)
    assert info.model == model
    spliced = splice_model(body, info, 'upstream/é"x')
    assert orjson.loads(spliced) == {**doc, "model": 'upstream/é"x'}
    # Only the value's bytes changed.
    span = find_model_span(body)
    assert span is not None
    assert (
        spliced[: span[0]] == body[: span[0]]
        and body[span[1] :] == spliced[len(spliced) - (len(body) - span[1]) :]
    )


def test_span_after_a_large_prompt_full_of_escaped_quotes() -> None:
    prompt = 'line with "quotes" and \\ backslashes\n' * 3000
    body = orjson.dumps({"messages": [{"role": "user", "content": prompt}], "model": "m", "max_tokens": 4})
    span = find_model_span(body)
    assert span is not None and body[span[0] : span[1]] == b'"m"'


# -- the C span finder (native/json_member.c) against this reference -------------------------------------

needs_native = pytest.mark.skipif(not native.HAVE_NATIVE, reason="gateway._gateway_native is not built")


@needs_native
@pytest.mark.parametrize(
    "body",
    [
        ODD,
        b'{"model":"a","model":"b"}',  # the last wins
        b'{"model":"a","model":7}',  # ... when it is a string; else the string before it
        b'{"model":"a\\"b\\\\"}',
        b'{"mod\\u0065l":"a"}',  # an escaped key is not looked for (the splice then re-serialises)
        b'{"x":{"model":"inner"}}',
        b'{"model"  :\n "spaced" }',
        b'[{"model":"in an array"}]',
        b'{"model":"unterminated',
        b"",
        b'"model"',
    ],
)
def test_c_span_matches_the_reference(body: bytes) -> None:
    assert native.model_span_c(body) == find_model_span(body)


@needs_native
@settings(max_examples=400, deadline=None)
@given(
    before=st.dictionaries(st.sampled_from(["messages", "model", 'a\\"b', "x"]), _JSON_VALUES, max_size=3),
    after=st.dictionaries(st.sampled_from(["messages", "model", "tools"]), _JSON_VALUES, max_size=3),
    indent=st.booleans(),
)
def test_c_span_matches_the_reference_on_json(
    before: dict[str, object], after: dict[str, object], indent: bool
) -> None:
    body = orjson.dumps({**before, **after}, option=orjson.OPT_INDENT_2 if indent else 0)
    assert native.model_span_c(body) == find_model_span(body)


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | _TEXT.map(str.encode))
def test_c_span_stays_in_bounds_on_any_bytes(body: bytes) -> None:
    span = native.model_span_c(body)
    if span is not None:
        assert 0 <= span[0] < span[1] <= len(body)
        assert body[span[0]] == 0x22 and body[span[1] - 1] == 0x22
