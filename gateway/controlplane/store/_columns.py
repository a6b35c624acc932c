"""How the store's rows hold configuration values: the column lists several tables share, each spec to
and from its columns (limits, prices, budgets), who manages a key, and new ids. A value that only a
hand-edited row can hold raises ``StoreError`` when read back. No I/O.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.controlplane.config.specs import BudgetSpec, LimitsSpec, PriceSpec
from gateway.controlplane.store._driver import Param
from gateway.errors import StoreError

__all__ = [
    "BUDGET_COLUMNS",
    "KEY_COLUMNS",
    "LIMIT_COLUMNS",
    "MANAGED_BY_API",
    "MANAGED_BY_CLI",
    "MANAGED_BY_FILE",
    "PRICE_COLUMNS",
    "Row",
    "budget_from",
    "budget_params",
    "budgets_by_owner",
    "limit_params",
    "limits_from",
    "model_limits_by_principal",
    "new_id",
    "price_from",
    "price_params",
    "to_json",
]

Row = tuple[Any, ...]
MANAGED_BY_FILE = "file"
MANAGED_BY_CLI = "cli"
MANAGED_BY_API = "api"  # created through the admin API, the web UI's included

LIMIT_COLUMNS = "limit_rpm, limit_tpm, limit_concurrency"
PRICE_COLUMNS = "price_input, price_output, price_cached_input"
# Of principal_budgets and key_budgets, after the owner's id; ordered by seq.
BUDGET_COLUMNS = "period, tokens, cost, alerts"
KEY_COLUMNS = (
    f"id, name, principal_id, key_hash, created_at, expires_at, revoked_at, managed_by, {LIMIT_COLUMNS}"
)


def new_id() -> str:
    return secrets.token_hex(8)


def limit_params(spec: LimitsSpec | None) -> tuple[Param, Param, Param]:
    if spec is None:
        return None, None, None
    return spec.requests_per_minute, spec.tokens_per_minute, spec.concurrent_requests


def limits_from(values: Sequence[Any]) -> LimitsSpec | None:
    """The inverse of ``limit_params`` for the three limit columns of a row."""
    for value in values:
        if value is not None and not isinstance(value, int):  # only a hand-edited row can hold one
            raise StoreError(f"unreadable limit {value!r} in the store")
    spec = LimitsSpec(*values)
    return None if spec.is_empty() else spec


def price_params(spec: PriceSpec | None) -> tuple[Param, Param, Param]:
    if spec is None:
        return None, None, None
    return spec.input, spec.output, spec.cached_input


def price_from(values: Sequence[Any]) -> PriceSpec | None:
    if values[0] is None or values[1] is None:
        return None
    return PriceSpec(float(values[0]), float(values[1]), None if values[2] is None else float(values[2]))


def budget_params(spec: BudgetSpec) -> tuple[Param, Param, Param, Param]:
    """The ``BUDGET_COLUMNS`` of one budget: the alert thresholds as a JSON array (NULL: none)."""
    return spec.period, spec.tokens, spec.cost, to_json(list(spec.alerts)) if spec.alerts else None


def budget_from(values: Sequence[Any]) -> BudgetSpec | None:
    """The inverse of ``budget_params`` for the four budget columns of a row; None for a budget of
    nothing (no row holds one unless edited by hand)."""
    period, tokens, cost, alerts = values
    if period is None or (tokens is None and cost is None):
        return None
    thresholds: Any = ()
    if alerts is not None:
        try:
            thresholds = orjson.loads(alerts) if isinstance(alerts, str) else None
        except orjson.JSONDecodeError:
            thresholds = None
    if (
        not isinstance(period, str)
        or (tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)))
        or (cost is not None and (not isinstance(cost, int | float) or isinstance(cost, bool)))
        or not isinstance(thresholds, list | tuple)
        or not all(isinstance(a, int | float) and not isinstance(a, bool) and 0 < a <= 1 for a in thresholds)
    ):  # only a hand-edited row can hold one
        raise StoreError(f"unreadable budget {tuple(values)!r} in the store")
    return BudgetSpec(
        period, tokens, None if cost is None else float(cost), tuple(sorted(float(a) for a in thresholds))
    )


def budgets_by_owner(rows: Sequence[Row]) -> dict[str, tuple[BudgetSpec, ...]]:
    """``(owner id, *BUDGET_COLUMNS)`` rows, in order -> each owner's budgets in that order."""
    out: dict[str, list[BudgetSpec]] = {}
    for row in rows:
        spec = budget_from(row[1:5])
        if spec is not None:
            out.setdefault(row[0], []).append(spec)
    return {owner: tuple(specs) for owner, specs in out.items()}


def model_limits_by_principal(rows: Sequence[Row]) -> dict[str, tuple[tuple[str, LimitsSpec], ...]]:
    """``(principal_id, model, *limits)`` rows -> each principal's ``(model, limits)`` in model order."""
    out: dict[str, list[tuple[str, LimitsSpec]]] = {}
    for row in sorted(rows, key=lambda r: str(r[1])):
        spec = limits_from(row[2:5])
        if spec is not None:
            out.setdefault(row[0], []).append((row[1], spec))
    return {pid: tuple(entries) for pid, entries in out.items()}


def to_json(value: object) -> str:
    return orjson.dumps(value).decode()
