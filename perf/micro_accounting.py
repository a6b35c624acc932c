"""Micro-benchmark of the request path's accounting, in one process: ``Accounting.admit`` and ``finish``
around a tapped non-streamed answer, with rate limits (all three kinds), a budget, a price and usage
records each on or off. Shared regions are private bytearrays and the usage ring is emptied as it fills;
no store, no network. Run with ``python -m perf.micro_accounting``. I/O: prints a table to stdout.

``--instructions`` counts instead of timing: each configuration runs in a child process under valgrind's
callgrind, once for 2,000 requests and once for 6,000, and the difference over 4,000 is the CPU
instructions one request's accounting costs. Unlike the timings, those counts do not move with the
machine's load, so two commits compare exactly (valgrind: ``./scripts/system-deps.sh profile``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.dataplane.accounting import Accounting, Exchange
from gateway.dataplane.budgets import BudgetGuard
from gateway.dataplane.limits import Limiter
from gateway.dataplane.tap import ResponseTap
from gateway.dataplane.usage_log import UsageLog
from gateway.native import AtomicWords, BucketTable, UsageRing, region_size, ring_region_size
from gateway.shm.holdings import HOLD_WORDS, Holdings
from gateway.snapshot import Snapshot
from perf.callgrind import instructions

N = 50_000
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
    }
)


def snapshot(limits: bool, budget: bool) -> Snapshot:
    principal: dict[str, Any] = {"name": "bench", "allow_all": True, "models": []}
    if limits:
        principal["limits"] = {"rpm": 10**9, "tpm": 10**12, "concurrency": 100_000}
    if budget:
        principal["budget"] = {"period": "day", "tokens": 10**12}
    doc = {
        "schema": 1,
        "revision": 1,
        "backends": {"e": {"url": "http://127.0.0.1:1"}},
        "routes": {
            "m": {
                "canonical": "m",
                "kind": "frontend",
                "targets": [["p", "e", "p"]],
                "price": [0.15, 0.6, 0.15],
            }
        },
        "principals": {"p1": principal},
        "keys": {"ab" * 32: {"id": "k1", "principal": "p1", "expires_at": None}},
    }
    return Snapshot.from_doc(doc, 1)


class _Proto:
    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        pass


def request_loop(limits: bool, budget: bool, usage: bool) -> Callable[[int], None]:
    """``run(n)``: n requests' accounting (admit, a tapped answer, finish) in fresh private regions."""
    snap = snapshot(limits, budget)
    key = next(iter(snap.keys.values()))
    route = snap.routes["m"]
    table = BucketTable.create_layout(bytearray(region_size(1024)), 1024)
    ring = UsageRing.create_layout(bytearray(ring_region_size(1, 4096, 1024)), 1, 4096, 1024)
    holdings = Holdings(AtomicWords(bytearray(8 * HOLD_WORDS)), 0)
    acc = Accounting(
        Limiter(table, holdings) if limits else None,
        BudgetGuard(table, "epoch") if budget else None,
        UsageLog(ring, 0) if usage else None,
    )
    proto = _Proto()
    headers = [("content-type", "application/json")]

    def run(n: int) -> None:
        for i in range(n):
            ex = acc.admit(key, "m", route, 120, 16, 512)
            if not isinstance(ex, Exchange):  # nothing to account: the do-nothing exchange
                continue
            tap = ResponseTap(proto, ex.headers)
            tap.response_bytes(200, headers, ANSWER)
            acc.finish(ex, tap, 200, "e")
            if i % 4000 == 3999:
                ring.advance(0, ring.pending(0))

    return run


def per_request_us(limits: bool, budget: bool, usage: bool) -> float:
    run = request_loop(limits, budget, usage)
    started = time.perf_counter()
    run(N)
    return (time.perf_counter() - started) / N * 1e6


ROWS = [
    ("nothing (no exchange: the plain path)", False, False, False),
    ("usage records only", False, False, True),
    ("budget only", False, True, False),
    ("rate limits only (rpm, tpm, concurrency)", True, False, False),
    ("all of them", True, True, True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one configuration's requests, for callgrind to count
        flags, n = args.child
        request_loop(*(flag == "1" for flag in flags))(int(n))
        return
    if args.instructions:
        print("| accounting on | instructions per request |")
        print("|---|---:|")
        for label, limits, budget, usage in ROWS:
            flags = "".join("1" if on else "0" for on in (limits, budget, usage))
            few, many = (
                instructions("perf.micro_accounting", "--child", flags, str(n)) for n in (2000, 6000)
            )
            print(f"| {label} | {(many - few) / 4000:,.0f} |")
        return
    print("| accounting on | µs per request |")
    print("|---|---:|")
    for label, limits, budget, usage in ROWS:
        best = min(per_request_us(limits, budget, usage) for _ in range(3))
        print(f"| {label} | {best:.2f} |")


if __name__ == "__main__":
    main()
