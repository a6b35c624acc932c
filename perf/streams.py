"""``python -m perf.streams``: an SSE load generator for many concurrent streams, which wrk cannot do well.

Each stream is one ``POST`` on a raw asyncio connection (HTTP/1.1, chunked or sized bodies). Per stream it
records the time to the first byte of the response (TTFB), to the first content token (TTFT), to the end,
the largest gap between two reads (a gap over ``--stall-after`` seconds is a *stall*), the number of
content tokens and whether ``data: [DONE]`` arrived. A stream is *complete* when it answered 200, ended
with ``[DONE]`` and carried at least ``--expect-tokens`` tokens.

Two modes:

- ``--streams N``: a burst. N streams on N connections, their starts spread evenly over ``--ramp``
  seconds, all awaited. Answers "do 2,000 concurrent slow streams all complete, and does any stall?".
- ``--connections C --duration D``: closed loop. C keep-alive connections, each sending its next
  streamed request as soon as the last ended, for D seconds; gives streams per second and latency
  percentiles like wrk does for whole responses.

Tokens are counted from the bytes (``"content":"`` followed by a non-empty string, in OpenAI chunk shape,
as vLLM and the mock engine write it), so nothing is parsed as JSON on the hot path. Prints one JSON object
on stdout. I/O: loopback or remote TCP connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["StreamResult", "main", "percentiles", "run"]

PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)
_TOKEN = re.compile(rb'"content":\s*"(?!")')
_DONE = b"data: [DONE]"


@dataclass(slots=True)
class StreamResult:
    """One stream. Times are seconds from the moment its request was written."""

    status: int = 0
    ttfb: float | None = None
    ttft: float | None = None
    last_token: float | None = None
    total: float | None = None
    tokens: int = 0
    done: bool = False
    max_gap: float = 0.0
    max_token_gap: float = 0.0  # the longest wait between two reads that carried tokens
    error: str | None = None
    token_gaps: list[float] = field(default_factory=list)  # only with --itl

    def complete(self, expect_tokens: int) -> bool:
        return self.status == 200 and self.done and self.error is None and self.tokens >= expect_tokens


def percentiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """Nearest-rank percentiles (and max) of ``values``, multiplied by ``scale`` (seconds to ms)."""
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)
    out = {str(q): ordered[min(n - 1, max(0, int(q / 100 * n + 0.999999) - 1))] * scale for q in PERCENTILES}
    out["max"] = ordered[-1] * scale
    return out


def _request(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Stream:
    """Reads one response off a connection, timing every read."""

    def __init__(self, reader: asyncio.StreamReader, started: float, itl: bool) -> None:
        self.reader = reader
        self.started = started
        self.last = started
        self.result = StreamResult()
        self.itl = itl
        self.pending = b""  # bytes of an event not yet complete
        self.last_token_at: float | None = None
        self.tail = b""

    def _saw_bytes(self, now: float) -> None:
        r = self.result
        r.max_gap = max(r.max_gap, now - self.last)
        self.last = now
        if r.ttfb is None:
            r.ttfb = now - self.started

    def _body(self, data: bytes, now: float) -> None:
        self._saw_bytes(now)
        events = self.pending + data
        cut = events.rfind(b"\n\n") + 2  # count only whole events; a split one waits for its end
        whole, self.pending = events[:cut], events[cut:]
        if not whole:
            return
        n = len(_TOKEN.findall(whole))
        r = self.result
        if n:
            if r.ttft is None:
                r.ttft = now - self.started
            elif self.last_token_at is not None:
                gap = now - self.last_token_at
                if gap > r.max_token_gap:
                    r.max_token_gap = gap
                if self.itl:
                    r.token_gaps.append(gap)
            if self.itl:
                r.token_gaps.extend([0.0] * (n - 1))  # tokens that arrived in the same read
            self.last_token_at = now
            r.last_token = now - self.started
            r.tokens += n
        if _DONE in whole:
            r.done = True

    async def read(self) -> tuple[StreamResult, bool]:
        """The response; and whether the connection can carry another request."""
        reader = self.reader
        head = await reader.readuntil(b"\r\n\r\n")
        self._saw_bytes(time.monotonic())
        lines = head.decode("latin-1").split("\r\n")
        self.result.status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        keep = headers.get("connection", "").lower() != "close"
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b""):
                        pass  # trailers
                    break
                data = await reader.readexactly(size + 2)
                self._body(data[:-2], time.monotonic())
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left > 0:
                data = await reader.read(min(left, 65536))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                self._body(data, time.monotonic())
        else:
            keep = False
            while data := await reader.read(65536):
                self._body(data, time.monotonic())
        if self.pending:
            self._body(b"\n\n", time.monotonic())  # a last event without its blank line
        self.result.total = time.monotonic() - self.started
        return self.result, keep


@dataclass(slots=True)
class Load:
    url: str
    body: bytes
    headers: dict[str, str]
    timeout: float
    itl: bool = False
    open_now: int = 0
    max_open: int = 0

    def target(self) -> tuple[str, int, str, str]:
        u = urlsplit(self.url)
        host = u.hostname or "127.0.0.1"
        port = u.port or 80
        return host, port, u.path or "/", f"{host}:{port}"


async def _one(
    load: Load, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None
) -> tuple[StreamResult, tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]:
    """One stream, on ``conn`` if given (keep-alive) or a fresh connection. Returns the connection if it
    can be reused."""
    host, port, path, authority = load.target()
    started = time.monotonic()
    result = StreamResult()
    load.open_now += 1
    load.max_open = max(load.max_open, load.open_now)
    try:
        async with asyncio.timeout(load.timeout):
            if conn is None:
                conn = await asyncio.open_connection(host, port)
                started = time.monotonic()  # TTFB from the request, not from the connect
            reader, writer = conn
            writer.write(_request(authority, path, load.body, load.headers))
            stream = _Stream(reader, started, load.itl)
            result = stream.result
            result, keep = await stream.read()
            if keep:
                return result, conn
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    except TimeoutError:
        result.error = f"timeout after {load.timeout:g} s"
    finally:
        load.open_now -= 1
    if conn is not None:
        conn[1].close()
    return result, None


async def burst(
    load: Load, streams: int, ramp: float, share: int = 0, shares: int = 1
) -> tuple[list[StreamResult], float]:
    """Streams ``share``, ``share + shares``, ... of ``streams`` started evenly over ``ramp`` seconds: with
    ``--procs``, each process opens every ``shares``-th stream, so together they keep the even spread."""

    async def delayed(i: int) -> StreamResult:
        await asyncio.sleep(ramp * i / streams)
        return (await _one(load, None))[0]

    started = time.monotonic()
    results = await asyncio.gather(*(delayed(i) for i in range(share, streams, shares)))
    return list(results), time.monotonic() - started


async def closed_loop(load: Load, connections: int, duration: float) -> tuple[list[StreamResult], float]:
    """Streams that ended within ``duration`` count; the ones still running then are finished and checked
    but not counted in the rate."""
    deadline = time.monotonic() + duration
    counted: list[StreamResult] = []
    late: list[StreamResult] = []

    async def worker() -> None:
        conn = None
        while time.monotonic() < deadline:
            result, conn = await _one(load, conn)
            (counted if time.monotonic() <= deadline else late).append(result)
        if conn is not None:
            conn[1].close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return counted + [r for r in late if not r.complete(0)], min(duration, time.monotonic() - started)


def summarize(
    results: Sequence[StreamResult], wall: float, expect_tokens: int, stall_after: float, load: Load
) -> dict[str, Any]:
    ok = [r for r in results if r.complete(expect_tokens)]
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            kind = r.error.split(":", 1)[0]
            errors[kind] = errors.get(kind, 0) + 1
    itl = [g for r in ok for g in r.token_gaps]
    mean_itl = [
        (r.last_token - r.ttft) / (r.tokens - 1)
        for r in ok
        if r.ttft is not None and r.last_token is not None and r.tokens > 1
    ]
    return {
        "streams": len(results),
        "complete": len(ok),
        "incomplete": len(results) - len(ok),
        "non_200": sum(1 for r in results if r.status not in (0, 200)),
        "no_done": sum(1 for r in results if r.status == 200 and not r.done),
        "short": sum(1 for r in results if r.done and r.tokens < expect_tokens),
        "errors": errors,
        "stalls": sum(1 for r in results if r.max_gap > stall_after or (r.error or "").startswith("timeout")),
        "stall_after_s": stall_after,
        "max_gap_ms": max((r.max_gap for r in results), default=0.0) * 1000,
        # Per complete stream, its longest wait between two tokens: against the upstream's pacing, a stall
        # shows here even when it is shorter than --stall-after.
        "max_token_gap_ms": percentiles([r.max_token_gap for r in ok]),
        "max_open": load.max_open,
        "wall_s": round(wall, 3),
        "streams_per_s": len(ok) / wall if wall else 0.0,
        "tokens": sum(r.tokens for r in ok),
        "tokens_per_s": sum(r.tokens for r in ok) / wall if wall else 0.0,
        "ttfb_ms": percentiles([r.ttfb for r in ok if r.ttfb is not None]),
        "ttft_ms": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "total_ms": percentiles([r.total for r in ok if r.total is not None]),
        "itl_ms": percentiles(itl),  # every gap between two tokens, with --itl
        "mean_itl_ms": percentiles(mean_itl),  # per stream: (last token - first token) / (tokens - 1)
        "first_error": next((r.error for r in results if r.error), None),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.streams", description=__doc__.split("\n")[0])
    p.add_argument("url", help="full URL, e.g. http://127.0.0.1:8080/v1/chat/completions")
    p.add_argument("--body", required=True, help="request body (JSON text), or @FILE")
    p.add_argument("-H", "--header", action="append", default=[], help="'Name: value', repeatable")
    p.add_argument("--streams", type=int, help="burst mode: this many concurrent streams")
    p.add_argument("--ramp", type=float, default=1.0, help="burst mode: seconds over which to start them (1)")
    p.add_argument("-c", "--connections", type=int, default=16, help="closed-loop mode: connections (16)")
    p.add_argument("-d", "--duration", type=float, default=10.0, help="closed-loop mode: seconds (10)")
    p.add_argument("--expect-tokens", type=int, default=1, help="fewer content tokens is incomplete (1)")
    p.add_argument("--stall-after", type=float, default=2.0, help="a gap this long is a stall, s (2)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a stream is abandoned")
    p.add_argument("--itl", action="store_true", help="keep every inter-token gap (itl_ms percentiles)")
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        help="processes sharing the streams or connections (1): one Python process reads about 70k "
        "tokens a second at most, and 5,000 paced streams send twice that",
    )
    return p.parse_args(argv)


Part = tuple[list[StreamResult], float, int]  # one process's results, wall time and most open at once


async def _measure(args: argparse.Namespace, share: int, shares: int) -> Part:
    raw = args.body
    body = Path(raw[1:]).read_bytes() if raw.startswith("@") else raw.encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    for h in args.header:
        k, _, v = h.partition(":")
        headers[k.strip()] = v.strip()
    load = Load(args.url, body, headers, args.timeout, args.itl)
    if args.streams:
        results, wall = await burst(load, args.streams, args.ramp, share, shares)
    else:
        connections = len(range(share, args.connections, shares))
        results, wall = await closed_loop(load, connections, args.duration)
    return results, wall, load.max_open


def _loop_runner() -> Any:
    try:
        import uvloop  # a cheaper loop leaves more of a small machine to what is measured

        return uvloop.run
    except ImportError:
        return asyncio.run


def _share(job: tuple[argparse.Namespace, int, int]) -> Part:
    """One process's part of a ``--procs`` run (module level, so that the pool can call it)."""
    args, share, shares = job
    result: Part = _loop_runner()(_measure(args, share, shares))
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The measurement, in this process or split over ``args.procs`` forked ones. With several, ``max
    open`` is the sum of each process's most open at once (an upper bound) and the wall time the
    longest."""
    procs = max(1, min(args.procs, args.streams or args.connections))
    if procs == 1:
        parts = [_share((args, 0, 1))]
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(procs) as pool:
            parts = pool.map(_share, [(args, i, procs) for i in range(procs)])
    results = [r for part in parts for r in part[0]]
    wall = max(part[1] for part in parts)
    load = Load(args.url, b"", {}, args.timeout, max_open=sum(part[2] for part in parts))
    out = summarize(results, wall, args.expect_tokens, args.stall_after, load)
    out["mode"] = "burst" if args.streams else "closed-loop"
    out["connections"] = args.streams or args.connections
    out["procs"] = procs
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = run(args)
    print(json.dumps(out))
    return 0 if out["incomplete"] == 0 and out["stalls"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
