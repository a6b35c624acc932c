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
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar

from gateway.budget import check_period
from gateway.controlplane.problems import Problems
from gateway.controlplane.routing_config import (
    BACKEND_FLOW_FIELDS,
    PoolSpec,
    PromptClassSpec,
    RuleSpec,
    check_routing,
    parse_networks,
    parse_pool,
    parse_prompt_class,
    parse_rules,
)
from gateway.controlplane.toml_places import TomlPlaces
from gateway.errors import ConfigError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FIRST_BYTE_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "LIMIT_FIELDS",
    "MAX_LIMIT",
    "PROTOCOLS",
    "BackendSpec",
    "BudgetSpec",
    "ConfigDoc",
    "KeySpec",
    "LimitsSpec",
    "ModelSpec",
    "PriceSpec",
    "PrincipalSpec",
    "ProviderBackend",
    "ProviderModelSpec",
    "RoleSpec",
    "check_limit",
    "check_name",
    "check_url",
    "dump_config",
    "load_config",
    "parse_config",
    "parse_timestamp",
]

PROTOCOLS = ("openai", "anthropic", "gemini")
# The same defaults gateway.snapshot uses when a document omits them.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_FIRST_BYTE_TIMEOUT = 60.0
DEFAULT_READ_TIMEOUT = 300.0
MIN_SECRET_LENGTH = 16
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")
# Far above any real limit, and far below the 64-bit integers the store and the shared buckets hold.
MAX_LIMIT = 10**12
# Prices per million tokens and budgets in currency units; spend is summed in nano-units in 64 bits.
MAX_PRICE = 10**6
MAX_BUDGET_COST = 10**9

_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
# Used with fullmatch: "$" would also match before a final newline.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    url: str  # without a trailing slash
    protocol: str = "openai"
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    # Flow control and active health (see routing_config and docs/configuration.md); None = default.
    max_concurrency: int | None = None
    waiting_high_water: int | None = None
    queue_size: int | None = None
    queue_timeout: float | None = None
    health_path: str | None = None  # "" turns the probe off; None: "/health" for openai backends
    # The credential read from this file (its content, stripped) when the store applies the document.
    api_key_file: str | None = None
    responses_api: bool | None = None  # true: serves /v1/responses itself (openai backends only)
    # A credential of a pool (``[[backends.credentials]]``): stored as a backend row of its own, named
    # ``BACKEND/CREDENTIAL``, so that it is sealed, rotated and opened like every backend's credential; the
    # snapshot folds it into its backend. Its URL, protocol and timeouts are its backend's.
    credential_of: str | None = None
    requests_per_minute: int | None = None  # the credential's own quota
    tokens_per_minute: int | None = None
    cool_down: float | None = None  # seconds after a 429 that gives no Retry-After (60)
    credentials: tuple[BackendSpec, ...] = ()  # only between _backend and parse_config's flattening


@dataclass(frozen=True, slots=True)
class ProviderBackend:
    backend: str
    model: str  # the model name the backend knows


@dataclass(frozen=True, slots=True)
class PriceSpec:
    """Currency units per million tokens; cached prompt tokens cost ``input`` unless priced apart."""

    input: float
    output: float
    cached_input: float | None = None

    def as_list(self) -> list[float]:
        """``[input, output, cached_input]`` with the cached price resolved, as the snapshot carries it."""
        return [self.input, self.output, self.input if self.cached_input is None else self.cached_input]


@dataclass(frozen=True, slots=True)
class ProviderModelSpec:
    name: str
    backends: tuple[ProviderBackend, ...]
    price: PriceSpec | None = None  # charged when a client calls this provider model by name
    context_window: int | None = None  # tokens, prompt and completion together (gateway.routing.context)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A frontend model: the name clients call, an ordered fallback chain, and alternative names."""

    name: str
    chain: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    price: PriceSpec | None = None  # charged when a client calls this model or one of its aliases
    rules: tuple[RuleSpec, ...] = ()  # terminal routing rules, first match wins (routing_config)
    context_failover: bool = False  # an upstream context-length 400 may go on to a larger window


