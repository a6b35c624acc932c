"""Which requests have their bodies logged: the ``[[body_logs]]`` entries as the snapshot carries them,
decoded once per generation for the proxy workers.

An entry selects requests by principal, key and model (each list optional: absent matches every one; all
the lists given must match), and logs a share of them (``sample``). The first entry whose selectors match
a request decides: it is logged when the sample draw says so, and no later entry is tried. The snapshot
names principals and keys by id (the builder resolved the names) and models by the names a client may
call; a model selector matches the name the client called, the route's name (a pattern alias) and the
frontend model it resolves to. What is redacted and how long bodies are kept is the control worker's
business (``gateway.controlplane.bodies``): the workers only carry the entry's name and ``id``, a
fingerprint of the whole entry that tells the control worker which redaction applies.

Document form (``"body_logs"`` in the snapshot, in declaration order)::

    {"name": "debug-alice", "id": "9f2c4e1a7b3d5f60", "principals": ["7"], "keys": null,
     "models": ["chat"], "sample": 0.5, "max_bytes": 65536, "retention_days": 7.0,
     "redact_paths": ["messages[*].content"], "redact_patterns": ["email", "card"]}

No I/O here; ``random`` is the process's own generator.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["DEFAULT_MAX_BYTES", "MAX_BYTES_LIMIT", "BodyLogRule", "BodyLogRules"]

DEFAULT_MAX_BYTES = 64 * 1024
MAX_BYTES_LIMIT = 1024 * 1024  # per body: a request and its answer must fit a worker's ring together


class BodyLogRule:
    __slots__ = ("id", "keys", "max_bytes", "models", "name", "principals", "sample")

    def __init__(
        self,
        name: str,
        rule_id: str,
        principals: frozenset[str] | None,
        keys: frozenset[str] | None,
        models: frozenset[str] | None,
        sample: float,
        max_bytes: int,
    ) -> None:
        self.name = name
        self.id = rule_id
        self.principals = principals  # None: every principal
        self.keys = keys
        self.models = models
        self.sample = sample
        self.max_bytes = max_bytes

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> BodyLogRule:
        def names(field: str) -> frozenset[str] | None:
            value = doc.get(field)
            return None if value is None else frozenset(str(v) for v in value)

        sample = float(doc.get("sample", 1.0))
        max_bytes = int(doc.get("max_bytes", DEFAULT_MAX_BYTES))
        return cls(
            str(doc["name"]),
            str(doc["id"]),
            names("principals"),
            names("keys"),
            names("models"),
            min(1.0, max(0.0, sample)),
            min(MAX_BYTES_LIMIT, max(0, max_bytes)),
        )

    def matches(self, principal_id: str, key_id: str, called: str, route: str, canonical: str) -> bool:
        models = self.models
        return (
            (self.principals is None or principal_id in self.principals)
            and (self.keys is None or key_id in self.keys)
            and (models is None or called in models or route in models or canonical in models)
        )


class BodyLogRules:
    """The snapshot's entries; ``pick`` is what the request path asks, only when there is at least one."""

    __slots__ = ("rules",)

    def __init__(self, rules: tuple[BodyLogRule, ...]) -> None:
        self.rules = rules

    @classmethod
    def from_doc(cls, entries: list[dict[str, Any]] | None) -> BodyLogRules | None:
        """None when the document has no entry: then the request path makes one test and no more."""
        if not entries:
            return None
        return cls(tuple(BodyLogRule.from_doc(e) for e in entries))

    def pick(
        self, principal_id: str, key_id: str, called: str, route: str, canonical: str
    ) -> BodyLogRule | None:
        """The entry that logs this request, or None: no entry matches, or the first that does drew
        against it (``sample``)."""
        for rule in self.rules:
            if rule.matches(principal_id, key_id, called, route, canonical):
                sample = rule.sample
                return rule if sample >= 1.0 or (sample > 0.0 and random.random() < sample) else None
        return None
