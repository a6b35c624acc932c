"""Micro-benchmark of body logs (issue 21 item 4), in-process, on this machine's CPU time:

- the request path's test when no ``[[body_logs]]`` entry exists, and ``BodyLogRules.pick`` with ten
  entries of which none or the last picks the request (what every request pays);
- a logged request's share on the worker: noting a 256-token stream's pieces (``BodyCapture.add``), making
  its frame and copying it into a body ring (``SpanRing.push``), for a short chat and a 64 KiB prompt;
- the control worker's share per body: decoding the frame, redacting (one path, e-mail and card patterns)
  and rebuilding the stream (``BodyRules.prepare``).

Run with ``python -m perf.micro_bodies [--seconds 0.5]``; each figure is the best of 5 timed batches, in
CPU time.
I/O: reads the stream transcript in tests/data/streams, prints to stdout.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from gateway.body_rules import BodyLogRules
from gateway.controlplane.bodies.rules import BodyRules
from gateway.dataplane.body_log import BodyCapture
from gateway.native import SpanRing, ring_region_size

STREAM = Path(__file__).resolve().parents[1] / "tests" / "data" / "streams" / "vllm_chat.include_usage.sse"


def per_call(fn: Callable[[], object], seconds: float) -> float:
    """CPU microseconds per call (this process's CPU time, so that other processes on a shared machine
    count less): the best of 5 batches, each about ``seconds / 5`` of CPU."""
    n, start = 1, time.process_time()
    while time.process_time() - start < seconds / 50:
        fn()
        n += 1
    n *= 10
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t0) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5)
    seconds = parser.parse_args().seconds
    entries = [
        {"name": f"e{i}", "id": f"id{i}", "principals": [f"p{i}"], "models": ["chat"]} for i in range(10)
    ]
    rules = BodyLogRules.from_doc(entries)
    assert rules is not None
    absent = None
    rows: list[tuple[str, float]] = []
    rows.append(
        ("no entry: the request path's test (and a lambda call)", per_call(lambda: absent is None, seconds))
    )
    rows.append(
        ("10 entries, none picks", per_call(lambda: rules.pick("px", "k", "chat", "chat", "chat"), seconds))
    )
    rows.append(
        (
            "10 entries, the last picks",
            per_call(lambda: rules.pick("p9", "k", "chat", "chat", "chat"), seconds),
        )
    )

    stream = STREAM.read_bytes()
    pieces = [e + b"\n\n" for e in stream.split(b"\n\n")[:-1]]
    rule = rules.rules[9]
    short = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "Name three rivers."}]})
    long = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "x " * 32768}]})
    region = bytearray(ring_region_size(1, 2048, 4096))
    ring = SpanRing.create_layout(region, 1, 2048, 4096)

    def logged(request: bytes) -> Callable[[], object]:
        def run() -> object:
            capture = BodyCapture(rule, request, "openai", "/v1/chat/completions", True)
            capture.streamed = True
            for piece in pieces:
                capture.add(piece)
            frame = capture.frame("0123456789abcdef00000001", "p9", "k", "chat", 200)
            ring.push(0, frame)
            ring.advance(0, ring.pending(0))  # a consumer that keeps up
            return frame

        return run

    rows.append(
        (f"short chat, {len(pieces)}-event stream: note, frame, push", per_call(logged(short), seconds))
    )
    rows.append(("64 KiB prompt, the same stream: note, frame, push", per_call(logged(long), seconds)))

    control = BodyRules()
    control.set_entries(
        [{**entries[9], "redact_paths": ["metadata.user_id"], "redact_patterns": ["email", "card"]}]
    )
    frames = {
        "short chat": logged(short)(),
        "64 KiB prompt": logged(long)(),
    }
    for label, frame in frames.items():
        assert isinstance(frame, bytes)
        rows.append(
            (f"control: redact and rebuild, {label}", per_call(lambda f=frame: control.prepare(f), seconds))
        )
    ring.close()
    width = max(len(label) for label, _ in rows)
    print(f"| {'what':<{width}} | CPU µs per call |\n|{'-' * (width + 2)}|---:|")
    for label, us in rows:
        print(f"| {label:<{width}} | {us:.2f} |")


if __name__ == "__main__":
    main()
