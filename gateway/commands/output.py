"""How the ``gateway`` subcommands show themselves: tables, times, limits and budgets as text, and the
actor they write the audit log as. I/O: stdout (``print_table``).
"""

from __future__ import annotations

import getpass
import os
from datetime import UTC, datetime

from gateway.controlplane.config.specs import BudgetSpec, LimitsSpec

__all__ = ["budgets_text", "cli_actor", "limits_text", "print_table", "utc_time"]


def cli_actor() -> str:
    """The audit log's actor for a CLI command: the OS user running it."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no passwd entry (a container's arbitrary uid)
        return f"cli:uid {os.getuid()}"


def utc_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def limits_text(spec: LimitsSpec | None) -> str:
    if spec is None:
        return "-"
    values = (spec.requests_per_minute, spec.tokens_per_minute, spec.concurrent_requests)
    return ",".join(
        f"{name}={value}"
        for name, value in zip(("rpm", "tpm", "concurrency"), values, strict=True)
        if value is not None
    )


def budgets_text(specs: tuple[BudgetSpec, ...]) -> str:
    """Budgets in a table cell: ``day:tokens=1000;month:cost=300``."""
    if not specs:
        return "-"
    parts = []
    for spec in specs:
        caps = [f"tokens={spec.tokens}"] if spec.tokens is not None else []
        caps += [f"cost={spec.cost:.15g}"] if spec.cost is not None else []
        parts.append(f"{spec.period}:" + ",".join(caps))
    return ";".join(parts)


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
