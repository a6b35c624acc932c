"""Budget alerts: when a principal's spend in its current budget window crosses one of its thresholds
(``alerts = [0.5, 0.8, 1.0]`` in its budget), say so once per threshold and window: a WARNING log line on
``gateway.controlplane``, the Prometheus gauges ``gateway_budget_used_ratio`` and
``gateway_budget_alert_threshold`` (the highest threshold reached), and, when ``--budget-alert-webhook``
is set, a JSON POST to that URL from the control worker.

The spend is the window's live counter plus its base, read from the host's bucket table, as the request
path enforces it. Which thresholds fired is kept in memory per window: a control worker that restarts
says once more what the current window has already crossed. I/O: the webhook POST (``send``); the rest
reads shared memory only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.budget import Budget, format_money

__all__ = ["Alert", "BudgetAlerts", "send"]

log = logging.getLogger("gateway.controlplane")

WEBHOOK_TIMEOUT = 5.0
_LONGEST_WINDOW = 400 * 86400.0  # what a window's fired thresholds are remembered for, at most


@dataclass(frozen=True, slots=True)
class Alert:
    principal: str
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
        return (
            f"budget alert: principal {self.principal} has used {self.used:.0%} of its {self.period} budget "
            f"({spent}), past its {self.threshold:.0%} threshold; the window resets at {resets}"
        )

    def document(self) -> dict[str, Any]:
        return {
            "event": "budget_threshold",
            "principal": self.principal,
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
        self.thresholds: dict[str, tuple[float, ...]] = {}  # principal id -> ascending thresholds
        self._fired: dict[tuple[str, float], float] = {}  # (principal id, window start) -> highest fired
        self.gauges: dict[tuple[str, str], tuple[float, float]] = {}  # (name, period) -> (used, reached)

    def set_thresholds(self, principals: dict[str, Any]) -> None:
        self.thresholds = {
            pid: tuple(sorted(float(t) for t in alerts))
            for pid, doc in principals.items()
            if (alerts := (doc.get("budget") or {}).get("alerts"))
        }

    def check(
        self,
        budgets: dict[str, Budget],
        spend: dict[str, tuple[int, int]],
        names: dict[str, str],
        now: float,
    ) -> list[Alert]:
        """The alerts newly due: ``spend`` is each budget's current window spend (tokens, nano-units)."""
        due: list[Alert] = []
        gauges: dict[tuple[str, str], tuple[float, float]] = {}
        for pid, budget in budgets.items():
            if pid not in spend:
                continue
            tokens, cost = spend[pid]
            used = max(
                tokens / budget.tokens if budget.tokens else 0.0,
                cost / budget.cost if budget.cost else 0.0,
            )
            start, end = budget.window(now)
            thresholds = self.thresholds.get(pid, ())
            reached = max((t for t in thresholds if used >= t), default=0.0)
            name = names.get(pid, pid)
            gauges[(name, budget.period)] = (used, reached)
            fired = self._fired.get((pid, start), 0.0)
            if reached > fired:
                self._fired[(pid, start)] = reached
                due.append(
                    Alert(
                        name,
                        budget.period,
                        reached,
                        used,
                        tokens,
                        budget.tokens,
                        cost,
                        budget.cost,
                        start,
                        end,
                    )
                )
        self.gauges = gauges
        # Windows that have ended need no memory of what they fired.
        self._fired = {k: v for k, v in self._fired.items() if k[1] + _LONGEST_WINDOW > now}
        for alert in due:
            log.warning("%s", alert.message())
        return due

    def render(self) -> list[str]:
        out = [
            "# HELP gateway_budget_used_ratio Spend in the current budget window over the budget (the larger "
            "of tokens and cost).",
            "# TYPE gateway_budget_used_ratio gauge",
        ]
        for (name, period), (used, _) in sorted(self.gauges.items()):
            out.append(
                f'gateway_budget_used_ratio{{principal="{_escape(name)}",period="{period}"}} {used:.6f}'
            )
        out += [
            "# HELP gateway_budget_alert_threshold The highest alert threshold the current window has "
            "reached (0: none).",
            "# TYPE gateway_budget_alert_threshold gauge",
        ]
        for (name, period), (_, reached) in sorted(self.gauges.items()):
            out.append(
                f'gateway_budget_alert_threshold{{principal="{_escape(name)}",period="{period}"}} {reached:g}'
            )
        return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def send(client: httpx.AsyncClient, url: str, alerts: list[Alert]) -> None:
    """POST each alert to the webhook; a failure is logged and not retried (the log line stands)."""
    for alert in alerts:
        try:
            resp = await client.post(url, json=alert.document(), timeout=WEBHOOK_TIMEOUT)
            if resp.status_code >= 300:
                log.warning("budget alert webhook answered HTTP %d for %s", resp.status_code, alert.principal)
        except httpx.HTTPError as exc:
            log.warning("budget alert webhook failed for %s: %s", alert.principal, exc)
