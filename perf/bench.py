"""``python -m perf.bench``: the single-host benchmark, every target measured side by side in one run.

An nginx mock engine answers a fixed chat.completion; wrk POSTs small non-streamed chat requests to it
directly, through a plain nginx reverse proxy, and through the gateway, at each connection count. Per
cell: req/s, latency percentiles, error counts, the proxy's CPU µs per request and its peak RSS. Prints a
Markdown table and writes perf/results/latest.json and latest.md (see perf/README.md).
I/O: subprocesses (nginx, the gateway, wrk), a temp directory, /proc, the results files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

from perf.loadgen import WrkResult, run_wrk, write_script, wrk_version
from perf.nginx import nginx_version
from perf.targets import (
    BENCH_KEY,
    BENCH_MODEL,
    CLK_TCK,
    ROOT,
    GatewayService,
    NginxService,
    Service,
    http_request,
    machine_cpu_ticks,
)

__all__ = ["main"]

# gateway: rate limits, a budget, prices and usage records on every request; gateway-bare: all of it off.
TARGETS = ("direct", "nginx", "gateway", "gateway-bare")
REFERENCE = "nginx"  # ratios are to this target's figures in the same scenario
PATH = "/v1/chat/completions"
REQUEST_BODY = json.dumps(
    {"model": BENCH_MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16},
    separators=(",", ":"),
).encode()
REQUEST_HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {BENCH_KEY}"}


@dataclass(slots=True)
class Target:
    """Where wrk sends requests, and which processes count as the proxy (none for ``direct``)."""

    name: str
    port: int
    proxy: Service | None


@dataclass(slots=True)
class Cell:
    """One target under one scenario. CPU figures are CPU seconds per wall second (cores in use)."""

    scenario: str
    target: str
    wrk: WrkResult
    round: int = 0
    cpu_us_per_request: float | None = None
    proxy_cpu_cores: float | None = None
    peak_rss_mib: float | None = None  # sum of VmHWM over the proxy's processes
    pss_mib: float | None = None  # sum of PSS at the end of the cell: shared pages counted once
    proxy_cpu_s_by_process: dict[str, float] = field(default_factory=dict)  # "role:pid" -> CPU seconds
    upstream_cpu_cores: float = 0.0  # shows whether the mock engine could have been the bottleneck
    wrk_cpu_cores: float = 0.0
    machine_busy_cores: float = 0.0  # everything on the machine, other users included
    machine_steal_cores: float = 0.0

    @property
    def other_cores(self) -> float:
        """Machine CPU use not charged to the proxy, the mock engine or wrk: kernel network work done in
        softirq context, this script, and anything else running on the machine (other people's tests)."""
        ours = (self.proxy_cpu_cores or 0.0) + self.upstream_cpu_cores + self.wrk_cpu_cores
        return max(0.0, self.machine_busy_cores - ours)

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "wrk"}
        return {**d, "other_cores": self.other_cores, **self.wrk.as_dict()}


