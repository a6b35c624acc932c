"""The asyncio side of the simulated engine (``--sim``): the step loop, and the bodies and metrics it shows.

``StepLoop`` owns a ``sim.Engine`` and one task that runs while anything waits or runs: plan a step, sleep
its duration (one timer per step, whatever the number of sequences), commit it and wake the requests
whose sequence progressed. ``Frames`` builds a request's SSE events and whole body; per token it only
concatenates a prebuilt head and tail around the piece. ``metrics_text`` renders the engine's state as
vLLM's Prometheus series.

``KVEventPublisher`` sends the engine's KV events as vLLM does (``--sim-kv-events``): a ZeroMQ PUB socket
bound to the endpoint, one message ``[topic, sequence, batch]`` per step that changed the cache.

I/O: sleeps on the running loop and resolves futures the request handlers await; the publisher's socket
sends without blocking (ZeroMQ queues, and drops past its high-water mark, as vLLM's would).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import orjson
import zmq

from gateway.mockengine import sim
from gateway.mockengine.responses import DONE
from gateway.protocol.kv_events import EventBatch, encode_message

__all__ = ["Frames", "KVEventPublisher", "StepLoop", "metrics_text", "stats_json"]


class KVEventPublisher:
    """vLLM's ``ZmqEventPublisher`` without its replay socket: PUB bound to ``endpoint``."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self._topic = topic.encode()
        self.sequence = 0
        self.sent = 0

    def publish(self, events: list[Any]) -> None:
        if not events:
            return
        frames = encode_message(self._topic, self.sequence, EventBatch(time.time(), tuple(events), 0))
        self.sequence += 1
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:  # past the high-water mark: lost, as the subscriber's sequence check will see
            pass

    def close(self) -> None:
        self._socket.close(0)
        self._context.term()


class StepLoop:
    def __init__(self, engine: sim.Engine, publisher: KVEventPublisher | None = None) -> None:
        self.engine = engine
        self.publisher = publisher
        self._task: asyncio.Task[None] | None = None

    def flush(self) -> None:
        """Publish the KV events the engine recorded since the last flush."""
        if self.publisher is not None:
            self.publisher.publish(self.engine.take_events())

    def submit(self, seq: sim.Sequence) -> None:
        self.engine.submit(seq)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self, seq: sim.Sequence) -> None:
        self.engine.cancel(seq)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        while (step := engine.plan()) is not None:
            self.flush()  # admission's evictions
            await asyncio.sleep(step.duration)
            touched = engine.commit(step, loop.time())
            self.flush()
            for seq in touched:
                listener = seq.listener
                if listener is not None and not listener.done():
                    listener.set_result(None)


def _usage(seq: sim.Sequence) -> dict[str, Any]:
    return {
        "prompt_tokens": seq.prompt_tokens,
        "total_tokens": seq.prompt_tokens + seq.generated,
        "completion_tokens": seq.generated,
        "prompt_tokens_details": {"cached_tokens": seq.cached_tokens},
    }


