"""Token usage of an Anthropic Messages answer relayed verbatim, read as the bytes pass. Sans-I/O.

The tail parser of ``usage.py`` cannot meter an Anthropic *stream*: the input and cache tokens are in
``message_start`` at its beginning, the output tokens in the last ``message_delta``. ``AnthropicUsageMeter``
is fed every piece of the response body and keeps only what it needs:

- A stream (the body does not start with ``{``): events are decoded with ``SSEDecoder`` capped at
  ``max_event_bytes`` (64 KiB by default); larger events are dropped unread, which is safe because the
  two events that carry usage are small. Only ``message_start`` and ``message_delta`` are parsed (by
  their ``event:`` name, or by ``type`` when an upstream leaves the name out). ``message_start`` gives
  input, cache read and cache creation tokens; ``message_delta`` the output tokens, which Anthropic
  reports cumulatively, and any input or cache figures it repeats (these then win).
- A JSON body: only the last ``DEFAULT_TAIL_CAPACITY`` bytes are kept (``usage`` is the last member of
  a Messages object); at the end the last ``"usage"`` object in them with input or output tokens is
  read, candidates tried from the end as ``usage.parse_usage`` does, but keeping Anthropic's four
  fields apart (cache writes and reads are priced differently).

Memory is bounded either way: a few KiB of tail, or one event of at most ``max_event_bytes``.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

from gateway.protocol.sse import SSEDecoder
from gateway.protocol.usage import MAX_OBJECT_ATTEMPTS, TOKEN_LIMIT, TailWindow, Usage

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "AnthropicUsageMeter"]

DEFAULT_MAX_EVENT_BYTES: Final = 64 * 1024
_WANTED: Final = ("message_start", "message_delta")
_FIELDS: Final = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_input_tokens", "cache_read_input_tokens"),
    ("cache_creation_input_tokens", "cache_creation_input_tokens"),
)


class AnthropicUsageMeter:
    """Feed it the response body in pieces; read ``usage()`` (or the four counters) at the end."""

    __slots__ = (
        "_kind",
        "_sse",
        "_tail",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "input_tokens",
        "output_tokens",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._sse = SSEDecoder(max_event_bytes)
        self._tail: TailWindow | None = None
        self._kind: str | None = None  # "stream" or "json", from the first non-blank byte
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cache_read_input_tokens: int | None = None
        self.cache_creation_input_tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        if self._kind is None:
            head = chunk.lstrip()
            if not head:
                return
            self._kind = "json" if head[:1] == b"{" else "stream"
            if self._kind == "json":
                self._tail = TailWindow()
        if self._tail is not None:
            self._tail.append(chunk)
            return
        for event in self._sse.feed(chunk):
            self._event(event.event, event.data)

    def finish(self) -> None:
        """At the end of the body: read the JSON tail, or the last event if its blank line never came."""
        if self._tail is not None:
            self._read(_last_usage(self._tail.getvalue()))
            self._tail = None
            return
        for event in self._sse.close():
            self._event(event.event, event.data)

    @property
    def dropped_events(self) -> int:
        """Events dropped for being larger than ``max_event_bytes``."""
        return self._sse.dropped

    def usage(self) -> Usage | None:
        """In the gateway's terms: prompt = input + cache read + cache creation; ``None`` if nothing seen."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        prompt = min(
            (self.input_tokens or 0)
            + (self.cache_read_input_tokens or 0)
            + (self.cache_creation_input_tokens or 0),
            TOKEN_LIMIT,
        )
        completion = self.output_tokens or 0
        return Usage(
            prompt, completion, min(prompt + completion, TOKEN_LIMIT), self.cache_read_input_tokens or 0
        )

    def _event(self, name: str | None, data: str) -> None:
        if name is not None and name not in _WANTED:
            return
        try:
            doc: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        kind = doc.get("type")
        if kind == "message_start":
            message = doc.get("message")
            self._read(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "message_delta":
            self._read(doc.get("usage"))

    def _read(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for attr, key in _FIELDS:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= TOKEN_LIMIT:
                setattr(self, attr, value)


_DECODER: Final = json.JSONDecoder()


def _last_usage(tail: bytes) -> dict[str, Any] | None:
    """The last ``"usage": {...}`` object in ``tail`` with input or output tokens, or ``None``."""
    text = tail.decode("utf-8", "replace")
    end = len(text)
    for _ in range(MAX_OBJECT_ATTEMPTS):
        p = text.rfind('"usage"', 0, end)
        if p < 0:
            return None
        end = p
        run = len(text[:p]) - len(text[:p].rstrip("\\"))
        if run % 2:
            continue  # an escaped quote: the key is inside a string
        rest = text[p + 7 :].lstrip()
        if not rest.startswith(":"):
            continue
        rest = rest[1:].lstrip()
        try:
            value, _ = _DECODER.raw_decode(rest)
        except ValueError:
            continue
        if isinstance(value, dict) and ("input_tokens" in value or "output_tokens" in value):
            return value
    return None
