"""Speaking each backend's protocol: what one target of a request is sent, and how its answer is turned
into the client's protocol.

The client speaks OpenAI (``/v1/*``), OpenAI's Responses API (``/v1/responses``) or Anthropic
(``/v1/messages``); a backend declares ``openai``, ``anthropic`` or ``gemini``. Same protocol on both
sides: the client's bytes go as they came (the model's value aside) and the answer comes back untouched —
an Anthropic answer is only metered as it passes (``AnthropicUsageMeter``), since the tail parser reads
OpenAI usage. Different protocols: the body is
translated by the sans-I/O translator named after the pair (``gateway.protocol.<client>_<backend>``), the
answer too, event by event for a stream, and usage is read from the translator. An Anthropic client in
front of a Gemini backend goes through both translators, with OpenAI's shape in between.

Responses API requests go verbatim to OpenAI backends marked ``responses_api`` (vLLM serves
``/v1/responses``), stored-response resources (``GET``/``DELETE /v1/responses/{id}``, ``…/input_items``)
included. Every other backend gets them translated (``responses_openai``) to chat completions, and on to
Anthropic or Gemini through that pair's translator; such a backend stores no responses, so those
resources are refused there.

Each backend gets its key where its protocol reads it: ``Authorization: Bearer`` (OpenAI),
``x-api-key`` with ``anthropic-version`` (Anthropic), ``x-goog-api-key`` (Gemini). Translated requests
carry only the headers their body needs; verbatim ones carry the client's (its credentials dropped).

``Outgoing.prepare(target)`` returns None for a target that cannot serve the request (an OpenAI path other
than chat completions on a non-OpenAI backend): the forwarder passes over it. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import BadRequest, StreamCut
from gateway.native import Usage, model_span, parse_usage
from gateway.protocol import anthropic_openai, openai_anthropic, openai_gemini, responses_openai
from gateway.protocol.anthropic import MessagesHead, estimate_input_tokens, parse_messages_doc
from gateway.protocol.anthropic_usage import AnthropicUsageMeter
from gateway.protocol.openai_request import RequestInfo, splice_model
from gateway.protocol.sse import encode_event
from gateway.snapshot import Target

__all__ = ["ANTHROPIC_VERSION", "Outgoing", "Translation", "Upstream"]

ANTHROPIC_VERSION = "2023-06-01"  # sent when the client did not name one
_JSON = ("content-type", "application/json")
_CHAT = "/v1/chat/completions"
_RESPONSES = "/v1/responses"
_PING = b'event: ping\ndata: {"type":"ping"}\n\n'


class Translation(Protocol):
    """The answer's side of one target: its body, its stream, its errors, and the usage seen in them."""

    verbatim: bool  # the answer's bytes and headers go to the client as they are (only metered)

    def whole(self, body: bytes) -> bytes: ...

    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...

    def cut(self, last: bytes) -> bytes:
        """What the client gets when the backend's stream broke off after ``last``: an error event in the
        client's protocol, unless the answer had already ended."""
        ...

    def error(self, status: int, body: bytes) -> bytes: ...

    def usage(self) -> Usage | None: ...

    def ping(self) -> bytes | None: ...


@dataclass(slots=True)
class Upstream:
    path_qs: str
    headers: list[tuple[str, str]]
    body: bytes
    translation: Translation | None  # None: a verbatim OpenAI answer (the tail buffer reads its usage)


_CUT = StreamCut("the backend's stream broke off before the answer was complete")


class _Metered:
    """An Anthropic answer relayed verbatim, its usage read as it passes."""

    verbatim = True

    def __init__(self) -> None:
        self.meter = AnthropicUsageMeter()

    def whole(self, body: bytes) -> bytes:
        self.meter.feed(body)
        self.meter.finish()
        return body

    def feed(self, chunk: bytes) -> bytes:
        self.meter.feed(chunk)
        return chunk

    def finish(self) -> bytes:
        self.meter.finish()
        return b""

    def cut(self, last: bytes) -> bytes:
        self.meter.finish()
        if b"message_stop" in last:  # the answer was complete: only the framing's end was missing
            return b""
        return encode_event("error", _CUT.anthropic_body())

    def error(self, status: int, body: bytes) -> bytes:
        return body

    def usage(self) -> Usage | None:
        return self.meter.usage()

    def ping(self) -> bytes | None:
        return None


