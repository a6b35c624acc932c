"""Micro-benchmarks of ``gateway.native``: one bucket ``take``, one usage parse of a 4 KiB tail (C and pure
Python), one ``TailBuffer.append`` of a 200-byte chunk. Run with ``python -m perf.micro_native``; takes a few
seconds, single-threaded. I/O: prints a table to stdout; the bucket table lives in a private bytearray.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from functools import partial

from gateway import native
from gateway.protocol import usage as pure

TAIL = native.DEFAULT_TAIL_CAPACITY


def stream_tail() -> bytes:
    """The last 4 KiB of a vLLM-style stream with include_usage: many chunks, then the usage chunk."""
    head = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1764468000,
        "model": "m",
    }
    frames = [
        {
            **head,
            "choices": [{"index": 0, "delta": {"content": f" word{i}"}, "finish_reason": None}],
            "usage": None,
        }
        for i in range(100)
    ]
    usage = {"prompt_tokens": 512, "completion_tokens": 100, "total_tokens": 612}
    frames.append(
        {**head, "choices": [], "usage": {**usage, "prompt_tokens_details": {"cached_tokens": 256}}}
    )
    body = "".join(f"data: {json.dumps(f, separators=(',', ':'))}\n\n" for f in frames) + "data: [DONE]\n\n"
    return body.encode()[-TAIL:]


def best_ns(fn: Callable[[], object], number: int) -> float:
    """Nanoseconds per call, best of five runs (the least disturbed by the rest of the machine)."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def main() -> None:
    rows: list[tuple[str, float, str]] = []

    with native.BucketTable.create_layout(bytearray(native.region_size(1024)), 1024) as table:
        key = native.bucket_key("key:1", "rpm")
        rows.append(
            ("BucketTable.take (admitted)", best_ns(lambda: table.take(key, 1e9, 10**9), 100_000), "ns")
        )
        refused = native.bucket_key("key:2", "rpm")
        table.take(refused, 1e-3, 1)
        rows.append(
            ("BucketTable.take (refused)", best_ns(lambda: table.take(refused, 1e-3, 1), 100_000), "ns")
        )
        rows.append(
            (
                "BucketTable.acquire+release",
                best_ns(lambda: (table.acquire(key, 10), table.release(key)), 50_000),
                "ns",
            )
        )

    tail = stream_tail()
    no_usage = tail.replace(b'"usage"', b'"usagE"')
    assert native.parse_usage_c(tail) == pure.parse_usage(tail) is not None
    rows.append(
        ("parse_usage, 4 KiB stream tail, C", best_ns(lambda: native.parse_usage_c(tail), 20_000) / 1e3, "µs")
    )
    rows.append(
        ("parse_usage, 4 KiB stream tail, Python", best_ns(lambda: pure.parse_usage(tail), 1_000) / 1e3, "µs")
    )
    rows.append(
        (
            "parse_usage, 4 KiB without usage, C",
            best_ns(lambda: native.parse_usage_c(no_usage), 20_000) / 1e3,
            "µs",
        )
    )
    rows.append(
        (
            "parse_usage, 4 KiB without usage, Python",
            best_ns(lambda: pure.parse_usage(no_usage), 1_000) / 1e3,
            "µs",
        )
    )
    body = tail * 4
    rows.append(
        (
            "parse_usage(memoryview(body)[-4096:]), C",
            best_ns(lambda: native.parse_usage_c(memoryview(body)[-TAIL:]), 20_000) / 1e3,
            "µs",
        )
    )

    chunk = bytes(range(200))
    for label, pure_impl in (("C", False), ("Python", True)):
        buf = native.TailBuffer(pure=pure_impl)
        rows.append((f"TailBuffer.append 200 B, {label}", best_ns(partial(buf.append, chunk), 200_000), "ns"))
    for label, pure_impl in (("C", False), ("Python", True)):
        buf = native.TailBuffer(pure=pure_impl)
        for start in range(0, TAIL, 200):
            buf.append(tail[start : start + 200])
        assert buf.usage() is not None
        rows.append((f"TailBuffer.usage, 4 KiB stream tail, {label}", best_ns(buf.usage, 1_000) / 1e3, "µs"))

    width = max(len(label) for label, _, _ in rows)
    for label, value, unit in rows:
        print(f"{label:<{width}}  {value:9.2f} {unit}")


if __name__ == "__main__":
    main()
