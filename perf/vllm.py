"""``python -m perf.vllm``: what the gateway adds in front of a real vLLM, per request and per token.

Takes a running vLLM (``--vllm-url``) or starts one (``--start-vllm --model M``), starts the gateway with a
generated config whose only backend is that vLLM, and measures the same load straight to vLLM (``direct``)
and through the gateway, interleaved:

- non-streamed chat completions (wrk, ``--max-tokens`` each) at each ``-c`` connection count: req/s, p50
  and p99 of each, and the gateway's added latency (gateway minus direct, at p50 and p99);
- streamed chat completions (``perf.streams --itl``, ``--stream-tokens`` each) at each
  ``--stream-connections``: TTFB, time to first token, inter-token latency (every gap between two
  tokens as the client sees them) and its per-stream mean, and the gateway's difference for each.

Requests carry ``ignore_eos`` (vLLM then generates exactly ``max_tokens``) and ``x-mock-tokens`` (the same
for the mock engine; vLLM ignores unknown headers), so both paths produce the same tokens.
``--dry-run`` prints every command and the gateway config without starting anything. ``--self-test`` runs
the whole thing briefly against the project's mock engine (started here, 10 ms between tokens) in place
of vLLM; ``--vllm-url http://127.0.0.1:<port>`` of a mock engine does the same with one you started.
I/O: subprocesses (vLLM, the gateway, wrk, perf.streams), HTTP to vLLM, a temp directory, the results files.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from perf.bench import machine_info, run_streams
from perf.loadgen import WrkResult, run_wrk, write_script
from perf.scenarios import CHAT, OPENAI_HEADERS, Scenario
from perf.targets import ACCOUNTED, BENCH_KEY, ROOT, GatewayService, MockEngineService, Service, http_request

__all__ = ["main"]

DIRECT_HEADERS = {"Content-Type": "application/json"}


class VLLMService(Service):
    """``python -m vllm.entrypoints.openai.api_server`` with ``--model``; ready when ``/health`` answers 200
    (loading weights and compiling can take many minutes, hence the long default wait)."""

    name = "vllm"

    def __init__(self, workdir: Path, argv: list[str], port: int) -> None:
        super().__init__(workdir)
        self.port = port
        self.argv = argv

    def start(self, timeout: float = 900.0) -> VLLMService:
        self._spawn(self.argv, cwd=self.workdir)
        self._wait(lambda: http_request(self.port, "GET", "/health")[0] == 200, timeout, "GET /health")
        return self


def vllm_argv(args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args.model, "--host", "127.0.0.1", "--port", str(args.vllm_port),
        *shlex.split(args.vllm_args),
    ]  # fmt: skip


def gateway_config(vllm_url: str, model: str, accounted: bool) -> str:
    """One backend (the vLLM), its model called by the same name as on vLLM (so both paths get the same
    body), the bench key; with ``accounted``, the rate
    limits, budget and price of the benchmark's ``gateway`` target (none of them ever refuses)."""
    price = "price = { input = 0.15, output = 0.60 }" if accounted else ""
    return f"""\
[[backends]]
name = "vllm"
url = "{vllm_url}"

[[provider_models]]
name = "{model}@vllm"
backends = [{{ backend = "vllm", model = "{model}" }}]

[[models]]
name = "{model}"
chain = ["{model}@vllm"]
{price}

[[roles]]
name = "bench"
permissions = ["model/*"]

[[principals]]
name = "bench"
roles = ["bench"]
{ACCOUNTED if accounted else ""}

[[keys]]
principal = "bench"
name = "bench-key"
secret = "{BENCH_KEY}"
"""