@dataclass(frozen=True, slots=True)
class RoleSpec:
    name: str
    permissions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LimitsSpec:
    """One scope's rate limits; None is unlimited. Parsing never yields one with every field None."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None

    def is_empty(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent_requests is None
        )


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """What a principal may spend per period: tokens, cost (currency units), or both. Never both None."""

    period: str = "month"
    tokens: int | None = None
    cost: float | None = None
    alerts: tuple[float, ...] = ()  # fractions of the budget at which to alert (budget_alerts)


@dataclass(frozen=True, slots=True)
class PrincipalSpec:
    name: str
    roles: tuple[str, ...]
    limits: LimitsSpec | None = None  # all of the principal's keys together
    # (model name a client calls, limits of this principal calling it), ordered by model name
    model_limits: tuple[tuple[str, LimitsSpec], ...] = ()
    budget: BudgetSpec | None = None


@dataclass(frozen=True, slots=True)
class KeySpec:
    name: str
    principal: str
    secret: str | None = field(default=None, repr=False)
    expires_at: float | None = None  # unix seconds
    limits: LimitsSpec | None = None
    # Narrower than the principal: client networks (CIDRs) the key may be used from, and the model names
    # it may call (None: all its principal's). Kept as a routing entry (routing_config.key_rules_doc).
    allow_ips: tuple[str, ...] = ()
    models: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ConfigDoc:
    backends: tuple[BackendSpec, ...] = ()
    provider_models: tuple[ProviderModelSpec, ...] = ()
    models: tuple[ModelSpec, ...] = ()
    roles: tuple[RoleSpec, ...] = ()
    principals: tuple[PrincipalSpec, ...] = ()
    keys: tuple[KeySpec, ...] = ()
    pools: tuple[PoolSpec, ...] = ()
    fallback: str | None = None  # [routing] fallback: the model tried when every target is down
    prompt_classes: tuple[PromptClassSpec, ...] = ()  # for rules' prompt_class conditions


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
    backends = _flatten_credentials(_section(p, data, "backends", _backend))
    provider_models = _section(p, data, "provider_models", _provider_model)
    models = _section(p, data, "models", _model)
    roles = _section(p, data, "roles", _role)
    principals = _section(p, data, "principals", _principal)
    keys = _section(p, data, "keys", _key)
    pools = _section(p, data, "pools", parse_pool)
    classes = _section(p, data, "prompt_classes", parse_prompt_class)
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
    )
    _check_references(p, backends, provider_models, models, roles, principals, keys)
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


# --- shared value checks (also used by the snapshot builder and the CLI) ------------------------------


def check_name(value: object) -> str | None:
    """The problem with a name, or None. Names are 1-200 characters without whitespace or controls."""
    if not isinstance(value, str):
        return "must be a string"
    if not _NAME.fullmatch(value):
        return "must be 1-200 characters without whitespace or control characters"
    return None


def check_url(value: object) -> str | None:
    if not isinstance(value, str) or not _URL.fullmatch(value):
        return "must be an http:// or https:// URL"
    return None


def check_limit(value: object) -> str | None:
    """The problem with one limit value, or None. Limits are positive integers (not booleans)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return "must be a positive integer"
    if value > MAX_LIMIT:
        return f"must be at most {MAX_LIMIT}"
    return None


