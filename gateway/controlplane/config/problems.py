"""The problems a configuration check collects before it reports them all at once. No I/O."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["Problems"]


class Problems:
    """Every problem found in a configuration document, each with its place (``models[2].rules[0]``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.places: list[str] = []  # the place of each line, for finding it in the source text
        self.first_place: str | None = None
        # Names declared per section, valid entry or not, so that an invalid entry does not also
        # produce an "unknown ..." line at every reference to it.
        self.declared: dict[str, set[str]] = {}

    def add(self, place: str, message: str) -> None:
        self.lines.append(f"{place}: {message}")
        self.places.append(place)
        if self.first_place is None:
            self.first_place = place

    def unknown_fields(self, place: str, table: dict[str, Any], known: Iterable[str]) -> None:
        allowed = set(known)
        for name in table:
            if name not in allowed:
                where = f"{place}.{name}" if place else name
                self.add(where, f"unknown field (expected one of: {', '.join(sorted(allowed))})")
