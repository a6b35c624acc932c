"""The proxy workers' event loop, measured: the gateway on uvloop against the gateway on asyncio's own loop,
same upstream (the nginx mock), same load, alternating rounds in one run.

    .venv/bin/python -m perf.loop_compare [--rounds 3] [-d 8] [-c 16,64] [--workers 1]

Why it matters: granian's Rust threads hand each request (and each response event) to the Python loop
with ``call_soon_threadsafe``; asyncio's selector loop answers each call with a write to its self-pipe and
a wake-up, which py-spy showed as a quarter of a proxy worker's samples. Prints one line per cell and the
medians. I/O: starts nginx, the gateway and wrk; stops them by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from perf.loadgen import run_wrk, write_script
from perf.targets import BENCH_KEY, BENCH_MODEL, GatewayService, NginxService

LOOPS = ("asyncio", "uvloop")
BODY = json.dumps(
    {"model": BENCH_MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16},
    separators=(",", ":"),
).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-d", "--duration", type=float, default=8.0, help="seconds per cell")
    parser.add_argument("-c", "--connections", default="16,64")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    conns = [int(c) for c in args.connections.split(",")]
    body = BODY
    results: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="loop-compare-") as tmp:
        work = Path(tmp)
        script = write_script(
            work / "req.lua",
            body,
            {"content-type": "application/json", "authorization": f"Bearer {BENCH_KEY}"},
        )
        upstream = NginxService.upstream(work).start()
        try:
            for round_ in range(args.rounds):
                for loop in LOOPS:
                    os.environ["GATEWAY_EVENT_LOOP"] = loop  # the gateway's Settings default reads it
                    (work / f"{loop}-{round_}").mkdir()
                    gw = GatewayService(work / f"{loop}-{round_}", upstream.url, workers=args.workers)
                    gw.start()
                    try:
                        url = gw.url + "/v1/chat/completions"
                        run_wrk(url, script, conns[0], 1, threads=1)  # warm-up
                        for c in conns:
                            r = run_wrk(url, script, c, args.duration, threads=2 if c > 8 else 1)
                            results.setdefault((loop, c), []).append(r.rps)
                            cell = f"round {round_ + 1} {loop:<8} c{c:<4}"
                            print(f"{cell} {r.rps:>9,.0f} req/s  p50 {r.p50_ms:.2f} ms")
                    finally:
                        gw.stop()
        finally:
            upstream.stop()
            os.environ.pop("GATEWAY_EVENT_LOOP", None)
    print("\n| conns | asyncio req/s | uvloop req/s | uvloop / asyncio |\n|---:|---:|---:|---:|")
    for c in conns:
        a, u = statistics.median(results[("asyncio", c)]), statistics.median(results[("uvloop", c)])
        print(f"| {c} | {a:,.0f} | {u:,.0f} | {u / a:.2f}x |")


if __name__ == "__main__":
    main()
