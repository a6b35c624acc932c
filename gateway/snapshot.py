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
                              "connect_timeout": 2.0, "first_byte_timeout": 60.0, "read_timeout": 300.0}},
      "routes": {            # every callable name: frontend models, their aliases, provider models
        "chat": {"canonical": "chat", "kind": "frontend",
                 "targets": [["llama-8b", "vllm-a", "meta-llama/Llama-3.1-8B-Instruct"], ...]}
      },
      "principals": {"7": {"name": "alice", "allow_all": false, "models": ["chat", "gpt-4o-mini"]}},
      "keys": {"<64 hex chars of keyed blake3>": {"id": "12", "principal": "7", "expires_at": null}},
      "skipped": 0                       # rows the build skipped as invalid (logged by the builder)
    }

A route's ``targets`` is the fallback chain already flattened: each provider model of the chain in order,
and within it each of its backends in order, as ``[provider_model, backend, upstream_model]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

SCHEMA = 1

__all__ = ["SCHEMA", "Backend", "KeyEntry", "Principal", "Route", "Snapshot", "Target"]


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    url: str  # base URL without a trailing slash; request paths such as /v1/chat/completions are appended
    api_key: str | None
    protocol: str  # "openai" | "anthropic" | "gemini"
    connect_timeout: float
    first_byte_timeout: float
    read_timeout: float


@dataclass(frozen=True, slots=True)
class Target:
    provider_model: str
    backend: Backend
    upstream_model: str


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    canonical: str
    kind: str  # "frontend" | "provider"
    targets: tuple[Target, ...]


@dataclass(frozen=True, slots=True)
class Principal:
    id: str
    name: str
    allow_all: bool
    models: frozenset[str]

    def may_use(self, model: str) -> bool:
        return self.allow_all or model in self.models


@dataclass(frozen=True, slots=True)
class KeyEntry:
    id: str
    principal: Principal
    expires_at: float | None


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

    @classmethod
    def empty(cls) -> Snapshot:
        return cls(0, 0.0, 0, {}, {}, {}, {}, 0)

    @classmethod
    def decode(cls, blob: bytes, generation: int) -> Snapshot:
        return cls.from_doc(orjson.loads(blob), generation)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], generation: int) -> Snapshot:
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"unsupported snapshot schema {doc.get('schema')!r}")
        backends = {
            name: Backend(
                name=name,
                url=b["url"].rstrip("/"),
                api_key=b.get("api_key"),
                protocol=b.get("protocol", "openai"),
                connect_timeout=float(b.get("connect_timeout", 5.0)),
                first_byte_timeout=float(b.get("first_byte_timeout", 60.0)),
                read_timeout=float(b.get("read_timeout", 300.0)),
            )
            for name, b in doc.get("backends", {}).items()
        }
        routes: dict[str, Route] = {}
        for name, r in doc.get("routes", {}).items():
            targets = tuple(
                Target(provider_model=pm, backend=backends[be], upstream_model=um)
                for pm, be, um in r["targets"]
                if be in backends
            )
            routes[name] = Route(
                name=name, canonical=r.get("canonical", name), kind=r.get("kind", "frontend"), targets=targets
            )
        principals = {
            pid: Principal(
                id=pid,
                name=p["name"],
                allow_all=bool(p.get("allow_all")),
                models=frozenset(p.get("models", ())),
            )
            for pid, p in doc.get("principals", {}).items()
        }
        keys: dict[bytes, KeyEntry] = {}
        for digest_hex, k in doc.get("keys", {}).items():
            principal = principals.get(k["principal"])
            if principal is None:
                continue
            exp = k.get("expires_at")
            keys[bytes.fromhex(digest_hex)] = KeyEntry(
                id=str(k["id"]), principal=principal, expires_at=None if exp is None else float(exp)
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
        )
