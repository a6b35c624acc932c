"""Pattern aliases: a model alias such as ``claude-*`` that stands for every name it matches, so an
operator maps the names a client picks for itself (Claude Code asks for ``claude-opus-4-…``,
``claude-sonnet-4-…`` and a small fast model) with one config entry.

Patterns are shell-style (``*``, ``?``, ``[…]``, case-sensitive, as ``fnmatch.fnmatchcase``), tried in
the order they were configured, after the exact names: an exact model name or alias always wins. What a
name resolved to is remembered (misses too) in a table of at most ``MEMO_SIZE`` names that is emptied when
full, so a client that repeats its names pays one dict lookup, and one that sends endless new names costs
bounded memory. No I/O here.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from typing import Generic, TypeVar

__all__ = ["GLOB_CHARS", "MEMO_SIZE", "PatternAliases", "is_pattern"]

GLOB_CHARS = frozenset("*?[")
MEMO_SIZE = 4096

T = TypeVar("T")


def is_pattern(name: str) -> bool:
    """Whether an alias is a pattern rather than one name."""
    return not GLOB_CHARS.isdisjoint(name)


class PatternAliases(Generic[T]):
    """``(pattern, value)`` pairs, first match wins; ``match`` returns the value or None."""

    __slots__ = ("_memo", "_patterns")

    def __init__(self, patterns: Sequence[tuple[str, T]] = ()) -> None:
        self._patterns = tuple((re.compile(fnmatch.translate(p)), v) for p, v in patterns)
        self._memo: dict[str, T | None] = {}

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def match(self, name: str) -> T | None:
        if not self._patterns:
            return None
        memo = self._memo
        if name in memo:
            return memo[name]
        found = next((value for regex, value in self._patterns if regex.match(name)), None)
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[name] = found
        return found
