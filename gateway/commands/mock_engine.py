"""``gateway mock-engine``: run the mock vLLM engine in the foreground until SIGTERM or SIGINT.

Besides vLLM's OpenAI-compatible API it answers Anthropic's ``POST /v1/messages`` and Gemini's
``POST /v1beta/models/{model}:generateContent`` / ``:streamGenerateContent?alt=sse``.

``register`` adds the subcommand to the main CLI; ``main`` parses the same flags on their own, so tests can
start the mock without the rest of the CLI. I/O: binds the listener and prints one
``mock-engine listening on http://HOST:PORT`` line to stdout once it is bound.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import zmq

from gateway.commands.options import Parser, port_number, positive_int
from gateway.mockengine.behaviour import Behaviour
from gateway.mockengine.server import MockEngine, serve
from gateway.mockengine.sim import SimConfig
from gateway.routing.chat_tokenizer import ChatTokenizer

__all__ = ["add_arguments", "main", "register", "run"]

DEFAULT_MODEL = "mock-model"

DESCRIPTION = """\
A stand-in for a vLLM engine, for demos and tests: it answers OpenAI's chat and text completions
(streamed or not), Anthropic's /v1/messages and Gemini's generateContent with made-up tokens, and serves
vLLM-style /metrics. It runs in the foreground until Ctrl-C or SIGTERM.

Point a backend at it in the gateway's config: url = "http://127.0.0.1:8001"."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8001, help="port to listen on (default 8001)")
    p.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help=f"model name served and reported; repeatable (default {DEFAULT_MODEL})",
    )
    p.add_argument("--tokens", type=int, default=16, help="completion tokens per answer (default 16)")
    p.add_argument(
        "--cache-read-tokens",
        type=int,
        default=0,
        help="prompt tokens the Anthropic and Gemini answers report as cache reads (default 0)",
    )
    p.add_argument(
        "--token-delay", type=float, default=0.0, help="seconds between streamed tokens (default 0)"
    )
    p.add_argument("--delay", type=float, default=0.0, help="seconds before answering (default 0)")
    p.add_argument("--fail-status", type=int, default=None, help="answer every API request with this status")
    sim = p.add_argument_group(
        "simulated engine",
        "With --sim, chat and text completions go through a simulated vLLM engine: continuous\n"
        "batching, a prefix cache of chained block hashes with LRU eviction, chunked prefill and a\n"
        "step-time model. One token = 4 bytes of the prompt rendered as a chat template; usage reports\n"
        'cached_tokens, /metrics vLLM\'s series, /mock/stats a "sim" object (docs/operations.md).',
    )
    sim.add_argument("--sim", action="store_true", help="turn the simulated engine on")
    sim.add_argument(
        "--sim-batch", type=positive_int, default=16, metavar="N",
        help="most sequences running at once; the rest wait, first come first served (default 16)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-block-tokens", type=positive_int, default=16, metavar="N",
        help="tokens per KV block, the prefix cache's granularity (default 16)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-cache-blocks", type=positive_int, default=2048, metavar="N",
        help="KV-cache capacity in blocks; blocks of finished sequences stay cached until evicted, least "
        "recently used first (default 2048)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-chunk-tokens", type=positive_int, default=512, metavar="N",
        help="chunked prefill: most prompt tokens prefilled in one step, over all sequences (default 512)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-step-ms", type=_milliseconds, default=15.0, metavar="F",
        help="fixed time of one step in milliseconds (default 15)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-seq-ms", type=_milliseconds, default=0.2, metavar="F",
        help="milliseconds a step takes per sequence in it (default 0.2)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-prefill-ms", type=_milliseconds, default=0.05, metavar="F",
        help="milliseconds a step takes per prompt token it prefills (default 0.05)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-output-tokens", type=int, default=None, metavar="N",
        help="completion length, at most the request's max_tokens (default: the request's max_tokens, "
        "else --tokens)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-kv-events", default=None, metavar="ENDPOINT",
        help="publish vLLM's KV-cache events on a ZeroMQ PUB socket bound to ENDPOINT, e.g. "
        "tcp://127.0.0.1:5557 (as vLLM's --kv-events-config); POST /mock/reset-cache clears the cache",
    )  # fmt: skip
    sim.add_argument(
        "--sim-tokenizer", default=None, metavar="DIR",
        help="tokenize prompts with the chat template and tokenizer.json of this Hugging Face model "
        "directory, as vLLM does (default: one token per 4 bytes of a fixed rendering)",
    )  # fmt: skip
    p.add_argument(
        "--backpressure",
        type=int,
        default=8192,
        help="most connections served at once (default 8192, enough for thousands of slow streams)",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "mock-engine",
        help="run a mock vLLM-compatible engine for tests and demos",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(handler=run)


def defaults_from_args(args: argparse.Namespace) -> Behaviour:
    """The behaviour ``/mock/reset`` returns to. Raises ``ValueError`` for out-of-range flags."""
    return Behaviour().merged(
        {
            "tokens": args.tokens,
            "cache_read_tokens": args.cache_read_tokens,
            "token_delay": args.token_delay,
            "delay": args.delay,
            "fail_status": args.fail_status,
        }
    )


def _milliseconds(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"expected milliseconds from 0, got {raw!r}")
    return value


def sim_from_args(args: argparse.Namespace) -> SimConfig | None:
    """The simulated engine's knobs, or ``None`` without ``--sim``. Raises ``ValueError`` if out of range."""
    if not args.sim:
        return None
    return SimConfig(
        batch=args.sim_batch,
        block_tokens=args.sim_block_tokens,
        cache_blocks=args.sim_cache_blocks,
        chunk_tokens=args.sim_chunk_tokens,
        step_ms=args.sim_step_ms,
        seq_ms=args.sim_seq_ms,
        prefill_ms=args.sim_prefill_ms,
        output_tokens=args.sim_output_tokens,
    )


def run(args: argparse.Namespace) -> int:
    try:
        defaults = defaults_from_args(args)
        sim = sim_from_args(args)
    except ValueError as exc:
        print(f"gateway mock-engine: error: {exc}", file=sys.stderr)
        return 2
    if (args.sim_kv_events or args.sim_tokenizer) and sim is None:
        print("gateway mock-engine: error: --sim-kv-events and --sim-tokenizer need --sim", file=sys.stderr)
        return 2
    try:
        tokenizer = ChatTokenizer.load(args.sim_tokenizer) if args.sim_tokenizer else None
        engine = MockEngine(defaults, args.models or [DEFAULT_MODEL], sim, args.sim_kv_events, tokenizer)
    except (ValueError, zmq.ZMQError) as exc:
        print(f"gateway mock-engine: error: {exc}", file=sys.stderr)
        return 2

    def announce() -> None:
        print(f"mock-engine listening on http://{args.host}:{args.port}", flush=True)

    asyncio.run(serve(engine, args.host, args.port, backpressure=args.backpressure, on_listening=announce))
    # Leave without finalising the interpreter. ``serve`` returns once granian stopped accepting, but its
    # Rust runtime thread still holds the connections clients keep alive (every SDK does), and the Python
    # objects bound to them. Finalising drops those objects from that thread after the interpreter is
    # gone, and pyo3 aborts with "panic in a function that cannot unwind" (6 runs of 6 after one SDK
    # request). Nothing is left to clean up here: the proxy workers leave the same way (``os._exit``).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(
        prog="gateway mock-engine",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return run(p.parse_args(argv))
