"""Usage and spend as documents, for the CLI (``gateway usage``, ``gateway budgets``) and the admin API
(and its web UI) alike, so they always say the same thing. I/O: the store reads ``budget_report`` makes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.budget import NANOS, period_window
from gateway.controlplane.store import Store
from gateway.controlplane.store._usage import UsageSummaryRow

__all__ = ["budget_report", "usage_groups"]


def usage_groups(rows: Sequence[UsageSummaryRow]) -> list[dict[str, Any]]:
    return [
        {
            "group": r.group,
            "requests": r.requests,
            "errors": r.errors,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "total_tokens": r.total_tokens,
            "cost": r.cost_nanos / NANOS,
            **({"bucket_start": r.bucket_start} if r.bucket_start is not None else {}),
        }
        for r in rows
    ]


def budget_report(store: Store, now: float) -> list[dict[str, Any]]:
    """Every budget of every principal and every unrevoked key: its current window and what its owner
    spent there, from the store. The principals' budgets first, then the keys', each in declared order."""
    out: list[dict[str, Any]] = []
    for b in store.budgets():
        spec = b.spec
        start, end = period_window(spec.period, now)
        if b.key_id is None:
            spent = store.usage.spend(start, end, [b.principal_id])
        else:
            spent = store.usage.key_spend(start, end, {b.key_id: b.principal_id})
        tokens = sum(r.tokens for r in spent)
        cost = sum(r.cost_nanos for r in spent)
        exceeded = (spec.tokens is not None and tokens >= spec.tokens) or (
            spec.cost is not None and cost >= round(spec.cost * NANOS)
        )
        out.append(
            {
                "scope": "principal" if b.key_id is None else "key",
                "principal": b.principal,
                "key": b.key,
                "period": spec.period,
                "window_start": start,
                "window_end": end,
                "tokens": tokens,
                "tokens_limit": spec.tokens,
                "cost": cost / NANOS,
                "cost_limit": spec.cost,
                "exceeded": exceeded,
                "alerts": list(spec.alerts),
            }
        )
    return out
