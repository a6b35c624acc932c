"""What is left of a body cut at its size cap, made safe to redact.

A JSON body cut anywhere no longer parses, and a redaction by JSON path needs it parsed. ``close_json``
turns the cut text into the longest well-formed prefix of the document it can find: complete values are
kept, open arrays and objects closed, and a string cut in the middle is ended where it was cut. The value
it ends in is not trusted whole: ``cut_tail`` drops the last, partial word (letters, digits and the
characters of an e-mail address), and then any run of digits, spaces and dashes before it, so that an
e-mail address or a card number cut in half leaves none of its characters for the patterns to miss. A text
body cut short loses its tail the same way. Pure; no I/O.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = ["close_json", "cut_tail"]

# Every character belongs to one token: a whole string, an unterminated string's opening quote, one
# structural character, or a run of anything else (numbers, literals, white space).
# Possessive: an unterminated string (the cut fell in it) fails once, not once per character it holds.
_TOKEN = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|"|[{}\[\],:]|[^"{}\[\],:]++', re.S)
_WORD_EXTRA = frozenset("_.%+@-")  # besides letters and digits: what an e-mail address is made of
_RUN_EXTRA = frozenset(" -")  # besides digits: what separates a card number's groups
_HALF_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?\Z")
_CLOSERS = {"{": "}", "[": "]"}


def cut_tail(text: str) -> str:
    """``text`` without its last, possibly partial word, nor the digits, spaces and dashes before it.
    Scanned from the end: a cut body can be a megabyte, and only its tail is looked at."""
    end = len(text)
    while end and (text[end - 1].isalnum() or text[end - 1] in _WORD_EXTRA):
        end -= 1
    while end and (text[end - 1].isdigit() or text[end - 1] in _RUN_EXTRA):
        end -= 1
    return text[:end]


def close_json(text: str) -> Any | None:
    """The decoded longest well-formed prefix of the JSON document ``text`` was cut from; None when
    nothing of it is (it does not start like a document)."""
    stripped = text.lstrip()
    if not stripped or stripped[0] not in '{["':
        return None
    stack: list[str] = []
    key_next: list[bool] = []  # per open object: whether a member name comes next
    # Places to cut, latest last: (end of the prefix kept, the containers open there).
    cuts: list[tuple[int, tuple[str, ...]]] = []
    open_string: tuple[int, tuple[str, ...]] | None = None
    for m in _TOKEN.finditer(text):
        token, start = m.group(), m.start()
        if token in ("{", "["):
            stack.append(token)
            key_next.append(token == "{")
            cuts.append((m.end(), tuple(stack)))
        elif token in ("}", "]"):
            if not stack:
                break
            stack.pop()
            key_next.pop()
            cuts.append((m.end(), tuple(stack)))
        elif token == ",":
            cuts.append((start, tuple(stack)))
            if stack and stack[-1] == "{":
                key_next[-1] = True
        elif token == ":":
            if key_next:
                key_next[-1] = False
        elif token == '"':
            # A string the cut fell in: kept, ended where it was cut, unless it is a member name.
            if not (stack and stack[-1] == "{" and key_next[-1]):
                open_string = (start, tuple(stack))
            break
        elif token.startswith('"'):
            if stack and stack[-1] == "{" and key_next[-1]:
                continue  # a member name: its value must follow before this is a place to cut
            cuts.append((m.end(), tuple(stack)))
    if open_string is not None:
        start, open_at = open_string
        inside = cut_tail(_drop_half_escape(text[start + 1 :]))
        closed = _parse(text[:start] + '"' + inside + '"' + _closing(open_at))
        if closed is not _FAILED:
            return closed
    for end, open_at in reversed(cuts):
        closed = _parse(text[:end] + _closing(open_at))
        if closed is not _FAILED:
            return closed
    return None


_FAILED = object()


def _drop_half_escape(inside: str) -> str:
    """The inside of a string cut in the middle of an escape (``\\`` or ``\\u00``) without that escape.
    Only the tail is searched (a cut escape is at most 5 characters), then the backslashes before it
    counted: an even run is escaped backslashes, and what follows them plain text."""
    tail = inside[-5:]
    m = _HALF_ESCAPE.search(tail)
    if m is None:
        return inside
    at = len(inside) - len(tail) + m.start()
    run = 0
    while at - run >= 0 and inside[at - run] == "\\":
        run += 1
    return inside[:at] if run % 2 else inside


def _closing(open_at: tuple[str, ...]) -> str:
    return "".join(_CLOSERS[c] for c in reversed(open_at))


def _parse(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _FAILED
