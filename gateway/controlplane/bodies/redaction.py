"""Redaction of logged bodies, applied by the control worker before anything is stored.

Two kinds of rule, from a ``[[body_logs]]`` entry:

- **JSON paths** (``redact_paths``): ``messages[*].content``, ``metadata.user_id``, ``input[0]``,
  ``tools[*].function.description``, ``*.secret``. A path is member names joined by dots, with ``[*]``
  for every element of an array, ``[N]`` for one, ``*`` for every member of an object and ``["a.b"]``
  for a name with dots or brackets in it; a leading ``$.`` is allowed. The value each path reaches, of
  whatever type, is replaced by the string ``"[REDACTED]"``. Every path is tried on the request and on
  the answer (a stream's answer rebuilt first): a path that does not exist in a document changes nothing.
- **Patterns** (``redact_patterns``), applied to every string of a JSON document (member values, not
  names) and to a body that is text but not JSON: ``email`` (an address such as ``jo@example.com``),
  ``card`` (13 to 19 digits, spaces or dashes between them allowed, that pass the Luhn check: a card
  number, not any long number), and ``{ name = "...", regex = "..." }`` of the operator's own. A match is
  replaced by ``[REDACTED:<name>]``.

Paths go first, then patterns, so a value a path removed is not searched. ``Redactor`` counts what it
replaced. Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUILTIN_PATTERNS",
    "REDACTED",
    "Pattern",
    "Redactor",
    "luhn_valid",
    "parse_path",
]

REDACTED = "[REDACTED]"
# A step of a path: ("member", name), ("index", n), ("every",) for [*], ("any",) for *.
Step = tuple[Any, ...]

_STEP = re.compile(r'\.?(?:\[(?P<bracket>\*|\d+|"(?:[^"\\]|\\.)*")\]|(?P<name>[^.\[\]]+))')


def parse_path(path: str) -> tuple[Step, ...]:
    """The steps of ``path``; ValueError naming what is wrong."""
    text = path.strip()
    if text.startswith("$"):
        text = text[1:]
    if not text:
        raise ValueError("is empty")
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        m = _STEP.match(text, pos)
        if m is None or m.end() == pos or (pos == 0 and text[0] == "." and not path.strip().startswith("$")):
            raise ValueError(f"cannot read {text[pos:]!r} (at character {pos + 1})")
        bracket, name = m.group("bracket"), m.group("name")
        if bracket == "*":
            steps.append(("every",))
        elif bracket is not None and bracket.isdigit():
            steps.append(("index", int(bracket)))
        elif bracket is not None:
            steps.append(("member", bracket[1:-1].replace('\\"', '"').replace("\\\\", "\\")))
        elif name == "*":
            steps.append(("any",))
        else:
            assert name is not None
            if name != name.strip():
                raise ValueError(f"member name {name!r} has spaces around it")
            steps.append(("member", name))
        pos = m.end()
    return tuple(steps)


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


@dataclass(frozen=True, slots=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    check: Callable[[str], bool] | None = None  # a match is replaced only when this says so

    @property
    def replacement(self) -> str:
        return f"[REDACTED:{self.name}]"


def _card_digits_valid(match: str) -> bool:
    digits = "".join(ch for ch in match if ch.isdigit())
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


BUILTIN_PATTERNS = {
    "email": Pattern(
        "email", re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")
    ),
    # Digits in groups, one space or dash between them at most, not inside a longer run of digits.
    "card": Pattern(
        "card", re.compile(r"(?<![0-9])[0-9](?:[ \-]?[0-9]){12,18}(?![0-9])"), _card_digits_valid
    ),
}


@dataclass(slots=True)
class Redactor:
    paths: tuple[tuple[Step, ...], ...] = ()
    patterns: tuple[Pattern, ...] = ()
    count: int = field(default=0)  # replacements made so far

    def document(self, value: Any) -> Any:
        """``value`` (decoded JSON) with the paths' values replaced, then the patterns' matches in every
        string; the count of replacements grows by what was done."""
        for steps in self.paths:
            value = self._at_path(value, steps)
        return self._strings(value) if self.patterns else value

    def text(self, text: str) -> str:
        """The patterns' matches in ``text`` replaced."""
        for pattern in self.patterns:
            text = self._sub(pattern, text)
        return text

    def _sub(self, pattern: Pattern, text: str) -> str:
        check = pattern.check
        if check is None:
            text, n = pattern.regex.subn(pattern.replacement, text)
            self.count += n
            return text

        def replace(m: re.Match[str]) -> str:
            if check(m.group()):
                self.count += 1
                return pattern.replacement
            return m.group()

        return pattern.regex.sub(replace, text)

    def _strings(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self._strings(v) for v in value]
        if isinstance(value, dict):
            return {k: self._strings(v) for k, v in value.items()}
        return value

    def _at_path(self, value: Any, steps: tuple[Step, ...]) -> Any:
        if not steps:
            self.count += 1
            return REDACTED
        step, rest = steps[0], steps[1:]
        kind = step[0]
        if kind == "member" and isinstance(value, dict) and step[1] in value:
            value[step[1]] = self._at_path(value[step[1]], rest)
        elif kind == "any" and isinstance(value, dict):
            for name in list(value):
                value[name] = self._at_path(value[name], rest)
        elif kind == "index" and isinstance(value, list) and step[1] < len(value):
            value[step[1]] = self._at_path(value[step[1]], rest)
        elif kind == "every" and isinstance(value, list):
            for i in range(len(value)):
                value[i] = self._at_path(value[i], rest)
        return value
