"""The ``[[backends]]`` tables of a configuration file, with their credential pools
(``[[backends.credentials]]``), parsed into ``BackendSpec``. A pool's credentials become backend specs of
their own (``BACKEND/CREDENTIAL``, see ``BackendSpec.credential_of``) once the whole section is read
(``flatten_credentials``). No I/O.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gateway.controlplane.config.fields import read_name, read_timeout
from gateway.controlplane.config.problems import Problems
from gateway.controlplane.config.specs import (
    BACKEND_FLOW_FIELDS,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_BYTE_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    PROTOCOLS,
    BackendSpec,
)
from gateway.controlplane.config.values import check_limit, check_url

__all__ = ["flatten_credentials", "parse_backend"]

# Used with fullmatch: "$" would also match before a final newline.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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


_ENDPOINT = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})")


def _check_endpoint(value: Any) -> str | None:
    """A problem with a ZeroMQ endpoint the gateway connects to, or None."""
    why = "must be a ZeroMQ endpoint to connect to, tcp://HOST:PORT (as the engine's --kv-events-config)"
    if not isinstance(value, str):
        return why
    match = _ENDPOINT.fullmatch(value)
    if match is None or not 0 < int(match.group(2)) < 65536:
        return why
    return None


def parse_backend(p: Problems, place: str, item: dict[str, Any]) -> BackendSpec | None:
    p.unknown_fields(place, item, _BACKEND_FIELDS)
    ok = True
    name = read_name(p, place, item)
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
        read_timeout(p, place, item, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
        read_timeout(p, place, item, "first_byte_timeout", DEFAULT_FIRST_BYTE_TIMEOUT),
        read_timeout(p, place, item, "read_timeout", DEFAULT_READ_TIMEOUT),
    ]
    counts: list[int | None] = []
    for key in ("max_concurrency", "waiting_high_water", "queue_size"):
        value = item.get(key)
        if value is not None and (problem := check_limit(value)):
            p.add(f"{place}.{key}", problem)
            ok = False
        counts.append(value)
    queue_timeout = read_timeout(p, place, item, "queue_timeout", 5.0) if "queue_timeout" in item else None
    ok = ok and ("queue_timeout" not in item or queue_timeout is not None)
    kv_high_water = item.get("kv_high_water")
    if kv_high_water is not None and (
        isinstance(kv_high_water, bool)
        or not isinstance(kv_high_water, int | float)
        or not 0 < kv_high_water <= 1
    ):
        p.add(f"{place}.kv_high_water", "must be a fraction of the KV cache above 0 and at most 1, e.g. 0.95")
        ok = False
    reserved = item.get("reserved_places")
    if reserved is not None and (isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 0):
        p.add(f"{place}.reserved_places", "must be a whole number of places, 0 or more")
        ok = False
    elif reserved and (not isinstance(counts[0], int) or reserved >= counts[0]):
        p.add(f"{place}.reserved_places", "must be fewer than the backend's max_concurrency (which it needs)")
        ok = False
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
    kv_events = item.get("kv_events")
    if kv_events is not None and (problem := _check_endpoint(kv_events)):
        p.add(f"{place}.kv_events", problem)
        ok = False
    elif kv_events is not None and protocol != "openai":
        p.add(f"{place}.kv_events", "only an openai backend (a vLLM engine) publishes KV events")
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
        kv_high_water=None if kv_high_water is None else float(kv_high_water),
        reserved_places=reserved,
        health_path=health_path,
        api_key_file=api_key_file,
        responses_api=responses_api,
        kv_events=kv_events,
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
    name = read_name(p, place, item)
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
    cool_down = read_timeout(p, place, item, "cool_down", 60.0) if "cool_down" in item else None
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


def flatten_credentials(
    backends: list[tuple[str, BackendSpec]],
) -> list[tuple[str, BackendSpec]]:
    """Backends, then every credential of every pool as a backend row of its own (in file order)."""
    out = [(pl, replace(b, credentials=())) for pl, b in backends]
    for pl, b in backends:
        out += [(f"{pl}.credentials[{i}]", c) for i, c in enumerate(b.credentials)]
    return out
