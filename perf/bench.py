"""``python -m perf.bench``: the single-host benchmark suite, every target measured side by side in one run.

Starts its own upstreams (an nginx mock engine, the project's Python mock engine for streams, and
``perf.paced`` for engine-paced streams), the targets (direct, a plain nginx reverse proxy, the floor of the
gateway's shape, the gateway with and without its per-request features, and the peers LiteLLM and Portkey
when installed) and load generators (wrk; ``perf.streams`` for SSE), runs every selected scenario
(``perf/scenarios.py``) against every target it applies to, and tears all of it down. Per cell: throughput,
latency percentiles up to p99.9, time to first byte for streams, errors and stalls, the proxy's CPU µs per
request (and per token for streams), its peak memory and, in bursts, its PSS per open stream above idle.
Prints Markdown and writes perf/results/latest.{json,md} and PNG plots.
I/O: subprocesses, a temp directory, /proc, the results files.
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
import threading
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
from perf.scenarios import ALL_TARGETS, GROUPS, Scenario, build_scenarios, processes_for, select
from perf.targets import (
    CLK_TCK,
    PEERS,
    ROOT,
    STREAM_MODEL,
    FloorService,
    GatewayService,
    LiteLLMService,
    MockEngineService,
    NginxService,
    PacedEngineService,
    PortkeyService,
    ProcessTree,
    Service,
    SmgService,
    http_request,
    machine_cpu_ticks,
)

__all__ = ["Cell", "Run", "main"]


@dataclass(slots=True)
class Cell:
    """One target under one scenario. CPU figures are CPU seconds per wall second (cores in use).

    Exactly one of ``wrk`` (whole responses) and ``streams`` (``perf.streams``' summary) is set."""

    scenario: str
    target: str
    wrk: WrkResult | None = None
    streams: dict[str, Any] | None = None
    round: int = 0
    cpu_us_per_request: float | None = None  # per completed stream for stream scenarios
    proxy_cpu_cores: float | None = None
    peak_rss_mib: float | None = None  # sum over the proxy's processes of their peak RSS during the cell
    pss_mib: float | None = None  # sum of PSS at the end of the cell: shared pages counted once
    proxy_cpu_s_by_process: dict[str, float] = field(default_factory=dict)  # "role:pid" -> CPU seconds
    upstream_cpu_cores: float = 0.0  # shows whether the mock engine could have been the bottleneck
    upstream_peak_rss_mib: float = 0.0
    loadgen_cpu_cores: float = 0.0  # wrk or perf.streams
    machine_busy_cores: float = 0.0  # everything on the machine, other users included
    machine_steal_cores: float = 0.0
    cpu_us_per_token: float | None = None  # streams: the proxy's CPU over the complete streams' tokens
    pss_idle_mib: float | None = None  # bursts: the proxy's PSS just before the first stream opened
    pss_peak_mib: float | None = None  # bursts: the largest PSS sampled while streams were open
    pss_per_stream_kib: float | None = None  # (peak - idle) / max open

    @property
    def rps(self) -> float:
        """Requests (wrk: every answer, 429s included) or complete streams per second."""
        if self.wrk is not None:
            return self.wrk.rps
        return float(self.streams["streams_per_s"]) if self.streams else 0.0

    @property
    def latency_ms(self) -> dict[str, float]:
        """Percentiles of whole-response (or whole-stream) latency: "50.0", ..., "99.99", "max"."""
        if self.wrk is not None:
            return self.wrk.percentiles_ms
        return dict(self.streams["total_ms"]) if self.streams else {}

    @property
    def served(self) -> int:
        if self.wrk is not None:
            return self.wrk.requests
        return int(self.streams["complete"]) if self.streams else 0

    @property
    def other_cores(self) -> float:
        """Machine CPU use not charged to the proxy, the upstream or the load generator: kernel network work
        done in softirq context, this script, and anything else running on the machine."""
        ours = (self.proxy_cpu_cores or 0.0) + self.upstream_cpu_cores + self.loadgen_cpu_cores
        return max(0.0, self.machine_busy_cores - ours)

    def problems(self, refused_expected: bool) -> list[str]:
        """What makes this cell a failure: errors, or for streams incomplete or stalled ones."""
        out = []
        if self.wrk is not None:
            if not self.wrk.requests:
                out.append("no answer within the cell")
            if self.wrk.socket_errors:
                out.append(f"{self.wrk.socket_errors} socket errors")
            if self.wrk.non_2xx and not refused_expected:
                out.append(f"{self.wrk.non_2xx} non-2xx answers")
        elif self.streams is not None:
            for key in ("incomplete", "stalls"):
                if self.streams.get(key):
                    out.append(f"{self.streams[key]} {key} streams")
        return out

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("wrk", "streams")}
        d["other_cores"] = self.other_cores
        if self.wrk is not None:
            return {**d, "loadgen": "wrk", **self.wrk.as_dict()}
        return {**d, "loadgen": "perf.streams", **(self.streams or {})}


