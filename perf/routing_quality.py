"""Routing quality on a simulated vLLM fleet: multi-turn sessions (``perf.multiturn``) through each router
over the same four engines, and a fairness scenario for the gateway's flow control.

Fleet: four ``python -m gateway mock-engine --sim`` processes (the engine simulator: continuous batching,
a block prefix cache with LRU eviction, chunked prefill; SIM_SPEC's defaults, passed explicitly) whose KV
cache is sized from the workload so that one engine holds ``cache_share`` of the working set and four
hold four times that. Without the simulator in this checkout the plain mock engine stands in (no cache:
every hit ratio is 0) and a line says so. The engines are restarted before each router, so every router
starts on cold caches with the same seed.

Routers: ``smg`` (SGLang Model Gateway, ``smg launch --policy cache_aware`` with its defaults, when
scripts/bench-peers.sh installed it) and the gateway (2 workers, engine scrapes every 0.5 s) with a model
whose rule routes to a ``[[pools]]`` of the four engines, once per pool policy.

Load: ``active`` sessions at once (a session holds its slot through its think times), sessions started
staggered; a session's request that fails ends the session (its history would no longer be the
engine's). Per request the client records TTFT, prompt and cached tokens from the usage chunk.

Fairness: tenant B (a standard key) sends first turns open-loop at ``rate`` req/s alone, then beside
tenant A (a sheddable key) at five times that; B's TTFT and any 429 it gets, and A's 429s.
I/O: starts engines, routers and the gateway as subprocesses (stopped by PID), loopback HTTP.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf.multiturn import Workload, working_set_tokens
from perf.sse_client import Answer, Connection
from perf.targets import (
    CLK_TCK,
    GatewayService,
    MockEngineService,
    Service,
    SmgService,
    free_port,
    machine_cpu_ticks,
)

__all__ = [
    "ENGINES",
    "EXACT",
    "Load",
    "RouterRun",
    "fairness",
    "gateway_pool_config",
    "run_router",
    "sim_available",
    "sim_flags",
]

ENGINES = 4
KEY = "sk-gw-routing-quality-00000000000000"
KEY_A = "sk-gw-routing-tenant-a-000000000000"
KEY_B = "sk-gw-routing-tenant-b-000000000000"
# SIM_SPEC's defaults, passed explicitly so a change of the simulator's defaults does not change this run.
SIM_DEFAULTS = {
    "--sim-batch": "16",
    "--sim-block-tokens": "16",
    "--sim-chunk-tokens": "512",
    "--sim-step-ms": "15",
    "--sim-seq-ms": "0.2",
    "--sim-prefill-ms": "0.05",
}
BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Load:
    name: str
    active: int  # sessions at once
    think: float  # mean seconds between an answer and the next turn


@dataclass(slots=True)
class Record:
    session: int
    turn: int
    answer: Answer


@dataclass(slots=True)
class RouterRun:
    router: str
    records: list[Record] = field(default_factory=list)
    seconds: float = 0.0
    client_cpu: float = 0.0
    machine_busy: float = 0.0  # the share of all CPUs busy during the run (anything, not only ours)
    engines: list[dict[str, Any]] = field(default_factory=list)  # /mock/stats of each engine
    hits_metric: list[float] = field(default_factory=list)  # vllm:prefix_cache_hits_total per engine
    queries_metric: list[float] = field(default_factory=list)
    skipped: str = ""


def sim_available() -> bool:
    """Whether this checkout's mock engine has the simulator (``--sim`` in its --help)."""
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "mock-engine", "--help"], capture_output=True, text=True, timeout=60
    )
    return "--sim" in out.stdout


