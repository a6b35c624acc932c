"""Budget alerts: when the spend in a budget's current window crosses one of its thresholds (``alerts =
[0.5, 0.8, 1.0]`` in the budget), say so once per threshold and window, for every budget of every
principal and every key: a WARNING log line on ``gateway.controlplane``, the Prometheus gauges
``gateway_budget_used_ratio`` and ``gateway_budget_alert_threshold`` (the highest threshold reached), and,
when ``--budget-alert-webhook`` is set, a JSON POST to that URL from the control worker.

The gauges of a principal's budget carry the labels ``principal`` and ``period``, as they did when a
principal had one budget and keys none; those of a key's budget add ``key`` (its name, or its id when it
has none), so ``{key=""}`` selects the principals' own.

The spend is the window's live counter plus its base, read from the host's bucket table, as the request
path enforces it. Which thresholds fired is kept in memory per budget and window: a control worker that
restarts says once more what the current windows have already crossed. I/O: the webhook POST (``send``,
each under a total deadline: ``outbound.call``); the rest reads shared memory only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.budget import Budget, format_money
from gateway.controlplane import outbound

__all__ = ["Alert", "BudgetAlerts", "WatchedWindow", "send"]

log = logging.getLogger("gateway.controlplane")

WEBHOOK_DEADLINE = 5.0  # seconds one POST has in all, however the webhook dribbles its answer
WEBHOOK_ANSWER_LIMIT = 1 << 20  # bytes of its answer read at most
_LONGEST_WINDOW = 400 * 86400.0  # what a window's fired thresholds are remembered for, at most


@dataclass(frozen=True, slots=True)
class WatchedWindow:
    """One budget's current window as the alerts see it: whose it is, and what it holds."""

    budget: Budget
    principal: str  # the principal's name (a key's budget: its principal's)
    key: str | None  # a key's budget: the key's name, or its id; None for a principal's budget
    tokens: int
    cost_nanos: int


@dataclass(frozen=True, slots=True)
class Alert:
    principal: str
    key: str | None  # None: the principal's own budget
    key_id: str | None
    period: str
    threshold: float
    used: float  # the larger of the tokens and cost fractions
    tokens: int
    tokens_limit: int | None
    cost_nanos: int
    cost_limit_nanos: int | None
    window_start: float
    window_end: float

    def message(self) -> str:
        spent = (
            f"{self.tokens} of {self.tokens_limit} tokens"
            if self.tokens_limit is not None
            else f"{format_money(self.cost_nanos)} of {format_money(self.cost_limit_nanos or 0)}"
        )
        resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.window_end))
        whose = (
            f"principal {self.principal}"
            if self.key is None
            else f"key {self.key} (principal {self.principal})"
        )
        return (
            f"budget alert: {whose} has used {self.used:.0%} of its {self.period} budget "
            f"({spent}), past its {self.threshold:.0%} threshold; the window resets at {resets}"
        )

    def document(self) -> dict[str, Any]:
        return {
            "event": "budget_threshold",
            "scope": "principal" if self.key is None else "key",
            "principal": self.principal,
            "key": self.key,
            "key_id": self.key_id,
            "period": self.period,
            "threshold": self.threshold,
            "used": round(self.used, 6),
            "tokens": self.tokens,
            "tokens_limit": self.tokens_limit,
            "cost": self.cost_nanos / 1e9,
            "cost_limit": None if self.cost_limit_nanos is None else self.cost_limit_nanos / 1e9,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "message": self.message(),
        }


class BudgetAlerts:
    def __init__(self) -> None:
        # (budget owner, period, window start) -> the highest threshold fired in that window
        self._fired: dict[tuple[str, str, float], float] = {}
        # (principal name, key name or None, period) -> (used, highest threshold reached)
        self.gauges: dict[tuple[str, str | None, str], tuple[float, float]] = {}

    def check(self, windows: list[WatchedWindow], now: float) -> list[Alert]:
        """The alerts newly due, from each budget's current window spend."""
        due: list[Alert] = []
        gauges: dict[tuple[str, str | None, str], tuple[float, float]] = {}
        for w in windows:
            budget = w.budget
            used = budget.used(w.tokens, w.cost_nanos)
            start, end = budget.window(now)
            reached = max((t for t in budget.alerts if used >= t), default=0.0)
            gauges[(w.principal, w.key, budget.period)] = (used, reached)
            window = (budget.owner, budget.period, start)
            if reached > self._fired.get(window, 0.0):
                self._fired[window] = reached
                due.append(
                    Alert(
                        w.principal,
                        w.key,
                        budget.key_id,
                        budget.period,
                        reached,
                        used,
                        w.tokens,
                        budget.tokens,
                        w.cost_nanos,
                        budget.cost,
                        start,
                        end,
                    )
                )
        self.gauges = gauges
        # Windows that have ended need no memory of what they fired.
        self._fired = {k: v for k, v in self._fired.items() if k[2] + _LONGEST_WINDOW > now}
        for alert in due:
            log.warning("%s", alert.message())
        return due

    def render(self) -> list[str]:
        rows = sorted(self.gauges.items(), key=lambda item: (item[0][0], item[0][1] or "", item[0][2]))
        out = [
            "# HELP gateway_budget_used_ratio Spend in the current budget window over the budget (the larger "
            "of tokens and cost).",
            "# TYPE gateway_budget_used_ratio gauge",
        ]
        out += [f"gateway_budget_used_ratio{{{_labels(*labels)}}} {used:.6f}" for labels, (used, _) in rows]
        out += [
            "# HELP gateway_budget_alert_threshold The highest alert threshold the current window has "
            "reached (0: none).",
            "# TYPE gateway_budget_alert_threshold gauge",
        ]
        out += [f"gateway_budget_alert_threshold{{{_labels(*labels)}}} {top:g}" for labels, (_, top) in rows]
        return out


def _labels(principal: str, key: str | None, period: str) -> str:
    if key is None:
        return f'principal="{_escape(principal)}",period="{period}"'
    return f'principal="{_escape(principal)}",key="{_escape(key)}",period="{period}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def send(client: httpx.AsyncClient, url: str, alerts: list[Alert]) -> None:
    """POST each alert to the webhook; a failure is logged and not retried (the log line stands)."""
    for alert in alerts:
        whose = alert.principal if alert.key is None else f"key {alert.key}"
        try:
            resp = await outbound.call(
                client,
                "POST",
                url,
                deadline=WEBHOOK_DEADLINE,
                limit=WEBHOOK_ANSWER_LIMIT,
                json=alert.document(),
                timeout=WEBHOOK_DEADLINE,
            )
            if resp.status_code >= 300:
                log.warning("budget alert webhook answered HTTP %d for %s", resp.status_code, whose)
        except httpx.HTTPError as exc:
            log.warning("budget alert webhook failed for %s: %s", whose, exc)
