"""Build the versioned snapshot document (schema in ``gateway.snapshot``) from the store.

``build_snapshot_doc`` reads every row in one read transaction (``Store.read_state``), so the document is
consistent with the revision it carries, then ``build_doc`` turns the rows into the document without
further I/O. One bad row never fails a build: it is skipped, counted in ``skipped`` and logged at WARNING
on ``gateway.snapshot`` (the first ``MAX_LOGGED`` of them individually, then one summary line).

Authorisation is by the name the caller used. A permission ``model/PATTERN`` (``fnmatch`` rules, case
sensitive) grants every route whose name matches; a matched frontend model or alias counts as the
frontend model it names, so it grants the model and all of its aliases. ``model/*`` also sets
``allow_all``. An alias with ``*``, ``?`` or ``[`` is a pattern (``gateway.routing.aliases``): it goes
into ``"alias_patterns"`` rather than ``"routes"``, longest pattern first, and a name it matches is
authorised, priced and routed as that alias. Other permissions (``usage:read``, ``key:create``, ...) do
not concern routing; they are listed in the principal's ``"permissions"`` for the admin API.
Keys already expired at build time are left out (not counted as skipped); the data plane still checks
``expires_at`` for keys that expire later.

Limits become ``"limits": {"rpm": .., "tpm": .., "concurrency": ..}`` with only the set ones, the key left
out when none is set, on principals and keys, and ``"model_limits": {model: {...}}`` on principals. A
principal or key whose limits cannot be read is skipped like any bad row, so that a damaged row makes
its requests fail rather than run unlimited.

A priced model or provider model gives its route (and its aliases' routes) ``"price": [input, output,
cached_input]`` per million tokens; a principal or key with budgets gets ``"budgets": [{"period": ..,
"tokens": .., "cost": .., "alerts": [..]}, ...]`` in their declared order (a key also its ``"name"``; a
principal also ``"budget"``, its first, which proxy hosts of an earlier version read). An unreadable price
is skipped (the model costs nothing); an unreadable budget skips its principal or key, like unreadable
limits.

Flow control: a principal's ``priority`` and ``weight``, a key's ``priority`` and a frontend model's
``priority`` (on its route and its aliases' routes) come from their routing entries, already checked by
``routing_from_rows``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

import orjson

from gateway.budget import MAX_BUDGETS, check_period
from gateway.controlplane.config.routing import rule_when_doc
from gateway.controlplane.config.routing_rows import RoutingRows, routing_from_rows
from gateway.controlplane.config.specs import PROTOCOLS
from gateway.controlplane.config.values import MAX_BUDGET_COST, MAX_PRICE, check_limit, check_name, check_url
from gateway.controlplane.store import Store, StoreState
from gateway.routing.aliases import is_pattern
from gateway.snapshot import SCHEMA

__all__ = ["MAX_LOGGED", "build_doc", "build_snapshot_doc"]

log = logging.getLogger("gateway.snapshot")

MAX_LOGGED = 20
DEFAULT_HEALTH_PATH = "/health"  # vLLM and SGLang both answer it
ALLOW_ALL = "model/*"
_MODEL_PERMISSION = "model/"
_HEX64 = re.compile(r"[0-9a-f]{64}")  # fullmatch
_GLOB_CHARS = frozenset("*?[")
_LIMIT_KEYS = ("rpm", "tpm", "concurrency")
# A backend's settings the document carries as they are (health_path is resolved apart; a credential's
# fields are folded into its backend by _fold_credentials).
_FLOW_DOC = (
    "max_concurrency",
    "waiting_high_water",
    "queue_size",
    "queue_timeout",
    "kv_high_water",
    "reserved_places",
    "responses_api",
    "kv_events",
)  # the store's limit_rpm, limit_tpm, limit_concurrency


def build_snapshot_doc(store: Store, *, now: float | None = None) -> dict[str, Any]:
    """The snapshot document for the store's current revision."""
    return build_doc(store.read_state(), now=now)


class _Skips:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, what: str, why: str) -> None:
        self.count += 1
        if self.count <= MAX_LOGGED:
            log.warning("snapshot build: skipping %s: %s", what, why)

    def summarise(self, revision: int) -> None:
        if self.count > MAX_LOGGED:
            log.warning(
                "snapshot build: skipped %d invalid rows at revision %d (%d not logged individually)",
                self.count,
                revision,
                self.count - MAX_LOGGED,
            )


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) and f >= 0 else None


