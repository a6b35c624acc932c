"""The routing part of the configuration file: model pools, frontend models' rules, the deployment-wide
fallback, and backends' flow-control settings — parsed and checked (``routing_rows`` keeps them in the
store as JSON rows, ``writer.dump_config`` writes them back as TOML from the specs' ``as_dict``).

    [routing]
    fallback = "chat-small"            # when every target of a request is down

    [[pools]]
    name = "llama"
    policy = "prefix_affinity"   # round_robin, weighted, least_inflight, prefix_affinity, engine_load,
                                 # cache_aware
    members = ["llama-a", "llama-b"]   # provider models
    weights = [3, 1]                   # weighted only
    prefix_bytes = 512                 # prefix_affinity only: how much of the body is hashed
    max_inflight = 32                  # prefix_affinity only: past it, the least-loaded member goes first
    # cache_aware only: block_bytes = 64, load_cost = 1024, balance_abs = 32, balance_rel = 1.5,
    # tokenizer = "/models/llama" (with backends' kv_events: the engines' exact KV caches)

    [[models.rules]]                   # under a [[models]] table; terminal, first match wins
    name = "free streams"
    when = { headers = { x-tier = "free" }, stream = true }
    refuse = { status = 429, message = "streaming is for paid plans" }   # or route = [...], delegate = "..."
    tag = "free"                       # labels the usage of the requests it decides
    policy = "least_inflight"          # reorders the route's targets

Conditions are listed in ``gateway.routing.rules``; here they keep their file form (``hours = "22:00-06:00"``,
``days = ["sat", "sun"]``), normalised so that a dump reads back equal. No I/O here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any

from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.specs import PoolSpec, PromptClassSpec, RuleSpec
from gateway.dataplane.flow import PRIORITIES
from gateway.routing.policies import POLICIES

__all__ = [
    "DAYS",
    "check_routing",
    "parse_count",
    "parse_networks",
    "parse_pool",
    "parse_priority",
    "parse_prompt_class",
    "parse_rules",
    "parse_weight",
    "rule_when_doc",
]

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HOURS = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)")
_LIST_CONDITIONS = ("user", "principals", "roles", "prompt_class")
_COUNT_CONDITIONS = ("prompt_tokens_min", "prompt_tokens_max", "max_tokens_min", "max_tokens_max")
_RULE_FIELDS = ("name", "when", "route", "refuse", "delegate", "tag", "policy")
_WHEN_FIELDS = (
    "headers",
    *_LIST_CONDITIONS,
    *_COUNT_CONDITIONS,
    "stream",
    "hours",
    "days",
    "max_inflight_per_backend",
)
MAX_RULES = 100

MAX_CLASSES = 64
MAX_EXAMPLES = 1000


def parse_prompt_class(p: Problems, place: str, item: dict[str, Any]) -> PromptClassSpec | None:
    p.unknown_fields(place, item, ("name", "examples", "keywords", "min_score"))
    before = len(p.lines)
    name = item.get("name")
    if not isinstance(name, str) or not name or len(name) > 200 or name != name.strip():
        p.add(f"{place}.name", "must be a non-empty name")
    examples = item.get("examples")
    if not isinstance(examples, list) or not examples or len(examples) > MAX_EXAMPLES:
        p.add(f"{place}.examples", f"must be an array of 1 to {MAX_EXAMPLES} example prompts")
    elif not all(isinstance(e, str) and e.strip() for e in examples):
        p.add(f"{place}.examples", "every example must be a non-empty string")
    keywords = item.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
        p.add(f"{place}.keywords", "must be an array of non-empty strings")
    min_score = item.get("min_score")
    if min_score is not None and (
        isinstance(min_score, bool) or not isinstance(min_score, int | float) or not 0 <= min_score <= 1
    ):
        p.add(f"{place}.min_score", "must be a number between 0 and 1")
    if len(p.lines) > before:
        return None
    assert isinstance(name, str) and isinstance(examples, list)
    return PromptClassSpec(
        name, tuple(examples), tuple(keywords), None if min_score is None else float(min_score)
    )


def parse_count(p: Problems, place: str, value: Any, *, minimum: int = 0) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value > 10**12:
        p.add(place, f"must be an integer of at least {minimum}")
        return None
    return value


def _strings(p: Problems, place: str, value: Any) -> list[str] | None:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        p.add(place, "must be a string or a non-empty array of strings")
        return None
    return list(values)


def _text(p: Problems, place: str, value: Any) -> str | None:
    if not isinstance(value, str) or not value or len(value) > 500:
        p.add(place, "must be a non-empty string of at most 500 characters")
        return None
    return value


def _when(p: Problems, place: str, raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        p.add(place, "must be a table of conditions")
        return None
    p.unknown_fields(place, raw, _WHEN_FIELDS)
    out: dict[str, Any] = {}
    if "headers" in raw:
        headers = raw["headers"]
        if not isinstance(headers, dict) or not headers:
            p.add(f"{place}.headers", "must be a table of header name = value(s)")
        else:
            out["headers"] = {}
            for name, value in headers.items():
                values = _strings(p, f"{place}.headers.{name}", value)
                if values is not None:
                    out["headers"][name.lower()] = values
    for key in _LIST_CONDITIONS:
        if key in raw and (values := _strings(p, f"{place}.{key}", raw[key])) is not None:
            out[key] = values
    for key in (*_COUNT_CONDITIONS, "max_inflight_per_backend"):
        if key in raw:
            minimum = 1 if key == "max_inflight_per_backend" else 0
            if (n := parse_count(p, f"{place}.{key}", raw[key], minimum=minimum)) is not None:
                out[key] = n
    if "stream" in raw:
        if not isinstance(raw["stream"], bool):
            p.add(f"{place}.stream", "must be true or false")
        else:
            out["stream"] = raw["stream"]
    if "hours" in raw:
        if not isinstance(raw["hours"], str) or not _HOURS.fullmatch(raw["hours"]):
            p.add(f"{place}.hours", 'must be "HH:MM-HH:MM" (UTC), e.g. "22:00-06:00"')
        else:
            out["hours"] = raw["hours"]
    if "days" in raw:
        days = raw["days"]
        if not isinstance(days, list) or not days or any(d not in DAYS for d in days):
            p.add(f"{place}.days", f"must be a non-empty array of {', '.join(DAYS)}")
        else:
            out["days"] = [d for d in DAYS if d in days]
    return out


MAX_NETWORKS = 256


def parse_networks(p: Problems, place: str, raw: Any) -> tuple[str, ...] | None:
    """A key's ``allow_ips``: CIDRs (or single addresses), normalised (``10.1.2.3/8`` is refused: host bits
    set is nearly always a typo for a narrower network than the operator meant)."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_NETWORKS:
        p.add(place, f'must be a non-empty array of at most {MAX_NETWORKS} CIDRs, e.g. ["10.0.0.0/8"]')
        return None
    out: list[str] = []
    for i, value in enumerate(raw):
        try:
            out.append(str(ipaddress.ip_network(value, strict=True)) if isinstance(value, str) else "")
        except ValueError as exc:
            p.add(f"{place}[{i}]", f"not a network: {exc}")
            continue
        if not out[-1]:
            p.add(f"{place}[{i}]", 'must be a string such as "192.0.2.0/24"')
    return tuple(out) if len(out) == len(raw) and all(out) else None


