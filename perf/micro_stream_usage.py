"""Micro-benchmark of withholding the usage the gateway asked for (``UsageWithholder.feed`` with the
gateway's C ``strip_usage_nulls``, and with its pure-Python reference): nanoseconds per stream event on
vLLM's transcript in tests/data/streams, once as an engine that adds ``"usage":null`` to every chunk sends
it and once as one that does not; each way one event per piece (an engine pacing tokens) and the whole
stream in one piece (a fast engine's stream read at once: 1-2 pieces per 256 tokens). Run with
``python -m perf.micro_stream_usage``. I/O: reads the transcripts, prints to stdout.
"""

from __future__ import annotations

import timeit
from pathlib import Path

from gateway.native import strip_usage_nulls
from gateway.protocol.stream_usage import Strip, UsageWithholder
from gateway.protocol.stream_usage import strip_usage_nulls as strip_usage_nulls_py

STREAMS = Path(__file__).resolve().parents[1] / "tests" / "data" / "streams"
ROUNDS = 3000


def events(name: str) -> list[bytes]:
    data = (STREAMS / name).read_bytes()
    return [e + b"\n\n" for e in data.split(b"\n\n")[:-1]]


def per_event(pieces: list[bytes], events: int, strip: Strip) -> float:
    """Nanoseconds per event of feeding ``pieces`` to a fresh withholder, the loop's own cost taken off."""

    def withheld() -> None:
        w = UsageWithholder(strip)
        for p in pieces:
            w.feed(p)

    def bare() -> None:
        for _ in pieces:
            pass

    spent = min(timeit.repeat(withheld, number=ROUNDS, repeat=3))
    base = min(timeit.repeat(bare, number=ROUNDS, repeat=3))
    return (spent - base) / ROUNDS / events * 1e9


def main() -> None:
    print("| stream | pieces | C ns/event | Python ns/event |")
    print("|---|---|---:|---:|")
    for label, name in (
        ('engine adds "usage":null', "vllm_chat.include_usage.sse"),
        ('engine adds no "usage":null', "vllm_chat.sse"),
    ):
        each = events(name)
        for cut, pieces in (("one per event", each), ("one for the stream", [b"".join(each)])):
            c, py = (
                per_event(pieces, len(each), strip) for strip in (strip_usage_nulls, strip_usage_nulls_py)
            )
            print(f"| {label} ({len(each)} events) | {cut} | {c:.0f} | {py:.0f} |")


if __name__ == "__main__":
    main()
