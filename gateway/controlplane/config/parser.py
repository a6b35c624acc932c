"""The declarative configuration file: TOML in, a validated frozen ``ConfigDoc`` out.

``load_config`` reads one file; ``parse_config`` validates an already-decoded TOML table, so tests and the
admin API can skip the disk. Every problem found is reported at once, each line naming its place
(``backends[1].url: must be an http:// or https:// URL``), in one ``ConfigError``. References are checked
here (a chain naming an unknown provider model, a principal naming an unknown role, duplicate names, an
alias colliding with another callable name, model limits naming an unknown model); environment variables
and key hashing are resolved later, when the store applies the document. ``load_config`` is the only
function here that does I/O.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from gateway.budget import MAX_BUDGETS, check_period
from gateway.controlplane.config.backends import flatten_credentials, parse_backend
from gateway.controlplane.config.body_logs import parse_body_log
from gateway.controlplane.config.fields import read_name, read_names
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.routing import (
    check_routing,
    parse_networks,
    parse_pool,
    parse_priority,
    parse_prompt_class,
    parse_rules,
    parse_weight,
)
from gateway.controlplane.config.specs import (
    LIMIT_FIELDS,
    BackendSpec,
    BodyLogSpec,
    BudgetSpec,
    ConfigDoc,
    KeySpec,
    LimitsSpec,
    ModelSpec,
    PriceSpec,
    PrincipalSpec,
    ProviderBackend,
    ProviderModelSpec,
    RoleSpec,
)
from gateway.controlplane.config.toml_places import TomlPlaces
from gateway.controlplane.config.values import (
    MAX_BUDGET_COST,
    MAX_PRICE,
    check_limit,
    check_name,
    parse_timestamp,
)
from gateway.controlplane.config.writer import toml_key
from gateway.errors import ConfigError

__all__ = ["load_config", "parse_budget", "parse_budgets", "parse_config"]

MIN_SECRET_LENGTH = 16


def load_config(path: str | Path) -> ConfigDoc:
    """Read and validate one TOML file. Each problem is one ``FILE:LINE: place: what`` line."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python 3.11's message ends with "(at line L, column C)"; the position goes first, like a compiler's.
        message = str(exc)
        if at := _TOML_AT.match(message):
            message = f"{at['line']}:{at['column']}: invalid TOML: {at['what']}"
        else:
            message = f" invalid TOML: {message}"
        raise ConfigError(f"{path}:{message}") from exc
    return parse_config(data, str(path), text)


_TOML_AT = re.compile(r"^(?P<what>.*?) \(at line (?P<line>\d+), column (?P<column>\d+)\)$", re.S)


def parse_config(data: dict[str, Any], source: str, text: str | None = None) -> ConfigDoc:
    """Validate a decoded TOML document; raises ``ConfigError`` listing every problem found, one a line,
    each with its line in ``text`` (the document's source) where that is given."""
    p = Problems()
    p.unknown_fields("", data, _SECTIONS)
    backends = flatten_credentials(_section(p, data, "backends", parse_backend))
    provider_models = _section(p, data, "provider_models", _provider_model)
    models = _section(p, data, "models", _model)
    roles = _section(p, data, "roles", _role)
    principals = _section(p, data, "principals", _principal)
    keys = _section(p, data, "keys", _key)
    pools = _section(p, data, "pools", parse_pool)
    classes = _section(p, data, "prompt_classes", parse_prompt_class)
    body_logs = _section(p, data, "body_logs", parse_body_log)
    fallback = _routing_table(p, data.get("routing", {}))
    doc = ConfigDoc(
        backends=tuple(b for _, b in backends),
        provider_models=tuple(m for _, m in provider_models),
        models=tuple(m for _, m in models),
        roles=tuple(r for _, r in roles),
        principals=tuple(pr for _, pr in principals),
        keys=tuple(k for _, k in keys),
        pools=tuple(pl for _, pl in pools),
        fallback=fallback,
        prompt_classes=tuple(c for _, c in classes),
        body_logs=tuple(b for _, b in body_logs),
    )
    _check_references(p, backends, provider_models, models, roles, principals, keys)
    _check_body_logs(p, body_logs)
    check_routing(
        p, pools, [(pl, m.name, m.rules) for pl, m in models if m.rules], fallback, p.declared, classes
    )
    if p.lines:
        places = TomlPlaces(text) if text is not None else None
        located = []
        for place, line in zip(p.places, p.lines, strict=True):
            number = places.line_of(place) if places is not None else None
            located.append(f"{source}:{number}: {line}" if number else f"{source}: {line}")
        raise ConfigError("\n".join(located), param=p.first_place)
    return doc