def cache_blocks(workload: Workload, active: int, share: float, scale: float = 1.0) -> tuple[int, int]:
    """(blocks per engine, working-set tokens): ``share`` of the working set, but never less than twice the
    longest prompt the workload sends, so that the batch can always admit a request. ``scale``: the
    engines' tokens per 4 bytes of text (1 for the simulator's own tokenizing; more for a BPE)."""
    working = math.ceil(working_set_tokens(workload, active) * scale)
    longest = max(
        len(workload.systems[s.system]) // 4 + sum(len(t.user) // 4 + t.max_tokens + 6 for t in s.turns)
        for s in workload.sessions
    )
    longest = math.ceil(longest * scale)
    return max(math.ceil(share * working / BLOCK_TOKENS), math.ceil(2 * longest / BLOCK_TOKENS)), working


def sim_flags(blocks: int) -> list[str]:
    flags = ["--sim", "--sim-cache-blocks", str(blocks)]
    for name, value in SIM_DEFAULTS.items():
        flags += [name, value]
    return flags


def gateway_pool_config(
    urls: Sequence[str],
    policy: str,
    tenants: str = "",
    gate: int = 2,
    reserve: int = 0,
    events: Sequence[str] = (),
    tokenizer: str | None = None,
) -> str:
    """Model ``chat`` whose one rule routes to pool ``fleet`` of the engines under ``policy``, one key.
    With ``tenants``, two tenants' keys instead and each backend gated at ``gate`` in flight; ``"flow"`` adds
    flow control's priorities and weights (tenant A's key sheddable, B's standard, equal weights) and
    ``reserve`` places of each gate kept from sheddable requests. ``events`` (an endpoint per engine) and
    ``tokenizer`` (a model directory): the exact index from the engines' KV events."""
    lines = []
    gated = f"max_concurrency = {gate}\n" if tenants else ""
    if tenants == "flow" and reserve:
        gated += f"reserved_places = {reserve}\n"
    for i, url in enumerate(urls):
        kv = f'kv_events = "{events[i]}"\n' if events else ""
        lines += [f'[[backends]]\nname = "e{i}"\nurl = "{url}"\nfirst_byte_timeout = 300.0\n{gated}{kv}']
        target = f'{{ backend = "e{i}", model = "mock-model" }}'
        lines += [f'[[provider_models]]\nname = "pm-e{i}"\nbackends = [{target}]\n']
    members = ", ".join(f'"pm-e{i}"' for i in range(len(urls)))
    tokenized = f'tokenizer = "{tokenizer}"\n' if tokenizer else ""
    lines += [f'[[pools]]\nname = "fleet"\npolicy = "{policy}"\nmembers = [{members}]\n{tokenized}']
    lines += ['[[models]]\nname = "chat"\nchain = ["pm-e0"]\n', '[[models.rules]]\nroute = ["fleet"]\n']
    lines += ['[[roles]]\nname = "r"\npermissions = ["model/*"]\n']
    if not tenants:
        lines += ['[[principals]]\nname = "p"\nroles = ["r"]\n']
        lines += [f'[[keys]]\nname = "k"\nprincipal = "p"\nsecret = "{KEY}"\n']
        return "\n".join(lines)
    flow = tenants == "flow"
    for tenant, key, priority in (("a", KEY_A, "sheddable"), ("b", KEY_B, "standard")):
        weight = "weight = 1\n" if flow else ""
        lines += [f'[[principals]]\nname = "tenant-{tenant}"\nroles = ["r"]\n{weight}']
        lines += [
            f'[[keys]]\nname = "key-{tenant}"\nprincipal = "tenant-{tenant}"\nsecret = "{key}"\n'
            + (f'priority = "{priority}"\n' if flow else "")
        ]
    return "\n".join(lines)


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        body: bytes = resp.read()
        return body


def _metric(text: str, name: str) -> float:
    return sum(
        float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )


def _body(model: str, messages: list[dict[str, str]], max_tokens: int) -> bytes:
    doc = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


