"""``POST /admin/routing/dry-run``: where a request would go, decided by the same function the request
path uses (``Snapshot.decide``) on the snapshot the control plane last built, sending nothing.

The request names the model, optionally the principal (by name: its roles and permissions then count),
headers and the JSON body the client would send (as an object, or as its exact text when the bytes
matter, as they do to prefix affinity). The answer is the decision — the model that decided
(after delegations), the rule that matched or none (the model's chain), the ordered targets, or the
refusal — plus whether the principal may call the model at all. Load comes from this host's shared
segments (in-flight gauges, the engine scraper's document): a dry run on a control-only host sees no
load. No I/O beyond what the caller hands in.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import BadRequest, NotFound
from gateway.protocol.openai_request import inspect_json
from gateway.routing.load import Load
from gateway.routing.rules import Facts
from gateway.snapshot import Principal, Snapshot

__all__ = ["SnapshotCache", "dry_run"]


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


def dry_run(snapshot: Snapshot, request: Any, load: Load) -> dict[str, Any]:
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
    )
    decision = snapshot.decide(route, facts, load)
    return {
        "called": info.model,
        "allowed": principal.may_use(route.name),
        "prompt_tokens_estimate": facts.prompt_tokens,
        **decision.describe(),
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
