"""The start and end of a usage query as an operator writes them: ``30m``, ``24h``, ``7d`` (that long ago)
or a timestamp. ``gateway usage --since/--until`` and ``GET /admin/usage?since=&until=`` read them alike.
No I/O.
"""

from __future__ import annotations

import re

from gateway.controlplane.config.values import parse_timestamp
from gateway.errors import ConfigError

__all__ = ["since_arg"]

_AGO = re.compile(r"^([1-9][0-9]*)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_arg(raw: str, now: float) -> float:
    """Unix seconds from ``30m``/``24h``/``7d`` (that long ago) or an RFC 3339 timestamp / unix seconds."""
    if m := _AGO.match(raw):
        return now - int(m.group(1)) * _SECONDS[m.group(2)]
    value: str | float = raw
    try:
        value = float(raw)
    except ValueError:
        pass
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise ConfigError(f"{raw!r}: {exc} (or a duration such as 24h)") from None
