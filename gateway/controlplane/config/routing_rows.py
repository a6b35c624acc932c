"""The routing entries of a configuration in the store's form: one ``(kind, name, JSON body)`` row per
entry of the ``routing_entries`` table (pools, rules, prompt classes, backends' flow-control and pool
credential fields, keys' networks, models and priority, principals' priority and weight, frontend models'
context failover and priority, context windows, body logs, the fallback),
and those rows back to specs, each re-validated by the file parser's own checks. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.controlplane.config.body_logs import parse_body_log
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.routing import (
    parse_count,
    parse_networks,
    parse_pool,
    parse_priority,
    parse_prompt_class,
    parse_rules,
    parse_weight,
)
from gateway.controlplane.config.specs import (
    BACKEND_FLOW_FIELDS,
    CREDENTIAL_ROW_FIELDS,
    BodyLogSpec,
    ConfigDoc,
    PoolSpec,
    PromptClassSpec,
    RuleSpec,
)

__all__ = ["RoutingRows", "routing_from_rows", "routing_rows"]

_BACKEND_ROW_FIELDS = (*BACKEND_FLOW_FIELDS, *CREDENTIAL_ROW_FIELDS)


def routing_rows(cfg: ConfigDoc) -> list[tuple[str, str, str]]:
    """The routing entries of ``cfg`` as ``routing_entries`` rows."""
    rows: list[tuple[str, str, str]] = []
    for b in cfg.backends:
        flow = {k: getattr(b, k) for k in _BACKEND_ROW_FIELDS if getattr(b, k) is not None}
        if flow:
            rows.append(("backend", b.name, orjson.dumps(flow).decode()))
    for pm in cfg.provider_models:
        if pm.context_window is not None:
            rows.append(("context", pm.name, str(pm.context_window)))
    for m in cfg.models:
        model: dict[str, Any] = {}
        if m.context_failover:
            model["context_failover"] = True
        if m.priority is not None:
            model["priority"] = m.priority
        if model:
            rows.append(("model", m.name, orjson.dumps(model).decode()))
        if m.rules:
            rows.append(("rules", m.name, orjson.dumps([r.as_dict() for r in m.rules]).decode()))
    for pool in cfg.pools:
        rows.append(("pool", pool.name, orjson.dumps(pool.as_dict()).decode()))
    for order, spec in enumerate(cfg.prompt_classes):
        rows.append(("class", spec.name, orjson.dumps({"order": order, **spec.as_dict()}).decode()))
    for order, entry in enumerate(cfg.body_logs):
        rows.append(("body_log", entry.name, orjson.dumps({"order": order, **entry.as_dict()}).decode()))
    for pr in cfg.principals:
        flow = {k: v for k, v in (("priority", pr.priority), ("weight", pr.weight)) if v is not None}
        if flow:
            rows.append(("principal", pr.name, orjson.dumps(flow).decode()))
    for k in cfg.keys:
        if k.allow_ips or k.models is not None or k.priority is not None:
            rule: dict[str, Any] = {}
            if k.allow_ips:
                rule["allow_ips"] = list(k.allow_ips)
            if k.models is not None:
                rule["models"] = list(k.models)
            if k.priority is not None:
                rule["priority"] = k.priority
            rows.append(("key", k.name, orjson.dumps(rule).decode()))
    if cfg.fallback is not None:
        rows.append(("setting", "fallback", orjson.dumps(cfg.fallback).decode()))
    return rows


@dataclass(frozen=True, slots=True)
class RoutingRows:
    backends: dict[str, dict[str, Any]]  # backend -> its flow-control fields
    rules: dict[str, tuple[RuleSpec, ...]]  # frontend model -> its rules
    pools: tuple[PoolSpec, ...]
    fallback: str | None
    skipped: list[str]  # "kind name: why" of rows that no longer parse
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # key name -> allow_ips, models, priority
    windows: dict[str, int] = field(default_factory=dict)  # provider model -> context window
    context_failover: frozenset[str] = frozenset()  # frontend models that allow it
    classes: tuple[PromptClassSpec, ...] = ()  # in declaration order
    body_logs: tuple[BodyLogSpec, ...] = ()  # in declaration order
    principals: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> priority, weight
    model_priority: dict[str, str] = field(default_factory=dict)  # frontend model -> its priority


def routing_from_rows(rows: Iterable[tuple[str, str, str]]) -> RoutingRows:
    """Rows back to specs, each re-validated by the file parser; a row that fails is skipped and named."""
    backends: dict[str, dict[str, Any]] = {}
    rules: dict[str, tuple[RuleSpec, ...]] = {}
    pools: list[PoolSpec] = []
    fallback: str | None = None
    skipped: list[str] = []
    keys: dict[str, dict[str, Any]] = {}
    windows: dict[str, int] = {}
    failover: set[str] = set()
    classes: list[tuple[int, PromptClassSpec]] = []
    body_logs: list[tuple[int, BodyLogSpec]] = []
    principals: dict[str, dict[str, Any]] = {}
    model_priority: dict[str, str] = {}
    for kind, name, body in rows:
        p = Problems()
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            skipped.append(f"{kind} {name}: {exc}")
            continue
        if kind == "backend" and isinstance(value, dict):
            p.unknown_fields(name, value, _BACKEND_ROW_FIELDS)
            if not p.lines:
                backends[name] = value
        elif kind == "rules":
            parsed = parse_rules(p, name, value)
            if parsed is not None and not p.lines:
                rules[name] = parsed
        elif kind == "pool" and isinstance(value, dict):
            pool = parse_pool(p, name, value)
            if pool is not None and not p.lines:
                pools.append(pool)
        elif kind == "setting" and name == "fallback" and isinstance(value, str):
            fallback = value
        elif kind == "class" and isinstance(value, dict):
            order = value.pop("order", 0)
            spec = parse_prompt_class(p, name, value)
            if spec is not None and not p.lines:
                classes.append((order if isinstance(order, int) else 0, spec))
        elif kind == "body_log" and isinstance(value, dict):
            order = value.pop("order", 0)
            entry = parse_body_log(p, name, value)
            if entry is not None and not p.lines:
                body_logs.append((order if isinstance(order, int) else 0, entry))
        elif kind == "context":
            if parse_count(p, name, value, minimum=1) is not None:
                windows[name] = value
        elif kind == "model" and isinstance(value, dict):
            p.unknown_fields(name, value, ("context_failover", "priority"))
            priority = parse_priority(p, name, value)
            if not p.lines:
                if value.get("context_failover") is True:
                    failover.add(name)
                if priority is not None:
                    model_priority[name] = priority
        elif kind == "principal" and isinstance(value, dict):
            p.unknown_fields(name, value, ("priority", "weight"))
            parse_priority(p, name, value)
            parse_weight(p, name, value)
            if not p.lines:
                principals[name] = value
        elif kind == "key" and isinstance(value, dict):
            p.unknown_fields(name, value, ("allow_ips", "models", "priority"))
            parse_priority(p, name, value)
            if "allow_ips" in value:
                parse_networks(p, f"{name}.allow_ips", value["allow_ips"])
            models = value.get("models")
            if models is not None and not (
                isinstance(models, list) and all(isinstance(m, str) for m in models)
            ):
                p.add(f"{name}.models", "must be an array of model names")
            if not p.lines:
                keys[name] = value
        else:
            p.add(name, f"unknown routing entry kind {kind!r}")
        if p.lines:
            skipped.append(f"{kind} {name}: {'; '.join(p.lines)}")
    return RoutingRows(
        backends,
        rules,
        tuple(pools),
        fallback,
        skipped,
        keys,
        windows,
        frozenset(failover),
        tuple(spec for _, spec in sorted(classes, key=lambda c: c[0])),
        tuple(entry for _, entry in sorted(body_logs, key=lambda b: b[0])),
        principals,
        model_priority,
    )