_SECTIONS = (
    "backends",
    "provider_models",
    "models",
    "roles",
    "principals",
    "keys",
    "pools",
    "routing",
    "prompt_classes",
    "body_logs",
)
T = TypeVar("T")


def _section(
    p: Problems, data: dict[str, Any], name: str, parse: Callable[[Problems, str, dict[str, Any]], T | None]
) -> list[tuple[str, T]]:
    """Each valid entry of an array of tables with its place; invalid entries are reported and dropped."""
    raw = data.get(name, [])
    if not isinstance(raw, list):
        p.add(name, f"must be an array of tables ([[{name}]])")
        return []
    out: list[tuple[str, T]] = []
    declared = p.declared.setdefault(name, set())
    for i, item in enumerate(raw):
        place = f"{name}[{i}]"
        if not isinstance(item, dict):
            p.add(place, "must be a table")
            continue
        if isinstance(item.get("name"), str):
            declared.add(item["name"])
        parsed = parse(p, place, item)
        if parsed is not None:
            out.append((place, parsed))
    return out


def _provider_model(p: Problems, place: str, item: dict[str, Any]) -> ProviderModelSpec | None:
    p.unknown_fields(place, item, ("name", "backends", "price", "context_window"))
    before = len(p.lines)
    name = read_name(p, place, item)
    window = item.get("context_window")
    if window is not None and (problem := check_limit(window)):
        p.add(f"{place}.context_window", problem)
    price = _price(p, f"{place}.price", item["price"]) if "price" in item else None
    raw = item.get("backends")
    if raw is None:
        p.add(f"{place}.backends", "is required")
        return None
    if not isinstance(raw, list) or not raw:
        p.add(f"{place}.backends", "must be a non-empty array")
        return None
    entries: list[ProviderBackend] = []
    for i, entry in enumerate(raw):
        where = f"{place}.backends[{i}]"
        if isinstance(entry, str):  # shorthand: the backend serves the model under the same name
            entry = {"backend": entry}
        if not isinstance(entry, dict):
            p.add(where, "must be a backend name or a table {backend = ..., model = ...}")
            continue
        p.unknown_fields(where, entry, ("backend", "model"))
        backend = read_name(p, where, entry, "backend")
        model = read_name(p, where, entry, "model") if "model" in entry else name
        if backend is not None and model is not None:
            pb = ProviderBackend(backend, model)
            if pb in entries:
                p.add(where, f"duplicate entry ({backend!r}, {model!r})")
            entries.append(pb)
    if name is None or len(entries) != len(raw) or len(p.lines) > before:
        return None
    return ProviderModelSpec(name, tuple(entries), price, window)


def _model(p: Problems, place: str, item: dict[str, Any]) -> ModelSpec | None:
    p.unknown_fields(
        place, item, ("name", "chain", "aliases", "price", "rules", "context_failover", "priority")
    )
    if isinstance(item.get("aliases"), list):  # even if invalid: see Problems.declared
        p.declared.setdefault("aliases", set()).update(a for a in item["aliases"] if isinstance(a, str))
    name = read_name(p, place, item)
    if "chain" not in item:
        p.add(f"{place}.chain", "is required")
        return None
    chain = read_names(p, f"{place}.chain", item["chain"], required=True)
    aliases = read_names(p, f"{place}.aliases", item.get("aliases", []), required=False)
    before = len(p.lines)
    price = _price(p, f"{place}.price", item["price"]) if "price" in item else None
    rules = parse_rules(p, f"{place}.rules", item["rules"]) if "rules" in item else ()
    failover = item.get("context_failover", False)
    if not isinstance(failover, bool):
        p.add(f"{place}.context_failover", "must be true or false")
    priority = parse_priority(p, place, item)
    if name is None or chain is None or aliases is None or rules is None or len(p.lines) > before:
        return None
    return ModelSpec(name, chain, aliases, price, rules, failover, priority)


