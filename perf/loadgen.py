"""wrk as the load generator: a Lua script that POSTs a fixed body, and the parsing of its results.

The script's ``done`` hook prints one machine-readable line (requests, errors, latency percentiles up to
p99.99 from wrk's own histogram), so nothing depends on wrk's human-oriented text. No per-response Lua hook is
defined: wrk would then build a Lua table for every response and become the bottleneck.
I/O: writes the script file, runs wrk.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["PERCENTILES", "WrkResult", "run_wrk", "write_script", "wrk_version"]

_MARK = "BENCH_RESULT "

# Percentiles printed by the done hook (wrk's histogram has microsecond resolution); "max" is added.
PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)

_DONE = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  local p = {}
  for _, q in ipairs({PCTS}) do
    p[#p + 1] = string.format("\"%s\":%d", tostring(q), latency:percentile(q))
  end
  io.write(string.format(
    "%s{\"requests\":%d,\"duration_us\":%d,\"bytes\":%d,\"status_errors\":%d,\"connect\":%d," ..
    "\"read\":%d,\"write\":%d,\"timeout\":%d,\"max_us\":%d,\"mean_us\":%.1f,\"pct_us\":{%s}}\n",
    "MARK", summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read, e.write,
    e.timeout, latency.max, latency.mean, table.concat(p, ",")))
end
""".replace("MARK", _MARK).replace("PCTS", ", ".join(repr(q) for q in PERCENTILES))


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run. ``non_2xx`` is wrk's "Non-2xx or 3xx responses" (statuses >= 400, as wrk counts them);
    ``socket_errors`` sums connect, read, write and timeout errors."""

    connections: int
    threads: int
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float
    non_2xx: int
    socket_errors: int
    error_detail: dict[str, int]
    percentiles_ms: dict[str, float]  # "50", "99.9", ... and "max", for the latency plots

    @property
    def ok_rps(self) -> float:
        """Answers below 400 per second (for a rate-limited key: the admitted ones)."""
        return (self.requests - self.non_2xx) / self.duration_s if self.duration_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lua_string(text: str) -> str:
    """A Lua long-bracket literal, which needs no escaping as long as its closing bracket is absent."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[{text}]{eq}]"


def write_script(path: Path, body: bytes, headers: dict[str, str]) -> Path:
    """A wrk script sending ``body`` as a POST with ``headers`` (Content-Type included by the caller)."""
    lines = ['wrk.method = "POST"', f"wrk.body = {_lua_string(body.decode())}"]
    lines += [f"wrk.headers[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in headers.items()]
    path.write_text("\n".join(lines) + "\n" + _DONE)
    return path


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise FileNotFoundError("wrk not found: run ./scripts/system-deps.sh bench")
    return found


def wrk_version() -> str:
    out = subprocess.run([wrk_binary(), "-v"], capture_output=True, text=True).stdout
    m = re.search(r"wrk (\S+)", out)
    return m.group(1) if m else "unknown"


def run_wrk(url: str, script: Path, connections: int, duration_s: float, threads: int = 2) -> WrkResult:
    """Run wrk against ``url`` for ``duration_s`` seconds (whole seconds, at least 1)."""
    threads = max(1, min(threads, connections))
    seconds = max(1, round(duration_s))
    argv = [wrk_binary(), "--latency", f"-t{threads}", f"-c{connections}", f"-d{seconds}s"]
    argv += ["-s", str(script), url]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            raw = json.loads(line[len(_MARK) :])
            break
    else:
        raise RuntimeError(f"wrk printed no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    duration = raw["duration_us"] / 1e6
    detail = {k: int(raw[k]) for k in ("connect", "read", "write", "timeout")}
    # Lua's tostring gives "50.0", "99.9", "99.99": key by the same text Python gives those floats.
    pct = {str(float(k)): v / 1000 for k, v in raw["pct_us"].items()}
    pct["max"] = raw["max_us"] / 1000
    return WrkResult(
        connections=connections,
        threads=threads,
        requests=int(raw["requests"]),
        duration_s=round(duration, 3),
        rps=raw["requests"] / duration if duration else 0.0,
        p50_ms=pct["50.0"],
        p90_ms=pct["90.0"],
        p99_ms=pct["99.0"],
        p999_ms=pct["99.9"],
        max_ms=pct["max"],
        mean_ms=raw["mean_us"] / 1000,
        non_2xx=int(raw["status_errors"]),
        socket_errors=sum(detail.values()),
        error_detail=detail,
        percentiles_ms=pct,
    )
