"""Routing: the cost of a decision for 1, 10 and 100 rules, ``engine_load`` against ``round_robin`` in
front of two engines of unequal speed, and routing quality on a simulated vLLM fleet against SGLang Model
Gateway, in one run.

    .venv/bin/python -m perf.routing_bench [--seconds 8] [--rounds 2] [-c 24]
        [--sessions 200] [--seed 1] [--load moderate|high|both] [--routers smg,round_robin,...]
        [--fairness] [--quick] [--no-quality | --quality-only]

Decision cost: ``Snapshot.decide`` in-process on a model whose N rules test a header, the request matching
only the last (the worst case: every rule is evaluated); best of 5 timed batches. The model with no rules
is the baseline every request without rules pays.

Unequal engines: two mock engines (``python -m gateway mock-engine``), one answering after 5 ms, the other
after 40 ms, both behind one gateway (2 workers, engine scrapes every 0.5 s). Model ``rr`` routes to a
round-robin pool of the two, ``el`` to an ``engine_load`` pool; wrk drives each in turn at the same
concurrency, rounds interleaved. Reported: req/s, p50, p90, p99 and the share each engine served.

Routing quality (``perf.routing_quality``, workload ``perf.multiturn``): 200 multi-turn chat sessions over
four shared system prompts of 2,000-6,000 tokens through each router over four simulated vLLM engines with
prefix caches (restarted cold for each router): ``smg launch --policy cache_aware`` (installed by
scripts/bench-peers.sh under perf/.peers/smg; its rows are left out without it) and the gateway once per
pool policy (every policy of ``gateway.routing.policies.POLICIES`` among round_robin, engine_load,
prefix_affinity and cache_aware by default). Two loads: ``moderate`` and ``high`` sessions at once, each
thinking ``--think`` seconds on average between turns. Reported per router: TTFT p50/p90/p99, prefix hit
ratio (cached over prompt tokens in the usage the client received, and as the engines counted), requests
and the longest waiting queue per engine, errors, the achieved request rate and the client's CPU.
``--fairness``: tenant B alone, then beside a sheddable tenant A at five times B's rate (needs the gateway's
flow control; without it, a line says the config was refused).
I/O: starts the mock engines, the gateway, smg and wrk, and stops them by PID.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.native import PrefixIndex
from gateway.routing.load import StaticLoad
from gateway.routing.policies import POLICIES
from gateway.routing.rules import Facts
from gateway.snapshot import Principal, Snapshot
from perf import routing_quality as rq
from perf.loadgen import run_wrk, write_script
from perf.multiturn import TURNS, make_workload
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


def cache_aware_doc() -> dict[str, Any]:
    """Model ``kv`` whose one rule routes to a ``cache_aware`` pool of four backends."""
    backends = {f"e{i}": {"url": f"http://127.0.0.1:{9000 + i}", "protocol": "openai"} for i in range(4)}
    targets = [["pm", name, "m"] for name in backends]
    rule = {"name": "kv", "when": {}, "action": "route", "steps": [{"pool": "fleet"}]}
    return {
        "schema": 1,
        "revision": 1,
        "backends": backends,
        "pools": {"fleet": {"policy": "cache_aware", "targets": targets}},
        "routes": {"kv": {"canonical": "kv", "kind": "frontend", "targets": targets[:1], "rules": [rule]}},
        "principals": {},
        "keys": {},
    }


def _timed_cache_aware(prompt_bytes: int) -> float:
    """Best µs per decision of a ``cache_aware`` pool for a conversation of ``prompt_bytes`` (its next turn
    each time, as a session's turns come: the index holds all but the last turn)."""
    snap = Snapshot.from_doc(cache_aware_doc(), 1)
    route = snap.routes["kv"]
    load = StaticLoad(index=PrefixIndex.private(1 << 16))
    principal = Principal("1", "p", True, frozenset())
    system = ("word " * (prompt_bytes // 5))[:prompt_bytes]
    body = json.dumps(
        {"model": "kv", "stream": True, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "next question"}]}
    ).encode()  # fmt: skip
    facts = Facts(principal, {}, None, len(body) // 4, None, True, body)

    def one() -> None:
        snap.decide(route, facts, load)

    number = max(200, int(0.2 / max(timeit.timeit(one, number=50) / 50, 1e-9)))
    return min(timeit.repeat(one, number=number, repeat=5)) / number * 1e6


def decision_costs() -> list[tuple[str, float]]:
    out = []
    for rules in (0, 1, 10, 100):
        snap = Snapshot.from_doc(decision_doc(max(rules, 1)), 1)
        label = "no rules" if rules == 0 else f"{rules} rule{'s' if rules > 1 else ''}"
        out.append((label, _timed_decision(snap, rules)))
    for size in (2_000, 24_000, 100_000):
        out.append(
            (f"1 rule to a cache_aware pool of 4, a {size // 1000} kB prompt", _timed_cache_aware(size))
        )
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


QUALITY_POLICIES = ("round_robin", "engine_load", "prefix_affinity", "cache_aware")


def quality(args: argparse.Namespace) -> None:
    """The routing-quality tables (and the fairness one with ``--fairness``) on stdout."""
    turns = (2, 2) if args.quick else TURNS
    workload = make_workload(args.sessions, args.seed, turns=turns)
    loads = [rq.Load("moderate", args.moderate, args.think), rq.Load("high", args.high, args.think)]
    loads = [ld for ld in loads if args.load in (ld.name, "both")]
    sim = rq.sim_available()
    print(
        f"\n## Routing quality: {len(workload.sessions)} sessions, {workload.requests} requests, seed "
        f"{args.seed}, {turns[0]}-{turns[1]} turns, 4 simulated engines\n"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="routing-quality-") as tmp:
        tokenizer = _tokenizer(args.tokenizer, Path(tmp))
        scale = 1.0
        if tokenizer:
            scale = _tokens_per_4_bytes(tokenizer, workload.systems)
            what = "a BPE of 16,384 tokens trained on docs/" if args.tokenizer == "train" else args.tokenizer
            print(
                f"- engines tokenize with {what} (its chat template and tokenizer.json; "
                f"{4 / scale:.2f} bytes a token on the system prompts, caches sized in its tokens) and "
                "publish their KV events, whichever the router"
            )
        for load in loads:
            flags, line = rq.plan_cache(workload, load, args.cache_share, sim, scale)
            # Each session sends its next turn a think time after its answer: at most active / think
            # requests per second, less by the answers' own time (the achieved rate is in the table).
            print(
                f"- {load.name}: {load.active} sessions at once, think {load.think:g} s mean, offering at "
                f"most {load.active / load.think:.1f} req/s; {line}"
            )
            for router in args.routers:
                work = Path(tmp) / f"{load.name}-{router}"
                work.mkdir()
                run = rq.run_router(router, workload, load, work, flags, tokenizer=tokenizer)
                if run.skipped:
                    print(f"  - {router}: skipped, {run.skipped}")
                    continue
                m = rq.summary(run)
                print(
                    f"  {load.name} {router}: {m['requests']} requests in {run.seconds:.0f} s "
                    f"({m['rps']:.1f}/s), TTFT p50 {m['p50']:.0f} ms, hit {m['hit']:.2f}, "
                    f"errors {m['errors']} {m['statuses']}, machine CPU {100 * m['busy']:.0f}% busy",
                    file=sys.stderr,
                )
                engines_hit = m["hit_engines"] if not math.isnan(m["hit_engines"]) else m["hit_metric"]
                if abs(engines_hit - m["hit"]) > 0.02:  # the usage the client got is not the engines' count
                    print(f"  !! {router}: hit ratio {m['hit']:.3f} in usage, {engines_hit:.3f} in engines")
                rows.append((load, router, m))
    if not rows:
        if args.fairness:
            fairness(args, workload, sim)
        return
    print(
        "\n| load | router | TTFT p50 ms | p90 | p99 | prefix hit ratio | engines' hit ratio "
        "| requests per engine | max waiting per engine | errors | req/s | client CPU (of a core) "
        "| machine busy |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for load, router, m in rows:
        label = "smg cache_aware" if router == "smg" else f"gateway {router}"
        engines_hit = m["hit_engines"] if not math.isnan(m["hit_engines"]) else m["hit_metric"]
        waiting = "/".join(map(str, m["max_waiting"])) or "-"
        errors = f"{m['errors']}" + (f" ({', '.join(map(str, m['statuses']))})" if m["statuses"] else "")
        print(
            f"| {load.name} | {label} | {m['p50']:.0f} | {m['p90']:.0f} | {m['p99']:.0f} | {m['hit']:.2f} "
            f"| {engines_hit:.2f} | {'/'.join(map(str, m['per_engine']))} | {waiting} | {errors} "
            f"| {m['rps']:.1f} | {100 * m['cpu']:.1f}% | {100 * m['busy']:.0f}% |"
        )
    if args.fairness:
        fairness(args, workload, sim)


def _tokenizer(wanted: str | None, tmp: Path) -> str | None:
    """The engines' model directory: ``train`` makes one (a byte-level BPE of 16,384 tokens trained on the
    repository's docs, as ``perf.micro_tokenize`` does), a path is taken as it is."""
    if wanted != "train":
        return wanted
    from perf.micro_tokenize import ROOT, model_dir

    text = "\n".join(f.read_text() for f in sorted((ROOT / "docs").glob("*.md")))
    directory = tmp / "model"
    directory.mkdir()
    return str(model_dir(directory, text, 16384))


def _tokens_per_4_bytes(model: str, texts: Sequence[str]) -> float:
    """The engines' tokens per 4 bytes of the workload's text under ``model``'s tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    tokens = sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts)
    return tokens / (sum(len(t.encode()) for t in texts) / 4)


def fairness(args: argparse.Namespace, workload: Any, sim: bool) -> None:
    load = rq.Load("fairness", args.moderate, args.think)
    flags, _ = rq.plan_cache(workload, load, args.cache_share, sim)
    seconds = 5.0 if args.quick else args.fairness_seconds
    rate, gate = args.fairness_rate, args.fairness_gate
    with tempfile.TemporaryDirectory(prefix="routing-fairness-") as tmp:
        f = rq.fairness(workload, Path(tmp), flags, rate, seconds, gate, args.flood, args.fairness_reserve)
    share = f["capacity"] / 2  # two tenants of equal weight
    print(
        f"\n## Fairness: tenant B at {rate:g} req/s, then beside tenant A at {f['rate_a']:.1f} req/s "
        f"({args.flood:g}x its share); {seconds:g} s each; the gateway, every backend gated at {gate}"
        f" with {args.fairness_reserve} of its places reserved from sheddable requests\n"
    )
    print(f"Mode: {f['mode']}.\n")
    print(
        f"The gated fleet serves about {f['capacity']:.1f} req/s (4 x {gate} in flight over B's mean "
        f"request time alone): a tenant's share is {share:.1f} req/s; B sends {rate / share:.1f}x its share."
    )
    (a50, a99), (f50, f99) = f["b_alone"], f["b_flood"]
    print("\n| tenant B | requests | TTFT p50 ms | p99 |\n|---|---:|---:|---:|")
    print(f"| alone | {f['b_requests'][0]} | {a50:.0f} | {a99:.0f} |")
    print(f"| under A's flood | {f['b_requests'][1]} | {f50:.0f} | {f99:.0f} |")
    print(
        f"\nA: {f['a_requests']} requests, {f['a_429']} answered 429, {f['a_other_errors']} other errors; "
        f"B: {f['b_429']} answered 429, {f['b_errors']} errors in all. Not 200 (status: count): "
        f"A {f['a_statuses']}, B {f['b_statuses']}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per wrk cell")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-c", "--connections", type=int, default=24)
    parser.add_argument("--no-engines", action="store_true", help="decision cost only")
    parser.add_argument("--no-quality", action="store_true", help="leave the routing-quality part out")
    parser.add_argument("--quality-only", action="store_true", help="only the routing-quality part")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--load", choices=("moderate", "high", "both"), default="both")
    parser.add_argument("--moderate", type=int, default=16, help="sessions at once under moderate load")
    parser.add_argument("--high", type=int, default=128, help="sessions at once near saturation")
    parser.add_argument("--think", type=float, default=2.0, help="mean think time between turns, seconds")
    parser.add_argument(
        "--cache-share", type=float, default=0.3, help="share of the working set one engine's KV cache holds"
    )
    default_routers = ["smg", *(p for p in QUALITY_POLICIES if p in POLICIES)]
    parser.add_argument(
        "--routers",
        type=lambda v: [r for r in v.split(",") if r],  # "" for none: the fairness scenario alone
        default=default_routers,
        help=f"comma-separated: smg, {rq.EXACT} (with --tokenizer) and pool policies {POLICIES} "
        f"(default {','.join(default_routers)})",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR|train",
        help="the engines tokenize with this model directory (or one trained on docs/: 'train') and publish "
        f"KV events; needed by the router {rq.EXACT}",
    )
    parser.add_argument("--fairness", action="store_true", help="add the fairness scenario (gateway only)")
    parser.add_argument("--fairness-rate", type=float, default=2.0, help="tenant B's requests per second")
    parser.add_argument("--fairness-seconds", type=float, default=30.0)
    parser.add_argument("--fairness-gate", type=int, default=2, help="max_concurrency of each backend")
    parser.add_argument(
        "--fairness-reserve",
        type=int,
        default=1,
        help="reserved_places of each backend (with flow control): kept from tenant A's sheddable requests",
    )
    parser.add_argument("--flood", type=float, default=5.0, help="tenant A's rate over its fair share")
    parser.add_argument("--quick", action="store_true", help="2 turns a session, 5 s fairness phases")
    args = parser.parse_args()
    unknown = [r for r in args.routers if r not in ("smg", rq.EXACT) and r not in POLICIES]
    if unknown:
        parser.error(f"unknown routers {unknown}: smg, {rq.EXACT} or one of {POLICIES}")
    if rq.EXACT in args.routers and not args.tokenizer:
        parser.error(f"{rq.EXACT} needs --tokenizer (a model directory, or 'train')")
    os.environ.setdefault("GATEWAY_EVENT_LOOP", "uvloop")
    if args.quality_only:
        quality(args)
        return
    when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    print(f"# Routing benchmark ({when}, `python -m perf.routing_bench`)\n")
    print("| model's rules | µs per decision |\n|---|---:|")
    for name, us in decision_costs():
        print(f"| {name} | {us:.2f} |")
    if args.no_engines:
        return
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
    if not args.no_quality:
        quality(args)


if __name__ == "__main__":
    main()
