"""Context-aware routing: which targets a request's estimated size fits, and whether an upstream 400 says
the context was exceeded.

A provider model may declare its ``context_window`` (prompt and completion tokens together). A request
needs about ``prompt + max_tokens`` tokens, the prompt estimated from the body's size (a quarter of its
bytes, the estimate routing rules use; deliberately cheap, and generous for English text so that a request
is not refused for a window it would fit). Targets without a declared window are never skipped. When no
target fits, the request is refused with 400 naming the figures, before anything is sent.

An upstream "context length exceeded" 400 (OpenAI's, vLLM's, SGLang's and Anthropic's wordings) is the one
4xx that may fail over, and only where the model allows it: to a later target with a larger declared
window. No I/O here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.errors import ContextTooLong

if TYPE_CHECKING:
    from gateway.routing.targets import Target

__all__ = ["estimate_prompt_tokens", "fitting", "says_context_exceeded"]


def estimate_prompt_tokens(body: bytes) -> int:
    return len(body) // 4


def fitting(targets: tuple[Target, ...], needed: int) -> tuple[Target, ...]:
    """``targets`` less those whose declared window is smaller than ``needed`` (order kept)."""
    if all(t.context_window is None or t.context_window >= needed for t in targets):
        return targets  # the common case allocates nothing
    return tuple(t for t in targets if t.context_window is None or t.context_window >= needed)


def refusal(model: str, targets: tuple[Target, ...], prompt: int, max_tokens: int) -> ContextTooLong:
    largest = max((t.context_window or 0) for t in targets) if targets else 0
    return ContextTooLong(
        f"This request needs about {prompt + max_tokens} tokens ({prompt} estimated prompt tokens + "
        f"{max_tokens} max_tokens), more than the largest context window of model `{model}` "
        f"({largest} tokens)",
        param="messages",
    )


# Lower-cased phrases of the engines' and providers' own errors, as they word them:
#   OpenAI:    "This model's maximum context length is 8192 tokens. However, your messages resulted in ..."
#              with code "context_length_exceeded"
#   vLLM:      "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens ..."
#              and "The decoder prompt (length 5000) is longer than the maximum model length of 4096"
#   SGLang:    "... is longer than the model's context length (4096 tokens)"
#   Anthropic: "prompt is too long: 210000 tokens > 200000 maximum"
_PHRASES = (
    b"context_length_exceeded",
    b"maximum context length",
    b"maximum model length",
    b"model's context length",
    b"prompt is too long",
)
READ_LIMIT = 64 * 1024  # an error body worth reading for the phrases; longer ones are not such errors


def says_context_exceeded(body: bytes) -> bool:
    lowered = body[:READ_LIMIT].lower()
    return any(phrase in lowered for phrase in _PHRASES)
