"""Usage and spend as documents, for the CLI (``gateway usage``, ``gateway budgets``) and the admin API
alike, so the two always say the same thing. I/O: the store reads ``budget_report`` makes."""

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
    """Every principal with a budget: its current window and what it spent there, from the store."""
    out: list[dict[str, Any]] = []
    for p in store.principals():
        if p.budget is None:
            continue
        start, end = period_window(p.budget.period, now)
        spent = store.usage.spend(start, end, [p.id])
        tokens = sum(r.tokens for r in spent)
        cost = sum(r.cost_nanos for r in spent)
        exceeded = (p.budget.tokens is not None and tokens >= p.budget.tokens) or (
            p.budget.cost is not None and cost >= round(p.budget.cost * NANOS)
        )
        out.append(
            {
                "principal": p.name,
                "period": p.budget.period,
                "window_start": start,
                "window_end": end,
                "tokens": tokens,
                "tokens_limit": p.budget.tokens,
                "cost": cost / NANOS,
                "cost_limit": p.budget.cost,
                "exceeded": exceeded,
            }
        )
    return out
