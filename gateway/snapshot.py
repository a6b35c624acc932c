"""The versioned snapshot: the only contract between the control plane and the data plane.

The control plane builds a plain JSON document (``SnapshotDoc``, schema below) and publishes its bytes;
each proxy worker decodes those bytes once per generation into the frozen objects here, pre-flattened so
that the request path does one dict lookup per question. No I/O in this module.

Document schema (``schema`` = 1)::

    {
      "schema": 1,
      "revision": 17,                    # config revision in the store; publication is monotonic in it
      "built_at": 1764470000.0,          # unix seconds
      "backends": {"vllm-a": {"url": "http://127.0.0.1:8001", "api_key": null, "protocol": "openai",
                              "connect_timeout": 2.0, "first_byte_timeout": 60.0, "read_timeout": 300.0,
                              "credentials": [{"name": "a", "api_key": "sk-...", "rpm": 500,  # optional
                                               "tpm": 90000, "cool_down": 60.0}]}},
      "routes": {            # every callable name: frontend models, their aliases, provider models
        "chat": {"canonical": "chat", "kind": "frontend",
                 "targets": [["llama-8b", "vllm-a", "meta-llama/Llama-3.1-8B-Instruct"], ...],
                 "price": [0.15, 0.6, 0.075]}   # optional: input, output, cached input per 1M tokens
      },
      "principals": {"7": {"name": "alice", "allow_all": false, "models": ["chat", "gpt-4o-mini"],
                           "limits": {"rpm": 100, "tpm": 20000, "concurrency": 8},      # optional
                           "model_limits": {"chat": {"rpm": 10}},                         # optional
                           "budgets": [{"period": "month", "tokens": 10000000, "cost": 50.0,   # optional
                                        "alerts": [0.8, 1.0]}, {"period": "day", "cost": 5.0}]}},
      "keys": {"<64 hex chars of keyed blake3>": {"id": "12", "principal": "7", "expires_at": null,
                                                  "limits": {"rpm": 30},                 # optional
                                                  "name": "ci", "allow_ips": ["10.0.0.0/8"],  # optional
                                                  "models": ["chat", "gpt-4o-mini"],     # optional
                                                  "budgets": [{"period": "day", "tokens": 50}]}},  # optional
      "pools": {"llama": {"policy": "prefix_affinity", "prefix_bytes": 512, "max_inflight": null,
                          "targets": [["llama-8b", "vllm-a", "meta-llama/...", 1], ...]}},  # weight last
      "fallback": "chat-small",          # optional: deployment-wide fallback model when all targets are down
      "alias_patterns": {"claude-*": {"canonical": "chat", "kind": "frontend", "targets": [...]}},
                                         # optional: pattern aliases, routes like the others, in config order
      "prompt_classes": [{"name": "code", "examples": ["fix this bug"], "keywords": ["stack trace"],
                          "min_score": 0.1}],   # optional, in declaration order
      "context_windows": {"llama-8b": 8192},  # optional: tokens per provider model (prompt + completion)
      "body_logs": [{"name": "debug-alice", "id": "9f2c4e1a7b3d5f60", "principals": ["7"], ...}],
                                         # optional: whose bodies are logged (gateway.body_rules)
      "skipped": 0                       # rows the build skipped as invalid (logged by the builder)
    }

A frontend route may carry ``"context_failover": true`` (an upstream "context length exceeded" 400 may
fail over to a target with a larger window) and ``"rules"``: ``[{"name", "when": {...}, "action":
"route" | "refuse" | "delegate", "steps": [{"pool": name} | {"targets": [[pm, backend, upstream_model],
...]}], "status", "message", "model", "tag", "policy"}]`` (``gateway.routing.rules`` describes
``when``). A backend may carry flow-control settings (``max_concurrency``, ``waiting_high_water``,
``queue_size``, ``queue_timeout``, ``kv_high_water``), ``health_path``, ``responses_api`` (true: it
serves ``/v1/responses`` itself) and ``kv_events`` (its engine's KV-event publisher, ``tcp://host:port``);
a pool ``"cache"`` (``cache_aware``'s knobs) and ``"tokenizer"`` (a model directory); a principal its
role names (``"roles"``), which rules may test.

Flow control (``gateway.dataplane.flow``): a principal, a key and a frontend route (with its aliases) may
carry ``"priority"``: ``"critical"``, ``"standard"`` or ``"sheddable"`` (the key's wins, then the
principal's, then the model's; none: standard); a principal ``"weight"``, a positive integer (default
1), its share against other principals of its class while requests wait.

Limits (all optional, absent or null meaning unlimited): ``rpm`` requests per minute, ``tpm`` tokens per
minute, ``concurrency`` requests in flight at once. Principal limits apply to all its keys together, key
limits to one key, ``model_limits`` to one principal calling one model name (the name the caller used).

Budgets and prices are explained in ``gateway.budget``. A principal's or key's ``"budgets"`` hold one
budget per period. A principal's ``"budget"`` is the form from before there could be several: a document
of that time carries only it, and it still decodes; a newer one repeats the first of ``"budgets"`` there,
for proxy hosts of the earlier version (``"budgets"`` wins where both are). A key carries its ``"name"``
when it has rules or budgets.

A route's ``targets`` is the fallback chain already flattened: each provider model of the chain in order,
and within it each of its backends in order, as ``[provider_model, backend, upstream_model]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.body_rules import BodyLogRules
from gateway.budget import KEY_OWNER, Budget, BudgetSet, Price, budgets_from_doc
from gateway.dataplane.flow import STANDARD, priority_rank
from gateway.key_rules import KeyRules
from gateway.routing.aliases import PatternAliases
from gateway.routing.load import Load
from gateway.routing.plan import Decision, Pool, Route, compile_pools, compile_rules, decide
from gateway.routing.prompt_classes import Classifier, PromptClass
from gateway.routing.rules import Facts
from gateway.routing.targets import Backend, Credential, Target, decode_backends, positive
from gateway.shm.bucket_keys import bucket_key

SCHEMA = 1

__all__ = [
    "SCHEMA",
    "Backend",
    "Credential",
    "KeyEntry",
    "Limits",
    "Principal",
    "Route",
    "Snapshot",
    "Target",
    "decode_backends",
]


@dataclass(frozen=True, slots=True)
class Limits:
    """One scope's limits, with the 64-bit bucket keys precomputed so the request path hashes nothing."""

    scope: str  # "p:<principal id>", "k:<key id>" or "pm:<principal id>:<model>"
    rpm: int | None
    tpm: int | None
    concurrency: int | None
    rpm_key: int
    tpm_key: int
    concurrency_key: int
    # The rate buckets to take from, ready for the request path: (counts tokens, limit, bucket key, rate
    # per second), requests before tokens.
    rates: tuple[tuple[bool, int, int, float], ...] = ()

    @classmethod
    def from_doc(cls, scope: str, doc: dict[str, Any] | None) -> Limits | None:
        if not doc:
            return None
        rpm, tpm, conc = (positive(doc.get(k)) for k in ("rpm", "tpm", "concurrency"))
        if rpm is None and tpm is None and conc is None:
            return None
        rpm_key, tpm_key = bucket_key(scope, "rpm"), bucket_key(scope, "tpm")
        rates = tuple(
            (counts_tokens, limit, key, limit / 60.0)
            for counts_tokens, limit, key in ((False, rpm, rpm_key), (True, tpm, tpm_key))
            if limit is not None
        )
        return cls(scope, rpm, tpm, conc, rpm_key, tpm_key, bucket_key(scope, "concurrency"), rates)


