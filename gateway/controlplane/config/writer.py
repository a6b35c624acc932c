"""The TOML writer: a ``ConfigDoc`` as the text of a config file, which the parser reads back to an equal
document. ``gateway export``, the admin API's ``GET /admin/config`` and the store's check of a merged
configuration use it. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from gateway.controlplane.config.specs import (
    BACKEND_FLOW_FIELDS,
    LIMIT_FIELDS,
    BudgetSpec,
    ConfigDoc,
    LimitsSpec,
    PriceSpec,
)

__all__ = ["dump_config", "toml_key", "toml_value"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


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


def toml_key(value: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise."""
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
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
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


def _toml_budgets(specs: tuple[BudgetSpec, ...]) -> list[str]:
    """An entry's budgets: ``budget = {...}`` for one, as files wrote it before there could be several."""
    if not specs:
        return []
    if len(specs) == 1:
        return [f"budget = {_toml_budget(specs[0])}"]
    return ["budgets = [" + ", ".join(_toml_budget(spec) for spec in specs) + "]"]


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
        if m.priority is not None:
            lines.append(f"priority = {_toml_str(m.priority)}")
        for rule in m.rules:
            lines += ["", "[[models.rules]]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in rule.as_dict().items()]
    for pool in doc.pools:
        lines += ["", "[[pools]]"] + [f"{k} = {toml_value(v)}" for k, v in pool.as_dict().items()]
    if doc.fallback is not None:
        lines += ["", "[routing]", f"fallback = {_toml_str(doc.fallback)}"]
    for spec in doc.prompt_classes:
        lines += ["", "[[prompt_classes]]"] + [f"{k} = {toml_value(v)}" for k, v in spec.as_dict().items()]
    for entry in doc.body_logs:
        lines += ["", "[[body_logs]]"] + [f"{k} = {toml_value(v)}" for k, v in entry.as_dict().items()]
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
            entries = ", ".join(f"{toml_key(m)} = {_toml_limits(spec)}" for m, spec in pr.model_limits)
            lines.append(f"model_limits = {{ {entries} }}")
        if pr.priority is not None:
            lines.append(f"priority = {_toml_str(pr.priority)}")
        if pr.weight is not None:
            lines.append(f"weight = {pr.weight}")
        lines += _toml_budgets(pr.budgets)
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
        if k.priority is not None:
            lines.append(f"priority = {_toml_str(k.priority)}")
        lines += _toml_budgets(k.budgets)
    return "\n".join(lines).lstrip("\n") + "\n"