def _limits(values: Sequence[object]) -> dict[str, int] | None:
    """The document's limits from a row's three limit columns; None when none is set.

    Raises ``ValueError`` naming the first unreadable value.
    """
    out: dict[str, int] = {}
    for key, value in zip(_LIMIT_KEYS, values, strict=True):
        if value is None:
            continue
        problem = check_limit(value)
        if problem is not None or not isinstance(value, int):  # the second test only narrows the type
            raise ValueError(f"{key} limit {value!r} {problem}")
        out[key] = value
    return out or None


def build_doc(state: StoreState, *, now: float | None = None) -> dict[str, Any]:
    """The document for ``state``; pure apart from logging skipped rows."""
    built_at = time.time()
    now = built_at if now is None else now
    skip = _Skips()
    routing = routing_from_rows(state.routing)
    for line in routing.skipped:
        skip("routing entry", line)
    backends = _backends(state, routing, skip)
    routes, aliases_of = _routes(state, backends, skip)
    pools = _pools(routing, routes, skip)
    _rules(routing, routes, pools, skip)
    principals = _principals(state, routes, aliases_of, skip)
    for entry in principals.values():  # flow control: its class and its share (by the principal's name)
        entry.update(routing.principals.get(entry["name"], {}))
    # Pattern aliases were routes like the others until now (rules, prices and grants reach them the same
    # way); the data plane tries them only when no route has the exact name, most specific first: the
    # longest pattern, then by name (the store keeps no config order).
    named = sorted((a for names in aliases_of.values() for a in names if is_pattern(a)), key=_specific)
    patterns = {a: routes.pop(a) for a in named}
    keys = _keys(state, principals, now, skip, _key_rules(routing, routes, aliases_of))
    skip.summarise(state.revision)
    doc = {
        "schema": SCHEMA,
        "revision": state.revision,
        "built_at": built_at,
        "backends": backends,
        "routes": routes,
        "principals": principals,
        "keys": keys,
        "pools": pools,
        "skipped": skip.count,
    }
    if patterns:
        doc["alias_patterns"] = patterns
    if routing.classes:
        doc["prompt_classes"] = [spec.as_dict() for spec in routing.classes]
    windows = {pm: w for pm, w in routing.windows.items() if routes.get(pm, {}).get("kind") == "provider"}
    if windows:
        doc["context_windows"] = windows
    for entry in (*routes.values(), *patterns.values()):
        if entry["kind"] == "frontend" and entry["canonical"] in routing.context_failover:
            entry["context_failover"] = True
        if entry["kind"] == "frontend" and entry["canonical"] in routing.model_priority:
            entry["priority"] = routing.model_priority[entry["canonical"]]
    body_logs = _body_logs(state, routing, principals, skip)
    if body_logs:
        doc["body_logs"] = body_logs
        doc["skipped"] = skip.count
    if routing.fallback is not None:
        if routing.fallback in routes:
            doc["fallback"] = routing.fallback
        else:
            skip("routing fallback", f"unknown or unusable model {routing.fallback!r}")
            doc["skipped"] = skip.count
    return doc


def _body_logs(
    state: StoreState, routing: RoutingRows, principals: dict[str, dict[str, Any]], skip: _Skips
) -> list[dict[str, Any]]:
    """The ``[[body_logs]]`` entries as the document carries them (``gateway.body_rules``): principals and
    keys by id. A selector name that names nothing (a principal or key since removed) selects nothing; an
    entry left with an empty selector matches no request, never every request."""
    ids_of_principal = {str(entry["name"]): pid for pid, entry in principals.items()}
    ids_of_key: dict[str, list[str]] = {}
    for key_id, name, *_rest in state.keys:
        if name is not None:
            ids_of_key.setdefault(str(name), []).append(str(key_id))
    out: list[dict[str, Any]] = []
    for spec in routing.body_logs:
        entry = spec.as_dict()
        # Names what the control worker redacts with: a worker's record carries it, so that a body is
        # redacted by the entry that logged it even after the entry changed (see controlplane.bodies).
        entry["id"] = hashlib.blake2b(orjson.dumps(entry), digest_size=8).hexdigest()
        if spec.principals is not None:
            entry["principals"] = []
            for name in spec.principals:
                if name in ids_of_principal:
                    entry["principals"].append(ids_of_principal[name])
                else:
                    skip(f"body log {spec.name!r}", f"unknown principal {name!r} (it selects nothing)")
        if spec.keys is not None:
            entry["keys"] = []
            for name in spec.keys:
                if name in ids_of_key:
                    entry["keys"] += ids_of_key[name]
                else:
                    skip(f"body log {spec.name!r}", f"unknown key {name!r} (it selects nothing)")
        out.append(entry)
    return out


