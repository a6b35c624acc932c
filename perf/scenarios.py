"""The benchmark's scenarios: what is sent, to which path, how hard, from which load generator, and which
targets it applies to. Pure values, no I/O; ``python -m perf.bench --list`` prints them.

Scenarios run on one of three upstreams: ``nginx`` (the nginx mock: fixed answers in microseconds, for
whole responses), ``engine`` (the project's Python mock engine, which streams and can trickle tokens) or
``paced`` (``perf.paced``: thousands of streams, each token 20-50 ms after the last, as from a busy vLLM).
Each has a group, so ``--scenarios`` takes either names or groups.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from perf.targets import BENCH_KEY, BENCH_MODEL, LIMITED_KEY, LIMITED_RPM, PACED_MODEL, STREAM_MODEL

__all__ = [
    "ALL_TARGETS",
    "FLOOR",
    "GROUPS",
    "OPTIONAL",
    "REFERENCE",
    "Scenario",
    "build_scenarios",
    "processes_for",
    "select",
]

# gateway: rate limits, a budget, prices and usage records on every request; gateway-bare: all of it off;
# null-app and minimal-proxy: the floor of the gateway's shape (perf/floor.py under granian); litellm,
# portkey and smg (SGLang Model Gateway, a compiled router, round robin over the one upstream): peers,
# measured only when installed (scripts/bench-peers.sh).
ALL_TARGETS = (
    "direct",
    "nginx",
    "null-app",
    "minimal-proxy",
    "gateway",
    "gateway-bare",
    "litellm",
    "portkey",
    "smg",
)
OPTIONAL = ("litellm", "portkey", "smg")  # a missing one is a row saying so, never a failure
REFERENCE = "nginx"  # ratios are to this target's figures in the same scenario
FLOOR = "minimal-proxy"  # and to this one's: what the gateway's own work costs on top of its shape
PROXIES = (
    "direct", "nginx", "null-app", "minimal-proxy", "gateway", "gateway-bare", "litellm", "portkey", "smg"
)  # fmt: skip
# null-app answers from memory: it cannot stream. Portkey's gateway 1.15.2 answers every stream with a 500
# on Node 20 (its updateHeaders appends to the immutable headers of undici's fetch Response: "TypeError:
# immutable" in its log, 2026-12-01), so it is measured on whole responses only.
STREAMERS = tuple(t for t in PROXIES if t not in ("null-app", "portkey"))
# The Python peers are left out of the paced bursts: at thousands of streams they would take the run's
# minutes; smg, compiled, is not.
PACED_TARGETS = ("direct", "nginx", "minimal-proxy", "gateway", "gateway-bare", "smg")
GATEWAYS = ("gateway", "gateway-bare")

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
OPENAI_HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {BENCH_KEY}"}
ANTHROPIC_HEADERS = {
    "Content-Type": "application/json",
    "x-api-key": BENCH_KEY,
    "anthropic-version": "2023-06-01",
}


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def chat_body(
    model: str = BENCH_MODEL, content: str = "Say hello.", max_tokens: int = 16, **extra: object
) -> bytes:
    return _json(
        {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            **extra,
        }
    )


SMALL_BODY = chat_body()  # 91 bytes
LARGE_PROMPT_BYTES = 100_000
LARGE_BODY = chat_body(content=("lorem " * (LARGE_PROMPT_BYTES // 6 + 1))[:LARGE_PROMPT_BYTES])


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    group: str
    what: str  # one line for the report
    upstream: str  # "nginx" | "engine" | "paced"
    loadgen: str  # "wrk" | "streams"
    path: str
    body: bytes
    headers: dict[str, str]
    connections: int  # wrk and closed-loop streams; burst: the number of streams
    targets: tuple[str, ...]
    refused_expected: bool = False  # the rate-limited key: 429s are the point, not errors
    check_marker: bytes = b'"choices"'  # what a good answer contains (429s aside)
    # streams only
    burst: bool = False
    expect_tokens: int = 1
    token_delay: float = 0.0  # the mock engine's seconds between chunks during this scenario
    ramp_s: float = 0.0
    stall_after_s: float = 2.0
    itl: bool = False  # keep every inter-token gap (perf.vllm)
    pace_ms: tuple[float, float] = (0.0, 0.0)  # perf.paced's gap between tokens, drawn per token
    procs: int = 1  # perf.streams processes sharing the streams


# One Python process of perf.streams reads, and one of perf.paced writes, at most some 70-90k tokens a
# second on this machine; a stream paced 20-50 ms apart carries ~29 a second. Past this many streams per
# process the load generator or the upstream, not the proxy, would set the pace.
STREAMS_PER_PROCESS = 2000


def processes_for(streams: int, cores: int) -> int:
    """How many load-generator (or paced-upstream) processes ``streams`` paced streams need, at most one a
    core: on a machine with fewer cores than that, the figures say so through the harness's own CPU."""
    return max(1, min(cores, -(-streams // STREAMS_PER_PROCESS)))


def build_scenarios(
    connections: Sequence[int] = (8, 64),
    *,
    large_connections: int = 8,
    stream_connections: int = 32,
    stream_tokens: int = 256,
    slow_streams: int = 2000,
    slow_tokens: int = 40,
    slow_token_delay: float = 0.2,
    slow_ramp_s: float = 2.0,
    stall_after_s: float = 2.0,
    paced_streams: Sequence[int] = (1000, 5000),
    paced_tokens: int = 256,
    paced_ms: tuple[float, float] = (20.0, 50.0),
    paced_ramp_s: float = 2.0,
    cores: int = 1,
) -> list[Scenario]:
    """Every scenario, in the order they run (the slow-stream burst last: it leaves the most behind)."""
    out = [
        Scenario(
            f"small-c{c}",
            "small",
            f"small non-streamed chat completion ({len(SMALL_BODY)}-byte body), {c} connections",
            "nginx",
            "wrk",
            CHAT,
            SMALL_BODY,
            OPENAI_HEADERS,
            c,
            PROXIES,
        )
        for c in connections
    ]
    out.append(
        Scenario(
            "large-body",
            "large-body",
            f"non-streamed chat completion with a {LARGE_PROMPT_BYTES // 1000} KB prompt "
            f"({len(LARGE_BODY):,}-byte body), {large_connections} connections",
            "nginx",
            "wrk",
            CHAT,
            LARGE_BODY,
            OPENAI_HEADERS,
            large_connections,
            PROXIES,
        )
    )
    out.append(
        Scenario(
            "rate-limited",
            "rate-limited",
            f"small chat completions on a key allowed {LIMITED_RPM} requests/minute (burst {LIMITED_RPM}), "
            "64 connections: nearly every answer is a 429",
            "nginx",
            "wrk",
            CHAT,
            SMALL_BODY,
            {**OPENAI_HEADERS, "Authorization": f"Bearer {LIMITED_KEY}"},
            64,
            ("nginx", *GATEWAYS),
            refused_expected=True,
        )
    )
    anthropic_body = _json(
        {"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}
    )
    out += [
        Scenario(
            "messages-chat",
            "messages",
            "POST /v1/chat/completions, model `chat` (OpenAI backend), 64 connections",
            "nginx",
            "wrk",
            CHAT,
            chat_body("chat"),
            OPENAI_HEADERS,
            64,
            GATEWAYS,
        ),
        Scenario(
            "messages-translated",
            "messages",
            "POST /v1/messages, model `chat`: Anthropic client translated to the OpenAI backend and back, "
            "64 connections",
            "nginx",
            "wrk",
            MESSAGES,
            anthropic_body,
            ANTHROPIC_HEADERS,
            64,
            GATEWAYS,
            check_marker=b'"type":"message"',
        ),
        Scenario(
            "messages-native",
            "messages",
            'POST /v1/messages, model `claude`: native passthrough to a `protocol = "anthropic"` backend, '
            "64 connections",
            "nginx",
            "wrk",
            MESSAGES,
            anthropic_body.replace(b'"model":"chat"', b'"model":"claude"'),
            ANTHROPIC_HEADERS,
            64,
            GATEWAYS,
            check_marker=b'"type":"message"',
        ),
    ]
    stream_body = chat_body(STREAM_MODEL, max_tokens=stream_tokens, stream=True)
    out.append(
        Scenario(
            f"stream-{stream_tokens}",
            "streams",
            f"streamed chat completions of {stream_tokens} tokens as fast as the mock engine sends them, "
            f"{stream_connections} connections (closed loop)",
            "engine",
            "streams",
            CHAT,
            stream_body,
            OPENAI_HEADERS,
            stream_connections,
            STREAMERS,
            check_marker=b"data: [DONE]",
            expect_tokens=stream_tokens,
            stall_after_s=stall_after_s,
        )
    )
    slow_body = chat_body(STREAM_MODEL, max_tokens=slow_tokens, stream=True)
    out.append(
        Scenario(
            "slow-streams",
            "slow-streams",
            f"{slow_streams:,} concurrent streams of {slow_tokens} tokens, {slow_token_delay:g} s apart "
            f"(~{slow_tokens * slow_token_delay:g} s each), started over {slow_ramp_s:g} s; a stall is "
            f"a gap over {stall_after_s:g} s",
            "engine",
            "streams",
            CHAT,
            slow_body,
            OPENAI_HEADERS,
            slow_streams,
            STREAMERS,
            check_marker=b"data: [DONE]",
            burst=True,
            expect_tokens=slow_tokens,
            token_delay=slow_token_delay,
            ramp_s=slow_ramp_s,
            stall_after_s=stall_after_s,
        )
    )
    paced_body = chat_body(PACED_MODEL, max_tokens=paced_tokens, stream=True)
    lo, hi = paced_ms
    out += [
        Scenario(
            f"paced-{n}",
            "engine-paced",
            f"{n:,} concurrent streams of {paced_tokens} tokens, one every {lo:g}-{hi:g} ms per stream "
            f"(perf.paced, as from a busy vLLM; ~{paced_tokens * (lo + hi) / 2000:.0f} s each), started over "
            f"{paced_ramp_s:g} s",
            "paced",
            "streams",
            CHAT,
            paced_body,
            OPENAI_HEADERS,
            n,
            PACED_TARGETS,
            check_marker=b"data: [DONE]",
            burst=True,
            expect_tokens=paced_tokens,
            ramp_s=paced_ramp_s,
            stall_after_s=stall_after_s,
            pace_ms=paced_ms,
            procs=processes_for(n, cores),
        )
        for n in paced_streams
    ]
    return out


GROUPS = ("small", "large-body", "rate-limited", "messages", "streams", "slow-streams", "engine-paced")


def select(scenarios: Sequence[Scenario], wanted: Sequence[str]) -> list[Scenario]:
    """The scenarios named, or in the groups named, in their running order. Raises ``ValueError`` for a
    name that is neither."""
    known = {s.name for s in scenarios} | {s.group for s in scenarios}
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise ValueError(f"unknown scenarios: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return [s for s in scenarios if s.name in wanted or s.group in wanted]
