"""Reading an inference engine's load from its Prometheus ``/metrics`` text.

vLLM publishes ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``
(older releases ``vllm:gpu_cache_usage_perc``); SGLang ``sglang:num_running_reqs``,
``sglang:num_queue_reqs`` and ``sglang:token_usage``. Each may come as one series per served model (label
``model_name``): requests are summed across series, cache use is the highest. The prompt tokens the engine
processed since it started (``vllm:prompt_tokens_total``, ``sglang:prompt_tokens_total``, summed) tell a
restarted engine: a counter that goes down belongs to a new process, whose cache starts empty. A text
with none of them is not an engine's (``engine_load`` returns None). Sans-I/O: text in, numbers out;
comments, other metrics, labels and timestamps are skipped, and a malformed line is ignored rather than
failing the whole read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EngineMetrics", "engine_load"]

# metric name -> (engine, field)
_METRICS = {
    "vllm:num_requests_running": ("vllm", "running"),
    "vllm:num_requests_waiting": ("vllm", "waiting"),
    "vllm:kv_cache_usage_perc": ("vllm", "kv_cache"),
    "vllm:gpu_cache_usage_perc": ("vllm", "kv_cache"),
    "sglang:num_running_reqs": ("sglang", "running"),
    "sglang:num_queue_reqs": ("sglang", "waiting"),
    "sglang:token_usage": ("sglang", "kv_cache"),
    "vllm:prompt_tokens_total": ("vllm", "prompt_tokens"),
    "sglang:prompt_tokens_total": ("sglang", "prompt_tokens"),
}


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    kind: str  # "vllm" | "sglang"
    running: int
    waiting: int
    kv_cache: float | None  # fraction 0..1; None when the engine does not publish it
    prompt_tokens: float | None = None  # a counter since the engine started; None when not published


def _sample(line: str) -> tuple[str, float] | None:
    """``(metric name, value)`` of one exposition line, or None."""
    if not line or line[0] == "#":
        return None
    brace = line.find("{")
    if brace >= 0:
        name = line[:brace]
        close = line.rfind("}")
        if close < brace:
            return None
        rest = line[close + 1 :].split()
    else:
        parts = line.split()
        if len(parts) < 2:
            return None
        name, rest = parts[0], parts[1:]
    if not rest:
        return None
    try:
        value = float(rest[0])
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return name.strip(), value


def engine_load(text: str) -> EngineMetrics | None:
    sums: dict[str, float] = {}
    kind = None
    kv: float | None = None
    for line in text.splitlines():
        sample = _sample(line.strip())
        if sample is None:
            continue
        known = _METRICS.get(sample[0])
        if known is None:
            continue
        engine, field = known
        if field != "prompt_tokens":  # a counter alone does not make a text an engine's
            kind = kind or engine
        if field == "kv_cache":
            kv = sample[1] if kv is None else max(kv, sample[1])
        else:
            sums[field] = sums.get(field, 0.0) + sample[1]
    if kind is None:
        return None
    return EngineMetrics(
        kind, int(sums.get("running", 0)), int(sums.get("waiting", 0)), kv, sums.get("prompt_tokens")
    )