def _routing_table(p: Problems, raw: object) -> str | None:
    """``[routing]``: today only ``fallback``, the model whose chain serves a request whose own targets
    are all down."""
    if not isinstance(raw, dict):
        p.add("routing", "must be a table ([routing])")
        return None
    p.unknown_fields("routing", raw, ("fallback",))
    if "fallback" not in raw:
        return None
    return read_name(p, "routing", raw, "fallback")


_PRICE_FIELDS = ("input", "output", "cached_input")


def _price(p: Problems, place: str, value: object) -> PriceSpec | None:
    if not isinstance(value, dict):
        p.add(place, "must be a table such as { input = 0.15, output = 0.60 } (per million tokens)")
        return None
    p.unknown_fields(place, value, _PRICE_FIELDS)
    values: dict[str, float] = {}
    for name in _PRICE_FIELDS:
        if name not in value:
            if name != "cached_input":
                p.add(f"{place}.{name}", "is required")
            continue
        v = value[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            p.add(f"{place}.{name}", "must be a non-negative number (currency units per million tokens)")
        elif v > MAX_PRICE:
            p.add(f"{place}.{name}", f"must be at most {MAX_PRICE}")
        else:
            values[name] = float(v)
    if "input" not in values or "output" not in values:
        return None
    return PriceSpec(values["input"], values["output"], values.get("cached_input"))


def parse_budgets(p: Problems, place: str, item: dict[str, Any]) -> tuple[BudgetSpec, ...]:
    """The budgets of a principal's or key's table: ``budget = {...}`` (one) and ``budgets = [{...},
    ...]`` (several), together at most ``MAX_BUDGETS``, one per period; the single one comes first."""
    found: list[tuple[str, BudgetSpec]] = []
    if "budget" in item:
        spec = parse_budget(p, f"{place}.budget", item["budget"])
        if spec is not None:
            found.append((f"{place}.budget", spec))
    if "budgets" in item:
        raw = item["budgets"]
        if not isinstance(raw, list):
            p.add(
                f"{place}.budgets", 'must be an array of budget tables, e.g. [{ period = "day", cost = 9 }]'
            )
        else:
            for i, value in enumerate(raw):
                spec = parse_budget(p, f"{place}.budgets[{i}]", value)
                if spec is not None:
                    found.append((f"{place}.budgets[{i}]", spec))
    if len(found) > MAX_BUDGETS:
        p.add(f"{place}.budgets", f"at most {MAX_BUDGETS} budgets (one per period)")
    seen: dict[str, str] = {}
    for where, spec in found:
        if spec.period in seen:
            p.add(f"{where}.period", f"another budget has the period {spec.period!r} ({seen[spec.period]})")
        seen.setdefault(spec.period, where)
    return tuple(spec for _, spec in found)


def parse_budget(p: Problems, place: str, value: object) -> BudgetSpec | None:
    """One budget table; None (with its problems in ``p``) when it is not a valid one."""
    if not isinstance(value, dict):
        p.add(place, 'must be a table such as { period = "month", tokens = 1000000, cost = 50.0 }')
        return None
    p.unknown_fields(place, value, ("period", "tokens", "cost", "alerts"))
    before = len(p.lines)
    period = value.get("period", "month")
    if problem := check_period(period):
        p.add(f"{place}.period", problem)
    tokens = value.get("tokens")
    if tokens is not None and (problem := check_limit(tokens)):
        p.add(f"{place}.tokens", problem)
    cost = value.get("cost")
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost <= 0
    ):
        p.add(f"{place}.cost", "must be a positive number (currency units)")
    elif cost is not None and cost > MAX_BUDGET_COST:
        p.add(f"{place}.cost", f"must be at most {MAX_BUDGET_COST}")
    if tokens is None and cost is None:
        p.add(place, "needs tokens, cost, or both")
    alerts = value.get("alerts", [])
    if not isinstance(alerts, list) or any(
        isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a <= 1 for a in alerts
    ):
        p.add(f"{place}.alerts", "must be an array of fractions of the budget, e.g. [0.5, 0.8, 1.0]")
    elif len(set(alerts)) != len(alerts):
        p.add(f"{place}.alerts", "lists a threshold twice")
    if len(p.lines) > before:
        return None
    return BudgetSpec(
        period, tokens, None if cost is None else float(cost), tuple(sorted(float(a) for a in alerts))
    )


