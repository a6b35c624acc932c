"""The redaction each logged body gets: the ``[[body_logs]]`` entries of the snapshots this process built
or followed, by the fingerprint (``id``) a worker's frame carries.

A frame is redacted by the very entry that logged it. Entries of earlier snapshots are kept (the last
``KEPT`` of them), so a body logged just before an entry changed is still redacted as that entry said; a
frame whose entry is not known here (this process started after the entry was removed, or the frame is
not one) is dropped, counted, and never stored. Pure apart from the clock the caller hands in.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from gateway.body_record import decode_body_record
from gateway.controlplane.bodies.redaction import BUILTIN_PATTERNS, Pattern, Redactor, Step, parse_path
from gateway.controlplane.bodies.stored import StoredBodies, stored_bodies

__all__ = ["KEPT", "BodyRules"]

log = logging.getLogger("gateway.controlplane")

KEPT = 256


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    paths: tuple[tuple[Step, ...], ...]
    patterns: tuple[Pattern, ...]
    retention_days: float


def _entry(doc: dict[str, Any]) -> _Entry:
    """Raises ValueError or KeyError for an entry the file parser would have refused."""
    patterns: list[Pattern] = []
    for p in doc.get("redact_patterns", ()):
        if isinstance(p, str):
            patterns.append(BUILTIN_PATTERNS[p])
        else:
            patterns.append(Pattern(str(p["name"]), re.compile(str(p["regex"]))))
    return _Entry(
        str(doc["name"]),
        tuple(parse_path(path) for path in doc.get("redact_paths", ())),
        tuple(patterns),
        float(doc.get("retention_days", 7.0)),
    )


class BodyRules:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.unknown_entry = 0  # frames whose entry is not known here: dropped
        self.unreadable = 0  # frames that are not body records: dropped

    def set_entries(self, entries: list[dict[str, Any]] | None) -> None:
        """Take a newly published snapshot document's ``body_logs``."""
        for doc in entries or ():
            rule_id = doc.get("id")
            if not isinstance(rule_id, str) or rule_id in self._entries:
                continue
            try:
                self._entries[rule_id] = _entry(doc)
            except (ValueError, KeyError, TypeError, re.error) as exc:
                log.error("body log entry %r cannot redact, its bodies are dropped: %s", doc.get("name"), exc)
        while len(self._entries) > KEPT:
            del self._entries[next(iter(self._entries))]

    def prepare(self, frame: bytes) -> StoredBodies | None:
        """The row to store for a worker's frame, redacted by its entry; None when it is dropped."""
        try:
            record = decode_body_record(frame)
        except ValueError as exc:
            self.unreadable += 1
            if self.unreadable == 1 or self.unreadable % 1000 == 0:
                log.error("dropping an unreadable body log frame (%d so far): %s", self.unreadable, exc)
            return None
        entry = self._entries.get(record.rule_id)
        if entry is None:
            self.unknown_entry += 1
            return None
        return stored_bodies(record, Redactor(entry.paths, entry.patterns), entry.retention_days)
