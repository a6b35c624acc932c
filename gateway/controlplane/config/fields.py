"""Readers of the fields most configuration tables share (a name, a list of names, a timeout): each
returns the value, or reports the problem with its place and returns None. No I/O.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.values import check_name

__all__ = ["read_name", "read_names", "read_timeout"]


def read_name(p: Problems, place: str, item: dict[str, Any], key: str = "name") -> str | None:
    if key not in item:
        p.add(f"{place}.{key}", "is required")
        return None
    problem = check_name(item[key])
    if problem:
        p.add(f"{place}.{key}", problem)
        return None
    value: str = item[key]
    return value


def read_names(p: Problems, place: str, value: object, *, required: bool) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        p.add(place, "must be an array of strings")
        return None
    if required and not value:
        p.add(place, "must not be empty")
        return None
    ok = True
    for i, v in enumerate(value):
        problem = check_name(v)
        if problem:
            p.add(f"{place}[{i}]", problem)
            ok = False
    if not ok:
        return None
    seen: set[str] = set()
    for i, v in enumerate(value):
        if v in seen:
            p.add(f"{place}[{i}]", f"duplicate entry {v!r}")
            ok = False
        seen.add(v)
    return tuple(value) if ok else None


def read_timeout(p: Problems, place: str, item: dict[str, Any], key: str, default: float) -> float | None:
    value = item.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        p.add(f"{place}.{key}", "must be a positive number of seconds")
        return None
    return float(value)