def parse_rules(p: Problems, place: str, raw: Any) -> tuple[RuleSpec, ...] | None:
    if not isinstance(raw, list) or len(raw) > MAX_RULES:
        p.add(place, f"must be an array of at most {MAX_RULES} tables ([[models.rules]])")
        return None
    rules: list[RuleSpec] = []
    ok = True
    for i, item in enumerate(raw):
        rule = _rule(p, f"{place}[{i}]", item)
        ok = ok and rule is not None
        if rule is not None:
            rules.append(rule)
    return tuple(rules) if ok else None


def _rule(p: Problems, place: str, item: Any) -> RuleSpec | None:
    if not isinstance(item, dict):
        p.add(place, "must be a table")
        return None
    p.unknown_fields(place, item, _RULE_FIELDS)
    actions = [a for a in ("route", "refuse", "delegate") if a in item]
    if len(actions) != 1:
        p.add(place, "needs exactly one of route, refuse, delegate")
        return None
    bad = False
    name = _text(p, f"{place}.name", item["name"]) if "name" in item else None
    tag = _text(p, f"{place}.tag", item["tag"]) if "tag" in item else None
    bad |= ("name" in item and name is None) or ("tag" in item and tag is None)
    when = _when(p, f"{place}.when", item.get("when", {}))
    policy = item.get("policy")
    if policy is not None and policy not in POLICIES:
        p.add(f"{place}.policy", f"must be one of {', '.join(POLICIES)}")
        bad = True
    if policy is not None and actions[0] != "route":
        p.add(f"{place}.policy", "only a rule that routes has a target-selection policy")
        bad = True
    route: tuple[str, ...] = ()
    refuse = None
    delegate = None
    if actions[0] == "route":
        targets = item["route"]
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            p.add(f"{place}.route", "must be a non-empty array of provider model or pool names")
            bad = True
        else:
            route = tuple(targets)
    elif actions[0] == "refuse":
        spec = item["refuse"]
        if not isinstance(spec, dict):
            p.add(f"{place}.refuse", "must be a table { status = ..., message = ... }")
            return None
        p.unknown_fields(f"{place}.refuse", spec, ("status", "message"))
        status = spec.get("status", 403)
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            p.add(f"{place}.refuse.status", "must be an HTTP error status (400-599)")
            bad = True
        message = _text(p, f"{place}.refuse.message", spec.get("message", "refused by a routing rule"))
        if message is None or bad:
            return None
        refuse = (status, message)
    else:
        if not isinstance(item["delegate"], str) or not item["delegate"]:
            p.add(f"{place}.delegate", "must name a frontend model")
            return None
        delegate = item["delegate"]
    if bad or when is None:
        return None
    return RuleSpec(when, route, refuse, delegate, name, tag, policy)