def _role(p: Problems, place: str, item: dict[str, Any]) -> RoleSpec | None:
    p.unknown_fields(place, item, ("name", "permissions"))
    name = read_name(p, place, item)
    perms = read_names(p, f"{place}.permissions", item.get("permissions", []), required=False)
    if perms is not None:
        for i, perm in enumerate(perms):
            if perm == "model/":
                p.add(f"{place}.permissions[{i}]", "model/ needs a model name or pattern, e.g. model/*")
                perms = None
                break
    if name is None or perms is None:
        return None
    return RoleSpec(name, perms)


def _limits(p: Problems, place: str, value: object) -> LimitsSpec | None:
    """A limits table; None when it sets nothing. Problems go to ``p`` (callers compare its length)."""
    if not isinstance(value, dict):
        p.add(place, "must be a table such as { requests_per_minute = 100 }")
        return None
    p.unknown_fields(place, value, LIMIT_FIELDS)
    values: dict[str, int] = {}
    for name in LIMIT_FIELDS:
        if name in value:
            if problem := check_limit(value[name]):
                p.add(f"{place}.{name}", problem)
            else:
                values[name] = value[name]
    spec = LimitsSpec(**values)
    return None if spec.is_empty() else spec


def _model_limits(p: Problems, place: str, value: object) -> tuple[tuple[str, LimitsSpec], ...]:
    if not isinstance(value, dict):
        p.add(
            place, 'must be a table of model names to limits, e.g. { "chat" = { requests_per_minute = 10 } }'
        )
        return ()
    out: list[tuple[str, LimitsSpec]] = []
    for model, limits in value.items():
        where = f"{place}.{toml_key(model)}"
        if problem := check_name(model):
            p.add(where, f"model name {problem}")
        elif (spec := _limits(p, where, limits)) is not None:
            out.append((model, spec))
    return tuple(sorted(out, key=lambda entry: entry[0]))


def _principal(p: Problems, place: str, item: dict[str, Any]) -> PrincipalSpec | None:
    p.unknown_fields(
        place, item, ("name", "roles", "limits", "model_limits", "budget", "budgets", "priority", "weight")
    )
    before = len(p.lines)
    name = read_name(p, place, item)
    roles = read_names(p, f"{place}.roles", item.get("roles", []), required=False)
    limits = _limits(p, f"{place}.limits", item["limits"]) if "limits" in item else None
    model_limits = _model_limits(p, f"{place}.model_limits", item.get("model_limits", {}))
    budgets = parse_budgets(p, place, item)
    priority = parse_priority(p, place, item)
    weight = parse_weight(p, place, item)
    if len(p.lines) > before or name is None or roles is None:
        return None
    return PrincipalSpec(name, roles, limits, model_limits, budgets, priority, weight)


def _key(p: Problems, place: str, item: dict[str, Any]) -> KeySpec | None:
    p.unknown_fields(
        place,
        item,
        (
            "name",
            "principal",
            "secret",
            "expires_at",
            "limits",
            "allow_ips",
            "models",
            "budget",
            "budgets",
            "priority",
        ),
    )
    ok = True
    name = read_name(p, place, item)
    principal = read_name(p, place, item, "principal")
    secret = item.get("secret")
    if secret is not None and (
        not isinstance(secret, str) or len(secret) < MIN_SECRET_LENGTH or secret != secret.strip()
    ):
        p.add(f"{place}.secret", f"must be a string of at least {MIN_SECRET_LENGTH} characters, no padding")
        ok = False
    expires_at: float | None = None
    if "expires_at" in item:
        try:
            expires_at = parse_timestamp(item["expires_at"])
        except ValueError as exc:
            p.add(f"{place}.expires_at", str(exc))
            ok = False
    limits: LimitsSpec | None = None
    if "limits" in item:
        before = len(p.lines)
        limits = _limits(p, f"{place}.limits", item["limits"])
        ok = ok and len(p.lines) == before
    allow_ips: tuple[str, ...] = ()
    if "allow_ips" in item:
        networks = parse_networks(p, f"{place}.allow_ips", item["allow_ips"])
        ok = ok and networks is not None
        allow_ips = networks or ()
    models: tuple[str, ...] | None = None
    if "models" in item:
        models = read_names(p, f"{place}.models", item["models"], required=True)
        ok = ok and models is not None
    before = len(p.lines)
    budgets = parse_budgets(p, place, item)
    priority = parse_priority(p, place, item)
    ok = ok and len(p.lines) == before
    if not ok or name is None or principal is None:
        return None
    return KeySpec(name, principal, secret, expires_at, limits, allow_ips, models, budgets, priority)