async def _sessions(
    workload: Workload, port: int, model: str, headers: dict[str, str], load: Load
) -> list[Record]:
    records: list[Record] = []
    slots = asyncio.Semaphore(load.active)
    turns = statistics.fmean(len(s.turns) for s in workload.sessions)
    # Sessions arrive at about the rate at which slots free up (a turn takes its think time and about a
    # second), so the first ones do not all start in the same instant.
    stagger = turns * (load.think + 1.0) / load.active
    t0 = time.monotonic()

    async def session(index: int) -> None:
        s = workload.sessions[index]
        await asyncio.sleep(max(0.0, t0 + s.start * stagger - time.monotonic()))
        async with slots:
            conn = Connection(port, headers)
            messages = [{"role": "system", "content": workload.systems[s.system]}]
            try:
                for n, turn in enumerate(s.turns):
                    messages.append({"role": "user", "content": turn.user})
                    answer = await conn.stream(
                        "/v1/chat/completions", _body(model, messages, turn.max_tokens)
                    )
                    records.append(Record(index, n, answer))
                    if answer.status != 200 or answer.error:
                        return
                    messages.append({"role": "assistant", "content": answer.content})
                    if n + 1 < len(s.turns):
                        await asyncio.sleep(turn.think * load.think)
            finally:
                await conn.close()

    await asyncio.gather(*(session(i) for i in range(len(workload.sessions))))
    return records


def _loop_run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _start_fleet(
    work: Path, extra: list[str], services: list[Service], events: Sequence[str] = ()
) -> list[MockEngineService]:
    """The engines, each added to ``services`` before it starts, so that the caller's ``finally`` stops
    those started when a later one fails; each publishing its KV events on its ``events`` endpoint."""
    engines: list[MockEngineService] = []
    for i in range(ENGINES):
        own = ["--sim-kv-events", events[i]] if events else []
        engines.append(MockEngineService(work, tokens=64, extra=[*extra, *own], name=f"engine{i}"))
        services.append(engines[-1])
        engines[-1].start()
    return engines


def _stop(services: Sequence[Service]) -> None:
    for service in services:
        service.stop()


EXACT = "cache_aware_exact"  # the cache_aware policy with a tokenizer and the engines' KV events


