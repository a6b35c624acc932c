"""Token usage from the tail of an LLM response: the pure-Python reference and the specification.

The gateway forwards response bytes untouched and keeps only the last few KiB of each response; at the end
it parses that tail once for token usage. ``native/usage_tail.c`` implements exactly the rules below, and
the tests check that both agree on arbitrary bytes, so change them together. Sans-I/O: bytes in, values out.

The rules
---------
1. Candidates are the occurrences of the 7 bytes ``"usage"``, tried from the last one backwards. That works
   for a plain JSON body, for SSE streams (``data:`` frames, LF or CRLF framing, comments, ``event:``
   lines) and for a tail that begins mid-frame or mid-UTF-8, without parsing the framing: inside a JSON
   string a ``"`` is always escaped, so model output cannot fake the key. An occurrence whose leading quote
   is escaped (an odd run of backslashes before it) is skipped.
2. A candidate must be followed, after JSON whitespace, by ``:`` and then ``{`` (so ``"usage": null``, the
   placeholder in intermediate stream chunks, is skipped). The object must be complete, well-formed JSON
   (RFC 8259 grammar, bytes >= 0x80 accepted as they are, containers nested at most ``MAX_DEPTH`` deep
   counting the usage object as 1). At most ``MAX_OBJECT_ATTEMPTS`` such objects are parsed per call, which
   bounds the work on adversarial input to a few passes over the tail.
3. Counted fields are members of the usage object whose raw key bytes are one of ``prompt_tokens``,
   ``completion_tokens``, ``total_tokens`` (OpenAI, vLLM, SGLang), ``input_tokens``, ``output_tokens``,
   ``cache_read_input_tokens``, ``cache_creation_input_tokens`` (Anthropic; OpenAI Responses), plus
   ``cached_tokens`` inside a ``prompt_tokens_details`` or ``input_tokens_details`` object. A value counts
   only if it is a plain JSON integer (no sign, fraction or exponent) no larger than 2**53; any other
   value (``null``, ``-1``, ``1.5``, ``1e3``, absurdly large) leaves the field absent. For duplicate keys
   the last occurrence wins. Other members are validated and skipped.
4. The first candidate from the end with at least one of prompt/completion/total/input/output tokens
   present wins; otherwise the search continues with the previous candidate, and no winner means ``None``.
5. Mapping (missing fields count as 0, sums saturate at 2**53):

   - ``prompt_tokens`` = prompt_tokens, else input_tokens + cache_read_input_tokens +
     cache_creation_input_tokens. Anthropic's ``input_tokens`` excludes cache reads and writes, while
     OpenAI's ``prompt_tokens`` includes cached tokens, so the sum keeps one meaning for both.
   - ``completion_tokens`` = completion_tokens, else output_tokens.
   - ``total_tokens`` = total_tokens, else prompt + completion as computed above.
   - ``cached_tokens`` = prompt_tokens_details.cached_tokens, else input_tokens_details.cached_tokens,
     else cache_read_input_tokens.

Known limitation: an Anthropic *stream* reports input tokens in ``message_start`` near the start of the
stream, usually outside the tail; its final ``message_delta`` may carry only ``output_tokens``, which then
gives ``prompt_tokens == 0``.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = [
    "DEFAULT_TAIL_CAPACITY",
    "MAX_DEPTH",
    "MAX_OBJECT_ATTEMPTS",
    "TOKEN_LIMIT",
    "TailWindow",
    "Usage",
    "parse_usage",
]

DEFAULT_TAIL_CAPACITY: Final = 4096
TOKEN_LIMIT: Final = 2**53
MAX_DEPTH: Final = 32
MAX_OBJECT_ATTEMPTS: Final = 16


class Usage(NamedTuple):
    """Token counts of one response, each in ``[0, 2**53]``; ``cached_tokens`` are part of the prompt. A
    tuple: built once per response on the request path, where a frozen dataclass costs twice as much."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int


_KEY: Final = b'"usage"'
_WS: Final = b" \t\n\r"
_STRING: Final = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9A-Fa-f]{4})*+"')
_NUMBER: Final = re.compile(rb"(-?)(0|[1-9][0-9]*+)(\.[0-9]++)?([eE][+-]?[0-9]++)?")
_LITERALS: Final = (b"true", b"false", b"null")
_FAIL: Final = -1

# Slots of the captured fields; the C code uses the same order.
_PROMPT, _COMPLETION, _TOTAL, _INPUT, _OUTPUT, _CACHE_READ, _CACHE_CREATION, _PROMPT_CACHED, _INPUT_CACHED = (
    range(9)
)
_COUNTED: Final = {
    b"prompt_tokens": _PROMPT,
    b"completion_tokens": _COMPLETION,
    b"total_tokens": _TOTAL,
    b"input_tokens": _INPUT,
    b"output_tokens": _OUTPUT,
    b"cache_read_input_tokens": _CACHE_READ,
    b"cache_creation_input_tokens": _CACHE_CREATION,
}
_DETAILS: Final = {b"prompt_tokens_details": _PROMPT_CACHED, b"input_tokens_details": _INPUT_CACHED}
_DETAIL_COUNTED: Final = b"cached_tokens"

Fields = list[int | None]