@dataclass(frozen=True, slots=True)
class Principal:
    id: str
    name: str
    allow_all: bool
    models: frozenset[str]
    limits: Limits | None = None
    model_limits: dict[str, Limits] | None = None
    budgets: tuple[Budget, ...] = ()  # one per period (gateway.budget)
    roles: frozenset[str] = frozenset()
    # Flow control (gateway.dataplane.flow): the class of its requests (a rank; None: unset) and its
    # weight against other tenants of the same class while they wait.
    priority: int | None = None
    weight: int = 1

    def may_use(self, model: str) -> bool:
        return self.allow_all or model in self.models


@dataclass(frozen=True, slots=True)
class KeyEntry:
    id: str
    principal: Principal
    expires_at: float | None
    limits: Limits | None = None
    rules: KeyRules | None = None  # networks and models narrower than the principal's (gateway.key_rules)
    # Every budget a request through this key answers to, its principal's and its own; None: none.
    budgets: BudgetSet | None = None
    name: str | None = None  # carried when the key has rules or budgets (the dry run finds it by name)
    priority: int | None = None  # flow-control class (a rank), over its principal's and the model's

    def flow_class(self, route: Route) -> int:
        """The flow-control class of this key's requests for ``route``: the key's own, else its
        principal's, else the model's, else standard (read only when the request must wait)."""
        for rank in (self.priority, self.principal.priority, route.priority):
            if rank is not None:
                return rank
        return STANDARD

    def may_use(self, model: str) -> bool:
        rules = self.rules
        return self.principal.may_use(model) and (
            rules is None or rules.models is None or model in rules.models
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    revision: int
    built_at: float
    generation: int
    backends: dict[str, Backend]
    routes: dict[str, Route]
    principals: dict[str, Principal]
    keys: dict[bytes, KeyEntry]  # raw 32-byte digest -> entry
    skipped: int
    pools: dict[str, Pool] = field(default_factory=dict)
    fallback: str | None = None  # the deployment-wide fallback model, when every target is down
    # Aliases such as ``claude-*``: tried when no route has the exact name (gateway.routing.aliases).
    patterns: PatternAliases[Route] = field(default_factory=PatternAliases)
    # Whether any provider model declares a context window: when none does, the request path makes one
    # check and never estimates a fit (gateway.routing.context).
    windows: bool = False
    # The prompt classes' fast tier (gateway.routing.prompt_classes), built from the operator's examples
    # once per generation; consulted only by rules that name a class, and by the dry run.
    classifier: Classifier | None = None
    # Whose request and response bodies are logged; None when no [[body_logs]] entry exists, and then the
    # request path makes this one test and nothing more (gateway.body_rules).
    body_logs: BodyLogRules | None = None

    @classmethod
    def empty(cls) -> Snapshot:
        return cls(0, 0.0, 0, {}, {}, {}, {}, 0)

    def route(self, name: str) -> Route | None:
        """The route a client's model name calls: its exact name, else the first pattern alias matching."""
        route = self.routes.get(name)
        if route is None and self.patterns:
            route = self.patterns.match(name)
        return route

    def decide(self, route: Route, facts: Facts | None, load: Load) -> Decision:
        """Where a request for ``route`` goes (``gateway.routing.plan.decide``)."""
        return decide(self.routes, self.fallback, route, facts, load)

    @classmethod
    def decode(cls, blob: bytes, generation: int) -> Snapshot:
        return cls.from_doc(orjson.loads(blob), generation)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], generation: int) -> Snapshot:
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"unsupported snapshot schema {doc.get('schema')!r}")
        backends = decode_backends(doc)
        windows = {pm: int(w) for pm, w in (doc.get("context_windows") or {}).items()}
        pools = compile_pools(doc.get("pools") or {}, backends, windows)
        routes = {
            name: _route(name, r, backends, pools, windows) for name, r in doc.get("routes", {}).items()
        }
        patterns = PatternAliases(
            [
                (n, _route(n, r, backends, pools, windows))
                for n, r in (doc.get("alias_patterns") or {}).items()
            ]
        )
        principals = {
            pid: Principal(
                id=pid,
                name=p["name"],
                allow_all=bool(p.get("allow_all")),
                models=frozenset(p.get("models", ())),
                limits=Limits.from_doc(f"p:{pid}", p.get("limits")),
                model_limits={
                    model: lim
                    for model, ml in (p.get("model_limits") or {}).items()
                    if (lim := Limits.from_doc(f"pm:{pid}:{model}", ml)) is not None
                }
                or None,
                budgets=budgets_from_doc(pid, p),
                roles=frozenset(p.get("roles") or ()),
                priority=priority_rank(p.get("priority")),
                weight=positive(p.get("weight")) or 1,
            )
            for pid, p in doc.get("principals", {}).items()
        }
        keys: dict[bytes, KeyEntry] = {}
        for digest_hex, k in doc.get("keys", {}).items():
            principal = principals.get(k["principal"])
            if principal is None:
                continue
            exp = k.get("expires_at")
            own = budgets_from_doc(KEY_OWNER + str(k["id"]), k) if "budgets" in k else ()
            keys[bytes.fromhex(digest_hex)] = KeyEntry(
                id=str(k["id"]),
                principal=principal,
                expires_at=None if exp is None else float(exp),
                limits=Limits.from_doc(f"k:{k['id']}", k.get("limits")),
                rules=KeyRules.from_doc(k) if "allow_ips" in k or "models" in k else None,
                budgets=BudgetSet(principal.budgets, own) if principal.budgets or own else None,
                name=k.get("name"),
                priority=priority_rank(k.get("priority")),
            )
        return cls(
            revision=int(doc["revision"]),
            built_at=float(doc.get("built_at", 0.0)),
            generation=generation,
            backends=backends,
            routes=routes,
            principals=principals,
            keys=keys,
            skipped=int(doc.get("skipped", 0)),
            pools=pools,
            fallback=doc.get("fallback"),
            patterns=patterns,
            windows=bool(windows),
            classifier=Classifier(tuple(PromptClass.from_doc(c) for c in doc["prompt_classes"]))
            if doc.get("prompt_classes")
            else None,
            body_logs=BodyLogRules.from_doc(doc.get("body_logs")),
        )


def _route(
    name: str,
    r: dict[str, Any],
    backends: dict[str, Backend],
    pools: dict[str, Pool],
    windows: dict[str, int],
) -> Route:
    targets = tuple(
        Target(pm, backends[be], um, windows.get(pm)) for pm, be, um in r["targets"] if be in backends
    )
    return Route(
        name=name,
        canonical=r.get("canonical", name),
        kind=r.get("kind", "frontend"),
        targets=targets,
        price=Price.from_doc(r.get("price")),
        rules=compile_rules(r.get("rules") or [], backends, pools, windows),
        context_failover=bool(r.get("context_failover")),
        priority=priority_rank(r.get("priority")),
    )
