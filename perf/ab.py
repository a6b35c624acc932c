"""A/B of gateway variants: the same upstream (the nginx mock), the same load, rounds interleaved in one
run, so that a change is measured against the build or setting before it and not against yesterday.

    .venv/bin/python -m perf.ab [--rounds 5] [-d 4] [-c 64] [--workers 2] VARIANT [VARIANT ...]

A variant is a configuration name, optionally followed by environment settings for the gateway:
``full:GATEWAY_CPU_AFFINITY=off`` or ``bare:GATEWAY_EVENT_LOOP=asyncio,GATEWAY_USAGE_RECORDS=0``. The
configurations (one principal, the bench key, the nginx mock behind an alias):

    bare        no limits, no budget, no prices, no usage records (``gateway-bare`` of perf.bench)
    full        every limit (requests, tokens, concurrency), a budget, prices, usage records (``gateway``)
    no-usage    as full, without usage records
    usage       usage records only: no limits, no budget, no prices
    rpm         one requests-per-minute limit on the principal, no usage records
    concurrency one concurrency limit on the principal, no usage records
    budget      a budget only, no usage records
    bodies      as full, and a [[body_logs]] entry that logs every request (redacting e-mails and cards)
    bodies-unpicked  as full, and a [[body_logs]] entry for another principal: the cost of asking

Each cell starts a fresh gateway, warms it for 2 s, and runs wrk; it prints req/s, p50 and the CPU µs per
request of each of the gateway's processes (from /proc, as perf.bench does). The table at the end has
the median of each variant over the rounds. I/O: starts nginx, the gateway and wrk; stops them by PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from perf.loadgen import run_wrk, write_script
from perf.scenarios import SMALL_BODY
from perf.targets import (
    ACCOUNTED,
    BENCH_KEY,
    CLK_TCK,
    GatewayService,
    NginxService,
    gateway_config,
)

# Body logs (issue 21 item 4): every request of the bench principal logged, or only another principal's.
BODIES_ALL = """
[[body_logs]]
name = "bench"
principals = ["bench"]
"""
BODIES_OTHER = """
[[principals]]
name = "other"
roles = ["bench"]

[[body_logs]]
name = "other"
principals = ["other"]
"""
# Per configuration: (what the principal gets, usage records on, what the file gets besides).
CONFIGS: dict[str, tuple[str, bool, str]] = {
    "bare": ("", False, ""),
    "full": (ACCOUNTED, True, ""),
    "no-usage": (ACCOUNTED, False, ""),
    "usage": ("", True, ""),
    "rpm": ("limits = { requests_per_minute = 1000000000 }", False, ""),
    "concurrency": ("limits = { concurrent_requests = 100000 }", False, ""),
    "budget": ('budget = { period = "day", tokens = 1000000000000, cost = 1000000000.0 }', False, ""),
    "bodies": (ACCOUNTED, True, BODIES_ALL),
    "bodies-unpicked": (ACCOUNTED, True, BODIES_OTHER),
}


@dataclass
class Variant:
    label: str
    config: str
    env: dict[str, str]
    rps: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str) -> Variant:
        name, _, settings = spec.partition(":")
        if name not in CONFIGS:
            raise SystemExit(f"unknown configuration {name!r}: one of {', '.join(CONFIGS)}")
        env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
        return cls(spec, name, env)


def config_text(upstream_url: str, name: str) -> tuple[str, bool]:
    """The gateway's TOML for configuration ``name`` (perf.targets' bare config, the principal's extras
    added), and whether usage records are on."""
    extra, usage, appended = CONFIGS[name]
    text = gateway_config(upstream_url, accounted=False)
    marker = 'roles = ["bench"]\n'
    return text.replace(marker, marker + extra + "\n", 1) + appended, usage


def run_cell(work: Path, upstream_url: str, variant: Variant, script: Path, args: argparse.Namespace) -> str:
    saved = {k: os.environ.get(k) for k in variant.env}
    os.environ.update(variant.env)  # the gateway's settings read GATEWAY_* from its environment
    try:
        text, usage = config_text(upstream_url, variant.config)
        gw = GatewayService(work, upstream_url, workers=args.workers, accounted=usage, config=text)
        gw.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        url = gw.url + "/v1/chat/completions"
        run_wrk(url, script, args.connections, 2, threads=2 if args.connections > 8 else 1)  # warm-up
        tree = gw.tree()
        before = tree.sample()
        r = run_wrk(url, script, args.connections, args.duration, threads=2 if args.connections > 8 else 1)
        after = tree.sample()
        labels = gw.process_labels()
    finally:
        gw.stop()
    by_role: dict[str, float] = {}
    for pid, ticks in after.ticks.items():
        role = labels.get(pid, "other").split("-")[0]
        spent = (ticks - before.ticks.get(pid, 0)) / CLK_TCK * 1e6 / max(1, r.requests)
        by_role[role] = by_role.get(role, 0.0) + spent
    cpu = sum(by_role.values())
    variant.rps.append(r.rps)
    variant.p50.append(r.p50_ms)
    variant.cpu.append(cpu)
    roles = ", ".join(f"{role} {us:.1f}" for role, us in sorted(by_role.items()) if us >= 0.05)
    bad = f"  non-2xx {r.non_2xx}" if r.non_2xx else ""
    return f"{r.rps:>9,.0f} req/s  p50 {r.p50_ms:.2f} ms  CPU {cpu:.1f} µs/req ({roles}){bad}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="configuration[:ENV=VALUE,...]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-d", "--duration", type=float, default=4.0, help="seconds per cell")
    parser.add_argument("-c", "--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    variants = [Variant.parse(spec) for spec in args.variants]
    with tempfile.TemporaryDirectory(prefix="perf-ab-") as tmp:
        work = Path(tmp)
        script = write_script(
            work / "req.lua",
            SMALL_BODY,
            {"content-type": "application/json", "authorization": f"Bearer {BENCH_KEY}"},
        )
        upstream = NginxService.upstream(work).start()
        try:
            for round_ in range(args.rounds):
                for i, variant in enumerate(variants):
                    cell = work / f"{round_}-{i}"
                    cell.mkdir()
                    line = run_cell(cell, upstream.url, variant, script, args)
                    print(f"round {round_ + 1} {variant.label:<28} {line}", flush=True)
        finally:
            upstream.stop()
    first = statistics.median(variants[0].rps)
    print(
        f"\n{args.connections} connections, {args.workers} workers, median of {args.rounds} rounds of"
        f" {args.duration:g} s"
    )
    print("\n| variant | req/s | vs first | p50 ms | CPU µs/req |\n|---|---:|---:|---:|---:|")
    for v in variants:
        rps = statistics.median(v.rps)
        print(
            f"| {v.label} | {rps:,.0f} | {rps / first - 1:+.1%} | {statistics.median(v.p50):.2f} |"
            f" {statistics.median(v.cpu):.1f} |"
        )


if __name__ == "__main__":
    main()