def _specific(pattern: str) -> tuple[int, str]:
    return -len(pattern), pattern


def _backends(state: StoreState, routing: RoutingRows, skip: _Skips) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, url, protocol, api_key, _env, connect, first_byte, read in state.backends:
        timeouts = [_seconds(connect), _seconds(first_byte), _seconds(read)]
        problem = (
            check_name(name)
            or check_url(url)
            or (None if protocol in PROTOCOLS else f"unknown protocol {protocol!r}")
            or (
                None
                if api_key is None or isinstance(api_key, str)
                else "its credential does not open with the secrets key at hand"
            )
            or (None if None not in timeouts and 0.0 not in timeouts else "timeouts must be positive numbers")
        )
        if problem:
            skip(f"backend {name!r}", problem)
            continue
        out[name] = {
            "url": url.rstrip("/"),
            "api_key": api_key,
            "protocol": protocol,
            "connect_timeout": timeouts[0],
            "first_byte_timeout": timeouts[1],
            "read_timeout": timeouts[2],
        }
        flow = routing.backends.get(name, {})
        out[name].update({k: v for k, v in flow.items() if k in _FLOW_DOC and v is not None})
        health_path = flow.get("health_path")
        if health_path is None and protocol == "openai":
            health_path = DEFAULT_HEALTH_PATH
        out[name]["health_path"] = health_path or None
    return _fold_credentials(out, routing, skip)


_CREDENTIAL_DOC = {"requests_per_minute": "rpm", "tokens_per_minute": "tpm", "cool_down": "cool_down"}


def _fold_credentials(
    out: dict[str, dict[str, Any]], routing: RoutingRows, skip: _Skips
) -> dict[str, dict[str, Any]]:
    """Each credential row into its backend's ``"credentials"`` (by name, in name order). A backend that
    declares credentials and has none left that opens is skipped: sending its requests without a
    credential would only earn 401s."""
    pooled: set[str] = set()
    for name in sorted(routing.backends):
        flow = routing.backends[name]
        parent = flow.get("credential_of")
        if parent is None:
            continue
        pooled.add(parent)
        row = out.pop(name, None)
        if row is None or parent not in out or not row["api_key"]:
            skip(f"credential {name!r}", "unreadable or without a key, or its backend is unusable")
            continue
        entry: dict[str, Any] = {"name": name[len(parent) + 1 :], "api_key": row["api_key"]}
        entry.update({doc: flow[k] for k, doc in _CREDENTIAL_DOC.items() if flow.get(k) is not None})
        out[parent].setdefault("credentials", []).append(entry)
    for parent in pooled:
        if parent in out and not out[parent].get("credentials"):
            skip(f"backend {parent!r}", "none of its credentials is usable")
            del out[parent]
    return out


def _pools(routing: RoutingRows, routes: dict[str, dict[str, Any]], skip: _Skips) -> dict[str, Any]:
    """Each pool with its members' targets flattened (weight appended), members that are gone skipped."""
    out: dict[str, Any] = {}
    for pool in routing.pools:
        weights = pool.weights or (1,) * len(pool.members)
        targets = []
        for member, weight in zip(pool.members, weights, strict=True):
            route = routes.get(member)
            if route is None or route["kind"] != "provider":
                skip(f"member {member!r} of pool {pool.name!r}", "unknown or unusable provider model")
                continue
            targets += [[*t, weight] for t in route["targets"]]
        if not targets:
            skip(f"pool {pool.name!r}", "no usable member")
            continue
        out[pool.name] = {
            "policy": pool.policy,
            "targets": targets,
            "prefix_bytes": pool.prefix_bytes,
            "max_inflight": pool.max_inflight,
            **({"cache": dict(pool.cache)} if pool.cache else {}),
            **({"tokenizer": pool.tokenizer} if pool.tokenizer else {}),
        }
    return out


