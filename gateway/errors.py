"""The one error hierarchy. Every error the gateway itself produces knows its HTTP status, its code, and
how to render itself in the OpenAI and Anthropic envelopes; every subclass of ``GatewayError`` lives here,
whichever part of the gateway raises it, so that the statuses and codes a client can meet are read in
one place. No I/O here."""

from __future__ import annotations

import orjson

__all__ = [
    "AddressNotAllowed",
    "BadRequest",
    "BadUpstreamResponse",
    "BudgetExceeded",
    "ConfigError",
    "ContextTooLong",
    "CredentialError",
    "Forbidden",
    "GateFull",
    "GatewayError",
    "GatewayTimeout",
    "IngestBusy",
    "MethodNotAllowed",
    "NotFound",
    "OwnershipConflict",
    "PayloadTooLarge",
    "RateLimited",
    "RequestTimeout",
    "RoutingRefused",
    "ServiceUnavailable",
    "StoreConflict",
    "StoreDataError",
    "StoreError",
    "StreamCut",
    "Unauthorized",
    "UpstreamUnavailable",
    "anthropic_error_type",
]


class GatewayError(Exception):
    """Base class. Subclasses pin ``status``, ``code`` and the two envelopes' type names."""

    status: int = 500
    code: str = "internal_error"
    openai_type: str = "server_error"
    anthropic_type: str = "api_error"

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers: dict[str, str] = headers or {}

    def openai_body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.openai_type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )

    def anthropic_body(self) -> bytes:
        return orjson.dumps(
            {"type": "error", "error": {"type": self.anthropic_type, "message": self.message}}
        )


class StreamCut(GatewayError):
    """Sent as the last event of a streamed answer whose backend broke off mid-stream (the status line went
    out long before): the client can tell a cut answer from a complete one."""

    status = 502
    code = "upstream_stream_cut"
    openai_type = "server_error"
    anthropic_type = "api_error"


class BadRequest(GatewayError):
    status = 400
    code = "invalid_request"
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class ContextTooLong(BadRequest):
    """The prompt (estimated from the body) and the completion asked for fit no target's context window."""

    code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status = 401
    code = "invalid_api_key"
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"


class BudgetExceeded(GatewayError):
    status = 402
    code = "budget_exceeded"
    openai_type = "insufficient_quota"
    anthropic_type = "billing_error"


class Forbidden(GatewayError):
    status = 403
    code = "model_not_allowed"
    openai_type = "permission_error"
    anthropic_type = "permission_error"


class AddressNotAllowed(Forbidden):
    """A key used from a client address outside its ``allow_ips``."""

    code = "address_not_allowed"


class NotFound(GatewayError):
    status = 404
    code = "model_not_found"
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status = 405
    code = "method_not_allowed"
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class RequestTimeout(GatewayError):
    """The client stopped sending its request body (no byte for the body timeout)."""

    status = 408
    code = "request_timeout"
    openai_type = "invalid_request_error"
    anthropic_type = "timeout_error"


class PayloadTooLarge(GatewayError):
    status = 413
    code = "request_too_large"
    openai_type = "invalid_request_error"
    anthropic_type = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    code = "rate_limit_exceeded"
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"


class UpstreamUnavailable(GatewayError):
    """Every target failed without an HTTP answer (connect errors, timeouts before the first byte)."""

    status = 502
    code = "upstream_unavailable"
    openai_type = "server_error"
    anthropic_type = "api_error"


class BadUpstreamResponse(GatewayError):
    """A backend answered 2xx with a body that is not what its protocol promises."""

    status = 502
    code = "bad_upstream_response"
    openai_type = "server_error"
    anthropic_type = "api_error"


class ServiceUnavailable(GatewayError):
    status = 503
    code = "service_unavailable"
    openai_type = "server_error"
    anthropic_type = "overloaded_error"


class IngestBusy(ServiceUnavailable):
    """The control plane holds as many usage records waiting for the store as it takes
    (``--ingest-queue-max``): the batch is to be sent again after ``retry_after`` seconds."""

    code = "ingest_busy"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})


class GateFull(RateLimited):
    """Flow control refused the request: every target was saturated and the request could not wait (the
    queue was full), waited past ``queue_timeout``, or was shed for a request of a higher priority. 429
    with Retry-After: the client should come back later, as from any rate limit."""

    code = "backend_saturated"


class GatewayTimeout(GatewayError):
    """No target of the model answered within the request's deadline."""

    status = 504
    code = "upstream_timeout"
    openai_type = "server_error"
    anthropic_type = "api_error"


class RoutingRefused(GatewayError):
    """A routing rule refused the request (its status and message), or no backend of the model is up."""

    code = "routing_refused"

    def __init__(self, status: int, message: str, *, by_rule: bool) -> None:
        super().__init__(message, headers={"retry-after": "1"} if status in (429, 503) else None)
        self.status = status
        self.code = "routing_refused" if by_rule else "no_healthy_backend"
        self.openai_type = "server_error" if status >= 500 else "invalid_request_error"
        self.anthropic_type = anthropic_error_type(status)


# Anthropic's error type for each HTTP status it documents; others go by class (4xx, 5xx).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """The Anthropic error type for an HTTP status: the documented ones, else by class (4xx, 5xx)."""
    kind = _ANTHROPIC_TYPES.get(status)
    if kind is not None:
        return kind
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


class ConfigError(GatewayError):
    """A configuration document or CLI argument is invalid. Never reaches a client."""

    status = 400
    code = "invalid_config"


class CredentialError(ConfigError):
    """A sealed credential that no key at hand opens, or a secrets key that cannot be used."""


class StoreError(GatewayError):
    """The database failed (locked past the busy timeout, disk full, corrupt file, ...)."""

    status = 500
    code = "store_error"


class StoreDataError(StoreError):
    """The database refused a value it was given (out of its column's range, a character its text type
    cannot hold, the wrong type): the data's fault, not the database's, so trying again cannot help."""


class StoreConflict(ConfigError, StoreError):
    """A write broke a uniqueness or reference rule: a caller's mistake, not a broken database."""


class OwnershipConflict(StoreConflict):
    """A write through the API or UI that would change or remove an entry a config file owns."""

    status = 409
    code = "owned_by_file"