def check(name: str, url: str, body: bytes, headers: dict[str, str]) -> None:
    """One request before measuring, through urllib so a remote vLLM works too."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            if b'"choices"' in resp.read():
                return
    except OSError as exc:
        raise SystemExit(f"{name}: POST {url} failed: {exc}") from None
    raise SystemExit(f"{name}: POST {url} answered without choices")


def served_model(url: str) -> str:
    """The first model vLLM lists on ``/v1/models`` (its ``--served-model-name``, by default ``--model``)."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def bodies(model: str, args: argparse.Namespace) -> tuple[bytes, bytes]:
    msg = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    whole = {"model": model, "messages": msg, "max_tokens": args.max_tokens, "ignore_eos": True}
    stream = {
        "model": model,
        "messages": msg,
        "max_tokens": args.stream_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},  # the gateway asks for it anyway; same bytes both ways
    }
    return json.dumps(whole).encode(), json.dumps(stream).encode()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.vllm", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--vllm-url", help="a running vLLM (or mock engine): http://host:port")
    src.add_argument("--start-vllm", action="store_true", help="start vLLM here with --model")
    src.add_argument("--self-test", action="store_true", help="use the project's mock engine instead of vLLM")
    p.add_argument("--model", help="model to start, or the served name to call (default: the first listed)")
    p.add_argument("--vllm-port", type=int, default=8000, help="--start-vllm: its port (8000)")
    p.add_argument("--vllm-args", default="", help="--start-vllm: more vLLM flags, one shell-quoted string")
    p.add_argument(
        "--vllm-start-timeout", type=float, default=900.0, help="seconds to wait for /health (900)"
    )
    p.add_argument("-c", "--connections", default="1,16", help="non-streamed connection counts (1,16)")
    p.add_argument("--stream-connections", default="1,16", help="streamed connection counts (1,16)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per non-streamed answer (16)")
    p.add_argument("--stream-tokens", type=int, default=256, help="tokens per streamed answer (256)")
    p.add_argument("-d", "--duration", type=int, default=20, help="seconds per measured cell (20)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured seconds before each cell (5)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; tables show medians (1)")
    p.add_argument("--workers", type=int, default=2, help="gateway proxy workers (2)")
    p.add_argument("--bare", action="store_true", help="gateway without limits, budget or usage records")
    p.add_argument("--dry-run", action="store_true", help="print what would run, start nothing")
    p.add_argument(
        "--results-dir", type=Path, default=ROOT / "perf" / "results", help="where vllm-latest.* go"
    )
    p.add_argument("--no-save", action="store_true", help="print only (implied by --self-test)")
    args = p.parse_args(argv)
    if not (args.vllm_url or args.start_vllm or args.self_test):
        p.error("give --vllm-url URL, --start-vllm --model M, or --self-test")
    if args.start_vllm and not args.model:
        p.error("--start-vllm needs --model")
    args.connections = [int(c) for c in args.connections.split(",") if c]
    args.stream_connections = [int(c) for c in args.stream_connections.split(",") if c]
    if args.self_test:
        args.no_save = True
    return args


