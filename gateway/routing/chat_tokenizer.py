"""A model's prompt as its engine tokenizes it: the chat template of a Hugging Face model directory rendered
over a request's messages, then encoded by the model's ``tokenizer.json``.

vLLM renders a chat request through transformers' ``apply_chat_template`` (a sandboxed Jinja2 template from
``tokenizer_config.json``'s ``chat_template``, with ``add_generation_prompt=True`` and the special tokens as
variables) and encodes the text without adding special tokens (the template writes them). This does the
same with ``jinja2`` and ``tokenizers``, without transformers. Text content parts are joined with a newline,
as vLLM's "string" content format does; a message with content that is not text (an image, audio) cannot
be tokenized as the engine does, so ``chat_ids`` returns None for it and routing falls back to the
approximate index.

Encoding costs about a microsecond a token (``perf/micro_tokenize.py``), too much to pay for a whole
conversation at every turn. But the tokenizer cuts its input at its added tokens (a chat template's
``<|im_start|>``...) before anything else and encodes each piece between them on its own; so do we, keeping
the ids of recent pieces (``SEGMENT_CACHE_CHARS`` of text), and a conversation's next turn encodes only its
new messages. It is exact: a model whose added tokens strip whitespace, take part in normalisation or
match single words only, or whose pre-tokenizer treats the first piece of an input apart
(``Metaspace`` with ``prepend_scheme = "first"``), or for which a probe at load encodes differently, is
encoded whole every time.

``request_prompt`` is what routing calls on the request path: a chat completion's ``messages`` (with an
Anthropic ``system`` put first) or a text completion's ``prompt``, else None. A prompt whose rendering is
longer than ``MAX_PROMPT_CHARS`` is encoded up to there only (a prefix is all that routing matches), less
its last ``CUT_MARGIN`` tokens, which may merge differently with what was cut: a client cannot make a
decision cost more than that much encoding.

I/O: ``ChatTokenizer.load`` reads the two files; ``loaded`` does so once per model directory and version of
its files (when a worker compiles a snapshot, off the request path), logging a directory it cannot use.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import jinja2
import jinja2.ext
import orjson
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

__all__ = [
    "MAX_PROMPT_CHARS",
    "SEGMENT_CACHE_CHARS",
    "ChatTokenizer",
    "PromptIds",
    "TemplateError",
    "TokenizerError",
    "loaded",
]

SEGMENT_CACHE_CHARS = 4 << 20  # text of the pieces whose ids are kept, per tokenizer and worker
MAX_PROMPT_CHARS = 64 << 10  # of a rendered prompt, encoded at most (about 16k tokens, 16 ms cold)
CUT_MARGIN = 16  # tokens dropped before a cut


class PromptIds(NamedTuple):
    ids: list[int]
    share: float  # of the rendered prompt's characters that ``ids`` cover: 1.0 unless it was cut


log = logging.getLogger("gateway.routing")

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TokenizerError(ValueError):
    """A model directory without a usable tokenizer.json or chat template."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _special(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class ChatTokenizer:
    """One model's tokenizer and chat template, and the ids of recently encoded pieces; shared by a worker's
    pools (one thread: not thread-safe)."""

    __slots__ = ("_added", "_cached", "_segments", "_split", "_template", "_tokenizer", "_variables", "path")

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: str,
        variables: Mapping[str, str],
        path: str,
        pre_tokenizer: Any = None,
    ) -> None:
        """``pre_tokenizer``: the ``tokenizer.json`` member of that name, which says whether the pieces
        between added tokens may be encoded apart."""
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(template)
        except TemplateError as exc:
            raise TokenizerError(f"{path}: the chat template does not compile: {exc}") from None
        self._tokenizer = tokenizer
        self._variables = dict(variables)
        self.path = path
        self._segments: OrderedDict[str, list[int]] = OrderedDict()
        self._cached = 0
        self._added, self._split = _added_tokens(tokenizer, pre_tokenizer)
        if self._split is not None:
            probe = "".join(f"{t} probe text {i}\n  spaced\t" for i, t in enumerate(self._added)) + " end"
            if self.encode(probe) != self._encode_whole(probe):
                self._split = None

    @classmethod
    def load(cls, directory: str) -> ChatTokenizer:
        """The tokenizer of a model directory (``tokenizer.json`` and ``tokenizer_config.json``)."""
        root = Path(directory)
        try:
            text = (root / "tokenizer.json").read_text(encoding="utf-8")
            tokenizer = Tokenizer.from_str(text)
            config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
            pre_tokenizer = orjson.loads(text).get("pre_tokenizer")
        except Exception as exc:  # OSError, ValueError; tokenizers raises a bare Exception on bad JSON
            raise TokenizerError(f"{directory}: {exc}") from None
        template = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str):
            raise TokenizerError(f"{directory}: tokenizer_config.json has no chat_template")
        variables = {k: v for k in _SPECIAL if (v := _special(config.get(k))) is not None}
        return cls(tokenizer, template, variables, directory, pre_tokenizer)

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> str:
        """The chat template over ``messages``, with the generation prompt. Raises ``TemplateError``."""
        return self._template.render(
            messages=messages, tools=tools, add_generation_prompt=True, **self._variables
        )

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, as the whole would encode (no special tokens added)."""
        split = self._split
        if split is None:
            return self._encode_whole(text)
        out: list[int] = []
        segments, added = self._segments, self._added
        for i, piece in enumerate(split.split(text)):
            if i % 2:
                out.append(added[piece])
            elif piece:
                ids = segments.get(piece)
                if ids is None:
                    ids = self._encode_whole(piece)
                    segments[piece] = ids
                    self._cached += len(piece)
                    while self._cached > SEGMENT_CACHE_CHARS:
                        old, _ = segments.popitem(last=False)
                        self._cached -= len(old)
                else:
                    segments.move_to_end(piece)
                out += ids
        return out

    def forget(self) -> None:
        """Drop the kept pieces (a benchmark's cold start)."""
        self._segments.clear()
        self._cached = 0

    def _encode_whole(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def chat_ids(self, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> list[int]:
        """The token ids of a chat request's prompt. Raises ``TemplateError`` when the template refuses
        the messages, ``ValueError`` when a message holds content that is not text."""
        return self.encode(self.render([_plain(m) for m in messages], tools))

    def request_ids(self, body: bytes, limit: int = MAX_PROMPT_CHARS) -> list[int] | None:
        """``request_prompt``'s ids alone."""
        prompt = self.request_prompt(body, limit)
        return None if prompt is None else prompt.ids

    def request_prompt(self, body: bytes, limit: int = MAX_PROMPT_CHARS) -> PromptIds | None:
        """The token ids of a request body's prompt as the engine would see them, its first ``limit``
        characters at most; None when this cannot say (not JSON, no messages or prompt, content that is
        not text, a template that refuses)."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict):
            return None
        messages = doc.get("messages")
        try:
            if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
                system = doc.get("system")  # Anthropic's, translated to a first system message
                if isinstance(system, (str, list)):
                    messages = [{"role": "system", "content": system}, *messages]
                # Only the leading messages that reach past ``limit`` are rendered: a body of thousands
                # of messages costs no more to template than one of ``limit`` characters.
                kept: list[Mapping[str, Any]] = []
                seen = 0
                for m in messages:
                    if seen > limit:
                        break
                    kept.append(_plain(m))
                    seen += _length(kept[-1])
                rest = sum(_length(m) for m in messages[len(kept) :])  # what was not rendered, about
                text = self.render(kept, doc.get("tools"))
            elif isinstance(doc.get("prompt"), str):
                text, rest = doc["prompt"], 0
            else:
                return None
        except (TemplateError, ValueError, TypeError):
            return None
        if len(text) <= limit:
            return PromptIds(self.encode(text), 1.0)
        ids = self.encode(text[:limit])
        return PromptIds(ids[: max(0, len(ids) - CUT_MARGIN)], limit / (len(text) + rest))


def _added_tokens(tokenizer: Tokenizer, pre: Any) -> tuple[dict[str, int], re.Pattern[str] | None]:
    """The added tokens by text, and a pattern that splits at them (capturing them) where encoding the
    pieces apart is encoding the whole; None where it may not be."""
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    tokens = tokenizer.get_added_tokens_decoder().values()
    if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in tokens):
        return added, None
    if '"first"' in json.dumps(pre):  # Metaspace(prepend_scheme="first"): the first piece is special
        return added, None
    longest_first = sorted(added, key=len, reverse=True)
    return added, re.compile("(" + "|".join(re.escape(t) for t in longest_first) + ")")


_LOADED: dict[tuple[str, int, int], ChatTokenizer | None] = {}


def loaded(directory: str) -> ChatTokenizer | None:
    """The tokenizer of ``directory``, loaded once per version of its files; None (logged once) when it
    cannot be used, and the pool then routes by the approximate index alone."""
    try:
        stamp = tuple(os.stat(os.path.join(directory, f)).st_mtime_ns for f in _FILES)
    except OSError as exc:
        key = (directory, -1, -1)
        if key not in _LOADED:
            _LOADED[key] = None
            log.error(
                "tokenizer %s cannot be read (%s): routing uses the approximate prefix index", directory, exc
            )
        return None
    key = (directory, stamp[0], stamp[1])
    if key not in _LOADED:
        try:
            _LOADED[key] = ChatTokenizer.load(directory)
        except TokenizerError as exc:
            _LOADED[key] = None
            log.error("%s: routing uses the approximate prefix index", exc)
    return _LOADED[key]


_FILES = ("tokenizer.json", "tokenizer_config.json")


def _length(message: Mapping[str, Any]) -> int:
    """About how many characters ``message`` adds to a rendered prompt: its content's."""
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text") or "") if isinstance(p, dict) else len(str(p)) for p in content)
    return 0


def _plain(message: Mapping[str, Any]) -> Mapping[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = []
    for part in content:
        if (
            isinstance(part, dict)
            and part.get("type") in ("text", None)
            and isinstance(part.get("text"), str)
        ):
            texts.append(part["text"])
        elif isinstance(part, str):
            texts.append(part)
        else:
            raise ValueError("content that is not text")
    return {**message, "content": "\n".join(texts)}
