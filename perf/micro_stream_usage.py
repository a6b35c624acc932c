"""Micro-benchmark of withholding the usage the gateway asked for (``UsageWithholder.feed``): nanoseconds
per stream event, one event per piece as engines send them, on vLLM's transcript in tests/data/streams,
once as an engine that adds ``"usage":null`` to every chunk sends it and once as one that does not. Run
with ``python -m perf.micro_stream_usage``. I/O: reads the transcripts, prints to stdout.
"""

from __future__ import annotations

import timeit
from pathlib import Path

from gateway.protocol.stream_usage import UsageWithholder

STREAMS = Path(__file__).resolve().parents[1] / "tests" / "data" / "streams"
ROUNDS = 3000


def events(name: str) -> list[bytes]:
    data = (STREAMS / name).read_bytes()
    return [e + b"\n\n" for e in data.split(b"\n\n")[:-1]]


def main() -> None:
    for label, name in (
        ('engine adds "usage":null', "vllm_chat.include_usage.sse"),
        ('engine adds no "usage":null', "vllm_chat.sse"),
    ):
        pieces = events(name)

        def withheld(pieces: list[bytes] = pieces) -> None:
            w = UsageWithholder()
            for p in pieces:
                w.feed(p)

        def bare(pieces: list[bytes] = pieces) -> None:
            for _ in pieces:
                pass

        spent = min(timeit.repeat(withheld, number=ROUNDS, repeat=3))
        base = min(timeit.repeat(bare, number=ROUNDS, repeat=3))
        per_event = (spent - base) / ROUNDS / len(pieces) * 1e9
        print(f"{label}: {per_event:.0f} ns per event ({len(pieces)} events)")


if __name__ == "__main__":
    main()
