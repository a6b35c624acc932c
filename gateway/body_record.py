"""One logged request's bodies as a proxy worker hands them to the control worker: the contract of the
body rings (``gateway.native.SpanRing``), beside the usage record's.

A frame is ``[uint32 header length][header: an orjson array][request bytes][answer bytes]``. The bodies
are the bytes as the client sent them and as it was answered (the answer of a stream: its events as
relayed), each cut at the entry's ``max_bytes``; the header says how long each really was, so that the
control worker can say what was cut. Nothing here is redacted yet: frames live in the worker's memory and
the shared ring only, and the control worker redacts before it stores anything. Pure; no I/O.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import orjson

__all__ = ["VERSION", "BodyRecord", "decode_body_record", "encode_body_record"]

VERSION = 1
_LENGTH = struct.Struct("=I")


class BodyRecord(NamedTuple):
    request_id: str  # the usage record's
    ts: float  # unix seconds when the answer ended
    principal_id: str
    key_id: str
    model: str  # the name the client called
    status: int  # what the client got (499: it left before an answer)
    rule: str  # the [[body_logs]] entry that logged it, by name
    rule_id: str  # and its fingerprint, which names the redaction that applies
    dialect: str  # the API the client spoke: "openai" | "anthropic" | "responses"
    path: str  # the request's path, e.g. /v1/chat/completions
    stream: bool  # whether the answer was relayed as a stream (its events, as sent)
    request_size: int  # bytes the client sent
    response_size: int  # bytes of the answer relayed to the client
    source: str  # whose answer: "backend", or "gateway" for the gateway's own error
    request: bytes  # at most the entry's max_bytes of the request
    response: bytes  # at most max_bytes of the answer

    @property
    def request_truncated(self) -> bool:
        return len(self.request) < self.request_size

    @property
    def response_truncated(self) -> bool:
        return len(self.response) < self.response_size


def encode_body_record(record: BodyRecord) -> bytes:
    header = orjson.dumps((VERSION, *record[:14], len(record.request), len(record.response)))
    return b"".join((_LENGTH.pack(len(header)), header, record.request, record.response))


_TYPES = (str, float, str, str, str, int, str, str, str, str, bool, int, int, str, int, int)


def decode_body_record(frame: bytes) -> BodyRecord:
    """The record in ``frame``; ValueError when it is not one (a scribbled or foreign slot)."""
    if len(frame) < _LENGTH.size:
        raise ValueError("a body record frame is shorter than its header's length")
    (length,) = _LENGTH.unpack_from(frame)
    end = _LENGTH.size + length
    try:
        values = orjson.loads(frame[_LENGTH.size : end])
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a body record: {exc}") from None
    if type(values) is not list or len(values) != 17 or values[0] != VERSION:
        raise ValueError(f"not a body record of version {VERSION}")
    fields = values[1:]
    for value, kind in zip(fields, _TYPES, strict=True):
        if type(value) is not kind and not (kind is float and type(value) is int):  # exact: no bool for int
            raise ValueError("a body record field has the wrong type")
    kept_request, kept_response = fields[14], fields[15]
    if kept_request < 0 or kept_response < 0 or end + kept_request + kept_response != len(frame):
        raise ValueError("a body record's lengths do not add up to its frame")
    request = frame[end : end + kept_request]
    response = frame[end + kept_request :]
    return BodyRecord._make([*fields[:14], request, response])