def _rules(
    routing: RoutingRows, routes: dict[str, dict[str, Any]], pools: dict[str, Any], skip: _Skips
) -> None:
    """Compile each frontend model's rules into its routes (the model's and its aliases')."""
    for model, specs in routing.rules.items():
        route = routes.get(model)
        if route is None or route["kind"] != "frontend":
            skip(f"rules of model {model!r}", "unknown or unusable frontend model")
            continue
        docs = []
        for i, rule in enumerate(specs):
            doc: dict[str, Any] = {"name": rule.name, "when": rule_when_doc(rule.when), "action": rule.action}
            if rule.tag is not None:
                doc["tag"] = rule.tag
            if rule.refuse is not None:
                doc["status"], doc["message"] = rule.refuse
            elif rule.delegate is not None:
                doc["model"] = rule.delegate
            else:
                steps = []
                for name in rule.route:
                    if name in pools:
                        steps.append({"pool": name})
                    elif name in routes and routes[name]["kind"] == "provider":
                        steps.append({"targets": routes[name]["targets"]})
                    else:
                        skip(f"target {name!r} of rule {i} of model {model!r}", "unknown or unusable")
                if not steps:
                    skip(f"rule {i} of model {model!r}", "no usable target: the rule is left out")
                    continue
                doc["steps"] = steps
                if rule.policy is not None:
                    doc["policy"] = rule.policy
            docs.append(doc)
        for entry in routes.values():
            if entry["canonical"] == model and entry["kind"] == "frontend":
                entry["rules"] = docs