@dataclass(slots=True)
class Run:
    args: argparse.Namespace
    scenarios: list[Scenario]
    cells: list[Cell] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # "target" or "scenario/target" -> why
    unavailable: dict[str, str] = field(default_factory=dict)  # optional targets not installed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 s cells, 1 s warm-up, shorter slow streams")
    p.add_argument("-d", "--duration", type=int, help="seconds per measured cell (7; --quick: 3)")
    p.add_argument("--warmup", type=int, help="seconds of unmeasured load before each cell (2; --quick: 1)")
    p.add_argument(
        "-c", "--connections", default="8,64", help="connection counts of the small-request scenarios (8,64)"
    )
    p.add_argument("-t", "--threads", type=int, default=2, help="wrk threads (2)")
    p.add_argument(
        "--scenarios",
        default="all",
        help=f"comma-separated scenario names or groups ({','.join(GROUPS)}), or all (all); see --list",
    )
    p.add_argument("--list", action="store_true", help="print the scenarios and exit")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every target this many times, interleaved; tables show each one's median (1)",
    )
    p.add_argument(
        "--targets", default=",".join(ALL_TARGETS), help=f"comma-separated subset of {','.join(ALL_TARGETS)}"
    )
    p.add_argument(
        "--workers", type=int, default=2, help="gateway/LiteLLM workers and nginx worker_processes (2)"
    )
    p.add_argument("--stream-connections", type=int, default=32, help="stream-256: connections (32)")
    p.add_argument("--slow-streams", type=int, help="slow-streams: concurrent streams (2000)")
    p.add_argument("--slow-tokens", type=int, help="slow-streams: tokens per stream (40; --quick: 15)")
    p.add_argument(
        "--token-delay", type=float, default=0.2, help="slow-streams: seconds between tokens (0.2)"
    )
    p.add_argument(
        "--stall-after", type=float, default=2.0, help="a gap in a stream this long is a stall (2)"
    )
    p.add_argument(
        "--paced-streams",
        default="1000,5000",
        help="engine-paced: concurrent streams of each scenario, comma-separated (1000,5000)",
    )
    p.add_argument("--paced-tokens", type=int, default=256, help="engine-paced: tokens per stream (256)")
    p.add_argument(
        "--paced-ms", default="20,50", help="engine-paced: shortest,longest gap between tokens in ms (20,50)"
    )
    p.add_argument(
        "--paced-ramp", type=float, default=2.0, help="engine-paced: seconds over which streams open (2)"
    )
    p.add_argument("--results-dir", type=Path, default=ROOT / "perf" / "results", help="where latest.* go")
    p.add_argument("--no-save", action="store_true", help="print the tables only; leave perf/results alone")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    args = p.parse_args(argv)
    args.duration = args.duration or (3 if args.quick else 7)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.connections = [int(c) for c in str(args.connections).split(",") if c]
    args.targets = [t for t in str(args.targets).split(",") if t]
    args.slow_streams = args.slow_streams or 2000
    args.slow_tokens = args.slow_tokens or (15 if args.quick else 40)
    args.paced_streams = [int(n) for n in str(args.paced_streams).split(",") if n]
    try:
        lo, hi = (float(x) for x in str(args.paced_ms).split(","))
    except ValueError:
        p.error("--paced-ms takes two numbers, e.g. 20,50")
    if not 0 < lo <= hi:
        p.error("--paced-ms: 0 < shortest <= longest")
    args.paced_ms = (lo, hi)
    unknown = set(args.targets) - set(ALL_TARGETS)
    if unknown:
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    wanted = [w for w in str(args.scenarios).split(",") if w]
    everything = build_scenarios(
        args.connections,
        stream_connections=args.stream_connections,
        slow_streams=args.slow_streams,
        slow_tokens=args.slow_tokens,
        slow_token_delay=args.token_delay,
        stall_after_s=args.stall_after,
        paced_streams=args.paced_streams,
        paced_tokens=args.paced_tokens,
        paced_ms=args.paced_ms,
        paced_ramp_s=args.paced_ramp,
        cores=len(os.sched_getaffinity(0)),
    )
    try:
        args.selected = everything if wanted == ["all"] else select(everything, wanted)
    except ValueError as exc:
        p.error(str(exc))
    return args


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop every process