def parse_timestamp(value: object) -> float:
    """Unix seconds from an RFC 3339 string or TOML datetime (with an offset) or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("must be an RFC 3339 timestamp or unix seconds")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError("must be a non-negative number of unix seconds")
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("must be an RFC 3339 timestamp such as 2027-01-01T00:00:00Z") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("must carry a UTC offset, e.g. 2027-01-01T00:00:00Z")
        return value.timestamp()
    if isinstance(value, date):
        raise ValueError("must be a date-time with a UTC offset, not a bare date")
    raise ValueError("must be an RFC 3339 timestamp or unix seconds")


# --- internals -----------------------------------------------------------------------------------------

_BACKEND_FIELDS = (
    "name",
    "url",
    "protocol",
    "api_key",
    "api_key_env",
    "api_key_file",
    "connect_timeout",
    "first_byte_timeout",
    "read_timeout",
    *BACKEND_FLOW_FIELDS,
    "credentials",
)
_CREDENTIAL_FIELDS = (
    "name",
    "api_key",
    "api_key_env",
    "api_key_file",
    "requests_per_minute",
    "tokens_per_minute",
    "cool_down",
)
MAX_CREDENTIALS = 64
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


def _name(p: Problems, place: str, item: dict[str, Any], key: str = "name") -> str | None:
    if key not in item:
        p.add(f"{place}.{key}", "is required")
        return None
    problem = check_name(item[key])
    if problem:
        p.add(f"{place}.{key}", problem)
        return None
    value: str = item[key]
    return value


def _names(p: Problems, place: str, value: object, *, required: bool) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        p.add(place, "must be an array of strings")
        return None
    if required and not value:
        p.add(place, "must not be empty")
        return None
    ok = True
    for i, v in enumerate(value):
        problem = check_name(v)
        if problem:
            p.add(f"{place}[{i}]", problem)
            ok = False
    if not ok:
        return None
    seen: set[str] = set()
    for i, v in enumerate(value):
        if v in seen:
            p.add(f"{place}[{i}]", f"duplicate entry {v!r}")
            ok = False
        seen.add(v)
    return tuple(value) if ok else None


def _timeout(p: Problems, place: str, item: dict[str, Any], key: str, default: float) -> float | None:
    value = item.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        p.add(f"{place}.{key}", "must be a positive number of seconds")
        return None
    return float(value)


def _backend(p: Problems, place: str, item: dict[str, Any]) -> BackendSpec | None:
    p.unknown_fields(place, item, _BACKEND_FIELDS)
    ok = True
    name = _name(p, place, item)
    url = item.get("url")
    if url is None:
        p.add(f"{place}.url", "is required")
        ok = False
    elif problem := check_url(url):
        p.add(f"{place}.url", problem)
        ok = False
    protocol = item.get("protocol", "openai")
    if protocol not in PROTOCOLS:
        p.add(f"{place}.protocol", f"must be one of {', '.join(PROTOCOLS)}")
        ok = False
    api_key = item.get("api_key")
    api_key_env = item.get("api_key_env")
    api_key_file = item.get("api_key_file")
    given = [
        f
        for f, v in (("api_key", api_key), ("api_key_env", api_key_env), ("api_key_file", api_key_file))
        if v is not None
    ]
    if len(given) > 1:
        p.add(f"{place}.{given[-1]}", "give either api_key, api_key_env or api_key_file, not several")
        ok = False
    if api_key_file is not None and (
        not isinstance(api_key_file, str) or not api_key_file.startswith("/") or "\x00" in api_key_file
    ):
        p.add(f"{place}.api_key_file", "must be an absolute path")
        ok = False
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        p.add(f"{place}.api_key", "must be a non-empty string")
        ok = False
    if api_key_env is not None and (not isinstance(api_key_env, str) or not _ENV_NAME.fullmatch(api_key_env)):
        p.add(f"{place}.api_key_env", "must be an environment variable name")
        ok = False
    timeouts = [
        _timeout(p, place, item, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
        _timeout(p, place, item, "first_byte_timeout", DEFAULT_FIRST_BYTE_TIMEOUT),
        _timeout(p, place, item, "read_timeout", DEFAULT_READ_TIMEOUT),
    ]
    counts: list[int | None] = []
    for key in ("max_concurrency", "waiting_high_water", "queue_size"):
        value = item.get(key)
        if value is not None and (problem := check_limit(value)):
            p.add(f"{place}.{key}", problem)
            ok = False
        counts.append(value)
    queue_timeout = _timeout(p, place, item, "queue_timeout", 5.0) if "queue_timeout" in item else None
    ok = ok and ("queue_timeout" not in item or queue_timeout is not None)
    health_path = item.get("health_path")
    if health_path is not None and (
        not isinstance(health_path, str) or (health_path and not health_path.startswith("/"))
    ):
        p.add(f"{place}.health_path", 'must be a path starting with "/" (or "" for no probe)')
        ok = False
    responses_api = item.get("responses_api")
    if responses_api is not None and not isinstance(responses_api, bool):
        p.add(f"{place}.responses_api", "must be true or false")
        ok = False
    elif responses_api is True and protocol != "openai":
        p.add(f"{place}.responses_api", "only an openai backend can serve the Responses API itself")
        ok = False
    if not ok or name is None or None in timeouts:
        return None
    connect, first_byte, read = (t for t in timeouts if t is not None)
    spec = BackendSpec(
        name,
        str(url).rstrip("/"),
        protocol,
        api_key,
        api_key_env,
        connect,
        first_byte,
        read,
        max_concurrency=counts[0],
        waiting_high_water=counts[1],
        queue_size=counts[2],
        queue_timeout=queue_timeout,
        health_path=health_path,
        api_key_file=api_key_file,
        responses_api=responses_api,
    )
    if "credentials" not in item:
        return spec
    if api_key is not None or api_key_env is not None or api_key_file is not None:
        p.add(f"{place}.credentials", "give either the backend's own api_key (or _env, _file) or credentials")
        return None
    raw = item["credentials"]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_CREDENTIALS:
        p.add(f"{place}.credentials", f"must be 1 to {MAX_CREDENTIALS} tables ([[backends.credentials]])")
        return None
    before = len(p.lines)
    parsed = [_credential(p, f"{place}.credentials[{i}]", entry, spec) for i, entry in enumerate(raw)]
    creds = tuple(c for c in parsed if c is not None)
    if len(p.lines) > before:
        return None
    return replace(spec, credentials=creds)


def _credential(p: Problems, place: str, item: Any, backend: BackendSpec) -> BackendSpec | None:
    if not isinstance(item, dict):
        p.add(place, "must be a table { name = ..., api_key_env = ... }")
        return None
    p.unknown_fields(place, item, _CREDENTIAL_FIELDS)
    before = len(p.lines)
    name = _name(p, place, item)
    api_key, api_key_env = item.get("api_key"), item.get("api_key_env")
    api_key_file = item.get("api_key_file")
    # At most one source: none is what a document with its credentials left out reads as (the store
    # re-validates such documents); a credential that has no key is then skipped by the snapshot.
    if sum(v is not None for v in (api_key, api_key_env, api_key_file)) > 1:
        p.add(f"{place}.api_key", "give one of api_key, api_key_env and api_key_file")
    elif api_key_file is not None and (
        not isinstance(api_key_file, str) or not api_key_file.startswith("/") or "\x00" in api_key_file
    ):
        p.add(f"{place}.api_key_file", "must be an absolute path")
    elif api_key is not None and (not isinstance(api_key, str) or not api_key):
        p.add(f"{place}.api_key", "must be a non-empty string")
    elif api_key_env is not None and (
        not isinstance(api_key_env, str) or not _ENV_NAME.fullmatch(api_key_env)
    ):
        p.add(f"{place}.api_key_env", "must be an environment variable name")
    quotas: list[int | None] = []
    for key in ("requests_per_minute", "tokens_per_minute"):
        value = item.get(key)
        if value is not None and (problem := check_limit(value)):
            p.add(f"{place}.{key}", problem)
        quotas.append(value)
    cool_down = _timeout(p, place, item, "cool_down", 60.0) if "cool_down" in item else None
    if len(p.lines) > before or name is None:
        return None
    return replace(
        backend,
        name=f"{backend.name}/{name}",
        api_key=api_key,
        api_key_env=api_key_env,
        api_key_file=api_key_file,
        credential_of=backend.name,
        requests_per_minute=quotas[0],
        tokens_per_minute=quotas[1],
        cool_down=cool_down,
    )


def _flatten_credentials(
    backends: list[tuple[str, BackendSpec]],
) -> list[tuple[str, BackendSpec]]:
    """Backends, then every credential of every pool as a backend row of its own (in file order)."""
    out = [(pl, replace(b, credentials=())) for pl, b in backends]
    for pl, b in backends:
        out += [(f"{pl}.credentials[{i}]", c) for i, c in enumerate(b.credentials)]
    return out


def _provider_model(p: Problems, place: str, item: dict[str, Any]) -> ProviderModelSpec | None:
    p.unknown_fields(place, item, ("name", "backends", "price", "context_window"))
    before = len(p.lines)
    name = _name(p, place, item)
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
        backend = _name(p, where, entry, "backend")
        model = _name(p, where, entry, "model") if "model" in entry else name
        if backend is not None and model is not None:
            pb = ProviderBackend(backend, model)
            if pb in entries:
                p.add(where, f"duplicate entry ({backend!r}, {model!r})")
            entries.append(pb)
    if name is None or len(entries) != len(raw) or len(p.lines) > before:
        return None
    return ProviderModelSpec(name, tuple(entries), price, window)


def _model(p: Problems, place: str, item: dict[str, Any]) -> ModelSpec | None:
    p.unknown_fields(place, item, ("name", "chain", "aliases", "price", "rules", "context_failover"))
    if isinstance(item.get("aliases"), list):  # even if invalid: see Problems.declared
        p.declared.setdefault("aliases", set()).update(a for a in item["aliases"] if isinstance(a, str))
    name = _name(p, place, item)
    if "chain" not in item:
        p.add(f"{place}.chain", "is required")
        return None
    chain = _names(p, f"{place}.chain", item["chain"], required=True)
    aliases = _names(p, f"{place}.aliases", item.get("aliases", []), required=False)
    before = len(p.lines)
    price = _price(p, f"{place}.price", item["price"]) if "price" in item else None
    rules = parse_rules(p, f"{place}.rules", item["rules"]) if "rules" in item else ()
    failover = item.get("context_failover", False)
    if not isinstance(failover, bool):
        p.add(f"{place}.context_failover", "must be true or false")
    if name is None or chain is None or aliases is None or rules is None or len(p.lines) > before:
        return None
    return ModelSpec(name, chain, aliases, price, rules, failover)


def _routing_table(p: Problems, raw: object) -> str | None:
    """``[routing]``: today only ``fallback``, the model whose chain serves a request whose own targets
    are all down."""
    if not isinstance(raw, dict):
        p.add("routing", "must be a table ([routing])")
        return None
    p.unknown_fields("routing", raw, ("fallback",))
    if "fallback" not in raw:
        return None
    return _name(p, "routing", raw, "fallback")


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


def _budget(p: Problems, place: str, value: object) -> BudgetSpec | None:
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
    name = _name(p, place, item)
    perms = _names(p, f"{place}.permissions", item.get("permissions", []), required=False)
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
        where = f"{place}.{_toml_key(model)}"
        if problem := check_name(model):
            p.add(where, f"model name {problem}")
        elif (spec := _limits(p, where, limits)) is not None:
            out.append((model, spec))
    return tuple(sorted(out, key=lambda entry: entry[0]))


def _principal(p: Problems, place: str, item: dict[str, Any]) -> PrincipalSpec | None:
    p.unknown_fields(place, item, ("name", "roles", "limits", "model_limits", "budget"))
    before = len(p.lines)
    name = _name(p, place, item)
    roles = _names(p, f"{place}.roles", item.get("roles", []), required=False)
    limits = _limits(p, f"{place}.limits", item["limits"]) if "limits" in item else None
    model_limits = _model_limits(p, f"{place}.model_limits", item.get("model_limits", {}))
    budget = _budget(p, f"{place}.budget", item["budget"]) if "budget" in item else None
    if len(p.lines) > before or name is None or roles is None:
        return None
    return PrincipalSpec(name, roles, limits, model_limits, budget)


def _key(p: Problems, place: str, item: dict[str, Any]) -> KeySpec | None:
    p.unknown_fields(
        place, item, ("name", "principal", "secret", "expires_at", "limits", "allow_ips", "models")
    )
    ok = True
    name = _name(p, place, item)
    principal = _name(p, place, item, "principal")
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
        models = _names(p, f"{place}.models", item["models"], required=True)
        ok = ok and models is not None
    if not ok or name is None or principal is None:
        return None
    return KeySpec(name, principal, secret, expires_at, limits, allow_ips, models)


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
                p.add(f"{pl}.model_limits.{_toml_key(model)}", f"unknown model name {model!r}")
    for pl, k in keys:
        if k.principal not in principal_names:
            p.add(f"{pl}.principal", f"unknown principal {k.principal!r}")
        for i, model in enumerate(k.models or ()):
            if model not in callable_names:
                p.add(f"{pl}.models[{i}]", f"unknown model name {model!r}")


# --- writing -------------------------------------------------------------------------------------------


def _toml_str(value: str) -> str:
    out = ['"']
    for ch in value:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(value: str) -> str:
    return value if _BARE_KEY.fullmatch(value) else _toml_str(value)


def toml_value(value: Any) -> str:
    """A value as inline TOML (tables inline, keys quoted only when they must be): routing entries."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _toml_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def _toml_limits(spec: LimitsSpec) -> str:
    values = (spec.requests_per_minute, spec.tokens_per_minute, spec.concurrent_requests)
    fields = [
        f"{name} = {value}" for name, value in zip(LIMIT_FIELDS, values, strict=True) if value is not None
    ]
    return "{ " + ", ".join(fields) + " }"