def parse_pool(p: Problems, place: str, item: dict[str, Any]) -> PoolSpec | None:
    p.unknown_fields(
        place,
        item,
        ("name", "policy", "members", "weights", "prefix_bytes", "max_inflight", "tokenizer", *_CACHE_FIELDS),
    )
    name = item.get("name")
    if not isinstance(name, str) or not name:
        p.add(f"{place}.name", "is required")
        return None
    policy = item.get("policy", "round_robin")
    ok = True
    if policy not in POLICIES:
        p.add(f"{place}.policy", f"must be one of {', '.join(POLICIES)}")
        ok = False
    members = item.get("members")
    if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
        p.add(f"{place}.members", "must be a non-empty array of provider model names")
        return None
    if len(set(members)) != len(members):
        p.add(f"{place}.members", "lists a provider model twice")
        ok = False
    weights: tuple[int, ...] = ()
    if "weights" in item:
        raw = item["weights"]
        if policy != "weighted":
            p.add(f"{place}.weights", 'only a "weighted" pool has weights')
            ok = False
        elif not isinstance(raw, list) or len(raw) != len(members):
            p.add(f"{place}.weights", "must give one weight per member")
            ok = False
        else:
            counted = [parse_count(p, f"{place}.weights[{i}]", w, minimum=1) for i, w in enumerate(raw)]
            ok = ok and None not in counted
            weights = tuple(w for w in counted if w is not None)
    prefix_bytes = max_inflight = None
    for key in ("prefix_bytes", "max_inflight"):
        if key in item:
            if policy != "prefix_affinity":
                p.add(f"{place}.{key}", 'only a "prefix_affinity" pool has it')
                ok = False
                continue
            value = parse_count(p, f"{place}.{key}", item[key], minimum=1)
            ok = ok and value is not None
            if key == "prefix_bytes":
                prefix_bytes = value
            else:
                max_inflight = value
    cache: list[tuple[str, int | float]] = []
    for key, (low, high) in _CACHE_FIELDS.items():
        if key not in item:
            continue
        if policy != "cache_aware":
            p.add(f"{place}.{key}", 'only a "cache_aware" pool has it')
            ok = False
            continue
        value = item[key]
        whole = key != "balance_rel"
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            p.add(f"{place}.{key}", "must be an integer" if whole else "must be a number")
            ok = False
        elif not low <= value <= high:
            p.add(f"{place}.{key}", f"must be between {low:g} and {high:g}")
            ok = False
        else:
            cache.append((key, value))
    tokenizer = item.get("tokenizer")
    if tokenizer is not None:
        if policy != "cache_aware":
            p.add(f"{place}.tokenizer", 'only a "cache_aware" pool has it')
            ok = False
        elif not isinstance(tokenizer, str) or not tokenizer.startswith("/") or "\x00" in tokenizer:
            p.add(f"{place}.tokenizer", "must be the absolute path of a model directory (tokenizer.json)")
            ok = False
    if not ok:
        return None
    return PoolSpec(
        name, policy, tuple(members), weights, prefix_bytes, max_inflight, tuple(cache), tokenizer
    )


# cache_aware's knobs and their ranges (defaults: gateway.routing.policies.CacheTuning)
_CACHE_FIELDS: dict[str, tuple[float, float]] = {
    "block_bytes": (16, 65536),
    "load_cost": (0, 2**30),
    "balance_abs": (0, 2**20),
    "balance_rel": (1.0, 1000.0),
}


