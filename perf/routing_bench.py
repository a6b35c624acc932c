"""Routing: the cost of a decision for 1, 10 and 100 rules, and ``engine_load`` against ``round_robin`` in
front of two engines of unequal speed, side by side in one run.

    .venv/bin/python -m perf.routing_bench [--seconds 8] [--rounds 2] [-c 24]

Decision cost: ``Snapshot.decide`` in-process on a model whose N rules test a header, the request matching
only the last (the worst case: every rule is evaluated); best of 5 timed batches. The model with no rules
is the baseline every request without rules pays.

Unequal engines: two mock engines (``python -m gateway mock-engine``), one answering after 5 ms, the other
after 40 ms, both behind one gateway (2 workers, engine scrapes every 0.5 s). Model ``rr`` routes to a
round-robin pool of the two, ``el`` to an ``engine_load`` pool; wrk drives each in turn at the same
concurrency, rounds interleaved. Reported: req/s, p50, p90, p99 and the share each engine served.
I/O: starts the mock engines, the gateway and wrk, and stops them by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from pathlib import Path
from typing import Any

from gateway.routing.load import StaticLoad
from gateway.routing.rules import Facts
from gateway.snapshot import Principal, Snapshot
from perf.loadgen import run_wrk, write_script
from perf.targets import free_port, http_request

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-gw-routing-bench-000000000000000"


def decision_doc(rules: int) -> dict[str, Any]:
    backend = {"url": "http://127.0.0.1:9", "protocol": "openai"}
    target = [["pm", "b", "m"]]
    docs = [
        {
            "name": f"r{i}",
            "when": {"headers": {"x-tier": [f"tier-{i}"]}},
            "action": "route",
            "steps": [{"targets": target}],
        }
        for i in range(rules)
    ]
    return {
        "schema": 1,
        "revision": 1,
        "backends": {"b": backend},
        "routes": {
            "plain": {"canonical": "plain", "kind": "frontend", "targets": target},
            "ruled": {"canonical": "ruled", "kind": "frontend", "targets": target, "rules": docs},
        },
        "principals": {},
        "keys": {},
    }


def _timed_decision(snap: Snapshot, rules: int) -> float:
    """Best µs per decision for a request only the last of ``rules`` rules matches (0: a model without)."""
    principal = Principal("1", "p", True, frozenset())
    route = snap.routes["plain" if rules == 0 else "ruled"]
    facts = Facts(principal, {"x-tier": f"tier-{max(rules, 1) - 1}"}, None, 4, None, False, b"{}")
    load = StaticLoad()

    def one() -> None:
        snap.decide(route, facts if rules else None, load)

    number = max(1000, int(0.2 / max(timeit.timeit(one, number=200) / 200, 1e-9)))
    return min(timeit.repeat(one, number=number, repeat=5)) / number * 1e6


def decision_costs() -> list[tuple[str, float]]:
    out = []
    for rules in (0, 1, 10, 100):
        snap = Snapshot.from_doc(decision_doc(max(rules, 1)), 1)
        label = "no rules" if rules == 0 else f"{rules} rule{'s' if rules > 1 else ''}"
        out.append((label, _timed_decision(snap, rules)))
    return out


def gateway_config(fast: str, slow: str) -> str:
    lines = []
    for name, url in (("fast", fast), ("slow", slow)):
        lines += [f'[[backends]]\nname = "{name}"\nurl = "{url}"\nfirst_byte_timeout = 30.0\n']
        lines += [
            f'[[provider_models]]\nname = "pm-{name}"\nbackends = [{{ backend = "{name}", model = "m" }}]\n'
        ]
    for model, policy in (("rr", "round_robin"), ("el", "engine_load")):
        lines += [
            f'[[pools]]\nname = "{model}-pool"\npolicy = "{policy}"\nmembers = ["pm-fast", "pm-slow"]\n'
        ]
        lines += [f'[[models]]\nname = "{model}"\nchain = ["pm-fast"]\n']
        lines += [f'[[models.rules]]\nroute = ["{model}-pool"]\n']
    lines += [
        '[[roles]]\nname = "r"\npermissions = ["model/*"]\n',
        '[[principals]]\nname = "p"\nroles = ["r"]\n',
    ]
    lines += [f'[[keys]]\nname = "k"\nprincipal = "p"\nsecret = "{KEY}"\n']
    return "\n".join(lines)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http_request(port, "GET", path)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"nothing answered {path} on port {port}")


def _served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/mock/stats", timeout=5) as resp:
        stats = json.load(resp)
    return int(stats.get("by_path", {}).get("/v1/chat/completions", 0))


def unequal_engines(seconds: float, rounds: int, connections: int) -> dict[str, dict[str, float]]:
    results: dict[str, list[dict[str, float]]] = {"rr": [], "el": []}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as tmp:
        work = Path(tmp)
        try:
            ports = {}
            for name, delay in (("fast", "0.005"), ("slow", "0.04")):
                port = ports[name] = free_port()
                argv = [sys.executable, "-m", "gateway", "mock-engine", "--port", str(port), "--delay", delay]
                procs.append(_spawn(argv, work / f"{name}.log"))
                _wait(port, "/health")
            (work / "gw.toml").write_text(
                gateway_config(*(f"http://127.0.0.1:{ports[n]}" for n in ("fast", "slow")))
            )
            gw_port = free_port()
            argv = [
                sys.executable, "-m", "gateway", "serve", "--config", str(work / "gw.toml"),
                "--data-dir", str(work / "data"), "--port", str(gw_port), "--workers", "2",
                "--engine-scrape-interval", "0.5", "--no-usage-records",
            ]  # fmt: skip
            procs.append(_spawn(argv, work / "gateway.log"))
            _wait(gw_port, "/readyz")
            for _ in range(rounds):
                for model in ("rr", "el"):
                    body = json.dumps(
                        {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                    ).encode()
                    script = write_script(
                        work / f"{model}.lua",
                        body,
                        {"content-type": "application/json", "authorization": f"Bearer {KEY}"},
                    )
                    before = {n: _served(p) for n, p in ports.items()}
                    r = run_wrk(
                        f"http://127.0.0.1:{gw_port}/v1/chat/completions", script, connections, seconds
                    )
                    after = {n: _served(p) for n, p in ports.items()}
                    slow_share = (after["slow"] - before["slow"]) / max(
                        1, sum(after[n] - before[n] for n in ports)
                    )
                    results[model].append(
                        {
                            "rps": r.rps,
                            "p50": r.p50_ms,
                            "p90": r.p90_ms,
                            "p99": r.p99_ms,
                            "slow_share": slow_share,
                        }
                    )
                    print(
                        f"{model}: {r.rps:,.0f} req/s  p50 {r.p50_ms:.1f} ms  p99 {r.p99_ms:.1f} ms  "
                        f"slow engine served {100 * slow_share:.0f}%  non-2xx {r.non_2xx}",
                        file=sys.stderr,
                    )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per wrk cell")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-c", "--connections", type=int, default=24)
    parser.add_argument("--no-engines", action="store_true", help="decision cost only")
    args = parser.parse_args()
    when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    print(f"# Routing benchmark ({when}, `python -m perf.routing_bench`)\n")
    print("| model's rules | µs per decision |\n|---|---:|")
    for name, us in decision_costs():
        print(f"| {name} | {us:.2f} |")
    if args.no_engines:
        return
    os.environ.setdefault("GATEWAY_EVENT_LOOP", "uvloop")
    med = unequal_engines(args.seconds, args.rounds, args.connections)
    c, n = args.connections, args.rounds
    print(f"\nTwo engines (5 ms and 40 ms per answer), {c} connections, median of {n} rounds:\n")
    print(
        "| policy | req/s | p50 ms | p90 ms | p99 ms | slow engine's share |\n|---|---:|---:|---:|---:|---:|"
    )
    for model, label in (("rr", "round_robin"), ("el", "engine_load")):
        m = med[model]
        share = f"{100 * m['slow_share']:.0f}%"
        print(f"| {label} | {m['rps']:,.0f} | {m['p50']:.1f} | {m['p90']:.1f} | {m['p99']:.1f} | {share} |")


if __name__ == "__main__":
    main()
