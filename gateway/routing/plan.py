"""Deciding where a request goes: the one function that the request path and the admin dry run share.

``decide`` walks the called model's rules (terminal, first match wins; a delegation restarts with the
other model's rules), or takes its fallback chain when none matches, expands pools through their policies,
and drops targets that may not be tried (active probes, passive health). When nothing is left it takes
the deployment-wide fallback model's chain, and when that is empty too it refuses with 503: a request is
never sent to a node known to be down.

The common case — a model with no rules and every backend available — returns the route's precomputed
target tuple without building anything. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.budget import Price
from gateway.routing.load import Load
from gateway.routing.policies import CacheTuning, make_policy
from gateway.routing.pools import Pool, Step
from gateway.routing.rules import Facts, Rule
from gateway.routing.targets import Backend, Target

if TYPE_CHECKING:
    from gateway.routing.chat_tokenizer import ChatTokenizer

__all__ = ["MAX_DELEGATIONS", "Decision", "Pool", "Route", "Step", "compile_pools", "compile_rules", "decide"]

MAX_DELEGATIONS = 8  # the control plane refuses cycles; this only bounds a damaged document


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer: the frontend model that decided (after delegations), the rule (None: its chain), the
    ordered targets, or a refusal ``(status, message)``; ``tag`` labels the request's usage."""

    model: str
    rule: Rule | None
    targets: tuple[Target, ...]
    refused: tuple[int, str] | None = None
    tag: str | None = None
    fallback: bool = False  # the targets are the deployment-wide fallback's

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "rule": self.rule.describe() if self.rule is not None else None,
            "targets": [
                {
                    "provider_model": t.provider_model,
                    "backend": t.backend.name,
                    "upstream_model": t.upstream_model,
                }
                for t in self.targets
            ],
            "refused": {"status": self.refused[0], "message": self.refused[1]} if self.refused else None,
            "tag": self.tag,
            "fallback": self.fallback,
        }


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    canonical: str
    kind: str  # "frontend" | "provider"
    targets: tuple[Target, ...]
    price: Price | None = None
    rules: tuple[Rule, ...] = ()  # frontend models only (and their aliases): see gateway.routing.rules
    decision: Decision | None = None  # where a request goes when it has no rules and all is up
    # An upstream "context length exceeded" 400 may fail over to a target with a larger window.
    context_failover: bool = False
    # Flow-control class of the frontend model's requests (gateway.dataplane.flow rank); None: unset.
    priority: int | None = None

    def __post_init__(self) -> None:
        if not self.rules:
            object.__setattr__(self, "decision", Decision(self.canonical, None, self.targets))


def _targets_of(
    entries: list[list[str]], backends: dict[str, Backend], windows: dict[str, int] | None = None
) -> tuple[Target, ...]:

    windows = windows or {}
    return tuple(
        Target(pm, backends[be], um, windows.get(pm)) for pm, be, um, *_ in entries if be in backends
    )


def compile_pools(
    doc: dict[str, Any], backends: dict[str, Backend], windows: dict[str, int] | None = None
) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    for name, p in (doc or {}).items():
        entries = [e for e in p.get("targets", []) if e[1] in backends]
        targets = _targets_of(entries, backends, windows)
        if not targets:
            continue
        weights = [int(e[3]) if len(e) > 3 else 1 for e in entries]
        policy = make_policy(
            p.get("policy", "round_robin"),
            targets,
            weights,
            int(p.get("prefix_bytes") or 512),
            p.get("max_inflight"),
            CacheTuning(**(p.get("cache") or {})),
            _tokenizer(p.get("tokenizer")),
        )
        pools[name] = Pool(name, policy)
    return pools


def _tokenizer(directory: object) -> ChatTokenizer | None:
    """A pool's tokenizer, read as the snapshot is compiled (once per model directory and version of its
    files); imported only then, so that workers without such a pool never load jinja2 and tokenizers."""
    if not isinstance(directory, str):
        return None
    from gateway.routing.chat_tokenizer import loaded

    return loaded(directory)


def compile_rules(
    docs: list[dict[str, Any]],
    backends: dict[str, Backend],
    pools: dict[str, Pool],
    windows: dict[str, int] | None = None,
) -> tuple[Rule, ...]:
    rules = []
    for index, doc in enumerate(docs or ()):
        steps: list[Step] = []
        for step in doc.get("steps") or ():
            if "pool" in step:
                if step["pool"] in pools:
                    steps.append(pools[step["pool"]])
            else:
                steps.extend(_targets_of(step.get("targets", []), backends, windows))
        names = frozenset(t.backend.name for s in steps for t in (s.targets if isinstance(s, Pool) else (s,)))
        policy = None
        if doc.get("policy") and steps:
            flat = tuple(t for s in steps for t in (s.targets if isinstance(s, Pool) else (s,)))
            policy = make_policy(doc["policy"], flat)
        rules.append(Rule(index, doc, tuple(steps), names, policy))
    return tuple(rules)


def _expand(rule: Rule, facts: Facts, load: Load) -> tuple[Target, ...]:
    if rule.policy is not None:
        return rule.policy.order(facts.body, load)
    out: list[Target] = []
    for step in rule.steps:
        if isinstance(step, Pool):
            out.extend(step.policy.order(facts.body, load))
        else:
            out.append(step)
    return tuple(out)


def decide(
    routes: dict[str, Route], fallback: str | None, route: Route, facts: Facts | None, load: Load
) -> Decision:
    """Where a request for ``route`` goes. ``facts`` may be None only for a route without rules."""
    for _ in range(MAX_DELEGATIONS):
        if not route.rules:
            if not load.degraded and route.decision is not None:
                return route.decision  # the common case: built once per snapshot, nothing allocated
            return _available(routes, fallback, route.canonical, None, route.targets, None, load)
        assert facts is not None, "a route with rules needs the request's facts"
        for rule in route.rules:
            if not rule.matches(facts, load):
                continue
            if rule.action == "refuse":
                return Decision(route.canonical, rule, (), (rule.status, rule.message), rule.tag)
            if rule.action == "delegate":
                target_route = routes.get(rule.delegate or "")
                if target_route is None:
                    return Decision(route.canonical, rule, (), (503, "routing rule delegates to no model"))
                route = target_route
                break
            return _available(
                routes, fallback, route.canonical, rule, _expand(rule, facts, load), rule.tag, load
            )
        else:
            return _available(routes, fallback, route.canonical, None, route.targets, None, load)
    return Decision(route.canonical, None, (), (508, "routing rules delegate in a loop"))


def _available(
    routes: dict[str, Route],
    fallback: str | None,
    model: str,
    rule: Rule | None,
    targets: tuple[Target, ...],
    tag: str | None,
    load: Load,
) -> Decision:
    if not load.degraded:
        return Decision(model, rule, targets, None, tag)
    kept = tuple(t for t in targets if load.available(t.backend.name))
    if kept:
        return Decision(model, rule, kept, None, tag)
    spare = routes.get(fallback) if fallback else None
    if spare is not None and spare.canonical != model:
        kept = tuple(t for t in spare.targets if load.available(t.backend.name))
        if kept:
            return Decision(model, rule, kept, None, tag, fallback=True)
    return Decision(model, rule, (), (503, f"no healthy backend serves the model `{model}` right now"), tag)
