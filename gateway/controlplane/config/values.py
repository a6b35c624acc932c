"""The checks a configuration value passes wherever it comes from: a config file, a CLI flag, the admin
API, or a row the snapshot builder reads back from the store. Each returns the problem in words (or
raises ``ValueError`` with it), for the caller to report in its own form. No I/O.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime

__all__ = [
    "MAX_BUDGET_COST",
    "MAX_LIMIT",
    "MAX_PRICE",
    "check_limit",
    "check_name",
    "check_url",
    "parse_timestamp",
]

# Far above any real limit, and far below the 64-bit integers the store and the shared buckets hold.
MAX_LIMIT = 10**12
# Prices per million tokens and budgets in currency units; spend is summed in nano-units in 64 bits.
MAX_PRICE = 10**6
MAX_BUDGET_COST = 10**9

_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


def check_name(value: object) -> str | None:
    """The problem with a name, or None. Names are 1-200 characters without whitespace or controls."""
    if not isinstance(value, str):
        return "must be a string"
    if not _NAME.fullmatch(value):
        return "must be 1-200 characters without whitespace or control characters"
    return None


def check_url(value: object) -> str | None:
    if not isinstance(value, str) or not _URL.fullmatch(value):
        return "must be an http:// or https:// URL"
    return None


def check_limit(value: object) -> str | None:
    """The problem with one limit value, or None. Limits are positive integers (not booleans)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return "must be a positive integer"
    if value > MAX_LIMIT:
        return f"must be at most {MAX_LIMIT}"
    return None


def parse_timestamp(value: object) -> float:
    """Unix seconds from an RFC 3339 string or TOML datetime (with an offset) or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("must be an RFC 3339 timestamp or unix seconds")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError("must be a non-negative number of unix seconds")
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("must be an RFC 3339 timestamp such as 2027-01-01T00:00:00Z") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("must carry a UTC offset, e.g. 2027-01-01T00:00:00Z")
        return value.timestamp()
    if isinstance(value, date):
        raise ValueError("must be a date-time with a UTC offset, not a bare date")
    raise ValueError("must be an RFC 3339 timestamp or unix seconds")
