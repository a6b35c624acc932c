"""Routing rules of a frontend model, compiled from the snapshot document into objects the request path
tests with a few comparisons each.

A rule is terminal: the first whose conditions all hold decides — route to its targets, refuse, or
delegate to another frontend model. Its ``when`` (snapshot form, normalised by the control plane)::

    {"headers": {"x-tier": ["free"]},         # a request header equals one of the values (names lowercase)
     "user": ["batch-7"],                     # the body's "user" (or Anthropic metadata.user)
     "principals": ["alice"], "roles": ["batch"],
     "prompt_tokens_min": 0, "prompt_tokens_max": 8000,   # the prompt estimate, bytes / 4
     "max_tokens_min": 1, "max_tokens_max": 4096,         # max_tokens as sent (absent counts as 0)
     "stream": true,
     "prompt_class": ["code"],                # the prompt's class (gateway.routing.prompt_classes)
     "hours": [1320, 360], "days": [0, 1, 2, 3, 4],       # UTC minutes of the day [from, to), Monday = 0
     "max_inflight_per_backend": 32}          # some backend of the rule's targets has fewer in flight

Absent keys do not constrain. No I/O here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.routing.load import Load
from gateway.routing.policies import Policy
from gateway.routing.pools import Step
from gateway.routing.prompt_classes import Classifier, prompt_text

__all__ = ["ACTIONS", "CONDITIONS", "Caller", "Facts", "HeaderLookup", "Rule"]

ACTIONS = ("route", "refuse", "delegate")
CONDITIONS = (
    "headers",
    "user",
    "principals",
    "roles",
    "prompt_tokens_min",
    "prompt_tokens_max",
    "max_tokens_min",
    "max_tokens_max",
    "stream",
    "hours",
    "days",
    "max_inflight_per_backend",
    "prompt_class",
)


class Caller(Protocol):
    """What rules may test of the calling principal (the snapshot's ``Principal`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def roles(self) -> frozenset[str]: ...


class HeaderLookup(Protocol):
    """A request's headers as rules read them, names lowercase: granian's on the request path (the data
    plane's ``rsgi.Headers``), a dict in the dry run."""

    def get(self, key: str, /) -> str | None: ...


@dataclass(slots=True)
class Facts:
    """What rules may look at, gathered once per request."""

    principal: Caller
    headers: HeaderLookup
    user: str | None
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    body: bytes
    now: float = 0.0  # unix seconds; 0 means "ask the clock"
    classifier: Classifier | None = None
    _class: tuple[str | None, float] | None = None

    def prompt_class(self) -> tuple[str | None, float]:
        """The prompt's class and score, worked out once per request and only when a rule asks."""
        got = self._class
        if got is None:
            classifier = self.classifier
            got = self._class = (
                classifier.classify(prompt_text(self.body)) if classifier is not None else (None, 0.0)
            )
        return got


Test = Callable[[Facts, Load], bool]


def _tests(when: dict[str, Any], backends: frozenset[str]) -> tuple[Test, ...]:
    tests: list[Test] = []
    if "stream" in when:
        stream = bool(when["stream"])
        tests.append(lambda f, _: f.stream is stream)
    if "principals" in when:
        names = frozenset(when["principals"])
        tests.append(lambda f, _: f.principal.name in names)
    if "roles" in when:
        roles = frozenset(when["roles"])
        tests.append(lambda f, _: not roles.isdisjoint(f.principal.roles))
    if "prompt_class" in when:
        classes = frozenset(when["prompt_class"])
        tests.append(lambda f, _: f.prompt_class()[0] in classes)
    if "user" in when:
        users = frozenset(when["user"])
        tests.append(lambda f, _: f.user in users)
    for header, values in (when.get("headers") or {}).items():
        tests.append(_header_test(header, frozenset(values)))
    lo, hi = when.get("prompt_tokens_min"), when.get("prompt_tokens_max")
    if lo is not None:
        tests.append(lambda f, _: f.prompt_tokens >= lo)
    if hi is not None:
        tests.append(lambda f, _: f.prompt_tokens <= hi)
    mlo, mhi = when.get("max_tokens_min"), when.get("max_tokens_max")
    if mlo is not None:
        tests.append(lambda f, _: (f.max_tokens or 0) >= mlo)
    if mhi is not None:
        tests.append(lambda f, _: (f.max_tokens or 0) <= mhi)
    if "hours" in when or "days" in when:
        start, end = when.get("hours") or (0, 1440)
        days = frozenset(when.get("days") or range(7))
        tests.append(lambda f, _: _in_window(f.now or time.time(), start, end, days))
    if "max_inflight_per_backend" in when:
        ceiling = int(when["max_inflight_per_backend"])
        candidates = tuple(sorted(backends))
        tests.append(lambda _, load: any(load.in_flight(b) < ceiling for b in candidates))
    return tuple(tests)


def _header_test(name: str, accepted: frozenset[str]) -> Test:
    return lambda f, _: f.headers.get(name) in accepted


def _in_window(now: float, start: int, end: int, days: frozenset[int]) -> bool:
    """Whether ``now`` falls in [start, end) minutes of a UTC day listed in ``days``; a window that wraps
    midnight (start > end) belongs to the day it starts on."""
    t = time.gmtime(now)
    minute = t.tm_hour * 60 + t.tm_min
    if start <= end:
        return t.tm_wday in days and start <= minute < end
    if minute >= start:
        return t.tm_wday in days
    return minute < end and (t.tm_wday - 1) % 7 in days


class Rule:
    """One compiled rule. ``steps`` for a route; ``status``/``message`` for a refusal; ``delegate`` names a
    frontend model. ``tag`` labels the usage of the requests it decides; ``policy`` reorders its targets."""

    __slots__ = (
        "action",
        "backends",
        "delegate",
        "doc",
        "index",
        "message",
        "name",
        "policy",
        "status",
        "steps",
        "tag",
        "tests",
    )

    def __init__(
        self,
        index: int,
        doc: dict[str, Any],
        steps: tuple[Step, ...],
        backends: frozenset[str],
        policy: Policy | None,
    ) -> None:
        self.index = index
        self.doc = doc
        self.name: str | None = doc.get("name")
        self.action: str = doc["action"]
        if self.action not in ACTIONS:
            raise ValueError(f"unknown rule action {self.action!r}")
        self.steps = steps
        self.backends = backends
        self.policy = policy
        self.status = int(doc.get("status") or 403)
        self.message = str(doc.get("message") or "refused by a routing rule")
        self.delegate: str | None = doc.get("model")
        self.tag: str | None = doc.get("tag")
        self.tests = _tests(doc.get("when") or {}, backends)

    def matches(self, facts: Facts, load: Load) -> bool:
        return all(test(facts, load) for test in self.tests)

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "action": self.action, "tag": self.tag}
