"""Body logs without processes: the ``[[body_logs]]`` entries parsed, stored and built into the snapshot,
the workers' choice of requests, the frame contract, and what the control worker makes of a frame:
redaction by path and pattern, bodies cut at the size cap closed before they are redacted, streams
rebuilt. The property every case checks: nothing the rules say to remove reaches the stored row."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.body_record import BodyRecord, decode_body_record, encode_body_record
from gateway.body_rules import BodyLogRules
from gateway.controlplane.bodies.redaction import (
    BUILTIN_PATTERNS,
    REDACTED,
    Pattern,
    Redactor,
    luhn_valid,
    parse_path,
)
from gateway.controlplane.bodies.rules import BodyRules
from gateway.controlplane.bodies.stored import StoredBodies, stored_bodies
from gateway.controlplane.bodies.truncated import close_json, cut_tail
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.routing_rows import routing_from_rows, routing_rows
from gateway.controlplane.config.specs import BodyLogSpec
from gateway.controlplane.config.writer import dump_config
from gateway.errors import ConfigError
from tests.unit.test_configfile import BASE

EMAIL, CARD = "jo.doe+x@mail.example.com", "4111 1111 1111 1111"
PATTERNS = (BUILTIN_PATTERNS["email"], BUILTIN_PATTERNS["card"])


# ---- the configuration -------------------------------------------------------------------------------------


def with_body_logs(*entries: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["body_logs"] = list(entries)
    return doc


def test_an_entry_parses_with_defaults_and_round_trips() -> None:
    cfg = parse_config(with_body_logs({"name": "all"}, {"name": "alice", "principals": ["alice"]}), "t")
    assert cfg.body_logs[0] == BodyLogSpec("all")
    assert cfg.body_logs[0].redact_patterns == ("email", "card") and cfg.body_logs[0].retention_days == 7.0
    full = {
        "name": "debug",
        "principals": ["alice"],
        "keys": ["alice-dev"],
        "models": ["chat"],
        "sample": 0.25,
        "max_bytes": 4096,
        "redact_paths": ["messages[*].content", '$.metadata["user.id"]'],
        "redact_patterns": ["email", {"name": "api-key", "regex": "sk-[A-Za-z0-9]{8,}"}],
        "retention_days": 0.5,
    }
    cfg = parse_config(with_body_logs(full), "t")
    (spec,) = cfg.body_logs
    assert spec.as_dict() == full
    assert parse_config(__import__("tomllib").loads(dump_config(cfg)), "again").body_logs == cfg.body_logs
    assert routing_from_rows(routing_rows(cfg)).body_logs == cfg.body_logs


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({}, r"body_logs\[0\]\.name: is required"),
        ({"name": "x", "sample": 1.5}, r"sample: must be a number between 0 and 1"),
        ({"name": "x", "sample": True}, r"sample: must be a number"),
        ({"name": "x", "max_bytes": 0}, r"max_bytes: must be an integer from 1"),
        ({"name": "x", "max_bytes": 2 << 20}, r"max_bytes: must be an integer from 1 to 1048576"),
        ({"name": "x", "retention_days": 0}, r"retention_days: must be a number of days above 0"),
        ({"name": "x", "redact_paths": ["a..b"]}, r"redact_paths\[0\]: not a JSON path"),
        ({"name": "x", "redact_paths": "a.b"}, r"redact_paths: must be an array of JSON paths"),
        ({"name": "x", "redact_patterns": ["phone"]}, r"unknown pattern 'phone'"),
        ({"name": "x", "redact_patterns": [{"name": "k", "regex": "("}]}, r"not a regular expression"),
        ({"name": "x", "redact_patterns": [{"name": "k", "regex": "a*"}]}, r"matches the empty string"),
        ({"name": "x", "redact_patterns": ["email", "email"]}, r"duplicate pattern 'email'"),
        ({"name": "x", "principals": ["ghost"]}, r"principals\[0\]: unknown principal 'ghost'"),
        ({"name": "x", "models": ["nope"]}, r"models\[0\]: unknown model name 'nope'"),
        ({"name": "x", "principals": []}, r"principals: must not be empty"),
        ({"name": "x", "colour": "red"}, r"unknown field"),
    ],
)
def test_bad_entries_are_refused_with_their_place(entry: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(with_body_logs(entry), "t")


def test_names_are_unique() -> None:
    with pytest.raises(ConfigError, match=r"duplicate body log 'x'"):
        parse_config(with_body_logs({"name": "x"}, {"name": "x"}), "t")


# ---- which requests the workers log ------------------------------------------------------------------------


def rules(*entries: dict[str, Any]) -> BodyLogRules:
    found = BodyLogRules.from_doc([{"id": f"id{i}", "max_bytes": 100, **e} for i, e in enumerate(entries)])
    assert found is not None
    return found


def test_no_entry_is_no_rules() -> None:
    assert BodyLogRules.from_doc(None) is None and BodyLogRules.from_doc([]) is None


def test_the_first_matching_entry_decides() -> None:
    r = rules(
        {"name": "alice-chat", "principals": ["p1"], "models": ["chat"]},
        {"name": "key", "keys": ["k9"], "sample": 0},
        {"name": "rest"},
    )
    assert r.pick("p1", "k1", "chat", "chat", "chat").name == "alice-chat"  # type: ignore[union-attr]
    # A model selector matches the name called, the route's name (a pattern alias) or its frontend model.
    assert r.pick("p1", "k1", "gpt-4o-mini", "gpt-4o-mini", "chat").name == "alice-chat"  # type: ignore[union-attr]
    assert r.pick("p1", "k1", "other", "other", "other").name == "rest"  # type: ignore[union-attr]
    assert r.pick("p2", "k9", "chat", "chat", "chat") is None  # picked by "key", which samples nothing


def test_an_empty_selector_selects_nothing() -> None:
    r = rules({"name": "gone", "principals": []})
    assert r.pick("p1", "k1", "chat", "chat", "chat") is None


def test_sampling_draws_per_request() -> None:
    r = rules({"name": "half", "sample": 0.5})
    picked = sum(r.pick("p", "k", "m", "m", "m") is not None for _ in range(4000))
    assert 1700 < picked < 2300
    assert all(
        rules({"name": "none", "sample": 0.0}).pick("p", "k", "m", "m", "m") is None for _ in range(100)
    )


# ---- the frame --------------------------------------------------------------------------------------------


def record(request: bytes, response: bytes = b"", **fields: Any) -> BodyRecord:
    values: dict[str, Any] = {
        "request_id": "r1",
        "ts": 1000.0,
        "principal_id": "p1",
        "key_id": "k1",
        "model": "chat",
        "status": 200,
        "rule": "debug",
        "rule_id": "id0",
        "dialect": "openai",
        "path": "/v1/chat/completions",
        "stream": False,
        "request_size": len(request),
        "response_size": len(response),
        "source": "backend",
        "request": request,
        "response": response,
    }
    values.update(fields)
    return BodyRecord(**values)


def test_a_frame_round_trips_and_a_bad_one_is_refused() -> None:
    rec = record(b'{"a": "\\u00e9"}', b"\x00\xffbinary", request_size=99, stream=True)
    frame = encode_body_record(rec)
    assert decode_body_record(frame) == rec
    assert rec.request_truncated and not rec.response_truncated
    for bad in (b"", frame[:3], frame[:-1], frame + b"x", b"\x05\x00\x00\x00[1,2]"):
        with pytest.raises(ValueError):
            decode_body_record(bad)


# ---- redaction ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("messages[*].content", (("member", "messages"), ("every",), ("member", "content"))),
        ("$.input[0]", (("member", "input"), ("index", 0))),
        ('metadata["user.id"]', (("member", "metadata"), ("member", "user.id"))),
        ("*.secret", (("any",), ("member", "secret"))),
    ],
)
def test_paths(path: str, steps: tuple[Any, ...]) -> None:
    assert parse_path(path) == steps


@pytest.mark.parametrize("path", ["", "$", ".a", "a.", "a..b", "a[", "a[x]", "a. b"])
def test_bad_paths(path: str) -> None:
    with pytest.raises(ValueError):
        parse_path(path)


def test_paths_replace_whatever_they_reach() -> None:
    doc = {
        "messages": [
            {"role": "user", "content": "secret"},
            {"role": "assistant", "content": [{"text": "x"}]},
        ],
        "metadata": {"user.id": 7, "keep": 1},
        "input": ["a", "b"],
    }
    paths = ("messages[*].content", 'metadata["user.id"]', "input[1]", "absent.path", "input[9]")
    redactor = Redactor(tuple(parse_path(p) for p in paths))
    out = redactor.document(doc)
    assert out["messages"] == [
        {"role": "user", "content": REDACTED},
        {"role": "assistant", "content": REDACTED},
    ]
    assert out["metadata"] == {"user.id": REDACTED, "keep": 1} and out["input"] == ["a", REDACTED]
    assert redactor.count == 4


@pytest.mark.parametrize(
    "number", ["4111111111111111", "4111 1111 1111 1111", "5500-0000-0000-0004", "378282246310005"]
)
def test_card_numbers_that_pass_luhn_are_replaced(number: str) -> None:
    redactor = Redactor(patterns=PATTERNS)
    assert redactor.text(f"pay with {number}.") == "pay with [REDACTED:card]."
    assert redactor.count == 1


@pytest.mark.parametrize(
    "text",
    [
        "order 4111111111111112 shipped",  # fails the Luhn check
        "id 123456789012",  # too short for a card
        "41111111111111111111111",  # a longer run of digits is not a card inside it
        "call 555-0100",
    ],
)
def test_other_numbers_are_left(text: str) -> None:
    redactor = Redactor(patterns=PATTERNS)
    assert redactor.text(text) == text and redactor.count == 0


def test_luhn() -> None:
    assert luhn_valid("79927398713") and not luhn_valid("79927398710")


def test_patterns_reach_every_string_but_member_names() -> None:
    redactor = Redactor(
        patterns=(*PATTERNS, Pattern("api-key", __import__("re").compile(r"sk-[a-z0-9]{6,}")))
    )
    out = redactor.document({EMAIL: [f"to {EMAIL}", {"k": "sk-abcdef12"}], "n": 4111111111111111})
    assert out == {EMAIL: ["to [REDACTED:email]", {"k": "[REDACTED:api-key]"}], "n": 4111111111111111}


# ---- bodies cut at the cap ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "closed"),
    [
        ('{"a": 1, "b": [1, 2', {"a": 1, "b": [1]}),  # a number at the cut may be cut: left out
        ('{"a": {"b": "c"}, "d": "hello wor', {"a": {"b": "c"}, "d": "hello"}),
        ('{"a": "x", "b"', {"a": "x"}),  # a member name without its value
        ('{"a": "x", "b": ', {"a": "x"}),
        ('[{"m": "esc \\u00', [{"m": "esc"}]),  # a \u escape cut in the middle
        ('{"a": "one\\\\', {"a": "one\\"}),  # an escaped backslash, whole
        ('{"a": "two \\', {"a": "two"}),  # a backslash that opened an escape
        ('"just a stri', "just a"),
        ("[", []),
    ],
)
def test_close_json(text: str, closed: Any) -> None:
    assert close_json(text) == closed


def test_not_json_is_not_closed() -> None:
    assert close_json("plain text") is None and close_json("") is None


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"mail {EMAIL[:12]}", "mail"),
        ("card 4111 1111 1111 11", "card"),
        ("card 4111-1111-", "card"),
        ("whole words ", "whole words"),
    ],
)
def test_cut_tail_leaves_nothing_of_a_pattern_cut_in_half(text: str, kept: str) -> None:
    assert cut_tail(text) == kept


SECRETS = (EMAIL, CARD, "4111111111111111", "s3cr3t-value")


def contains_secret(row: StoredBodies) -> bool:
    stored = f"{row.request_body} {row.response_body}"
    parts = [EMAIL, EMAIL.split("@")[0], "s3cr3t-value", "4111 1111", "41111111"]
    return any(p in stored for p in parts)


def chat_request(content: str) -> bytes:
    doc = {
        "model": "chat",
        "messages": [{"role": "user", "content": content}],
        "metadata": {"pin": "s3cr3t-value"},
    }
    return orjson.dumps(doc)


REDACT = Redactor(tuple(parse_path(p) for p in ("metadata.pin",)), PATTERNS)


def redactor() -> Redactor:
    return Redactor(REDACT.paths, REDACT.patterns)


def test_a_whole_body_is_redacted_by_path_and_pattern() -> None:
    body = chat_request(f"write to {EMAIL}, card {CARD}")
    row = stored_bodies(record(body), redactor(), 7)
    assert row.request_kind == "json" and not row.request_truncated and row.redactions == 3
    assert orjson.loads(row.request_body or "") == {
        "model": "chat",
        "messages": [{"role": "user", "content": "write to [REDACTED:email], card [REDACTED:card]"}],
        "metadata": {"pin": REDACTED},
    }
    assert row.expires_at == 1000.0 + 7 * 86400


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(min_value=1, max_value=200), st.sampled_from(["", "x" * 37, "prefix " * 5]))
def test_cut_anywhere_nothing_to_redact_is_stored(cap: int, padding: str) -> None:
    # The secrets sit at every place a cut can fall: in the middle of the e-mail address, of the card
    # number, of the member whose path is redacted, or after them.
    body = chat_request(f"{padding}mail {EMAIL} card {CARD} end")
    cut = body[:cap]
    row = stored_bodies(record(cut, request_size=len(body)), redactor(), 7)
    assert row.request_truncated == (cap < len(body)) and row.request_kind in ("json", "withheld")
    assert not contains_secret(row), row.request_body


def test_a_cut_text_body_loses_its_partial_tail() -> None:
    body = f"plain text for {EMAIL} and more".encode()
    row = stored_bodies(record(body[:22], request_size=len(body)), redactor(), 7)
    assert row.request_kind == "text" and row.request_body == "plain text for"


def test_json_that_does_not_parse_is_withheld_when_paths_apply() -> None:
    row = stored_bodies(record(b'{"metadata": {"pin": "s3cr3t-value"'), redactor(), 7)  # not cut: broken
    assert row.request_kind == "withheld" and row.request_body is None
    only_patterns = stored_bodies(record(b'{"x": "' + EMAIL.encode()), Redactor((), PATTERNS), 7)
    assert only_patterns.request_kind == "text" and EMAIL not in (only_patterns.request_body or "")


def test_binary_and_empty_bodies_keep_their_size_only() -> None:
    row = stored_bodies(record(b"", b"\xff\xfe\x00audio"), redactor(), 7)
    assert (row.request_kind, row.response_kind, row.response_body) == ("none", "binary", None)
    assert row.response_size == 8


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chunk(content: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}],
    }


def test_a_stream_is_rebuilt_then_redacted() -> None:
    raw = sse(chunk("your mail is jo.doe+x"), chunk("@mail.example"), chunk(".com"))
    row = stored_bodies(record(b"{}", raw, stream=True), redactor(), 7)
    assert row.response_kind == "json" and row.stream_events == 4
    answer = orjson.loads(row.response_body or "")
    assert answer["choices"][0]["message"]["content"] == "your mail is [REDACTED:email]"


def test_a_cut_stream_keeps_its_whole_events() -> None:
    raw = sse(chunk("one "), chunk("two "), chunk("three"))
    cut = raw[: raw.index(b"three")]
    row = stored_bodies(record(b"{}", cut, stream=True, response_size=len(raw)), redactor(), 7)
    assert row.response_truncated and row.stream_events == 2
    assert orjson.loads(row.response_body or "")["choices"][0]["message"]["content"] == "one two "


def test_a_stream_that_does_not_rebuild_is_withheld_when_paths_apply() -> None:
    raw = b"data: {not json}\n\n"
    row = stored_bodies(record(b"{}", raw, stream=True), redactor(), 7)
    assert row.response_kind == "withheld" and row.response_body is None
    text = stored_bodies(record(b"{}", raw, stream=True), Redactor((), PATTERNS), 7)
    assert text.response_kind == "text" and text.response_body == raw.decode()


# ---- the control worker's choice of redaction --------------------------------------------------------------


def entry(name: str, rule_id: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "id": rule_id, "redact_patterns": ["email"], "retention_days": 1, **fields}


def test_a_frame_is_redacted_by_the_entry_that_logged_it() -> None:
    r = BodyRules()
    r.set_entries([entry("debug", "old", redact_paths=["metadata.pin"])])
    r.set_entries([entry("debug", "new")])  # the entry changed: frames logged before still use the old one
    frame = encode_body_record(record(chat_request(EMAIL), rule_id="old"))
    row = r.prepare(frame)
    assert row is not None and "s3cr3t-value" not in (row.request_body or "") and row.redactions == 2
    assert r.prepare(encode_body_record(record(b"{}", rule_id="unknown"))) is None
    assert r.prepare(b"garbage") is None
    assert (r.unknown_entry, r.unreadable) == (1, 1)


def test_a_row_crosses_the_cluster_api_as_it_is() -> None:
    row = stored_bodies(record(chat_request("hi"), b'{"ok": true}'), redactor(), 7)
    wire = orjson.loads(orjson.dumps([row.row()]))
    assert StoredBodies.from_wire(wire[0]) == row
    for bad in ([], [*wire[0][:-1], "x"], "row"):
        with pytest.raises(ValueError):
            StoredBodies.from_wire(bad)