def check_routing(
    p: Problems,
    pools: list[tuple[str, PoolSpec]],
    rules: list[tuple[str, str, tuple[RuleSpec, ...]]],  # (place of the model, its name, its rules)
    fallback: str | None,
    names: dict[str, set[str]],  # declared: provider_models, models, aliases, roles, principals
    classes: Iterable[tuple[str, PromptClassSpec]] = (),
) -> None:
    """References between routing entries and the rest; delegation cycles."""
    provider_models = names.get("provider_models", set())
    models = names.get("models", set())
    pool_names: dict[str, str] = {}
    for place, pool in pools:
        if pool.name in pool_names:
            p.add(f"{place}.name", f"duplicate pool name {pool.name!r} (first at {pool_names[pool.name]})")
        elif pool.name in provider_models or pool.name in models or pool.name in names.get("aliases", set()):
            p.add(f"{place}.name", f"{pool.name!r} is already a model name")
        pool_names.setdefault(pool.name, place)
        for i, member in enumerate(pool.members):
            if member not in provider_models:
                p.add(f"{place}.members[{i}]", f"unknown provider model {member!r}")
    delegates: dict[str, list[str]] = {}
    for model_place, model, model_rules in rules:
        for i, rule in enumerate(model_rules):
            place = f"{model_place}.rules[{i}]"
            for j, target in enumerate(rule.route):
                if target not in provider_models and target not in pool_names:
                    p.add(f"{place}.route[{j}]", f"unknown provider model or pool {target!r}")
            if rule.delegate is not None:
                if rule.delegate not in models:
                    p.add(f"{place}.delegate", f"unknown frontend model {rule.delegate!r}")
                else:
                    delegates.setdefault(model, []).append(rule.delegate)
            for value in rule.when.get("prompt_class", ()):
                if value not in names.get("prompt_classes", set()):
                    p.add(f"{place}.when.prompt_class", f"unknown prompt class {value!r}")
            for key, declared in (("roles", "roles"), ("principals", "principals")):
                for value in rule.when.get(key, ()):
                    if value not in names.get(declared, set()):
                        p.add(f"{place}.when.{key}", f"unknown {declared[:-1]} {value!r}")
    for model_place, model, _ in rules:
        if _reaches(model, model, delegates, set()):
            p.add(f"{model_place}.rules", f"delegations starting at {model!r} come back to it")
    seen_classes: dict[str, str] = {}
    for place, spec in classes:
        if spec.name in seen_classes:
            p.add(
                f"{place}.name", f"duplicate prompt class {spec.name!r} (first at {seen_classes[spec.name]})"
            )
        seen_classes.setdefault(spec.name, place)
    if len(seen_classes) > MAX_CLASSES:
        p.add("prompt_classes", f"at most {MAX_CLASSES} prompt classes")
    if fallback is not None and fallback not in models and fallback not in provider_models:
        p.add("routing.fallback", f"unknown model {fallback!r}")


def _reaches(start: str, node: str, edges: dict[str, list[str]], seen: set[str]) -> bool:
    for nxt in edges.get(node, ()):
        if nxt == start:
            return True
        if nxt not in seen:
            seen.add(nxt)
            if _reaches(start, nxt, edges, seen):
                return True
    return False


def rule_when_doc(when: dict[str, Any]) -> dict[str, Any]:
    """A rule's conditions as the snapshot carries them: hours as [from, to) minutes, days as numbers."""
    out = {k: v for k, v in when.items() if k not in ("hours", "days")}
    if "hours" in when:
        m = _HOURS.fullmatch(when["hours"])
        assert m is not None
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        out["hours"] = [h1 * 60 + m1, min(h2 * 60 + m2, 1440)]
    if "days" in when:
        out["days"] = [DAYS.index(d) for d in when["days"]]
    return out


def parse_priority(p: Problems, place: str, item: dict[str, Any]) -> str | None:
    """A table's ``priority``: one of the flow-control classes, or None when not set."""
    value = item.get("priority")
    if value is not None and value not in PRIORITIES:
        names = ", ".join(f'"{n}"' for n in PRIORITIES)
        p.add(f"{place}.priority", f"must be one of {names} (got {value!r})")
        return None
    return value


def parse_weight(p: Problems, place: str, item: dict[str, Any]) -> int | None:
    """A principal's ``weight``: a positive integer, its share while requests wait; None when not set."""
    value = item.get("weight")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1000):
        p.add(f"{place}.weight", "must be a whole number from 1 to 1000 (its share of a saturated backend)")
        return None
    return value