def _routes(
    state: StoreState, backends: dict[str, dict[str, Any]], skip: _Skips
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Routes by callable name, and each frontend model's aliases."""
    provider_targets: dict[str, list[list[str]]] = {}
    for name in state.provider_models:
        if problem := check_name(name):
            skip(f"provider model {name!r}", problem)
        else:
            provider_targets[name] = []
    for pm, backend, upstream in state.provider_model_backends:
        what = f"backend {backend!r} of provider model {pm!r}"
        if pm not in provider_targets:
            skip(what, "unknown provider model")
        elif backend not in backends:
            skip(what, "unknown or invalid backend")
        elif problem := check_name(upstream):
            skip(what, f"upstream model {problem}")
        else:
            provider_targets[pm].append([pm, backend, upstream])

    routes: dict[str, dict[str, Any]] = {}
    for pm, targets in provider_targets.items():
        if targets:
            routes[pm] = {"canonical": pm, "kind": "provider", "targets": targets}
        else:
            skip(f"provider model {pm!r}", "no usable backend")

    chains: dict[str, list[str]] = {}
    for name in state.models:
        if problem := check_name(name):
            skip(f"model {name!r}", problem)
        else:
            chains[name] = []
    for model, pm in state.model_chain:
        if model not in chains:
            skip(f"chain entry {pm!r} of model {model!r}", "unknown model")
        elif pm not in provider_targets or pm not in routes:
            skip(f"chain entry {pm!r} of model {model!r}", "unknown or unusable provider model")
        else:
            chains[model].append(pm)
    for model, pms in chains.items():
        targets = [target for pm in pms for target in routes[pm]["targets"]]
        if not targets:
            skip(f"model {model!r}", "no usable provider model in its chain")
        elif model in routes:
            skip(f"model {model!r}", "name already used by a provider model")
        else:
            routes[model] = {"canonical": model, "kind": "frontend", "targets": targets}

    aliases_of: dict[str, list[str]] = {}
    for alias, model in state.model_aliases:
        target = routes.get(model)
        if target is None or target["kind"] != "frontend":
            skip(f"alias {alias!r}", f"unknown or unusable model {model!r}")
        elif problem := check_name(alias):
            skip(f"alias {alias!r}", problem)
        elif alias in routes:
            skip(f"alias {alias!r}", "name already used by a model")
        else:
            routes[alias] = {"canonical": model, "kind": "frontend", "targets": list(target["targets"])}
            aliases_of.setdefault(model, []).append(alias)

    prices: dict[str, list[float]] = {}
    for name, *values in state.prices:
        if (price := _price(values)) is None:
            skip(f"price of model {name!r}", f"unreadable price {values!r}")
        else:
            prices[name] = price
    for route in routes.values():
        if (price := prices.get(route["canonical"])) is not None:
            route["price"] = price
    return routes, aliases_of


def _number(value: object, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
        return None
    return float(value) if math.isfinite(value) else None


def _price(values: Sequence[object]) -> list[float] | None:
    """``[input, output, cached_input]`` per million tokens, the cached price defaulting to the input one."""
    inp, out = _number(values[0], MAX_PRICE), _number(values[1], MAX_PRICE)
    cached = inp if values[2] is None else _number(values[2], MAX_PRICE)
    if inp is None or out is None or cached is None:
        return None
    return [inp, out, cached]


def _budgets(rows: Sequence[Sequence[object]]) -> dict[object, list[dict[str, Any]] | str]:
    """Each owner's budgets from ``(owner id, period, tokens, cost, alerts)`` rows in declared order, or
    why they cannot be read (then the owner is skipped, as for unreadable limits)."""
    out: dict[object, list[dict[str, Any]] | str] = defaultdict(list)
    for owner, *values in rows:
        found = out[owner]
        if isinstance(found, str):
            continue
        try:
            budget = _budget(values)
        except ValueError as exc:
            out[owner] = str(exc)
            continue
        if len(found) == MAX_BUDGETS or any(b["period"] == budget["period"] for b in found):
            out[owner] = f"more than one budget of period {budget['period']!r}, or more than {MAX_BUDGETS}"
        else:
            found.append(budget)
    return dict(out)


def _budget(values: Sequence[object]) -> dict[str, Any]:
    """The document's budget from a row's four budget columns; ValueError when unreadable."""
    period, tokens, cost, alerts = values
    if check_period(period) is not None:
        raise ValueError(f"unreadable budget period {period!r}")
    if tokens is not None and check_limit(tokens) is not None:
        raise ValueError(f"unreadable budget tokens {tokens!r}")
    if cost is not None and not _number(cost, MAX_BUDGET_COST):
        raise ValueError(f"unreadable budget cost {cost!r}")
    if tokens is None and cost is None:
        raise ValueError("a budget without tokens or cost")
    budget: dict[str, Any] = {"period": period}
    if tokens is not None:
        budget["tokens"] = tokens
    if cost is not None:
        budget["cost"] = float(cost)  # type: ignore[arg-type]
    if alerts is not None:
        try:
            thresholds = orjson.loads(alerts) if isinstance(alerts, str) else None
        except orjson.JSONDecodeError:
            thresholds = None
        if not isinstance(thresholds, list) or not all(
            isinstance(a, int | float) and not isinstance(a, bool) and 0 < a <= 1 for a in thresholds
        ):
            raise ValueError(f"unreadable budget alerts {alerts!r}")
        if thresholds:
            budget["alerts"] = sorted(float(a) for a in thresholds)
    return budget


def _grants(
    permissions: frozenset[str], routes: dict[str, dict[str, Any]], aliases_of: dict[str, list[str]]
) -> tuple[bool, list[str]]:
    granted: set[str] = set()
    for perm in permissions:
        if not perm.startswith(_MODEL_PERMISSION):
            continue
        pattern = perm[len(_MODEL_PERMISSION) :]
        if _GLOB_CHARS.isdisjoint(pattern):
            matched = [pattern] if pattern in routes else []
        else:
            matched = [name for name in routes if fnmatchcase(name, pattern)]
        for name in matched:
            route = routes[name]
            if route["kind"] == "frontend":
                canonical = route["canonical"]
                granted.add(canonical)
                granted.update(aliases_of.get(canonical, ()))
            else:
                granted.add(name)
    return ALLOW_ALL in permissions, sorted(granted)


def _principals(
    state: StoreState,
    routes: dict[str, dict[str, Any]],
    aliases_of: dict[str, list[str]],
    skip: _Skips,
) -> dict[str, dict[str, Any]]:
    permissions: dict[str, set[str]] = {}
    for name in state.roles:
        permissions[name] = set()
    for role, perm in state.role_permissions:
        if role not in permissions:
            skip(f"permission {perm!r} of role {role!r}", "unknown role")
        elif not isinstance(perm, str) or not perm:
            skip(f"permission {perm!r} of role {role!r}", "not a permission string")
        else:
            permissions[role].add(perm)

    names: dict[str, str] = {}
    limits: dict[str, dict[str, Any]] = {}
    for pid, name, *limit_values in state.principals:
        if not isinstance(pid, str) or not pid or check_name(name):
            skip(f"principal {pid!r}", f"invalid id or name {name!r}")
            continue
        try:
            own = _limits(limit_values)
        except ValueError as exc:
            skip(f"principal {pid!r}", str(exc))
            continue
        names[pid] = name
        if own is not None:
            limits[pid] = {"limits": own}
    for pid, model, *limit_values in state.principal_model_limits:
        what = f"limits of principal {pid!r} on model {model!r}"
        if pid not in names:
            skip(what, "unknown or invalid principal")
        elif problem := check_name(model):
            skip(what, f"model name {problem}")
        else:
            try:
                own = _limits(limit_values)
            except ValueError as exc:
                skip(f"principal {pid!r}", f"{what}: {exc}")
                del names[pid]
                limits.pop(pid, None)
                continue
            if own is not None:
                limits.setdefault(pid, {}).setdefault("model_limits", {})[model] = own
    for pid, budgets in _budgets(state.budgets).items():
        if pid not in names:
            continue
        if isinstance(budgets, str):
            skip(f"principal {pid!r}", budgets)
            del names[pid]
            limits.pop(pid, None)
        elif budgets:
            # "budget": the first again, for proxy hosts not upgraded yet (they read only that one).
            limits.setdefault(pid, {}).update(budgets=budgets, budget=budgets[0])
    held: dict[str, set[str]] = {pid: set() for pid in names}
    roles_of: dict[str, set[str]] = {}
    for pid, role in state.principal_roles:
        if pid not in held:
            skip(f"role {role!r} of principal {pid!r}", "unknown principal")
        elif role not in permissions:
            skip(f"role {role!r} of principal {pid!r}", "unknown role")
        else:
            held[pid].update(permissions[role])
            roles_of.setdefault(pid, set()).add(role)

    # Principals mostly share a handful of role combinations: match patterns once per combination.
    cache: dict[frozenset[str], tuple[bool, list[str]]] = {}
    out: dict[str, dict[str, Any]] = {}
    for pid, name in names.items():
        perms = frozenset(held[pid])
        grant = cache.get(perms)
        if grant is None:
            grant = cache[perms] = _grants(perms, routes, aliases_of)
        entry = {"name": name, "allow_all": grant[0], "models": grant[1], **limits.get(pid, {})}
        if roles_of.get(pid):
            entry["roles"] = sorted(roles_of[pid])
        admin = sorted(p for p in perms if not p.startswith(_MODEL_PERMISSION))
        if admin:
            entry["permissions"] = admin  # what the admin API checks: usage:read, key:create, ...
        out[pid] = entry
    return out


def _key_rules(
    routing: RoutingRows, routes: dict[str, dict[str, Any]], aliases_of: dict[str, list[str]]
) -> dict[str, dict[str, Any]]:
    """Each restricted key's rules as the document carries them: its networks, and its model list granted
    the way a role's permissions are (a frontend model brings its aliases; a pattern alias is matched)."""
    out: dict[str, dict[str, Any]] = {}
    for name, rule in routing.keys.items():
        entry: dict[str, Any] = {}
        if rule.get("allow_ips"):
            entry["allow_ips"] = list(rule["allow_ips"])
        if rule.get("models") is not None:
            entry["models"] = _grants(
                frozenset(_MODEL_PERMISSION + m for m in rule["models"]), routes, aliases_of
            )[1]
        if rule.get("priority") is not None:
            entry["priority"] = rule["priority"]
        out[name] = entry
    return out


def _keys(
    state: StoreState,
    principals: dict[str, dict[str, Any]],
    now: float,
    skip: _Skips,
    rules: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    budgets_of = _budgets(state.key_budgets)
    for key_id, name, pid, key_hash, _created, expires_at, revoked_at, _by, *limit_values in state.keys:
        if revoked_at is not None:
            continue
        if pid not in principals:
            skip(f"key {key_id!r}", f"unknown or invalid principal {pid!r}")
            continue
        if not isinstance(key_hash, str) or not _HEX64.fullmatch(key_hash):
            skip(f"key {key_id!r}", "hash is not 64 lowercase hex characters")
            continue
        expires: float | None = None
        if expires_at is not None:
            expires = _seconds(expires_at)
            if expires is None:
                skip(f"key {key_id!r}", f"unparsable expires_at {expires_at!r}")
                continue
            if expires <= now:
                continue
        try:
            limits = _limits(limit_values)
        except ValueError as exc:
            skip(f"key {key_id!r}", str(exc))
            continue
        if key_hash in out:
            skip(f"key {key_id!r}", "hash duplicates another key's")
            continue
        budgets = budgets_of.get(key_id)
        if isinstance(budgets, str):
            skip(f"key {key_id!r}", budgets)
            continue
        entry: dict[str, Any] = {"id": str(key_id), "principal": pid, "expires_at": expires}
        if limits is not None:
            entry["limits"] = limits
        if name is not None and name in rules:
            entry["name"] = name
            entry.update(rules[name])
        if budgets:
            entry["budgets"] = budgets
            if name is not None:
                entry["name"] = name  # alerts and the dry run name the key
        out[key_hash] = entry
    return out