def _check_references(
    p: Problems,
    backends: list[tuple[str, BackendSpec]],
    provider_models: list[tuple[str, ProviderModelSpec]],
    models: list[tuple[str, ModelSpec]],
    roles: list[tuple[str, RoleSpec]],
    principals: list[tuple[str, PrincipalSpec]],
    keys: list[tuple[str, KeySpec]],
) -> None:
    def unique(entries: Iterable[tuple[str, str]], what: str) -> None:
        seen: dict[str, str] = {}
        for place, name in entries:
            if name in seen:
                p.add(place, f"duplicate {what} {name!r} (first at {seen[name]})")
            else:
                seen[name] = place

    unique(((f"{pl}.name", b.name) for pl, b in backends), "backend name")
    unique(((f"{pl}.name", r.name) for pl, r in roles), "role name")
    unique(((f"{pl}.name", pr.name) for pl, pr in principals), "principal name")
    unique(((f"{pl}.name", k.name) for pl, k in keys), "key name")
    unique(((f"{pl}.secret", k.secret) for pl, k in keys if k.secret is not None), "key secret")
    # Provider models, frontend models and aliases share one namespace: the model name a client sends.
    unique(
        [(f"{pl}.name", m.name) for pl, m in provider_models]
        + [(f"{pl}.name", m.name) for pl, m in models]
        + [(f"{pl}.aliases[{i}]", a) for pl, m in models for i, a in enumerate(m.aliases)],
        "model name or alias",
    )
    backend_names = p.declared.get("backends", set())
    provider_names = p.declared.get("provider_models", set())
    role_names = p.declared.get("roles", set())
    principal_names = p.declared.get("principals", set())
    callable_names = provider_names | p.declared.get("models", set()) | p.declared.get("aliases", set())
    for pl, pm in provider_models:
        for i, entry in enumerate(pm.backends):
            if entry.backend not in backend_names:
                p.add(f"{pl}.backends[{i}].backend", f"unknown backend {entry.backend!r}")
    for pl, m in models:
        for i, pm_name in enumerate(m.chain):
            if pm_name not in provider_names:
                p.add(f"{pl}.chain[{i}]", f"unknown provider model {pm_name!r}")
    for pl, pr in principals:
        for i, role in enumerate(pr.roles):
            if role not in role_names:
                p.add(f"{pl}.roles[{i}]", f"unknown role {role!r}")
        for model, _ in pr.model_limits:
            if model not in callable_names:
                p.add(f"{pl}.model_limits.{toml_key(model)}", f"unknown model name {model!r}")
    for pl, k in keys:
        if k.principal not in principal_names:
            p.add(f"{pl}.principal", f"unknown principal {k.principal!r}")
        for i, model in enumerate(k.models or ()):
            if model not in callable_names:
                p.add(f"{pl}.models[{i}]", f"unknown model name {model!r}")


def _check_body_logs(p: Problems, entries: list[tuple[str, BodyLogSpec]]) -> None:
    """Names unique; the principals and models an entry selects declared in the document (keys are
    resolved when the snapshot is built: the CLI makes keys no file declares)."""
    seen: dict[str, str] = {}
    principal_names = p.declared.get("principals", set())
    callable_names = (
        p.declared.get("provider_models", set())
        | p.declared.get("models", set())
        | p.declared.get("aliases", set())
    )
    for place, spec in entries:
        if spec.name in seen:
            p.add(f"{place}.name", f"duplicate body log {spec.name!r} (first at {seen[spec.name]})")
        seen.setdefault(spec.name, place)
        for i, principal in enumerate(spec.principals or ()):
            if principal not in principal_names:
                p.add(f"{place}.principals[{i}]", f"unknown principal {principal!r}")
        for i, model in enumerate(spec.models or ()):
            if model not in callable_names:
                p.add(f"{place}.models[{i}]", f"unknown model name {model!r}")
