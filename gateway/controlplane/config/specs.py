"""What a configuration is made of: the frozen specs a validated document holds (``ConfigDoc`` and its
entries, the routing entries among them) and the constants their fields are checked against.

The file parser (``parser``) makes them, the TOML writer (``writer``) and the store's apply read them,
and the store rebuilds them from its rows (``gateway.controlplane.store``); none of that lives here. No
I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BACKEND_FLOW_FIELDS",
    "CREDENTIAL_ROW_FIELDS",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FIRST_BYTE_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "LIMIT_FIELDS",
    "PROTOCOLS",
    "BackendSpec",
    "BodyLogSpec",
    "BudgetSpec",
    "ConfigDoc",
    "KeySpec",
    "LimitsSpec",
    "ModelSpec",
    "PoolSpec",
    "PriceSpec",
    "PrincipalSpec",
    "PromptClassSpec",
    "ProviderBackend",
    "ProviderModelSpec",
    "RoleSpec",
    "RuleSpec",
]

PROTOCOLS = ("openai", "anthropic", "gemini")
# The same defaults gateway.snapshot uses when a document omits them.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_FIRST_BYTE_TIMEOUT = 60.0
DEFAULT_READ_TIMEOUT = 300.0
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")
# A backend's settings kept beside its store row: flow control, its probe, and whether it serves the
# Responses API itself.
BACKEND_FLOW_FIELDS = (
    "max_concurrency",
    "waiting_high_water",
    "queue_size",
    "queue_timeout",
    "kv_high_water",
    "reserved_places",
    "health_path",
    "responses_api",
    "kv_events",
)
# A pool credential's row (never a [[backends]] field): its backend, its quota and its cool-down.
CREDENTIAL_ROW_FIELDS = ("credential_of", "requests_per_minute", "tokens_per_minute", "cool_down")


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
    # Flow control and active health (see config.routing and docs/configuration.md); None = default.
    max_concurrency: int | None = None
    waiting_high_water: int | None = None
    queue_size: int | None = None
    queue_timeout: float | None = None
    kv_high_water: float | None = None  # KV cache fraction (0..1] past which the backend counts as saturated
    reserved_places: int | None = None  # of max_concurrency, the places sheddable requests may not take
    health_path: str | None = None  # "" turns the probe off; None: "/health" for openai backends
    # The credential read from this file (its content, stripped) when the store applies the document.
    api_key_file: str | None = None
    responses_api: bool | None = None  # true: serves /v1/responses itself (openai backends only)
    kv_events: str | None = None  # the engine's KV-event publisher, tcp://host:port (openai backends only)
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
    rules: tuple[RuleSpec, ...] = ()  # terminal routing rules, first match wins (config.routing)
    context_failover: bool = False  # an upstream context-length 400 may go on to a larger window
    priority: str | None = None  # flow-control class of its requests (critical, standard, sheddable)


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
    """What a principal or a key may spend per period: tokens, cost (currency units), or both (never both
    None). An owner has at most one budget per period."""

    period: str = "month"
    tokens: int | None = None
    cost: float | None = None
    alerts: tuple[float, ...] = ()  # fractions of the budget at which to alert (budget_alerts)

    def as_dict(self) -> dict[str, Any]:
        """The budget table's fields as the file and the admin API write them (unset ones left out)."""
        out: dict[str, Any] = {"period": self.period}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.cost is not None:
            out["cost"] = self.cost
        if self.alerts:
            out["alerts"] = list(self.alerts)
        return out


@dataclass(frozen=True, slots=True)
class PrincipalSpec:
    name: str
    roles: tuple[str, ...]
    limits: LimitsSpec | None = None  # all of the principal's keys together
    # (model name a client calls, limits of this principal calling it), ordered by model name
    model_limits: tuple[tuple[str, LimitsSpec], ...] = ()
    budgets: tuple[BudgetSpec, ...] = ()  # one per period, in the order declared
    # Flow control: the class of its requests and its share against other principals of the class (None:
    # unset, standard and 1). Kept as a routing entry (config.routing_rows).
    priority: str | None = None
    weight: int | None = None