def _median(results: list[Any], key: Any) -> Any:
    return sorted(results, key=key)[(len(results) - 1) // 2]


def _delta(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{b - a:+.2f}"


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def whole_table(cells: dict[tuple[int, str], list[WrkResult]]) -> str:
    lines = [
        "| conns | direct req/s | gateway req/s | direct p50 ms | gateway p50 ms | added p50 ms "
        "| direct p99 ms | gateway p99 ms | added p99 ms | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sorted({c for c, _ in cells}):
        d = _median(cells.get((c, "direct"), []), lambda w: w.rps) if cells.get((c, "direct")) else None
        g = _median(cells.get((c, "gateway"), []), lambda w: w.rps) if cells.get((c, "gateway")) else None
        errors = sum(
            w.non_2xx + w.socket_errors for w in cells.get((c, "direct"), []) + cells.get((c, "gateway"), [])
        )
        lines.append(
            f"| {c} | {d.rps if d else 0:,.1f} | {g.rps if g else 0:,.1f} | {_fmt(d and d.p50_ms)} "
            f"| {_fmt(g and g.p50_ms)} | {_delta(d and d.p50_ms, g and g.p50_ms)} | {_fmt(d and d.p99_ms)} "
            f"| {_fmt(g and g.p99_ms)} | {_delta(d and d.p99_ms, g and g.p99_ms)} | {errors} |"
        )
    return "\n".join(lines)


def stream_table(cells: dict[tuple[int, str], list[dict[str, Any]]]) -> str:
    figures = [
        ("TTFB p50", "ttfb_ms", "50.0"),
        ("TTFB p99", "ttfb_ms", "99.0"),
        ("TTFT p50", "ttft_ms", "50.0"),
        ("TTFT p99", "ttft_ms", "99.0"),
        ("ITL p50", "itl_ms", "50.0"),
        ("ITL p99", "itl_ms", "99.0"),
        ("mean ITL p50", "mean_itl_ms", "50.0"),
    ]
    lines = [
        "| conns | figure (ms) | direct | gateway | added |",
        "|---:|---|---:|---:|---:|",
    ]
    for c in sorted({c for c, _ in cells}):
        runs = {
            t: _median(cells[(c, t)], lambda s: s["streams_per_s"])
            for t in ("direct", "gateway")
            if cells.get((c, t))
        }
        d, g = runs.get("direct"), runs.get("gateway")
        for label, key, q in figures:
            dv = d[key].get(q) if d else None
            gv = g[key].get(q) if g else None
            lines.append(f"| {c} | {label} | {_fmt(dv)} | {_fmt(gv)} | {_delta(dv, gv)} |")
    lines.append("")
    for (c, t), runs_ in sorted(cells.items()):
        s = _median(runs_, lambda s: s["streams_per_s"])
        lines.append(
            f"- {c} connections, {t}: {s['streams_per_s']:.2f} streams/s,"
            f" {s['tokens'] / max(1, s['complete']):.0f} tokens/stream, {s['incomplete']} incomplete,"
            f" {s['stalls']} stalled"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.self_test:
        args.connections, args.stream_connections = args.connections[:1], args.stream_connections[:1]
        args.duration, args.warmup, args.stream_tokens = min(args.duration, 3), min(args.warmup, 1), 64
    with tempfile.TemporaryDirectory(prefix="perf-vllm-") as tmp:
        return run(args, Path(tmp))


def run(args: argparse.Namespace, workdir: Path) -> int:
    services: list[Service] = []
    model = args.model or "<first model on /v1/models>"
    vllm_url = args.vllm_url or f"http://127.0.0.1:{args.vllm_port}"
    if args.dry_run:
        return dry_run(args, model, vllm_url)
    try:
        if args.self_test:
            engine = MockEngineService(workdir, tokens=args.stream_tokens)
            services.append(engine)
            engine.start()
            engine.configure(token_delay=0.01)  # 100 tokens/s per stream, like a busy GPU
            vllm_url = engine.url
        elif args.start_vllm:
            vllm = VLLMService(workdir, vllm_argv(args), args.vllm_port)
            services.append(vllm)
            print(f"starting vLLM: {shlex.join(vllm.argv)}", file=sys.stderr)
            vllm.start(args.vllm_start_timeout)
        vllm_url = vllm_url.rstrip("/")
        model = args.model if args.model and not args.self_test else served_model(vllm_url)
        config = gateway_config(vllm_url, model, accounted=not args.bare)
        gateway = GatewayService(workdir, vllm_url, args.workers, accounted=not args.bare, config=config)
        services.append(gateway)
        gateway.start()
        return measure_all(args, workdir, model, vllm_url, gateway.port)
    finally:
        for service in reversed(services):
            service.stop()


def dry_run(args: argparse.Namespace, model: str, vllm_url: str) -> int:
    print("# perf.vllm --dry-run: nothing is started\n")
    if args.self_test:
        print(
            "1. start the mock engine: python -m gateway mock-engine --port <free> --tokens 64;"
            " token_delay 0.01"
        )
    elif args.start_vllm:
        print(
            f"1. start vLLM, wait up to {args.vllm_start_timeout:g} s for /health:\n"
            f"   {shlex.join(vllm_argv(args))}"
        )
    else:
        print(f"1. use the running vLLM at {vllm_url}; model: {model}")
    print("\n2. start the gateway with this config:\n")
    print(gateway_config(vllm_url, model, accounted=not args.bare))
    gw = f"python -m gateway serve --config gateway.toml --port <free> --workers {args.workers}"
    print(f"   {gw}{' --no-usage-records' if args.bare else ''}\n")
    whole, stream = bodies(model, args)
    print(
        f"3. non-streamed, direct then through the gateway, {args.rounds} round(s), {args.warmup} s warm-up:"
    )
    for c in args.connections:
        wrk = f"wrk --latency -t{min(2, c)} -c{c} -d{args.duration}s -s chat.lua"
        print(f"   {wrk} {{{vllm_url},<gateway>}}{CHAT}")
    print(f"   body: {whole.decode()}")
    print("\n4. streamed, same order:")
    for c in args.stream_connections:
        print(
            f"   python -m perf.streams {{{vllm_url},<gateway>}}{CHAT} --body @stream.json -c {c} "
            f"-d {args.duration} --itl"
        )
    print(f"   body: {stream.decode()}")
    print("\n5. print the added latency tables; write perf/results/vllm-latest.{json,md} unless --no-save")
    return 0


def measure_all(args: argparse.Namespace, workdir: Path, model: str, vllm_url: str, gateway_port: int) -> int:
    whole_body, stream_body = bodies(model, args)
    mock = {"x-mock-tokens": str(args.max_tokens)}
    mock_stream = {"x-mock-tokens": str(args.stream_tokens)}
    paths = {
        "direct": (f"{vllm_url}{CHAT}", {**DIRECT_HEADERS, **mock}),
        "gateway": (f"http://127.0.0.1:{gateway_port}{CHAT}", {**OPENAI_HEADERS, **mock}),
    }
    for name, (url, headers) in paths.items():
        check(name, url, whole_body, headers)
    whole: dict[tuple[int, str], list[WrkResult]] = {}
    streamed: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for c in args.connections:
        for _ in range(args.rounds):
            for name, (url, headers) in paths.items():
                script = write_script(workdir / f"{name}.lua", whole_body, headers)
                if args.warmup:
                    run_wrk(url, script, c, args.warmup)
                w = run_wrk(url, script, c, args.duration)
                whole.setdefault((c, name), []).append(w)
                print(
                    f"whole c{c} {name:<8} {w.rps:,.1f} req/s p50 {w.p50_ms:.2f} p99 {w.p99_ms:.2f}",
                    file=sys.stderr,
                )
    for c in args.stream_connections:
        for _ in range(args.rounds):
            for name, (url, headers) in paths.items():
                body_file = workdir / "stream.json"
                body_file.write_bytes(stream_body)
                scenario = Scenario(
                    "vllm-stream", "vllm", "", "vllm", "streams", CHAT, stream_body,
                    {**headers, **mock_stream}, c, (name,), check_marker=b"", itl=True,
                )  # fmt: skip
                if args.warmup:
                    run_streams(scenario, url, body_file, args.warmup)
                s = run_streams(scenario, url, body_file, args.duration)
                streamed.setdefault((c, name), []).append(s)
                print(
                    f"stream c{c} {name:<8} {s['streams_per_s']:.2f}/s"
                    f" ttfb p50 {s['ttfb_ms'].get('50.0', 0):.2f}"
                    f" itl p50 {s['itl_ms'].get('50.0', 0):.2f} incomplete {s['incomplete']}",
                    file=sys.stderr,
                )
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "perf.vllm", *sys.argv[1:]]),
        "vllm_url": vllm_url,
        "model": model,
        "self_test": args.self_test,
        "machine": machine_info(),
        "gpu": _gpu(),
    }
    with_vllm = {}
    for pkg in ("vllm", "torch"):
        try:
            with_vllm[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    meta["machine"]["versions"].update(with_vllm)
    md = "\n".join(
        [
            "# Gateway overhead in front of " + ("the mock engine (self-test)" if args.self_test else "vLLM"),
            "",
            f"- date: {meta['date']}; command: `{meta['command']}`",
            f"- upstream: {vllm_url}, model `{model}`; GPU: {meta['gpu'] or 'none seen'}",
            f"- gateway: {args.workers} workers, "
            + ("bare" if args.bare else "limits, budget, usage records on"),
            f"- {args.duration} s per cell after {args.warmup} s warm-up;"
            f" non-streamed {args.max_tokens} tokens,"
            f" streamed {args.stream_tokens} tokens (ignore_eos)",
            "",
            "## Non-streamed (wrk): added latency per request",
            "",
            whole_table(whole),
            "",
            "## Streamed (perf.streams --itl): added latency per stream and per token",
            "",
            stream_table(streamed),
            "",
        ]
    )
    print(md)
    if not args.no_save:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        doc = {
            **meta,
            "whole": [
                {"connections": c, "target": t, **w.as_dict()} for (c, t), ws in whole.items() for w in ws
            ],
            "streamed": [{"connections": c, "target": t, **s} for (c, t), ss in streamed.items() for s in ss],
        }
        (args.results_dir / "vllm-latest.json").write_text(json.dumps(doc, indent=2) + "\n")
        (args.results_dir / "vllm-latest.md").write_text(md)
    bad = sum(w.non_2xx + w.socket_errors for ws in whole.values() for w in ws)
    bad += sum(s["incomplete"] + s["stalls"] for ss in streamed.values() for s in ss)
    return 1 if bad else 0


def _gpu() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return "; ".join(out.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        return ""


if __name__ == "__main__":
    sys.exit(main())