class _Unbilled:
    """A stored response's resource relayed verbatim: it generates nothing, so it is billed nothing (its
    body repeats the usage of the response it stores, which the tail parser would otherwise bill again)."""

    verbatim = True
    unbilled = True  # not even for what was relayed of it when it is cut short (``ResponseTap``)
    _NONE = Usage(0, 0, 0, 0)

    def whole(self, body: bytes) -> bytes:
        return body

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def finish(self) -> bytes:
        return b""

    def cut(self, last: bytes) -> bytes:
        return b""  # a stored resource, not a generation: a short body is all the client needs to see

    def error(self, status: int, body: bytes) -> bytes:
        return body

    def usage(self) -> Usage | None:
        return self._NONE

    def ping(self) -> bytes | None:
        return None


_UNBILLED = _Unbilled()


class _StreamTranslator(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...

    def usage(self) -> Usage | None: ...


class _Translated:
    """A translated answer: ``whole_fn`` for a body (it returns the client's bytes and the answer's OpenAI
    form, from which usage is read), a stream translator built on first use, ``error_fn`` for error
    bodies."""

    verbatim = False

    def __init__(
        self,
        whole_fn: Callable[[bytes], tuple[bytes, bytes]],
        stream_fn: Callable[[], _StreamTranslator],
        error_fn: Callable[[int, bytes], bytes],
        ping: bytes | None = None,
    ) -> None:
        self._whole, self._stream_fn, self._error = whole_fn, stream_fn, error_fn
        self._stream: _StreamTranslator | None = None
        self._usage: Usage | None = None
        self._ping = ping

    def whole(self, body: bytes) -> bytes:
        out, openai_form = self._whole(body)
        self._usage = parse_usage(memoryview(openai_form)[-4096:])
        return out

    def feed(self, chunk: bytes) -> bytes:
        if self._stream is None:
            self._stream = self._stream_fn()
        return self._stream.feed(chunk)

    def finish(self) -> bytes:
        return self._stream.finish() if self._stream is not None else b""

    def cut(self, last: bytes) -> bytes:
        return self.finish()  # a translator ends a stream cut short with its own error event

    def error(self, status: int, body: bytes) -> bytes:
        return self._error(status, body)

    def usage(self) -> Usage | None:
        return self._stream.usage() if self._stream is not None else self._usage

    def ping(self) -> bytes | None:
        return self._ping


class _Chained:
    """Two stream translators in a row (Gemini -> OpenAI -> Anthropic)."""

    def __init__(self, first: _StreamTranslator, second: _StreamTranslator) -> None:
        self.first, self.second = first, second

    def feed(self, chunk: bytes) -> bytes:
        middle = self.first.feed(chunk)
        return self.second.feed(middle) if middle else b""

    def finish(self) -> bytes:
        return self.second.feed(self.first.finish()) + self.second.finish()

    def usage(self) -> Usage | None:
        return self.first.usage()


@dataclass(slots=True)
class Outgoing:
    """The client's request, ready to be sent to any target."""

    dialect: str  # "openai" | "responses" | "anthropic": what the client speaks
    method: str
    path_qs: str
    headers: list[tuple[str, str]]  # the client's, its credentials and hop-by-hop headers dropped
    body: bytes
    info: RequestInfo | None
    # An Anthropic request as the gateway read it (``read_messages_head``): the whole shape is checked only
    # when a target needs it translated, so a verbatim relay never refuses what its backend accepts.
    messages: MessagesHead | None = None
    default_max_tokens: int = 4096
    anthropic_version: str = ANTHROPIC_VERSION
    responses: dict[str, Any] | None = None  # the parsed body of a POST /v1/responses
    # The model allows an upstream "context length exceeded" 400 to fail over (gateway.routing.context).
    context_failover: bool = False
    # The API key of the try under way when its backend has a credential pool (else the backend's own).
    credential: str | None = None

    def prepare(self, target: Target) -> Upstream | None:
        protocol = target.backend.protocol
        if self.dialect == "responses":
            return self._responses(target)
        if self.dialect == "openai":
            if protocol == "openai":
                return Upstream(self.path_qs, self._bearer(target, self.headers), self._spliced(target), None)
            if self.path_qs.partition("?")[0] != _CHAT or self.info is None:
                return None
            if protocol == "anthropic":
                return self._openai_to_anthropic(target)
            return self._openai_to_gemini(target)
        assert self.messages is not None
        if protocol == "anthropic":
            return Upstream(
                self.path_qs, self._anthropic_auth(target, self.headers), self._spliced(target), _Metered()
            )
        if protocol == "openai":
            return self._anthropic_to_openai(target)
        return self._anthropic_to_gemini(target)

    # -- the six pairs -------------------------------------------------------------------------------------
    def _openai_to_anthropic(self, target: Target) -> Upstream:
        assert self.info is not None
        model, include_usage = self.info.model, self.info.include_usage
        body = openai_anthropic.request_to_anthropic(
            self.body, target.upstream_model, self.default_max_tokens
        )
        translation = _Translated(
            lambda b: _same(openai_anthropic.response_to_openai(b, model)),
            lambda: openai_anthropic.AnthropicStreamToOpenAI(model, include_usage=include_usage),
            openai_anthropic.error_to_openai,
        )
        return Upstream("/v1/messages", self._anthropic_auth(target, [_JSON]), body, translation)

    def _openai_to_gemini(self, target: Target) -> Upstream:
        assert self.info is not None
        model, include_usage = self.info.model, self.info.include_usage
        suffix, body = openai_gemini.request_to_gemini(self.body)
        translation = _Translated(
            lambda b: _same(openai_gemini.response_to_openai(b, model)),
            lambda: openai_gemini.GeminiStreamToOpenAI(model, include_usage=include_usage),
            openai_gemini.error_to_openai,
        )
        return Upstream(self._gemini_path(target, suffix), self._gemini_auth(target), body, translation)

    def _anthropic_to_openai(self, target: Target) -> Upstream:
        assert self.messages is not None
        req = parse_messages_doc(self.messages.doc)
        estimate = estimate_input_tokens(req)
        body = anthropic_openai.request_to_openai(req, target.upstream_model)
        translation = _Translated(
            lambda b: (anthropic_openai.response_from_openai(b, req.model), b),
            lambda: anthropic_openai.StreamToAnthropic(req.model, input_tokens_estimate=estimate),
            anthropic_openai.error_to_anthropic,
            ping=_PING,
        )
        return Upstream(_CHAT, self._bearer(target, [_JSON]), body, translation)

    def _anthropic_to_gemini(self, target: Target) -> Upstream:
        assert self.messages is not None
        req = parse_messages_doc(self.messages.doc)
        estimate = estimate_input_tokens(req)
        suffix, body = openai_gemini.request_to_gemini(
            anthropic_openai.request_to_openai(req, target.upstream_model)
        )
        translation = _Translated(
            lambda b: _via_openai(openai_gemini.response_to_openai(b, req.model), req.model),
            lambda: _Chained(
                openai_gemini.GeminiStreamToOpenAI(req.model, include_usage=True),
                anthropic_openai.StreamToAnthropic(req.model, input_tokens_estimate=estimate),
            ),
            lambda status, b: anthropic_openai.error_to_anthropic(
                status, openai_gemini.error_to_openai(status, b)
            ),
            ping=_PING,
        )
        return Upstream(self._gemini_path(target, suffix), self._gemini_auth(target), body, translation)

    # -- the Responses API -------------------------------------------------------------------------------
    def _responses(self, target: Target) -> Upstream:
        backend = target.backend
        doc, info = self.responses, self.info
        if backend.protocol == "openai" and backend.responses_api:
            unbilled = None if doc is not None else _UNBILLED
            return Upstream(self.path_qs, self._bearer(target, self.headers), self._spliced(target), unbilled)
        if doc is None or info is None:  # a stored response's resource: only a native backend has them
            raise BadRequest(
                f"backend {backend.name!r} does not store responses: the gateway translates the Responses "
                f"API for it and keeps none, so {self.path_qs.partition('?')[0]} cannot be served",
            )
        model, echo = info.model, responses_openai.echo_of(doc)
        chat = responses_openai.request_to_chat(doc, target.upstream_model)
        if backend.protocol == "openai":
            translation = _Translated(
                lambda b: (responses_openai.response_from_chat(b, model, echo), b),
                lambda: responses_openai.StreamToResponses(model, echo),
                _verbatim_error,  # a chat backend's errors are already in the OpenAI envelope
            )
            return Upstream(_CHAT, self._bearer(target, [_JSON]), chat, translation)
        if backend.protocol == "anthropic":
            body = openai_anthropic.request_to_anthropic(chat, target.upstream_model, self.default_max_tokens)
            translation = _Translated(
                lambda b: _to_responses(openai_anthropic.response_to_openai(b, model), model, echo),
                lambda: _Chained(
                    openai_anthropic.AnthropicStreamToOpenAI(model, include_usage=True),
                    responses_openai.StreamToResponses(model, echo),
                ),
                openai_anthropic.error_to_openai,
            )
            return Upstream("/v1/messages", self._anthropic_auth(target, [_JSON]), body, translation)
        suffix, body = openai_gemini.request_to_gemini(chat)
        translation = _Translated(
            lambda b: _to_responses(openai_gemini.response_to_openai(b, model), model, echo),
            lambda: _Chained(
                openai_gemini.GeminiStreamToOpenAI(model, include_usage=True),
                responses_openai.StreamToResponses(model, echo),
            ),
            openai_gemini.error_to_openai,
        )
        return Upstream(self._gemini_path(target, suffix), self._gemini_auth(target), body, translation)

    # -- bodies and credentials ----------------------------------------------------------------------------
    def _spliced(self, target: Target) -> bytes:
        info = self.info
        # A bodiless call (its model named in the query string) has nothing to splice.
        if info is not None and self.body and target.upstream_model != info.model:
            return splice_model(self.body, info, target.upstream_model, model_span)
        return self.body

    def _key(self, target: Target) -> str | None:
        return self.credential or target.backend.api_key

    def _bearer(self, target: Target, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        key = self.credential or target.backend.api_key
        return [*headers, ("authorization", "Bearer " + key)] if key else headers

    def _anthropic_auth(self, target: Target, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        out = list(headers)
        if not any(k.lower() == "anthropic-version" for k, _ in out):
            out.append(("anthropic-version", self.anthropic_version))
        key = self._key(target)
        if key:
            out.append(("x-api-key", key))
        return out

    def _gemini_auth(self, target: Target) -> list[tuple[str, str]]:
        key = self._key(target)
        return [_JSON, ("x-goog-api-key", key)] if key else [_JSON]

    @staticmethod
    def _gemini_path(target: Target, suffix: str) -> str:
        return f"/v1beta/models/{target.upstream_model}{suffix}"


def _same(openai_body: bytes) -> tuple[bytes, bytes]:
    return openai_body, openai_body


def _to_responses(openai_body: bytes, model: str, echo: responses_openai.Echo) -> tuple[bytes, bytes]:
    return responses_openai.response_from_chat(openai_body, model, echo), openai_body


def _verbatim_error(status: int, body: bytes) -> bytes:
    return body


def _via_openai(openai_body: bytes, model: str) -> tuple[bytes, bytes]:
    return anthropic_openai.response_from_openai(openai_body, model), openai_body