def run_router(
    router: str,
    workload: Workload,
    load: Load,
    work: Path,
    engine_flags: list[str],
    scrape: float = 0.5,
    tokenizer: str | None = None,
) -> RouterRun:
    """``router`` is ``smg``, a pool policy of the gateway, or ``EXACT``. Starts the fleet and the router,
    runs the sessions, reads the engines' counters, stops everything. With ``tokenizer`` (a model
    directory) the engines tokenize with it and publish their KV events, whichever the router."""
    run = RouterRun(router)
    if router == "smg" and not SmgService.available():
        run.skipped = "smg not installed (scripts/bench-peers.sh smg)"
        return run
    services: list[Service] = []
    try:
        events = [f"tcp://127.0.0.1:{free_port()}" for _ in range(ENGINES)] if tokenizer else []
        flags = [*engine_flags, "--sim-tokenizer", tokenizer] if tokenizer else engine_flags
        engines = _start_fleet(work, flags, services, events)
        urls = [e.url for e in engines]
        if router == "smg":
            front: Service = SmgService(work, urls)
            services.append(front)
            front.start()
            model, headers = "mock-model", {}
        else:
            if router == EXACT:
                if not tokenizer:
                    raise ValueError(f"{EXACT} needs the engines' tokenizer")
                config = gateway_pool_config(urls, "cache_aware", events=events, tokenizer=tokenizer)
            else:
                config = gateway_pool_config(urls, router)
            gateway = GatewayService(
                work, urls[0], workers=2, accounted=False, config=config,
                extra=["--engine-scrape-interval", str(scrape)],
            )  # fmt: skip
            front = gateway
            services.append(front)
            front.start()
            model, headers = "chat", {"Authorization": f"Bearer {KEY}"}
        cpu0, t0, busy0 = time.process_time(), time.monotonic(), machine_cpu_ticks()[0]
        run.records = _loop_run(_sessions(workload, front.port, model, headers, load))
        run.seconds = time.monotonic() - t0
        run.client_cpu = time.process_time() - cpu0
        ticks = run.seconds * CLK_TCK * (os.cpu_count() or 1)
        run.machine_busy = (machine_cpu_ticks()[0] - busy0) / ticks if ticks else math.nan
        for engine in engines:
            run.engines.append(json.loads(_get(engine.port, "/mock/stats")))
            text = _get(engine.port, "/metrics").decode()
            run.hits_metric.append(_metric(text, "vllm:prefix_cache_hits_total"))
            run.queries_metric.append(_metric(text, "vllm:prefix_cache_queries_total"))
    finally:
        _stop(services[::-1])
    return run


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summary(run: RouterRun) -> dict[str, Any]:
    ok = [r.answer for r in run.records if r.answer.status == 200 and not r.answer.error]
    ttft = [a.ttft * 1000 for a in ok if a.ttft is not None]
    prompt = sum(a.prompt_tokens for a in ok)
    cached = sum(a.cached_tokens for a in ok)
    sims = [e.get("sim") or {} for e in run.engines]
    sim_prompt = sum(int(s.get("prompt_tokens", 0)) for s in sims)
    sim_cached = sum(int(s.get("cached_tokens", 0)) for s in sims)
    queries = sum(run.queries_metric)
    return {
        "requests": len(run.records),
        "errors": len(run.records) - len(ok),
        "statuses": sorted({r.answer.status for r in run.records if r.answer.status != 200}),
        "p50": percentile(ttft, 50),
        "p90": percentile(ttft, 90),
        "p99": percentile(ttft, 99),
        "hit": cached / prompt if prompt else math.nan,
        "hit_engines": sim_cached / sim_prompt if sim_prompt else math.nan,
        "hit_metric": sum(run.hits_metric) / queries if queries else math.nan,
        "per_engine": [int(e.get("by_path", {}).get("/v1/chat/completions", 0)) for e in run.engines],
        "max_waiting": [int(s.get("max_waiting", 0)) for s in sims] if any(sims) else [],
        "rps": len(run.records) / run.seconds if run.seconds else math.nan,
        "cpu": run.client_cpu / run.seconds if run.seconds else math.nan,
        "busy": run.machine_busy,
    }


# -- fairness ------------------------------------------------------------------------------------------


async def _open_loop(
    port: int, key: str, workload: Workload, rate: float, seconds: float, seed: int
) -> list[Answer]:
    """First turns of the workload's sessions (system prompt and first user message), sent at Poisson
    arrivals of ``rate`` per second for ``seconds``, each on a kept-alive connection from a free list."""
    rng = random.Random(seed)
    idle: list[Connection] = []
    answers: list[Answer] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        s = workload.sessions[i % len(workload.sessions)]
        messages = [
            {"role": "system", "content": workload.systems[s.system]},
            {"role": "user", "content": s.turns[0].user},
        ]
        conn = idle.pop() if idle else Connection(port, {"Authorization": f"Bearer {key}"})
        answers.append(
            await conn.stream("/v1/chat/completions", _body("chat", messages, s.turns[0].max_tokens))
        )
        idle.append(conn)

    t0 = time.monotonic()
    at, i = 0.0, 0
    while True:
        at += rng.expovariate(rate)
        if at > seconds:
            break
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
    await asyncio.gather(*tasks)
    for conn in idle:
        await conn.close()
    return answers


def _statuses(answers: list[Answer]) -> dict[int, int]:
    """How many answers of each status other than a complete 200 (0: no answer)."""
    out: dict[int, int] = {}
    for a in answers:
        if a.status != 200 or a.error:
            out[a.status] = out.get(a.status, 0) + 1
    return dict(sorted(out.items()))


