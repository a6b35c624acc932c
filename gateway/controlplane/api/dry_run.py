"""``POST /admin/routing/dry-run``: where a request would go, decided by the same function the request
path uses (``Snapshot.decide``) on the snapshot the control plane last built, sending nothing.

The request names the model, optionally the principal (by name: its roles and permissions then count), a
key (by name) and the client address it would come from (its ``allow_ips`` and ``models`` then count),
headers and the JSON body the client would send (as an object, or as its exact text when the bytes
matter, as they do to prefix affinity). The answer is the decision — the model that decided
(after delegations), the rule that matched or none (the model's chain), the ordered targets, or the
refusal — plus whether the principal may call the model at all, and every budget the request would
answer to (the principal's, and the key's own when a key is named) with its window's spend and whether it
would refuse (``"budgets"``, ``"budget_refusal"``: the 402 message the first exhausted one gives). Load and
spend come from this host's shared segments (in-flight gauges, the engine scraper's document, the budget
windows the control worker keeps): a dry run on a control-only host sees no load, and the spend the store
holds. A ``cache_aware`` pool reads the host's prefix index (never writing it), and the answer's
``prefix`` says how many bytes of the rendered prompt the chosen target is expected to hold. No I/O beyond
what the caller hands in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.budget import Budget, exceeded_message
from gateway.controlplane.api.calls import Call, Reply, ok
from gateway.errors import BadRequest, NotFound, ServiceUnavailable
from gateway.protocol.openai_request import inspect_json
from gateway.routing.context import fitting, refusal
from gateway.routing.load import Load
from gateway.routing.plan import Decision
from gateway.routing.prompt_classes import prompt_text
from gateway.routing.rules import Facts
from gateway.snapshot import KeyEntry, Principal, Snapshot

__all__ = ["SnapshotCache", "dry_run", "routing_dry_run"]

# A budget's current window spend, live plus base, as (tokens, cost in nano-units).
Spend = Callable[[Budget, float], tuple[int, int]]


class SnapshotCache:
    """The decoded snapshot of the last document seen, so that repeated dry runs decode it once."""

    def __init__(self) -> None:
        self._doc: dict[str, Any] | None = None
        self._snapshot = Snapshot.empty()

    def get(self, doc: dict[str, Any]) -> Snapshot:
        if doc is not self._doc:
            self._snapshot = Snapshot.from_doc(doc, int(doc.get("revision", 0)))
            self._doc = doc
        return self._snapshot


def routing_dry_run(call: Call) -> Reply:
    """The admin route: the request described by the body, on the last snapshot and this host's load."""
    snapshot = call.snapshot()
    if snapshot is None:
        raise ServiceUnavailable("no snapshot was built yet")
    try:
        request = orjson.loads(call.body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    return ok(dry_run(snapshot, request, call.ctx.routing_load(), call.ctx.budget_spend))


def dry_run(snapshot: Snapshot, request: Any, load: Load, spend: Spend | None = None) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise BadRequest("expected a JSON object {model, principal, headers, body}")
    raw = request.get("body") or {}
    if isinstance(raw, str):  # the body as the client sends it, byte for byte (prefix affinity hashes it)
        body = raw.encode()
    elif isinstance(raw, dict):
        body = orjson.dumps({**raw, "model": request["model"]} if "model" in request else raw)
    else:
        raise BadRequest("body must be the JSON object the client would send, or its text", param="body")
    info = inspect_json(body)
    headers = request.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise BadRequest("headers must be an object of strings", param="headers")
    principal = _principal(snapshot, request.get("principal"))
    route = snapshot.route(info.model)
    if route is None:
        raise NotFound(f"The model `{info.model}` does not exist", param="model")
    facts = Facts(
        principal,
        {str(k).lower(): v for k, v in headers.items()},
        info.user,
        len(body) // 4,
        info.max_tokens,
        info.stream,
        body,
        classifier=snapshot.classifier,
    )
    decision = snapshot.decide(route, facts, load)
    answer = {
        "called": info.model,
        "allowed": principal.may_use(route.name),
        "prompt_tokens_estimate": facts.prompt_tokens,
        **decision.describe(),
    }
    noted = getattr(load, "prefixes", None)  # a cache_aware pool's expectation for the target it chose
    if noted:
        backend, (prompt, matched) = next(iter(noted.items()))
        answer["prefix"] = {"backend": backend, "prompt_bytes": prompt, "matched_bytes": matched}
    if snapshot.classifier is not None:
        # Every class's score, as the rules would see them (the dry run always classifies; the request
        # path only when a rule asks).
        name, score = facts.prompt_class()
        scores = snapshot.classifier.scores(prompt_text(body))
        answer["prompt_class"] = {
            "name": name,
            "score": score,
            "scores": {c.name: round(s, 4) for c, s in zip(snapshot.classifier.classes, scores, strict=True)},
        }
    if snapshot.windows and decision.refused is None:
        answer["context"] = _context_decision(snapshot, decision, facts)
    if request.get("key") is not None:
        answer["key"] = _key_decision(
            snapshot, request["key"], request.get("client_ip"), route.name, info.model
        )
    budgets = _budgets(snapshot, principal, request.get("key"))
    if budgets and spend is not None:
        answer["budgets"], answer["budget_refusal"] = _budget_decision(budgets, spend, time.time())
    return answer


def _budgets(snapshot: Snapshot, principal: Principal, key_name: Any) -> tuple[Budget, ...]:
    """What the request answers to: the named key's budgets (its principal's and its own), else the
    principal's."""
    key = _key_entry(snapshot, key_name) if isinstance(key_name, str) else None
    if key is not None:
        return () if key.budgets is None else (*key.budgets.principal, *key.budgets.key)
    return principal.budgets


def _budget_decision(
    budgets: tuple[Budget, ...], spend: Spend, now: float
) -> tuple[list[dict[str, Any]], str | None]:
    """Each budget's window and spend, and the refusal of the first that is exhausted (the request path
    checks them in this order)."""
    out: list[dict[str, Any]] = []
    refusal: str | None = None
    for budget in budgets:
        tokens, cost = spend(budget, now)
        exhausted = budget.exceeded(tokens, cost)
        if exhausted and refusal is None:
            refusal = exceeded_message(budget, tokens, cost, now)
        start, end = budget.window(now)
        out.append(
            {
                "scope": "principal" if budget.key_id is None else "key",
                "period": budget.period,
                "window_start": start,
                "window_end": end,
                "tokens": tokens,
                "tokens_limit": budget.tokens,
                "cost": cost / 1e9,
                "cost_limit": None if budget.cost is None else budget.cost / 1e9,
                "refuses": exhausted,
            }
        )
    return out, refusal


def _key_entry(snapshot: Snapshot, name: str) -> KeyEntry | None:
    """The key of this name; only keys with rules or budgets carry their name in the snapshot."""
    return next((k for k in snapshot.keys.values() if k.name == name), None)


def _context_decision(snapshot: Snapshot, decision: Decision, facts: Facts) -> dict[str, Any]:
    """Which targets the request's estimated size fits, as the request path decides it."""
    wanted = facts.max_tokens or 0
    needed = facts.prompt_tokens + wanted
    fit = fitting(decision.targets, needed)
    decided = snapshot.routes.get(decision.model)
    return {
        "needed_tokens": needed,
        "skipped": [
            {
                "backend": t.backend.name,
                "provider_model": t.provider_model,
                "context_window": t.context_window,
            }
            for t in decision.targets
            if t not in fit
        ],
        "refusal": None
        if fit
        else refusal(decision.model, decision.targets, facts.prompt_tokens, wanted).message,
        "context_failover": decided is not None and decided.context_failover,
    }


def _key_decision(
    snapshot: Snapshot, name: Any, client_ip: Any, route_name: str, called: str
) -> dict[str, Any]:
    """What a key's own rules (``allow_ips``, ``models``) say of this request from ``client_ip``."""
    if not isinstance(name, str) or (client_ip is not None and not isinstance(client_ip, str)):
        raise BadRequest("key must be a key's name, client_ip an address", param="key")
    entry = _key_entry(snapshot, name)
    rules = entry.rules if entry is not None else None
    if rules is None:  # only keys with rules (or budgets) are named in the snapshot; any other has none
        return {"name": name, "rules": None, "refusal": None}
    refusal = rules.address_refusal(client_ip) if client_ip is not None else None
    refusal = refusal or rules.model_refusal(route_name, called)
    return {
        "name": name,
        "rules": {
            "allow_ips": [str(n) for n in rules.networks],
            "models": None if rules.models is None else sorted(rules.models),
        },
        "refusal": refusal,
    }


def _principal(snapshot: Snapshot, name: Any) -> Principal:
    if name is None:
        return Principal("", "", True, frozenset())
    if not isinstance(name, str):
        raise BadRequest("principal must be a principal's name", param="principal")
    for principal in snapshot.principals.values():
        if principal.name == name:
            return principal
    raise NotFound(f"no principal named `{name}`", param="principal")
