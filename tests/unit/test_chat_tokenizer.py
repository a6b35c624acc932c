"""A pool's tokenizer (``gateway.routing.chat_tokenizer``): a model directory's chat template rendered over
a request's messages and encoded without added special tokens, as vLLM does, over a tiny tokenizer
trained in the test (no network)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from gateway.routing.chat_tokenizer import ChatTokenizer, TokenizerError, loaded
from tests.fixtures.tiny_tokenizer import write_tiny_model


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny")


def test_the_template_renders_as_transformers_would_and_encodes_without_added_tokens(model: Path) -> None:
    tok = ChatTokenizer.load(str(model))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who built Harlech?"}]
    text = tok.render(messages)
    assert text == (
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho built Harlech?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    raw = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tok.chat_ids(messages) == raw.encode(text, add_special_tokens=False).ids
    assert tok.chat_ids(messages)[0] == raw.token_to_id("<s>")  # the template's, written once


def test_request_bodies_give_the_engines_prompt_ids(model: Path) -> None:
    tok = ChatTokenizer.load(str(model))
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": parts}], "stream": True})
    assert tok.request_ids(chat) == tok.chat_ids([{"role": "user", "content": "a\nb"}])
    anthropic = orjson.dumps({"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]})
    assert tok.request_ids(anthropic) == tok.chat_ids(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    assert tok.request_ids(orjson.dumps({"prompt": "Harlech"})) == tok.encode("Harlech")
    image = [{"type": "image_url", "image_url": {"url": "data:"}}]
    assert tok.request_ids(orjson.dumps({"messages": [{"role": "user", "content": image}]})) is None
    assert tok.request_ids(b"not json") is None and tok.request_ids(b"[1]") is None


def test_a_directory_without_a_template_is_refused_and_loading_is_cached(model: Path, tmp_path: Path) -> None:
    assert loaded(str(model)) is loaded(str(model))
    bare = tmp_path / "bare"
    write_tiny_model(bare)
    (bare / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="no chat_template"):
        ChatTokenizer.load(str(bare))
    assert loaded(str(bare)) is None and loaded(str(tmp_path / "missing")) is None


def test_pieces_between_added_tokens_are_encoded_once_and_as_the_whole_would_be(model: Path) -> None:
    tok = ChatTokenizer.load(str(model))
    raw = Tokenizer.from_file(str(model / "tokenizer.json"))
    history = [{"role": "system", "content": "You answer questions about castles. " * 20}]
    for turn in range(4):
        history.append({"role": "user", "content": f"Question {turn}: who built the walls of tower {turn}?"})
        text = tok.render(history)
        assert tok.chat_ids(history) == raw.encode(text, add_special_tokens=False).ids
        history.append({"role": "assistant", "content": f"  Edward, in {1280 + turn}.\n\n"})
    # Each message is one piece between added tokens: the system prompt was encoded once.
    assert sum(1 for piece in tok._segments if piece.startswith("system")) == 1


def variant(model: Path, directory: Path, doc: dict[str, Any]) -> Path:
    """A copy of ``model`` in ``directory`` whose tokenizer.json is ``doc``."""
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes(orjson.dumps(doc))
    (directory / "tokenizer_config.json").write_bytes((model / "tokenizer_config.json").read_bytes())
    return directory


def test_added_tokens_that_strip_whitespace_turn_piecewise_encoding_off(model: Path, tmp_path: Path) -> None:
    doc = orjson.loads((model / "tokenizer.json").read_bytes())
    for token in doc["added_tokens"]:
        token["lstrip"] = True
    other = variant(model, tmp_path / "strip", doc)
    tok = ChatTokenizer.load(str(other))
    text = tok.render([{"role": "user", "content": "hi  "}])
    assert tok._split is None
    assert (
        tok.encode(text)
        == Tokenizer.from_file(str(other / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    )


def test_a_long_prompt_is_encoded_up_to_the_limit_less_a_margin(model: Path) -> None:
    tok = ChatTokenizer.load(str(model))
    messages = [{"role": "user", "content": "Harlech was built by Edward. " * 400}]
    body = orjson.dumps({"messages": messages})
    whole = tok.request_prompt(body, limit=1 << 20)
    cut = tok.request_prompt(body, limit=2000)
    assert whole is not None and cut is not None and whole.share == 1.0
    assert 0 < cut.share < 0.2 and len(cut.ids) < len(whole.ids) // 4
    assert cut.ids == whole.ids[: len(cut.ids)]  # the margin keeps what the cut could change out


def test_a_pre_tokenizer_that_treats_the_first_piece_apart_turns_it_off(model: Path, tmp_path: Path) -> None:
    doc = orjson.loads((model / "tokenizer.json").read_bytes())
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
    doc["decoder"] = None
    other = variant(model, tmp_path / "metaspace", doc)
    tok = ChatTokenizer.load(str(other))
    text = tok.render([{"role": "user", "content": "hi there"}])
    assert tok._split is None
    raw = Tokenizer.from_file(str(other / "tokenizer.json"))
    assert tok.encode(text) == raw.encode(text, add_special_tokens=False).ids


def test_a_body_of_many_messages_renders_only_those_that_reach_the_limit(model: Path) -> None:
    tok = ChatTokenizer.load(str(model))
    many = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 10} for i in range(20_000)
    ]
    cut = tok.request_prompt(orjson.dumps({"messages": many}), limit=2000)
    few = tok.request_prompt(orjson.dumps({"messages": many[:40]}), limit=2000)
    assert cut is not None and few is not None
    assert cut.ids == few.ids  # the same leading messages, rendered and cut alike
    # The share counts the messages left unrendered: about 2,000 of 20,000 x ~80 characters.
    assert 0 < cut.share < 0.002


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "", "<|im_end|>"])},
    optional={
        "content": st.text(max_size=200)
        | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": _JSON})),
        "name": _JSON,
    },
)
_BODY = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(_MESSAGE, max_size=6) | _JSON,
        "system": st.text(max_size=100) | _JSON,
        "tools": _JSON,
        "prompt": st.text(max_size=200) | _JSON,
    },
)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(body=_BODY | _JSON, limit=st.integers(min_value=1, max_value=300))
def test_any_body_gives_ids_or_none_never_an_error(body: Any, limit: int) -> None:
    """What a client may send, as the request path hands it to the pool's tokenizer: ids within the limit
    and a share in (0, 1], or None; never an exception on the request path."""
    tok = _tiny()
    got = tok.request_prompt(orjson.dumps(body), limit=limit)
    if got is not None:
        assert 0 < got.share <= 1
        assert all(isinstance(i, int) for i in got.ids)


@functools.cache
def _tiny() -> ChatTokenizer:
    """One tiny model for the property test's examples (hypothesis refuses function-scoped fixtures)."""
    return ChatTokenizer.load(str(write_tiny_model(Path(tempfile.mkdtemp()) / "tiny")))