class Frames:
    """The bodies of one simulated answer, for ``/v1/chat/completions`` (``chat``) or ``/v1/completions``."""

    def __init__(
        self, chat: bool, model: str, rid: str, created: int, include_usage: bool, capped: bool
    ) -> None:
        self.chat = chat
        self.model = model
        self.rid = rid
        self.created = created
        self.include_usage = include_usage
        self.finish = "length" if capped else "stop"
        kind = "chat.completion.chunk" if chat else "text_completion"
        self._head = {"id": rid, "object": kind, "created": created, "model": model}
        if chat:
            # Everything around the piece's JSON string is the same for every token of the answer.
            self._before, self._after = self._split(
                {"index": 0, "delta": {"content": "\0"}, "logprobs": None, "finish_reason": None}
            )
        else:
            self._before, self._after = self._split(
                {"index": 0, "text": "\0", "logprobs": None, "finish_reason": None, "stop_reason": None}
            )

    def _split(self, choice: Mapping[str, Any]) -> tuple[bytes, bytes]:
        before, after = self._event(choice).split(b'"\\u0000"')
        return before, after

    def _event(self, choice: Mapping[str, Any]) -> bytes:
        body: dict[str, Any] = {**self._head, "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def tokens(self, seq: sim.Sequence, start: int, end: int) -> bytes:
        """SSE events for generated tokens ``start`` to ``end``, one each (vLLM's role event before the
        first); then, if the sequence finished, the finish event, the usage event and ``[DONE]``."""
        out = []
        if start == 0 and end > 0 and self.chat:
            out.append(
                self._event(
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                )
            )
        before, after = self._before, self._after
        out.extend(before + orjson.dumps(seq.piece(i)) + after for i in range(start, end))
        if seq.state is sim.State.FINISHED:
            if self.chat:
                out.append(
                    self._event({"index": 0, "delta": {}, "logprobs": None, "finish_reason": self.finish})
                )
            else:
                last = {
                    "index": 0,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": self.finish,
                    "stop_reason": None,
                }
                out.append(self._event(last))
            if self.include_usage:
                out.append(
                    b"data: " + orjson.dumps({**self._head, "choices": [], "usage": _usage(seq)}) + b"\n\n"
                )
            out.append(DONE)
        return b"".join(out)

    def whole(self, seq: sim.Sequence) -> bytes:
        text = seq.text()
        if self.chat:
            message = {"role": "assistant", "content": text, "tool_calls": []}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
            choice |= {"finish_reason": self.finish, "stop_reason": None}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish}
            choice |= {"stop_reason": None, "prompt_logprobs": None}
            kind = "text_completion"
        body = {**self._head, "object": kind, "choices": [choice], "usage": _usage(seq)}
        return orjson.dumps(body)


def metrics_text(engine: sim.Engine, model: str) -> bytes:
    """vLLM's Prometheus series for the simulated engine, labelled with the one model it serves."""
    label = f'{{model_name="{model}"}}'
    s = engine.stats
    lines: list[str] = []

    def series(name: str, kind: str, help_: str, value: float) -> None:
        lines.extend((f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"))

    series(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        len(engine.running),
    )
    series(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        len(engine.waiting),
    )
    series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", engine.usage())
    series(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of tokens.",
        s.queried_tokens,
    )
    series(
        "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of tokens.", s.cached_tokens
    )
    series("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", s.prompt_tokens)
    series(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        s.generation_tokens,
    )
    series("vllm:request_success_total", "counter", "Count of successfully processed requests.", s.success)
    name = "vllm:time_to_first_token_seconds"
    lines += [f"# HELP {name} Histogram of time to first token in seconds.", f"# TYPE {name} histogram"]
    cumulative = 0
    for bound, count in zip(sim.TTFT_BUCKETS, s.ttft_buckets, strict=True):
        cumulative += count
        lines.append(f'{name}_bucket{{le="{bound}",model_name="{model}"}} {float(cumulative)}')
    lines.append(f'{name}_bucket{{le="+Inf",model_name="{model}"}} {float(s.ttft_count)}')
    lines.append(f"{name}_count{label} {float(s.ttft_count)}")
    lines.append(f"{name}_sum{label} {s.ttft_sum}")
    return ("\n".join(lines) + "\n").encode()


def stats_json(engine: sim.Engine) -> dict[str, Any]:
    """The ``"sim"`` object of ``GET /mock/stats``."""
    s = engine.stats
    return {
        "requests": s.requests,
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "prefilled_tokens": s.prefilled_tokens,
        "generation_tokens": s.generation_tokens,
        "success": s.success,
        "cancelled": s.cancelled,
        "running": len(engine.running),
        "waiting": len(engine.waiting),
        "max_waiting": s.max_waiting,
        "cache_blocks_used": engine.used,
        "cache_blocks_pinned": engine.pinned,
        "cache_blocks": engine.config.cache_blocks,
        "evictions": s.evictions,
        "ttft_p50": s.ttft_quantile(0.5),
        "ttft_p99": s.ttft_quantile(0.99),
    }