@dataclass(frozen=True, slots=True)
class KeySpec:
    name: str
    principal: str
    secret: str | None = field(default=None, repr=False)
    expires_at: float | None = None  # unix seconds
    limits: LimitsSpec | None = None
    # Narrower than the principal: client networks (CIDRs) the key may be used from, and the model names
    # it may call (None: all its principal's). Kept as a routing entry (config.routing_rows).
    allow_ips: tuple[str, ...] = ()
    models: tuple[str, ...] | None = None
    budgets: tuple[BudgetSpec, ...] = ()  # the key's own, on top of its principal's
    priority: str | None = None  # flow-control class, over its principal's (a routing entry too)


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
    body_logs: tuple[BodyLogSpec, ...] = ()  # which requests' bodies are logged, first match deciding


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    policy: str
    members: tuple[str, ...]  # provider models
    weights: tuple[int, ...] = ()
    prefix_bytes: int | None = None
    max_inflight: int | None = None
    # cache_aware only, each None for its default (gateway.routing.policies.CacheTuning)
    cache: tuple[tuple[str, int | float], ...] = ()
    tokenizer: str | None = None  # cache_aware only: a model directory whose tokens the engines cache

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "policy": self.policy, "members": list(self.members)}
        if self.weights:
            out["weights"] = list(self.weights)
        if self.prefix_bytes is not None:
            out["prefix_bytes"] = self.prefix_bytes
        if self.max_inflight is not None:
            out["max_inflight"] = self.max_inflight
        out.update(self.cache)
        if self.tokenizer is not None:
            out["tokenizer"] = self.tokenizer
        return out


@dataclass(frozen=True, slots=True)
class PromptClassSpec:
    """A prompt class (``[[prompt_classes]]``): example prompts, optional keywords, the least score."""

    name: str
    examples: tuple[str, ...]
    keywords: tuple[str, ...] = ()
    min_score: float | None = None  # None: gateway.routing.prompt_classes' default

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "examples": list(self.examples)}
        if self.keywords:
            out["keywords"] = list(self.keywords)
        if self.min_score is not None:
            out["min_score"] = self.min_score
        return out


@dataclass(frozen=True, slots=True)
class RuleSpec:
    when: dict[str, Any] = field(default_factory=dict)  # file form, normalised
    route: tuple[str, ...] = ()  # provider models and pools, in order
    refuse: tuple[int, str] | None = None
    delegate: str | None = None
    name: str | None = None
    tag: str | None = None
    policy: str | None = None

    @property
    def action(self) -> str:
        return "refuse" if self.refuse else "delegate" if self.delegate else "route"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["when"] = self.when
        if self.refuse is not None:
            out["refuse"] = {"status": self.refuse[0], "message": self.refuse[1]}
        elif self.delegate is not None:
            out["delegate"] = self.delegate
        else:
            out["route"] = list(self.route)
        if self.tag is not None:
            out["tag"] = self.tag
        if self.policy is not None:
            out["policy"] = self.policy
        return out


@dataclass(frozen=True, slots=True)
class BodyLogSpec:
    """A ``[[body_logs]]`` entry: which requests have their bodies logged, how many, how much of each,
    what is redacted before they are stored and for how long they are kept (``config.body_logs``)."""

    name: str
    principals: tuple[str, ...] | None = None  # None: every principal
    keys: tuple[str, ...] | None = None  # key names; None: every key
    models: tuple[str, ...] | None = None  # names a client calls; None: every model
    sample: float = 1.0
    max_bytes: int = 65536
    redact_paths: tuple[str, ...] = ()
    # Built-in pattern names ("email", "card") and (name, regex) pairs of the operator's own.
    redact_patterns: tuple[str | tuple[str, str], ...] = ("email", "card")
    retention_days: float = 7.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for field_name in ("principals", "keys", "models"):
            value = getattr(self, field_name)
            if value is not None:
                out[field_name] = list(value)
        out["sample"] = self.sample
        out["max_bytes"] = self.max_bytes
        if self.redact_paths:
            out["redact_paths"] = list(self.redact_paths)
        out["redact_patterns"] = [
            p if isinstance(p, str) else {"name": p[0], "regex": p[1]} for p in self.redact_patterns
        ]
        out["retention_days"] = self.retention_days
        return out
