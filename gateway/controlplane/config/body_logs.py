"""``[[body_logs]]``: which requests have their request and response bodies logged.

    [[body_logs]]
    name = "debug-alice"                   # required, unique
    principals = ["alice"]                 # optional selectors: all the lists given must match
    keys = ["ci"]                          #   (key names; a key made with `gateway keys create --name`)
    models = ["chat"]                      #   (names a client calls)
    sample = 0.25                          # share of the matching requests logged (1)
    max_bytes = 65536                      # bytes kept of each body, as sent (64 KiB, at most 1 MiB)
    redact_paths = ["messages[*].content"] # JSON paths whose values are replaced (none)
    redact_patterns = ["email", "card", { name = "api-key", regex = "sk-[A-Za-z0-9]{20,}" }]
                                           # (["email", "card"]; [] for none)
    retention_days = 7                     # kept this long, then purged (7)

The first entry whose selectors match a request decides. Principals and models must be declared in the
same document, as everywhere in the file; key names are resolved when the snapshot is built (a key the
CLI made has no place in a file). No I/O.
"""

from __future__ import annotations

import math
import re
from typing import Any

from gateway.body_rules import MAX_BYTES_LIMIT
from gateway.controlplane.bodies.redaction import BUILTIN_PATTERNS, parse_path
from gateway.controlplane.config.fields import read_name, read_names
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.specs import BodyLogSpec
from gateway.controlplane.config.values import check_name

__all__ = ["MAX_RETENTION_DAYS", "parse_body_log"]

MAX_RETENTION_DAYS = 3650
MAX_REGEX = 1000  # characters of an operator's pattern
_FIELDS = (
    "name",
    "principals",
    "keys",
    "models",
    "sample",
    "max_bytes",
    "redact_paths",
    "redact_patterns",
    "retention_days",
)


def parse_body_log(p: Problems, place: str, item: dict[str, Any]) -> BodyLogSpec | None:
    p.unknown_fields(place, item, _FIELDS)
    before = len(p.lines)
    name = read_name(p, place, item)
    selectors: dict[str, tuple[str, ...] | None] = {}
    for field in ("principals", "keys", "models"):
        selectors[field] = (
            read_names(p, f"{place}.{field}", item[field], required=True) if field in item else None
        )
    sample = item.get("sample", 1.0)
    if isinstance(sample, bool) or not isinstance(sample, int | float) or not 0 <= sample <= 1:
        p.add(f"{place}.sample", "must be a number between 0 and 1 (the share of matching requests logged)")
    max_bytes = item.get("max_bytes", 65536)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= MAX_BYTES_LIMIT:
        p.add(f"{place}.max_bytes", f"must be an integer from 1 to {MAX_BYTES_LIMIT} (bytes of each body)")
    paths = _paths(p, f"{place}.redact_paths", item.get("redact_paths", []))
    patterns = _patterns(p, f"{place}.redact_patterns", item.get("redact_patterns", ["email", "card"]))
    days = item.get("retention_days", 7)
    if (
        isinstance(days, bool)
        or not isinstance(days, int | float)
        or not math.isfinite(days)
        or not 0 < days <= MAX_RETENTION_DAYS
    ):
        p.add(f"{place}.retention_days", f"must be a number of days above 0, at most {MAX_RETENTION_DAYS}")
    if len(p.lines) > before or name is None or paths is None or patterns is None:
        return None
    return BodyLogSpec(
        name,
        selectors["principals"],
        selectors["keys"],
        selectors["models"],
        float(sample),
        max_bytes,
        paths,
        patterns,
        float(days),
    )


def _paths(p: Problems, place: str, value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        p.add(place, 'must be an array of JSON paths, e.g. ["messages[*].content"]')
        return None
    ok = True
    for i, path in enumerate(value):
        try:
            parse_path(path)
        except ValueError as exc:
            p.add(f"{place}[{i}]", f"not a JSON path: {exc}")
            ok = False
    return tuple(value) if ok else None


def _patterns(p: Problems, place: str, value: Any) -> tuple[str | tuple[str, str], ...] | None:
    if not isinstance(value, list):
        p.add(place, 'must be an array of "email", "card" and { name = ..., regex = ... } tables')
        return None
    out: list[str | tuple[str, str]] = []
    names: set[str] = set()
    for i, entry in enumerate(value):
        where = f"{place}[{i}]"
        if isinstance(entry, str):
            if entry not in BUILTIN_PATTERNS:
                known = ", ".join(sorted(BUILTIN_PATTERNS))
                p.add(where, f"unknown pattern {entry!r} (built in: {known}; or a table with name and regex)")
                continue
            pattern_name: str = entry
            out.append(entry)
        elif isinstance(entry, dict):
            p.unknown_fields(where, entry, ("name", "regex"))
            name, regex = entry.get("name"), entry.get("regex")
            if problem := check_name(name):
                p.add(f"{where}.name", problem)
                continue
            if not isinstance(regex, str) or not regex or len(regex) > MAX_REGEX:
                p.add(f"{where}.regex", f"must be a regular expression of 1 to {MAX_REGEX} characters")
                continue
            try:
                compiled = re.compile(regex)
            except re.error as exc:
                p.add(f"{where}.regex", f"not a regular expression: {exc}")
                continue
            if compiled.match(""):
                p.add(f"{where}.regex", "matches the empty string (it would redact between every character)")
                continue
            assert isinstance(name, str)
            pattern_name = name
            out.append((name, regex))
        else:
            p.add(where, 'must be "email", "card" or a table { name = ..., regex = ... }')
            continue
        if pattern_name in names:
            p.add(where, f"duplicate pattern {pattern_name!r}")
        names.add(pattern_name)
    return tuple(out)
