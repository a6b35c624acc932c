"""Where in a TOML file a place such as ``backends[0].wibble`` is written, for error messages. No I/O.

``tomllib`` returns plain dicts and lists without positions, and the configuration check names each
problem by its place in the decoded document. This module reads the source text once, line by line, and
maps each table header and each key line to that same kind of place: ``[[backends]]`` opens
``backends[N]``, ``[[models.rules]]`` inside it opens ``models[K].rules[J]``, ``url = ...`` under it is
``backends[N].url``. It is a reader for messages, not a parser: a place it cannot find (a value inside an
inline table, a key in a multi-line string) falls back to the nearest enclosing place it did find.
"""

from __future__ import annotations

import re

__all__ = ["TomlPlaces"]

_HEADER = re.compile(r"^\s*(\[\[?)\s*(?P<path>[^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*(?P<key>(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_PART = re.compile(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""")
_LAST = re.compile(r"(\.[^.\[\]]+|\[\d+\])$")


def _parts(dotted: str) -> list[str]:
    return [p[1:-1] if p[:1] in "\"'" else p for p in _PART.findall(dotted)]


class TomlPlaces:
    """The line (1-based) of each place in one TOML text."""

    def __init__(self, text: str) -> None:
        self.lines: dict[str, int] = {}
        arrays: dict[str, int] = {}  # array-of-tables place -> index of its last element
        table = ""
        in_multiline = False
        for number, line in enumerate(text.splitlines(), start=1):
            # A key line inside a multi-line string is text, not a key.
            if line.count('"""') % 2 == 1 or line.count("'''") % 2 == 1:
                in_multiline = not in_multiline
                if not in_multiline:
                    continue
            elif in_multiline:
                continue
            if header := _HEADER.match(line):
                table = self._open(_parts(header["path"]), header.group(1) == "[[", arrays)
                enclosing = table
                while enclosing:  # "[principals.alice]" also places "principals"
                    self.lines.setdefault(enclosing, number)
                    enclosing = _LAST.sub("", enclosing) if _LAST.search(enclosing) else ""
            elif key := _KEY.match(line):
                parts = _parts(key["key"])
                for end in range(1, len(parts) + 1):  # "a.b = 1" also places "a"
                    self.lines.setdefault(".".join(filter(None, [table, *parts[:end]])), number)

    @staticmethod
    def _open(parts: list[str], is_array: bool, arrays: dict[str, int]) -> str:
        place = ""
        for i, part in enumerate(parts):
            place = f"{place}.{part}" if place else part
            if is_array and i == len(parts) - 1:
                arrays[place] = arrays.get(place, -1) + 1
                return f"{place}[{arrays[place]}]"
            if place in arrays:
                place = f"{place}[{arrays[place]}]"
        return place

    def line_of(self, place: str | None) -> int | None:
        """The line of ``place``, or of the nearest enclosing place written in the file."""
        while place:
            if place in self.lines:
                return self.lines[place]
            trimmed = _LAST.sub("", place)
            if trimmed == place:
                return None
            place = trimmed
        return None