def _toml_price(spec: PriceSpec) -> str:
    fields = [f"input = {spec.input!r}", f"output = {spec.output!r}"]
    if spec.cached_input is not None:
        fields.append(f"cached_input = {spec.cached_input!r}")
    return "{ " + ", ".join(fields) + " }"


def _toml_budget(spec: BudgetSpec) -> str:
    fields = [f"period = {_toml_str(spec.period)}"]
    if spec.tokens is not None:
        fields.append(f"tokens = {spec.tokens}")
    if spec.cost is not None:
        fields.append(f"cost = {spec.cost!r}")
    if spec.alerts:
        fields.append("alerts = [" + ", ".join(repr(a) for a in spec.alerts) + "]")
    return "{ " + ", ".join(fields) + " }"


def _rfc3339(ts: float) -> str:
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.isoformat(timespec="microseconds" if ts % 1 else "seconds").replace("+00:00", "Z")


def dump_config(doc: ConfigDoc, header: str = "") -> str:
    """``doc`` as TOML that ``parse_config`` reads back to an equal document (secrets included if set)."""
    lines: list[str] = [f"# {line}" if line else "#" for line in header.splitlines()]
    for b in doc.backends:
        if b.credential_of is not None:
            continue  # written under its backend
        lines += ["", "[[backends]]", f"name = {_toml_str(b.name)}", f"url = {_toml_str(b.url)}"]
        lines.append(f"protocol = {_toml_str(b.protocol)}")
        if b.api_key is not None:
            lines.append(f"api_key = {_toml_str(b.api_key)}")
        if b.api_key_env is not None:
            lines.append(f"api_key_env = {_toml_str(b.api_key_env)}")
        if b.api_key_file is not None:
            lines.append(f"api_key_file = {_toml_str(b.api_key_file)}")
        lines.append(f"connect_timeout = {b.connect_timeout!r}")
        lines.append(f"first_byte_timeout = {b.first_byte_timeout!r}")
        lines.append(f"read_timeout = {b.read_timeout!r}")
        for key in BACKEND_FLOW_FIELDS:
            value = getattr(b, key)
            if value is not None:
                lines.append(f"{key} = {toml_value(value)}")
        for c in doc.backends:
            if c.credential_of == b.name:
                lines += ["", "[[backends.credentials]]"]
                lines.append(f"name = {_toml_str(c.name[len(b.name) + 1 :])}")
                if c.api_key is not None:
                    lines.append(f"api_key = {_toml_str(c.api_key)}")
                if c.api_key_env is not None:
                    lines.append(f"api_key_env = {_toml_str(c.api_key_env)}")
                if c.api_key_file is not None:
                    lines.append(f"api_key_file = {_toml_str(c.api_key_file)}")
                for key in ("requests_per_minute", "tokens_per_minute", "cool_down"):
                    if (value := getattr(c, key)) is not None:
                        lines.append(f"{key} = {toml_value(value)}")
    for pm in doc.provider_models:
        entries = ", ".join(
            f"{{ backend = {_toml_str(e.backend)}, model = {_toml_str(e.model)} }}" for e in pm.backends
        )
        lines += ["", "[[provider_models]]", f"name = {_toml_str(pm.name)}", f"backends = [{entries}]"]
        if pm.price is not None:
            lines.append(f"price = {_toml_price(pm.price)}")
        if pm.context_window is not None:
            lines.append(f"context_window = {pm.context_window}")
    for m in doc.models:
        lines += ["", "[[models]]", f"name = {_toml_str(m.name)}", f"chain = {_toml_list(m.chain)}"]
        lines.append(f"aliases = {_toml_list(m.aliases)}")
        if m.price is not None:
            lines.append(f"price = {_toml_price(m.price)}")
        if m.context_failover:
            lines.append("context_failover = true")
        for rule in m.rules:
            lines += ["", "[[models.rules]]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in rule.as_dict().items()]
    for pool in doc.pools:
        lines += ["", "[[pools]]"] + [f"{k} = {toml_value(v)}" for k, v in pool.as_dict().items()]
    if doc.fallback is not None:
        lines += ["", "[routing]", f"fallback = {_toml_str(doc.fallback)}"]
    for spec in doc.prompt_classes:
        lines += ["", "[[prompt_classes]]"] + [f"{k} = {toml_value(v)}" for k, v in spec.as_dict().items()]
    for r in doc.roles:
        lines += [
            "",
            "[[roles]]",
            f"name = {_toml_str(r.name)}",
            f"permissions = {_toml_list(r.permissions)}",
        ]
    for pr in doc.principals:
        lines += ["", "[[principals]]", f"name = {_toml_str(pr.name)}", f"roles = {_toml_list(pr.roles)}"]
        if pr.limits is not None:
            lines.append(f"limits = {_toml_limits(pr.limits)}")
        if pr.model_limits:
            entries = ", ".join(f"{_toml_key(m)} = {_toml_limits(spec)}" for m, spec in pr.model_limits)
            lines.append(f"model_limits = {{ {entries} }}")
        if pr.budget is not None:
            lines.append(f"budget = {_toml_budget(pr.budget)}")
    for k in doc.keys:
        lines += ["", "[[keys]]", f"name = {_toml_str(k.name)}", f"principal = {_toml_str(k.principal)}"]
        if k.secret is not None:
            lines.append(f"secret = {_toml_str(k.secret)}")
        if k.expires_at is not None:
            lines.append(f"expires_at = {_toml_str(_rfc3339(k.expires_at))}")
        if k.limits is not None:
            lines.append(f"limits = {_toml_limits(k.limits)}")
        if k.allow_ips:
            lines.append(f"allow_ips = {_toml_list(k.allow_ips)}")
        if k.models is not None:
            lines.append(f"models = {_toml_list(k.models)}")
    return "\n".join(lines).lstrip("\n") + "\n"