def parse_usage(tail: bytes | bytearray | memoryview) -> Usage | None:
    """The usage in ``tail`` by the rules in the module docstring, or ``None``."""
    s = bytes(tail)
    end = len(s)
    attempts = 0
    while True:
        p = s.rfind(_KEY, 0, end)
        if p < 0:
            return None
        end = p + len(_KEY) - 1  # the next candidate must start before p
        if _escaped(s, p):
            continue
        i = _skip_ws(s, p + len(_KEY))
        if s[i : i + 1] != b":":
            continue
        i = _skip_ws(s, i + 1)
        if s[i : i + 1] != b"{":
            continue
        attempts += 1
        if attempts > MAX_OBJECT_ATTEMPTS:
            return None
        fields: Fields = [None] * 9
        if _object(s, i, 1, fields, _COUNTED) != _FAIL and (usage := _to_usage(fields)) is not None:
            return usage


def _escaped(s: bytes, p: int) -> bool:
    run = 0
    while p - run > 0 and s[p - run - 1] == 0x5C:  # backslash
        run += 1
    return run % 2 == 1


def _skip_ws(s: bytes, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _object(s: bytes, i: int, depth: int, fields: Fields, counted: dict[bytes, int] | None) -> int:
    """Scan the object at ``s[i] == '{'``; return the index after it or ``_FAIL``.

    ``counted`` maps member names to field slots: the usage object's own table at depth 1, a one-entry
    table inside a details object, ``None`` everywhere else.
    """
    if depth > MAX_DEPTH:
        return _FAIL
    i = _skip_ws(s, i + 1)
    if s[i : i + 1] == b"}":
        return i + 1
    while True:
        key = _STRING.match(s, i)
        if key is None:
            return _FAIL
        name = key.group()[1:-1]
        i = _skip_ws(s, key.end())
        if s[i : i + 1] != b":":
            return _FAIL
        i = _skip_ws(s, i + 1)
        slot = counted.get(name) if counted is not None else None
        details = _DETAILS.get(name) if counted is _COUNTED else None
        if slot is not None:
            i = _counted_value(s, i, depth, fields, slot)
        elif details is not None:
            fields[details] = None
            if s[i : i + 1] == b"{":
                i = _object(s, i, depth + 1, fields, {_DETAIL_COUNTED: details})
            else:
                i = _value(s, i, depth)
        else:
            i = _value(s, i, depth)
        if i == _FAIL:
            return _FAIL
        i = _skip_ws(s, i)
        sep = s[i : i + 1]
        if sep == b"}":
            return i + 1
        if sep != b",":
            return _FAIL
        i = _skip_ws(s, i + 1)


def _counted_value(s: bytes, i: int, depth: int, fields: Fields, slot: int) -> int:
    number = _NUMBER.match(s, i)
    if number is None:
        fields[slot] = None
        return _value(s, i, depth)
    sign, digits, fraction, exponent = number.groups()
    plain = not sign and fraction is None and exponent is None and len(digits) <= 16
    fields[slot] = int(digits) if plain and int(digits) <= TOKEN_LIMIT else None
    return number.end()


def _value(s: bytes, i: int, depth: int) -> int:
    """Scan any JSON value starting exactly at ``i`` (a container in it sits at ``depth + 1``)."""
    lead = s[i : i + 1]
    if lead == b"{":
        return _object(s, i, depth + 1, [], None)
    if lead == b"[":
        return _array(s, i, depth + 1)
    m = _STRING.match(s, i) if lead == b'"' else _NUMBER.match(s, i)
    if m is not None:
        return m.end()
    for literal in _LITERALS:
        if s.startswith(literal, i):
            return i + len(literal)
    return _FAIL


def _array(s: bytes, i: int, depth: int) -> int:
    if depth > MAX_DEPTH:
        return _FAIL
    i = _skip_ws(s, i + 1)
    if s[i : i + 1] == b"]":
        return i + 1
    while True:
        i = _value(s, i, depth)
        if i == _FAIL:
            return _FAIL
        i = _skip_ws(s, i)
        sep = s[i : i + 1]
        if sep == b"]":
            return i + 1
        if sep != b",":
            return _FAIL
        i = _skip_ws(s, i + 1)


def _to_usage(f: Fields) -> Usage | None:
    if all(f[k] is None for k in (_PROMPT, _COMPLETION, _TOTAL, _INPUT, _OUTPUT)):
        return None

    def get(k: int) -> int:
        return f[k] or 0

    if f[_PROMPT] is not None:
        prompt = get(_PROMPT)
    else:
        prompt = min(get(_INPUT) + get(_CACHE_READ) + get(_CACHE_CREATION), TOKEN_LIMIT)
    completion = get(_COMPLETION) if f[_COMPLETION] is not None else get(_OUTPUT)
    total = get(_TOTAL) if f[_TOTAL] is not None else min(prompt + completion, TOKEN_LIMIT)
    cached = next((v for v in (f[_PROMPT_CACHED], f[_INPUT_CACHED], f[_CACHE_READ]) if v is not None), 0)
    return Usage(prompt, completion, total, cached)


class TailWindow:
    """The last ``capacity`` bytes of everything appended, in a ``bytearray``: the pure-Python tail buffer."""

    __slots__ = ("_buf", "_capacity")

    def __init__(self, capacity: int = DEFAULT_TAIL_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._buf = bytearray()

    @property
    def capacity(self) -> int:
        return self._capacity

    def append(self, chunk: bytes | bytearray | memoryview) -> None:
        buf = self._buf
        if len(chunk) >= self._capacity:
            buf[:] = memoryview(chunk).cast("B")[-self._capacity :]
            return
        buf += chunk
        excess = len(buf) - self._capacity
        if excess > 0:
            del buf[:excess]

    def usage(self) -> Usage | None:
        return parse_usage(self._buf)

    def clear(self) -> None:
        self._buf.clear()

    def getvalue(self) -> bytes:
        return bytes(self._buf)

    def __len__(self) -> int:
        return len(self._buf)