@dataclass(slots=True)
class Fleet:
    """Every started process. ``endpoint`` finds where a target listens for a scenario's upstream."""

    upstreams: dict[str, Service] = field(default_factory=dict)  # "nginx", "engine"
    proxies: dict[tuple[str, str], Service] = field(default_factory=dict)  # (target, upstream)

    def endpoint(self, target: str, upstream: str) -> tuple[int, Service | None] | None:
        if target == "direct":
            up = self.upstreams.get(upstream)
            return (up.port, None) if up else None
        proxy = self.proxies.get((target, upstream))
        return (proxy.port, proxy) if proxy else None


@contextlib.contextmanager
def started_fleet(workdir: Path, run: Run) -> Iterator[Fleet]:
    """Start the upstreams and every target the selected scenarios need; stop all of them, whatever
    happens. A target that fails to start is recorded in ``run.failures`` and left out; a peer that is not
    installed is recorded in ``run.unavailable``."""
    args = run.args
    fleet = Fleet()
    services: list[Service] = []
    wanted = {t for s in run.scenarios for t in s.targets} & set(args.targets)
    upstream_kinds = sorted({s.upstream for s in run.scenarios})
    # Which upstream kinds each target serves: a target is started once per kind for the proxies that
    # have one upstream (nginx, the minimal proxy), once for all kinds for the gateways and peers.
    kinds_of = {
        t: sorted({s.upstream for s in run.scenarios if t in s.targets}) for t in ALL_TARGETS if t in wanted
    }
    try:
        nginx_up = NginxService.upstream(workdir)  # the gateway's config names it whatever runs
        services.append(nginx_up)
        nginx_up.start()
        fleet.upstreams["nginx"] = nginx_up
        engine_url = paced_url = None
        if "engine" in upstream_kinds:
            # stream-model first in its /v1/models: smg registers a worker under the first model it lists.
            engine = MockEngineService(workdir, extra=["--model", STREAM_MODEL, "--model", "mock-model"])
            services.append(engine)
            engine.start()
            fleet.upstreams["engine"] = engine
            engine_url = engine.url
        if "paced" in upstream_kinds:
            most = max(s.connections for s in run.scenarios if s.upstream == "paced")
            paced = PacedEngineService(workdir, procs=processes_for(most, len(os.sched_getaffinity(0))))
            services.append(paced)
            paced.start()
            fleet.upstreams["paced"] = paced
            paced_url = paced.url
        for name in (t for t in ALL_TARGETS if t in wanted and t != "direct"):
            try:
                if name in ("nginx", "minimal-proxy", "null-app", "smg"):
                    if name == "smg" and not SmgService.available():
                        run.unavailable[name] = "not installed (scripts/bench-peers.sh smg)"
                        continue
                    for kind in kinds_of[name]:
                        up = fleet.upstreams[kind]
                        label = name if kind == "nginx" else f"{name}-{'sse' if kind == 'engine' else kind}"
                        svc: Service
                        if name == "nginx":
                            svc = NginxService.proxy(
                                workdir, up.port, workers=args.workers, name=label, streaming=kind != "nginx"
                            )
                        elif name == "smg":  # one router a kind: its workers serve one model each
                            svc = SmgService(workdir, [up.url], policy="round_robin", name=label)
                        else:
                            svc = FloorService(workdir, name, up.url, args.workers, label=label)
                        services.append(svc)
                        svc.start()
                        fleet.proxies[(name, kind)] = svc
                    continue
                if name == "litellm":
                    if not LiteLLMService.available():
                        run.unavailable[name] = "not installed (scripts/bench-peers.sh)"
                        continue
                    svc = LiteLLMService(workdir, nginx_up.url, engine_url, workers=args.workers)
                elif name == "portkey":
                    if not PortkeyService.available():
                        run.unavailable[name] = "not installed (scripts/bench-peers.sh; needs node)"
                        continue
                    svc = PortkeyService(workdir)
                else:
                    svc = GatewayService(
                        workdir,
                        nginx_up.url,
                        args.workers,
                        accounted=name == "gateway",
                        engine_url=engine_url,
                        paced_url=paced_url,
                    )
                services.append(svc)
                svc.start()
                for kind in upstream_kinds:
                    fleet.proxies[(name, kind)] = svc
            except (RuntimeError, TimeoutError, OSError) as exc:
                run.failures[name] = str(exc)
                print(f"!! {name} not measured: {exc}", file=sys.stderr)
        yield fleet
    finally:
        for service in reversed(services):
            service.stop()