@dataclass(slots=True)
class Run:
    args: argparse.Namespace
    cells: list[Cell] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 s cells, 1 s warm-up (for development)")
    p.add_argument("-d", "--duration", type=int, help="seconds per measured cell (10; --quick: 3)")
    p.add_argument("--warmup", type=int, help="seconds of unmeasured load before each cell (2; --quick: 1)")
    p.add_argument("-c", "--connections", default="8,64", help="comma-separated connection counts (8,64)")
    p.add_argument("-t", "--threads", type=int, default=2, help="wrk threads (2)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every target this many times, interleaved; tables show each one's median (1)",
    )
    p.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated subset of {','.join(TARGETS)}"
    )
    p.add_argument(
        "--workers", type=int, default=2, help="gateway proxy workers and nginx worker_processes (2)"
    )
    p.add_argument("--results-dir", type=Path, default=ROOT / "perf" / "results", help="where latest.* go")
    p.add_argument("--no-save", action="store_true", help="print the table only; leave perf/results alone")
    args = p.parse_args(argv)
    args.duration = args.duration or (3 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.connections = [int(c) for c in str(args.connections).split(",") if c]
    args.targets = [t for t in str(args.targets).split(",") if t]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    return args


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop every process


def check_target(target: Target) -> None:
    """One request before measuring: a target that answers errors would only measure its error path."""
    status, body = http_request(target.port, "POST", PATH, REQUEST_BODY, REQUEST_HEADERS)
    if status != 200 or b'"choices"' not in body:
        raise RuntimeError(f"{target.name}: POST {PATH} answered {status}: {body[:300]!r}")


@contextlib.contextmanager
def started_targets(workdir: Path, run: Run) -> Iterator[tuple[NginxService, list[Target]]]:
    """Start the upstream and every requested target; stop all of them, whatever happens."""
    services: list[Service] = []
    try:
        upstream = NginxService.upstream(workdir)
        services.append(upstream)
        upstream.start()
        targets: list[Target] = []
        for name in run.args.targets:
            service: Service | None = None
            try:
                if name == "nginx":
                    service = NginxService.proxy(workdir, upstream.port, workers=run.args.workers)
                elif name in ("gateway", "gateway-bare"):
                    service = GatewayService(
                        workdir, upstream.url, workers=run.args.workers, accounted=name == "gateway"
                    )
                if service is not None:
                    services.append(service)
                    service.start()
                target = Target(name, service.port if service else upstream.port, service)
                check_target(target)
                targets.append(target)
            except (RuntimeError, TimeoutError, OSError) as exc:
                run.failures[name] = str(exc)
                print(f"!! {name} not measured: {exc}", file=sys.stderr)
        yield upstream, targets
    finally:
        for service in reversed(services):
            service.stop()


def measure(
    target: Target, upstream: NginxService, script: Path, connections: int, args: argparse.Namespace
) -> Cell:
    """Warm up, then one measured wrk run with /proc samples of the proxy, the upstream and the machine
    taken just before and just after it."""
    url = f"http://127.0.0.1:{target.port}{PATH}"
    if args.warmup > 0:
        run_wrk(url, script, connections, args.warmup, args.threads)
    proxy_tree = target.proxy.tree() if target.proxy else None
    up_tree = upstream.tree()
    before = proxy_tree.sample() if proxy_tree else None
    up_before, busy_before, wrk_before = up_tree.sample(), machine_cpu_ticks(), _children_cpu_s()
    started = time.monotonic()
    result = run_wrk(url, script, connections, args.duration, args.threads)
    wall = time.monotonic() - started
    up_after, busy_after, wrk_after = up_tree.sample(), machine_cpu_ticks(), _children_cpu_s()
    after = proxy_tree.sample() if proxy_tree else None
    cell = Cell(
        f"c{connections}",
        target.name,
        result,
        upstream_cpu_cores=up_after.cpu_seconds_since(up_before) / wall,
        wrk_cpu_cores=(wrk_after - wrk_before) / wall,  # the only child reaped in between is wrk
        machine_busy_cores=(busy_after[0] - busy_before[0]) / CLK_TCK / wall,
        machine_steal_cores=(busy_after[1] - busy_before[1]) / CLK_TCK / wall,
    )
    if target.proxy is not None and before is not None and after is not None:
        cpu = after.cpu_seconds_since(before)
        cell.cpu_us_per_request = cpu * 1e6 / result.requests if result.requests else None
        cell.proxy_cpu_cores = cpu / wall
        cell.peak_rss_mib = after.peak_rss_bytes / 2**20
        cell.pss_mib = after.pss_bytes / 2**20
        labels = target.proxy.process_labels()
        by_pid = after.cpu_seconds_by_pid(before)
        cell.proxy_cpu_s_by_process = {
            f"{labels.get(pid, 'gone')}:{pid}": round(seconds, 3) for pid, seconds in sorted(by_pid.items())
        }
    return cell


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
    versions = {"python": platform.python_version(), "nginx": nginx_version(), "wrk": wrk_version()}
    for pkg in ("granian", "aiohttp"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "versions": versions,
        "git": _git_revision(),
    }


def _git_revision() -> str:
    def git(*args: str) -> str:
        cmd = ["git", "--no-optional-locks", *args]  # never take the index lock others may hold
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        rev = git("rev-parse", "--short", "HEAD") or "unknown"
        return rev + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def render_table(cells: Sequence[Cell]) -> str:
    ref = {c.scenario: c for c in cells if c.target == REFERENCE}
    head = (
        "| conns | target | req/s | x nginx req/s | p50 ms | x nginx p50 | p90 ms | p99 ms | non-2xx "
        "| socket errors | CPU µs/req | peak RSS MiB |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        r = ref.get(c.scenario)
        rps_ratio = c.wrk.rps / r.wrk.rps if r and r.wrk.rps else None
        p50_ratio = c.wrk.p50_ms / r.wrk.p50_ms if r and r.wrk.p50_ms else None
        lines.append(
            f"| {c.wrk.connections} | {c.target} | {c.wrk.rps:,.0f} | {_num(rps_ratio, '.2f')}x "
            f"| {c.wrk.p50_ms:.2f} | {_num(p50_ratio, '.2f')}x | {c.wrk.p90_ms:.2f} | {c.wrk.p99_ms:.2f} "
            f"| {c.wrk.non_2xx} | {c.wrk.socket_errors} | {_num(c.cpu_us_per_request, '.1f')} "
            f"| {_num(c.peak_rss_mib, '.1f')} |"
        )
    return "\n".join(lines)


def medians(cells: Sequence[Cell]) -> list[Cell]:
    """One cell per scenario and target: the median by req/s of its rounds, in first-seen order."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.scenario, c.target), []).append(c)
    return [sorted(g, key=lambda c: c.wrk.rps)[(len(g) - 1) // 2] for g in groups.values()]


def render_accounting(cells: Sequence[Cell]) -> str:
    """What rate limits, a budget and usage records cost: the gateway with them against without them."""
    bare = {c.scenario: c for c in cells if c.target == "gateway-bare"}
    lines = []
    for c in cells:
        b = bare.get(c.scenario)
        if c.target != "gateway" or b is None or not b.wrk.rps:
            continue
        cpu = (
            f", CPU {c.cpu_us_per_request:.1f} vs {b.cpu_us_per_request:.1f} µs/req"
            if c.cpu_us_per_request and b.cpu_us_per_request
            else ""
        )
        lines.append(
            f"- {c.wrk.connections} connections: {c.wrk.rps:,.0f} vs {b.wrk.rps:,.0f} req/s, "
            f"{(1 - c.wrk.rps / b.wrk.rps) * 100:+.1f}% throughput cost{cpu}"
        )
    if not lines:
        return ""
    head = "Limits, budget and usage records on (gateway) against off (gateway-bare), same run:"
    return "\n".join([head, "", *lines])


def render_markdown(run: Run, meta: dict[str, Any]) -> str:
    m = meta["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    parts = [
        "# Benchmark: single-host gateway",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}",
        f"- versions: {versions}; git {m['git']}",
        f"- load: wrk -t{run.args.threads}, {run.args.duration} s per cell after {run.args.warmup} s "
        f"warm-up; POST {PATH}, {len(REQUEST_BODY)}-byte body, non-streamed; "
        f"proxies run {run.args.workers} workers",
        "",
        render_table(medians(run.cells)),
        "",
    ]
    if run.args.rounds > 1:
        parts[-1:-1] = [f"Each row is the median (by req/s) of {run.args.rounds} interleaved rounds.", ""]
    if accounting := render_accounting(medians(run.cells)):
        parts += [accounting, ""]
    if run.cells:
        busiest = max(c.upstream_cpu_cores for c in run.cells)
        other = max(c.other_cores for c in run.cells)
        parts.append(
            f"Mock engine (nginx, 1 worker) CPU use peaked at {busiest:.2f} cores in any cell; CPU used by"
            f" neither the targets nor wrk (kernel softirq, other processes) peaked at {other:.2f} cores"
            f" of {meta['machine']['nproc']}. Per-cell CPU, PSS and per-process figures are in latest.json."
        )
    for name, why in run.failures.items():
        parts.append(f"\n**{name} not measured:**\n\n```\n{why.strip()[-2000:]}\n```")
    return "\n".join(parts) + "\n"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _progress(cell: Cell) -> None:
    w = cell.wrk
    print(
        f"{cell.scenario:<5} {cell.target:<12} {w.rps:>9,.0f} req/s  p50 {w.p50_ms:.2f} ms"
        f"  p99 {w.p99_ms:.2f} ms  non-2xx {w.non_2xx}  cpu {_num(cell.cpu_us_per_request, '.1f')} us/req",
        file=sys.stderr,
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    run = Run(args)
    command = shlex.join(["python", "-m", "perf.bench", *(sys.argv[1:] if argv is None else argv)])
    with tempfile.TemporaryDirectory(prefix="perf-bench-") as tmp:
        workdir = Path(tmp)
        script = write_script(workdir / "chat.lua", REQUEST_BODY, REQUEST_HEADERS)
        with started_targets(workdir, run) as (upstream, targets):
            # Targets interleave within a scenario so that each ratio compares neighbouring minutes.
            for connections in args.connections:
                for round_ in range(args.rounds):
                    for target in targets:
                        cell = measure(target, upstream, script, connections, args)
                        cell.round = round_
                        run.cells.append(cell)
                        _progress(cell)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine_info(),
    }
    md = render_markdown(run, meta)
    print(md)
    if not args.no_save:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        settings = {k: (_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        doc = {
            **meta,
            "settings": settings,
            "cells": [c.as_dict() for c in run.cells],
            "failures": run.failures,
        }
        (args.results_dir / "latest.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        (args.results_dir / "latest.md").write_text(md)
        print(f"wrote {args.results_dir / 'latest.json'} and latest.md", file=sys.stderr)
    errors = sum(c.wrk.non_2xx + c.wrk.socket_errors for c in run.cells)
    return 1 if run.failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
