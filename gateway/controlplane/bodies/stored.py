"""A logged request's bodies as they are stored: decoded, a stream's answer rebuilt, cut bodies closed,
and redacted, from the frame a proxy worker sent (``gateway.body_record``).

Each body is stored as one of:

- ``json``: the body parsed (a JSON body cut at the size cap closed as ``truncated.close_json`` says),
  redacted by path and pattern, stored as compact JSON text;
- ``text``: a body that is UTF-8 but not JSON (a multipart upload's fields, a plain-text answer, or a
  stream whose events are of no shape ``stream_answer`` knows), redacted by pattern;
- ``binary``: bytes that are not UTF-8 (audio), of which only the size is kept;
- ``withheld``: while the entry redacts by path, a body that looks like JSON but does not parse even
  closed, or a stream whose events do not rebuild: the paths cannot be applied to it, so only its size
  is kept;
- ``none``: no body (a GET, or an answer that never started).

A streamed answer is rebuilt into the answer the same API gives without streaming
(``gateway.protocol.stream_answer``), and the count of its events is kept. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.body_record import BodyRecord
from gateway.controlplane.bodies.redaction import Redactor
from gateway.controlplane.bodies.truncated import close_json, cut_tail
from gateway.protocol.stream_answer import rebuild

__all__ = ["BODY_COLUMNS", "StoredBodies", "stored_bodies"]

DAY = 86400.0
BODY_COLUMNS = (
    "request_id, ts, expires_at, principal_id, key_id, model, rule, status, path, "
    "request_kind, request_size, request_truncated, request_body, "
    "response_kind, response_size, response_truncated, response_body, stream_events, redactions"
)


@dataclass(frozen=True, slots=True)
class StoredBodies:
    request_id: str
    ts: float
    expires_at: float
    principal_id: str
    key_id: str
    model: str
    rule: str
    status: int
    path: str
    request_kind: str
    request_size: int
    request_truncated: bool
    request_body: str | None
    response_kind: str
    response_size: int
    response_truncated: bool
    response_body: str | None
    stream_events: int | None  # a stream's answer: the events it was rebuilt from
    redactions: int

    def row(self) -> tuple[Any, ...]:
        return (
            self.request_id,
            self.ts,
            self.expires_at,
            self.principal_id,
            self.key_id,
            self.model,
            self.rule,
            self.status,
            self.path,
            self.request_kind,
            self.request_size,
            int(self.request_truncated),
            self.request_body,
            self.response_kind,
            self.response_size,
            int(self.response_truncated),
            self.response_body,
            self.stream_events,
            self.redactions,
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...] | list[Any]) -> StoredBodies:
        values = list(row)
        values[11] = bool(values[11])
        values[15] = bool(values[15])
        return cls(*values)

    @classmethod
    def from_wire(cls, values: Any) -> StoredBodies:
        """A row as a proxy-role host sent it (``row()`` as JSON); ValueError when it is not one."""
        if type(values) is not list or len(values) != len(_WIRE_TYPES):
            raise ValueError(f"a logged-bodies row is an array of {len(_WIRE_TYPES)} values")
        for value, types, name in zip(values, _WIRE_TYPES, BODY_COLUMNS.split(", "), strict=True):
            if type(value) not in types:
                raise ValueError(f"logged-bodies field {name} has the wrong type")
        return cls.from_row(values)

    def as_doc(self) -> dict[str, Any]:
        """What the admin API, the UI and ``gateway requests show --bodies`` show."""
        return {
            "rule": self.rule,
            "path": self.path,
            "redactions": self.redactions,
            "logged_at": self.ts,
            "expires_at": self.expires_at,
            "request": _body_doc(
                self.request_kind, self.request_size, self.request_truncated, self.request_body
            ),
            "response": _body_doc(
                self.response_kind, self.response_size, self.response_truncated, self.response_body
            )
            | ({"stream_events": self.stream_events} if self.stream_events is not None else {}),
        }


_S, _N, _I, _SN, _IN = (str,), (int, float), (int,), (str, type(None)), (int, type(None))
_WIRE_TYPES = (_S, _N, _N, _S, _S, _S, _S, _I, _S, _S, _I, _I, _SN, _S, _I, _I, _SN, _IN, _I)


def _body_doc(kind: str, size: int, truncated: bool, body: str | None) -> dict[str, Any]:
    shown: Any = body
    if kind == "json" and body is not None:
        shown = orjson.loads(body)
    return {"kind": kind, "size": size, "truncated": truncated, "body": shown}


def stored_bodies(record: BodyRecord, redactor: Redactor, retention_days: float) -> StoredBodies:
    """``record`` made ready to store: nothing in it is left unredacted."""
    redactor.count = 0
    request_kind, request_body = _body(record.request, record.request_truncated, redactor)
    events: int | None = None
    response_kind: str
    response_body: str | None
    if record.stream and record.response:
        answer, events = rebuild(
            record.dialect, record.path, record.response, complete=not record.response_truncated
        )
        if answer is not None:
            response_kind, response_body = "json", _dump(redactor.document(answer))
        elif redactor.paths:  # events of no known shape: the paths cannot be applied to them
            response_kind, response_body = "withheld", None
        else:
            response_kind, response_body = _body(record.response, record.response_truncated, redactor)
    else:
        response_kind, response_body = _body(record.response, record.response_truncated, redactor)
    return StoredBodies(
        record.request_id,
        record.ts,
        record.ts + retention_days * DAY,
        record.principal_id,
        record.key_id,
        record.model,
        record.rule,
        record.status,
        record.path,
        request_kind,
        record.request_size,
        record.request_truncated,
        request_body,
        response_kind,
        record.response_size,
        record.response_truncated,
        response_body,
        events,
        redactor.count,
    )


def _body(data: bytes, truncated: bool, redactor: Redactor) -> tuple[str, str | None]:
    if not data:
        return "none", None
    try:
        # A cut body may end inside a character: that character goes (it is at the cut anyway).
        text = data.decode("utf-8", "ignore" if truncated else "strict")
    except UnicodeDecodeError:
        return "binary", None
    if truncated and not text:
        return "binary", None
    value = _json(text, truncated)
    if value is not _NOT_JSON:
        return "json", _dump(redactor.document(value))
    if redactor.paths and text.lstrip()[:1] in ("{", "["):
        return "withheld", None  # JSON that does not parse: the paths cannot be applied to it
    if truncated:
        text = cut_tail(text)
    return "text", redactor.text(text).replace("\x00", "\ufffd")  # PostgreSQL text holds no NUL


_NOT_JSON = object()


def _json(text: str, truncated: bool) -> Any:
    if truncated:
        closed = close_json(text)
        return _NOT_JSON if closed is None else closed
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _dump(value: Any) -> str:
    return orjson.dumps(value).decode()