def target_headers(scenario: Scenario, proxy: Service | None, upstream: Service) -> dict[str, str]:
    """The scenario's headers, plus what a target needs to find the upstream (Portkey's routing headers)."""
    if isinstance(proxy, PortkeyService):
        return {**scenario.headers, **PortkeyService.headers_for(upstream.url)}
    return scenario.headers


def check(scenario: Scenario, port: int, headers: dict[str, str]) -> None:
    """One request before measuring: a target that answers errors would only measure its error path."""
    status, body = http_request(port, "POST", scenario.path, scenario.body, headers)
    if scenario.refused_expected and status == 429:
        return
    if status != 200 or scenario.check_marker not in body:
        raise RuntimeError(f"POST {scenario.path} answered {status}: {body[:300]!r}")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_streams(
    scenario: Scenario,
    url: str,
    body_file: Path,
    duration: float,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``python -m perf.streams`` in its own process (its CPU is then the load generator's, as wrk's), with
    the scenario's headers unless ``headers`` are given."""
    argv = [sys.executable, "-m", "perf.streams", url, "--body", f"@{body_file}"]
    headers = scenario.headers if headers is None else headers
    argv += [x for k, v in headers.items() if k.lower() != "content-type" for x in ("-H", f"{k}: {v}")]
    argv += ["--expect-tokens", str(scenario.expect_tokens), "--stall-after", str(scenario.stall_after_s)]
    if scenario.itl:
        argv.append("--itl")
    if scenario.procs > 1:
        argv += ["--procs", str(scenario.procs)]
    if scenario.burst:
        argv += ["--streams", str(scenario.connections), "--ramp", str(scenario.ramp_s)]
        gap = max(scenario.token_delay, scenario.pace_ms[1] / 1000)
        expected = scenario.ramp_s + scenario.expect_tokens * gap
    else:
        argv += ["-c", str(scenario.connections), "-d", str(duration)]
        expected = duration
    timeout = 3 * expected + 60
    argv += ["--timeout", str(timeout - 10)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"perf.streams printed nothing (exit {proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


class PssWatch:
    """Samples the summed PSS of a process tree every ``interval`` seconds on a thread and keeps the
    largest: the memory a burst's open streams take. PSS, not RSS: the forked workers share their parent's
    pages, which a sum of RSS would count once per worker. Reading smaps_rollup walks each process's page
    tables (a few ms for the gateway's): its CPU is this script's, never the proxy's."""

    def __init__(self, tree: ProcessTree, interval: float = 0.5) -> None:
        self.tree = tree
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-watch", daemon=True)

    def __enter__(self) -> PssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        pids = self.tree.pids()  # the tree does not change during a cell; walking /proc each time would
        while not self._stop.wait(self.interval):
            self.peak_bytes = max(self.peak_bytes, self.tree.pss_bytes(pids))


def measure(
    scenario: Scenario,
    target: str,
    port: int,
    proxy: Service | None,
    upstream: Service,
    workdir: Path,
    args: argparse.Namespace,
) -> Cell:
    """Warm up, then one measured run with /proc samples of the proxy, the upstream and the machine taken
    just before and just after it; peak RSS is reset before it, so the figure is this cell's. In a burst,
    the proxy's PSS is also sampled while the streams are open."""
    url = f"http://127.0.0.1:{port}{scenario.path}"
    headers = target_headers(scenario, proxy, upstream)
    script = workdir / f"{scenario.name}-{target}.lua"
    body_file = workdir / f"{scenario.name}.json"
    if not script.exists():
        write_script(script, scenario.body, headers)
        body_file.write_bytes(scenario.body)
    if args.warmup > 0 and not scenario.burst:
        if scenario.loadgen == "wrk":
            run_wrk(url, script, scenario.connections, args.warmup, args.threads)
        else:
            run_streams(scenario, url, body_file, args.warmup, headers)
    proxy_tree = proxy.tree() if proxy else None
    up_tree = upstream.tree()
    for tree in (proxy_tree, up_tree):
        if tree is not None:
            tree.reset_peaks()
    before = proxy_tree.sample() if proxy_tree else None
    up_before, busy_before, load_before = up_tree.sample(), machine_cpu_ticks(), _children_cpu_s()
    started = time.monotonic()
    cell = Cell(scenario.name, target)
    watch = PssWatch(proxy_tree) if proxy_tree is not None and scenario.burst else None
    with watch or contextlib.nullcontext():
        if scenario.loadgen == "wrk":
            cell.wrk = run_wrk(url, script, scenario.connections, args.duration, args.threads)
        else:
            cell.streams = run_streams(scenario, url, body_file, args.duration, headers)
    wall = time.monotonic() - started
    up_after, busy_after, load_after = up_tree.sample(), machine_cpu_ticks(), _children_cpu_s()
    after = proxy_tree.sample() if proxy_tree else None
    cell.upstream_cpu_cores = up_after.cpu_seconds_since(up_before) / wall
    cell.upstream_peak_rss_mib = up_after.peak_rss_bytes / 2**20
    cell.loadgen_cpu_cores = (load_after - load_before) / wall  # the only child reaped in between
    cell.machine_busy_cores = (busy_after[0] - busy_before[0]) / CLK_TCK / wall
    cell.machine_steal_cores = (busy_after[1] - busy_before[1]) / CLK_TCK / wall
    if proxy is not None and before is not None and after is not None:
        cpu = after.cpu_seconds_since(before)
        cell.cpu_us_per_request = cpu * 1e6 / cell.served if cell.served else None
        tokens = int(cell.streams.get("tokens", 0)) if cell.streams else 0
        cell.cpu_us_per_token = cpu * 1e6 / tokens if tokens else None
        cell.proxy_cpu_cores = cpu / wall
        cell.peak_rss_mib = after.peak_rss_bytes / 2**20
        cell.pss_mib = after.pss_bytes / 2**20
        if watch is not None and watch.peak_bytes:
            cell.pss_idle_mib = before.pss_bytes / 2**20
            cell.pss_peak_mib = watch.peak_bytes / 2**20
            opened = int(cell.streams.get("max_open", 0)) if cell.streams else 0
            if opened:
                cell.pss_per_stream_kib = max(0, watch.peak_bytes - before.pss_bytes) / 1024 / opened
        labels = proxy.process_labels()
        by_pid = after.cpu_seconds_by_pid(before)
        cell.proxy_cpu_s_by_process = {
            f"{labels.get(pid, 'gone')}:{pid}": round(seconds, 3) for pid, seconds in sorted(by_pid.items())
        }
    return cell


def _pace(upstream: Service, scenario: Scenario, checking: bool) -> None:
    """The upstream's token pacing for this scenario; none for the check request, which must not trickle."""
    if isinstance(upstream, MockEngineService):
        upstream.configure(token_delay=0.0 if checking else scenario.token_delay)
    elif isinstance(upstream, PacedEngineService):
        upstream.pace(*((0.0, 0.0) if checking else scenario.pace_ms))


def restart(scenario: Scenario, proxy: Service, upstream: Service) -> None:
    """A fresh proxy for an engine-paced cell, checked with one request: its PSS above idle is then what
    holding the burst's streams costs, not what is left of a heap that earlier scenarios grew and the
    burst reuses (which read as 0 KiB per stream for a burst after stream-256 and slow-streams)."""
    proxy.stop()
    proxy.start()
    _pace(upstream, scenario, checking=True)
    try:
        check(scenario, proxy.port, target_headers(scenario, proxy, upstream))
    finally:
        _pace(upstream, scenario, checking=False)


def run_scenarios(run: Run, fleet: Fleet, workdir: Path) -> None:
    """Targets interleave within a scenario, so that each ratio compares neighbouring minutes."""
    args = run.args
    for scenario in run.scenarios:
        upstream = fleet.upstreams[scenario.upstream]
        _pace(upstream, scenario, checking=True)
        ready: list[tuple[str, int, Service | None]] = []
        for target in (t for t in scenario.targets if t in args.targets):
            found = fleet.endpoint(target, scenario.upstream)
            if found is None:
                continue  # not started: its failure or absence is already recorded
            try:
                check(scenario, found[0], target_headers(scenario, found[1], upstream))
                ready.append((target, *found))
            except (RuntimeError, OSError) as exc:
                run.failures[f"{scenario.name}/{target}"] = str(exc)
                print(f"!! {scenario.name}/{target} not measured: {exc}", file=sys.stderr)
        _pace(upstream, scenario, checking=False)
        for round_ in range(args.rounds):
            for target, port, proxy in ready:
                try:
                    if scenario.upstream == "paced" and proxy is not None:
                        restart(scenario, proxy, upstream)
                    cell = measure(scenario, target, port, proxy, upstream, workdir, args)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError, OSError) as exc:
                    run.failures[f"{scenario.name}/{target}"] = str(exc)
                    print(f"!! {scenario.name}/{target}: {exc}", file=sys.stderr)
                    continue
                cell.round = round_
                run.cells.append(cell)
                _progress(cell)


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
    for pkg in ("granian", "aiohttp", "uvloop"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "versions": versions,
        "git": _git_revision(),
        "peers": peer_versions(),
    }


def peer_versions() -> dict[str, str]:
    """The installed peers' versions, read from their own package metadata under perf/.peers/."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError, StopIteration):
        dist = next((PEERS / "litellm" / "lib").glob("python*/site-packages/litellm-*.dist-info"))
        out["litellm"] = dist.name.removeprefix("litellm-").removesuffix(".dist-info")
    with contextlib.suppress(OSError, ValueError, KeyError):
        pkg = PEERS / "node" / "node_modules" / "@portkey-ai" / "gateway" / "package.json"
        out["portkey"] = str(json.loads(pkg.read_text())["version"])
    with contextlib.suppress(OSError, ValueError, StopIteration):
        dist = next((PEERS / "smg" / "lib").glob("python*/site-packages/smg-*.dist-info"))
        out["smg"] = dist.name.removeprefix("smg-").removesuffix(".dist-info")
    return out


def _git_revision() -> str:
    def git(*args: str) -> str:
        cmd = ["git", "--no-optional-locks", *args]  # never take the index lock others may hold
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        rev = git("rev-parse", "--short", "HEAD") or "unknown"
        return rev + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _progress(cell: Cell) -> None:
    lat = cell.latency_ms
    cpu = "—" if cell.cpu_us_per_request is None else f"{cell.cpu_us_per_request:.1f}"
    extra = ""
    if cell.wrk is not None:
        extra = f"non-2xx {cell.wrk.non_2xx}  socket errors {cell.wrk.socket_errors}"
    elif cell.streams is not None:
        s = cell.streams
        extra = f"complete {s['complete']}/{s['streams']}  stalls {s['stalls']}  max open {s['max_open']}"
    print(
        f"{cell.scenario:<20} {cell.target:<12} {cell.rps:>9,.0f}/s  p50 {lat.get('50.0', 0):.2f} ms"
        f"  p99 {lat.get('99.0', 0):.2f} ms  {extra}  cpu {cpu} us/req",
        file=sys.stderr,
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in args.selected:
            print(f"{s.name:<22} [{s.group}] {s.what}; targets: {', '.join(s.targets)}")
        return 0
    from perf import report  # matplotlib, when present, is only imported there

    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    # Thousands of concurrent streams need as many descriptors in the load generator and the proxies.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    run = Run(args, list(args.selected))
    command = shlex.join(["python", "-m", "perf.bench", *(sys.argv[1:] if argv is None else argv)])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perf-bench-") as tmp:
        workdir = Path(tmp)
        with started_fleet(workdir, run) as fleet:
            run_scenarios(run, fleet, workdir)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "elapsed_s": round(time.monotonic() - started, 1),
        "machine": machine_info(),
    }
    md = report.render_markdown(run, meta)
    print(md)
    if not args.no_save:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        settings = {
            k: (_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "selected"
        }
        settings["scenarios_run"] = [s.name for s in run.scenarios]
        doc = {
            **meta,
            "settings": settings,
            "scenarios": {
                s.name: {"group": s.group, "what": s.what, "upstream": s.upstream} for s in run.scenarios
            },
            "cells": [c.as_dict() for c in run.cells],
            "failures": run.failures,
            "unavailable": run.unavailable,
        }
        (args.results_dir / "latest.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        (args.results_dir / "latest.md").write_text(md)
        written = ["latest.json", "latest.md"]
        if not args.no_plots:
            written += [p.name for p in report.plot(run, args.results_dir)]
        print(f"wrote {', '.join(written)} in {_relative(args.results_dir)}", file=sys.stderr)
    refused = {s.name for s in run.scenarios if s.refused_expected}
    problems = [p for c in run.cells for p in c.problems(c.scenario in refused)]
    return 1 if run.failures or problems else 0


if __name__ == "__main__":
    sys.exit(main())