def fairness(
    workload: Workload,
    work: Path,
    engine_flags: list[str],
    rate: float,
    seconds: float,
    gate: int,
    flood: float,
    reserve: int = 0,
) -> dict[str, Any]:
    """Tenant B alone, then B beside A at ``flood`` times its share; the gateway with flow control, or, where
    this checkout refuses its config, with the gates alone (the baseline), which ``mode`` says."""
    services: list[Service] = []
    try:
        engines = _start_fleet(work, engine_flags, services)
        urls = [e.url for e in engines]

        def gated(tenants: str, policy: str) -> GatewayService:
            (work / tenants).mkdir()
            service = GatewayService(
                work / tenants, urls[0], workers=2, accounted=False,
                config=gateway_pool_config(urls, policy, tenants=tenants, gate=gate, reserve=reserve),
            )  # fmt: skip
            services.append(service)
            service.start()
            return service

        mode = f"flow control (A sheddable, B standard, equal weights; reserved_places {reserve})"
        try:
            gateway = gated("flow", "cache_aware")
        except (RuntimeError, TimeoutError) as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            mode = f"NO flow control, the gates alone (this checkout refused priorities: {last})"
            services.pop().stop()
            # A checkout without flow control has no cache_aware either: the gates over round robin.
            gateway = gated("gate", "round_robin")

        alone = _loop_run(_open_loop(gateway.port, KEY_B, workload, rate, seconds, 1))
        # The gated fleet's capacity in requests per second, from B's requests alone: at most ``gate`` in
        # flight per engine, each taking the mean seconds B's took. Two tenants of equal weight: a
        # tenant's share is half of it, and A sends ``flood`` times that.
        alone_seconds = [a.seconds for a in alone if a.status == 200 and not a.error]
        capacity = ENGINES * gate / statistics.fmean(alone_seconds) if alone_seconds else 2 * rate
        rate_a = flood * capacity / 2

        async def both() -> tuple[list[Answer], list[Answer]]:
            a, b = await asyncio.gather(
                _open_loop(gateway.port, KEY_A, workload, rate_a, seconds, 2),
                _open_loop(gateway.port, KEY_B, workload, rate, seconds, 1),
            )
            return a, b

        flood_a, flood_b = _loop_run(both())
    finally:
        _stop(services[::-1])

    def ttft(answers: list[Answer]) -> tuple[float, float]:
        ms = [a.ttft * 1000 for a in answers if a.status == 200 and a.ttft is not None]
        return percentile(ms, 50), percentile(ms, 99)

    return {
        "mode": mode,
        "capacity": capacity,
        "rate_a": rate_a,
        "b_alone": ttft(alone),
        "b_flood": ttft(flood_b),
        "b_requests": (len(alone), len(flood_b)),
        "b_429": sum(a.status == 429 for a in alone + flood_b),
        "b_errors": sum(a.status != 200 or bool(a.error) for a in alone + flood_b),
        "a_requests": len(flood_a),
        "a_429": sum(a.status == 429 for a in flood_a),
        "a_other_errors": sum(a.status != 429 and (a.status != 200 or bool(a.error)) for a in flood_a),
        "a_statuses": _statuses(flood_a),
        "b_statuses": _statuses(alone + flood_b),
    }


def plan_cache(
    workload: Workload, load: Load, share: float, sim: bool, scale: float = 1.0
) -> tuple[list[str], str]:
    """The engines' flags for ``load`` and a line that says how the cache was sized."""
    if not sim:
        return [], "engine simulator not in this checkout: the plain mock engine (no prefix cache, no queue)"
    blocks, working = cache_blocks(workload, load.active, share, scale)
    held = blocks * BLOCK_TOKENS
    line = (
        f"KV cache per engine {blocks:,} blocks = {held:,} tokens; working set {working:,} tokens "
        f"(4 system prompts + {load.active} sessions' histories): one engine holds {held / working:.0%}, "
        f"four {ENGINES * held / working:.0%}"
    )
    return sim_flags(blocks), line
