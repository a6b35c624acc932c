"""What the mock engine should do next: the test-controlled knobs, their defaults and their validation.

``Behaviour`` is an immutable value. ``POST /mock/config`` merges a JSON object into the current one with
``Behaviour.merged``, which validates every field first and either returns a whole new value or raises
``ValueError``, so a bad update never leaves half a configuration behind. No I/O here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Behaviour"]


@dataclass(frozen=True, slots=True)
class Behaviour:
    """Every field is settable through ``POST /mock/config``; ``POST /mock/reset`` restores the CLI's."""

    fail_status: int | None = None
    """Answer API requests (``/v1/...``, ``/v1beta/...``) with this status instead of serving them."""
    fail_body: str | None = None
    """Exact body of injected failures; ``None`` means an OpenAI-shaped error naming the status."""
    fail_count: int | None = None
    """Fail only this many more requests, then behave; ``None`` means fail every one."""
    delay: float = 0.0
    """Seconds to wait before sending the response headers."""
    tokens: int = 16
    """Completion tokens per answer, before the request's ``max_tokens`` caps it."""
    cache_read_tokens: int = 0
    """Prompt tokens reported as read from cache by the Anthropic and Gemini answers (at most the prompt)."""
    token_delay: float = 0.0
    """Seconds between streamed chunks."""
    drop_after_chunks: int | None = None
    """Close streams abruptly after this many chunks, never sending the last one (``[DONE]``)."""
    raw_response: str | None = None
    """Exact body for non-streamed inference requests, sent verbatim with ``raw_content_type``."""
    raw_content_type: str = "application/json"
    raw_stream: list[str] | None = None
    """Exact chunks for streamed inference requests, sent in order, ``raw_chunk_delay`` apart."""
    raw_chunk_delay: float = 0.0
    waiting: int | dict[str, int] = 0
    """``vllm:num_requests_waiting``: one value for every model, or a value per model name."""
    kv_cache_usage: float = 0.0
    """``vllm:kv_cache_usage_perc``, a fraction between 0 and 1."""
    metrics_enabled: bool = True
    """``False`` makes ``/metrics`` answer 404, like an engine started without metrics."""
    health_status: int = 200
    """Status ``/health`` answers with; failure injection never touches ``/health``."""
    record: bool = True
    """Keep copies of incoming requests for ``/mock/requests``; benchmarks turn this off."""
    key_status: dict[str, int] = dataclasses.field(default_factory=dict)
    """Answer requests presenting one of these API keys (``Authorization: Bearer`` or ``x-api-key``) with
    its status, as a provider refusing (401, 403) or rate-limiting (429) that key; other keys are served."""
    retry_after: str | None = None
    """``Retry-After`` header value on injected 429 answers."""

    def merged(self, update: Mapping[str, Any]) -> Behaviour:
        """A copy with ``update`` applied. Raises ``ValueError`` naming the first bad field."""
        unknown = sorted(set(update) - set(_VALIDATORS))
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(unknown)}")
        changes = {}
        for name, value in update.items():
            try:
                changes[name] = _VALIDATORS[name](value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: {exc}") from None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _int(value: Any, low: int, high: int | None = None) -> int:
    # bool is an int subclass; `true` for a count is a mistake in the test, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{value} is out of range")
    return value


def _status(value: Any) -> int:
    return _int(value, 200, 599)


def _count(value: Any) -> int:
    return _int(value, 0)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number of seconds, got {value!r}")
    if not 0 <= value <= 3600:
        raise ValueError(f"{value} is out of range")
    return float(value)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"expected a number between 0 and 1, got {value!r}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _str_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of strings")
    return list(value)


def _waiting(value: Any) -> int | dict[str, int]:
    if isinstance(value, dict):
        return {_str(k): _count(v) for k, v in value.items()}
    return _count(value)


def _dict(value: Any) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    return value


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "fail_status": _optional(_status),
    "fail_body": _optional(_str),
    "fail_count": _optional(_count),
    "delay": _seconds,
    "tokens": _count,
    "cache_read_tokens": _count,
    "token_delay": _seconds,
    "drop_after_chunks": _optional(_count),
    "raw_response": _optional(_str),
    "raw_content_type": _str,
    "raw_stream": _optional(_str_list),
    "raw_chunk_delay": _seconds,
    "waiting": _waiting,
    "kv_cache_usage": _fraction,
    "metrics_enabled": _bool,
    "health_status": _status,
    "record": _bool,
    "key_status": lambda value: {_str(k): _status(v) for k, v in _dict(value).items()},
    "retry_after": _optional(_str),
}
assert set(_VALIDATORS) == {f.name for f in dataclasses.fields(Behaviour)}
