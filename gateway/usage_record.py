"""One usage record: what a proxy worker hands the control worker for every request it forwarded.

The contract between the planes in the other direction from the snapshot: a worker encodes a record into
a few hundred bytes (an orjson array, version first) and pushes it into its shared-memory ring; the
control worker decodes it and writes it to the store, idempotently by ``request_id``. Pure; no I/O.

A record must fit one ring slot (``gateway.shm.regions.RING_SLOT_BYTES`` less the slot's 8-byte header:
1016 bytes). Its other fields are bounded (names at most 200 characters, the client's request id at most
128), but a routing rule's tag may have up to 500 characters and a route trace one entry per target tried, so
``fit_record`` first leaves out the middle attempts of a long trace (the first and the last stay, and the
count of those left out), then cuts the tag; a record is never refused for its trace or its tag.

The route trace (version 6) is a list of attempts (``RouteStep``), each ``[backend, provider_model,
outcome, ttfb_ms, duration_ms]``, ``backend`` naming a pool's credential as ``BACKEND/CREDENTIAL``:
``outcome`` is the HTTP status the backend answered, or why there was no answer (``ATTEMPT_OUTCOMES``),
null when the client went away first; an attempt's outcome is why the next one was tried. A sampled
request's attempts add ``span_id, start_ms`` (OpenTelemetry). An entry that is a plain integer stands for
that many attempts left out to fit. ``rule`` names the routing rule that decided (``"#N"`` by position
when unnamed); ``span`` is the request's OpenTelemetry identity when it was sampled:
``[trace_id, parent_span_id | None, span_id, operation, dialect]``.

Budgets (version 7): ``budget_keys`` lists the live spend counters of the principal's budgets the request
was added to (one per period), ``key_budget_keys`` those of the key's own budgets; older versions named at
most one counter, the principal's (``budget_key``), which decodes as a list of one. A record's budget keys
are never left out to fit: there are at most ``gateway.budget.MAX_BUDGETS`` of each.

Bounds (``bound_record``): what the control worker stores is checked first, since a record may carry any
figure a proxy worker computed or a proxy host sent. Token counts and the cost are clamped into
``[0, MAX_FIGURE]``, the status and the attempts into ``[0, 2**31 - 1]`` (an SQL INTEGER), the latencies
into ``[0, MAX_FIGURE]`` ms (NaN to 0), and a budget key list keeps only the entries that can name a live
counter (integers in (0, 2**64); none left: None); a record whose end time is not a finite number cannot be
placed in any window and is refused (ValueError), for the caller to set aside.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

__all__ = [
    "ATTEMPT_OUTCOMES",
    "MAX_FIGURE",
    "VERSION",
    "RouteStep",
    "UsageRecord",
    "access_line",
    "bound_record",
    "counter_key",
    "decode_record",
    "encode_record",
    "fit_record",
    "fit_tag",
    "record_from_values",
    "records_from_values",
    "to_signed64",
    "to_unsigned64",
]

# 2 client_request_id, 3 attempts, 4 tag, 5 cut, 6 rule/trace/span, 7 budget key lists; older ones (a
# spool, a proxy host not upgraded yet) decode.
VERSION = 7

# Why an attempt gave no HTTP answer: no connection, no response headers in time, the connection failed
# otherwise, the target's protocol cannot carry the request (not sent), its flow-control gate was full
# (passed over); "cut": the backend failed after the answer had started.
ATTEMPT_OUTCOMES = ("connect", "timeout", "error", "unsupported", "full", "cut")


class RouteStep(list[Any]):
    """One attempt of a route trace: a list, so that it is stored, sent and read back as the trace's
    version 6 entries always were, with its places named for the code that fills it in as the attempt
    goes. ``backend`` is ``BACKEND/CREDENTIAL`` when a credential pool's key was used (by name, never
    its secret), as the record's own ``backend`` is."""

    __slots__ = ()

    @classmethod
    def start(cls, backend: str, provider_model: str, outcome: int | str | None = None) -> RouteStep:
        return cls((backend, provider_model, outcome, None, None))

    @property
    def backend(self) -> str:
        return str(self[0])

    @property
    def outcome(self) -> int | str | None:
        """The HTTP status answered, or why there was none (``ATTEMPT_OUTCOMES``); None while waiting."""
        outcome: int | str | None = self[2]
        return outcome

    def answered(self, status: int, ttfb_ms: float) -> None:
        self[2] = status
        self[3] = ttfb_ms

    def failed(self, outcome: str) -> None:
        self[2] = outcome

    def ended(self, duration_ms: float) -> None:
        self[4] = duration_ms

    def sampled(self, span_id: str, start_ms: float) -> None:
        """A sampled request's attempt: its OpenTelemetry span id and start, after the five places."""
        self += (span_id, start_ms)


class UsageRecord(NamedTuple):
    """A tuple, so that it is its own row and its own encoding."""

    request_id: str
    ts: float  # unix seconds when the response ended
    principal_id: str
    key_id: str
    model: str  # the name the client called
    backend: str | None  # which backend answered; None when none did
    status: int  # what the client got; 499 when it went away before an answer
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int
    usage_source: str  # "reported" | "estimated" | "none"
    cost_nanos: int
    latency_ms: float
    ttfb_ms: float | None
    # The live spend counters (unsigned 64-bit) of the principal's budgets this request was added to.
    budget_keys: Sequence[int] | None
    client_request_id: str | None = None  # what the client sent as x-request-id, if anything
    attempts: int = 1  # targets tried: 1 when the first answered, more after failovers, 0 when none was
    tag: str | None = None  # the usage tag of the routing rule that decided the request, if it had one
    # How an answer that started ended short: None when it ended as the backend ended it; "client" when
    # the client went away first, "upstream" when the backend's stream broke off. ``status`` stays what
    # the client was sent.
    cut: str | None = None
    rule: str | None = None  # the routing rule that decided, if a rule did (version 6)
    trace: list[Any] | None = None  # the route trace: one entry per attempt (see the module's docstring)
    span: list[Any] | None = None  # OpenTelemetry ids when the request was sampled
    key_budget_keys: Sequence[int] | None = None  # the same for the key's own budgets (version 7)

    def row(self) -> tuple[Any, ...]:
        """The values in column order, the trace, the span and the budget key lists as JSON text."""
        trace, span, keys, own = self.trace, self.span, self.budget_keys, self.key_budget_keys
        return (
            *self[:15],
            None if keys is None else orjson.dumps(keys).decode(),
            *self[16:21],
            None if trace is None else orjson.dumps(trace).decode(),
            None if span is None else orjson.dumps(span).decode(),
            None if own is None else orjson.dumps(own).decode(),
        )


def encode_record(record: UsageRecord) -> bytes:
    return orjson.dumps((VERSION, *record))


_STR, _INT, _NUM, _LIST = frozenset({str}), frozenset({int}), frozenset({int, float}), frozenset({list})
_NONE = frozenset({type(None)})
# Exact types per field (bool is not an int here); a set with NoneType for the nullable ones.
_TYPES = (
    _STR,  # request_id
    _NUM,  # ts
    _STR,  # principal_id
    _STR,  # key_id
    _STR,  # model
    _STR | _NONE,  # backend
    _INT,  # status
    _INT,  # prompt_tokens
    _INT,  # completion_tokens
    _INT,  # cached_tokens
    _INT,  # total_tokens
    _STR,  # usage_source
    _INT,  # cost_nanos
    _NUM,  # latency_ms
    _NUM | _NONE,  # ttfb_ms
    _LIST | _NONE,  # budget_keys (an integer before version 7)
    _STR | _NONE,  # client_request_id (version 2)
    _INT,  # attempts (version 3)
    _STR | _NONE,  # tag (version 4)
    _STR | _NONE,  # cut (version 5)
    _STR | _NONE,  # rule (version 6)
    _LIST | _NONE,  # trace (version 6)
    _LIST | _NONE,  # span (version 6)
    _LIST | _NONE,  # key_budget_keys (version 7)
)


def decode_record(data: bytes) -> UsageRecord:
    """The record in ``data``; ValueError when it is not one (a torn or foreign slot)."""
    try:
        values = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a usage record: {exc}") from None
    return record_from_values(values)


# Every allowed combination of field types, so a record is checked with one lookup (3072 combinations).
_SIGNATURES = frozenset(itertools.product(*_TYPES))
_new = tuple.__new__  # a record from exactly its 24 fields, without ``_make``'s Python frame
_BUDGET_KEY = UsageRecord._fields.index("budget_keys")


def record_from_values(values: Any) -> UsageRecord:
    """The record of an already decoded JSON array (``[version, *fields]``); ValueError otherwise."""
    if type(values) is not list:
        raise ValueError("a usage record is a JSON array")
    n = len(_TYPES)
    if len(values) == n + 1 and values[0] == VERSION:
        fields = values[1:]
    elif len(values) == n and values[0] == 6:
        fields = [*values[1:], None]
    elif len(values) == n - 3 and values[0] == 5:
        fields = [*values[1:], None, None, None, None]
    elif len(values) == n - 4 and values[0] == 4:
        fields = [*values[1:], None, None, None, None, None]
    elif len(values) == n - 5 and values[0] == 3:
        fields = [*values[1:], None, None, None, None, None, None]
    elif len(values) == n - 6 and values[0] == 2:
        fields = [*values[1:], 1, None, None, None, None, None, None]
    elif len(values) == n - 7 and values[0] == 1:
        fields = [*values[1:], None, 1, None, None, None, None, None, None]
    else:
        raise ValueError(f"not a usage record of version 1 to {VERSION}")
    if values[0] != VERSION and type(fields[_BUDGET_KEY]) is int:
        fields[_BUDGET_KEY] = [fields[_BUDGET_KEY]]  # the one counter of a record before version 7
    if tuple(map(type, fields)) not in _SIGNATURES:
        for value, types, name in zip(fields, _TYPES, UsageRecord._fields, strict=True):
            if type(value) not in types:
                raise ValueError(f"usage record field {name} has the wrong type")
    if not fields[0] or len(fields[0]) > 64:
        raise ValueError("usage record without a valid request id")
    return _new(UsageRecord, fields)


def records_from_values(batch: list[Any]) -> list[UsageRecord] | None:
    """The records of a batch of decoded JSON arrays when every one is a valid record of the current
    version, as ``record_from_values`` would make them; None when any is not (of an older version, or not
    a record at all): then decode them one by one, for ``record_from_values`` to tell which.

    Checked a column at a time rather than a record at a time: the same checks, in a few C loops."""
    if not batch:
        return []
    width = len(_TYPES) + 1
    if {*map(type, batch)} != {list} or {*map(len, batch)} != {width}:
        return None
    # The columns as slices of all the values in a row: a few large lists, where zip(*batch) would make
    # an iterator per record for the garbage collector to count and scan.
    values = list(itertools.chain.from_iterable(batch))
    if values[::width].count(VERSION) != len(batch):  # == as in record_from_values (4.0 is 4)
        return None
    columns = [values[i::width] for i in range(1, width)]
    del values  # not to be scanned by the collections that making the records sets off
    for column, types in zip(columns, _TYPES, strict=True):
        if not types.issuperset(map(type, column)):
            return None
    ids = columns[0]
    if not all(ids) or max(map(len, ids)) > 64:
        return None
    return list(map(_new, itertools.repeat(UsageRecord), zip(*columns, strict=True)))


def fit_record(data: bytes, limit: int) -> bytes:
    """The encoded record ``data`` in at most ``limit`` bytes: the middle attempts of its route trace left
    out (an integer entry counts them), then its tag cut (``fit_tag``), then the trace left out whole.
    ``data`` itself when it fits."""
    if len(data) <= limit:
        return data
    values = orjson.loads(data)
    trace = values[_TRACE] if len(values) > _TRACE else None
    if isinstance(trace, list) and len(trace) > 2:
        last, omitted = trace[-1], 0
        body = trace[1:-1]
        while body and len(data) > limit:
            dropped = body.pop()
            omitted += dropped if type(dropped) is int else 1
            values[_TRACE] = [trace[0], *body, omitted, last]
            data = orjson.dumps(values)
    data = fit_tag(data, limit)
    if len(data) > limit and trace is not None:
        values = orjson.loads(data)
        values[_TRACE] = None
        data = orjson.dumps(values)
    return data


def fit_tag(data: bytes, limit: int) -> bytes:
    """The encoded record ``data`` in at most ``limit`` bytes, by cutting its tag at a character boundary
    (the tag becomes None when not one character fits). ``data`` itself when it fits or has no tag; a
    record too long even without its tag stays too long, for the ring to refuse."""
    if len(data) <= limit:
        return data
    values = orjson.loads(data)
    tag = values[_TAG]
    if not isinstance(tag, str):
        return data
    excess = len(data) - limit
    cut = len(tag)
    while cut and excess > 0:  # what each character takes in the JSON: UTF-8 bytes, or its escape
        cut -= 1
        excess -= len(orjson.dumps(tag[cut])) - 2
    values[_TAG] = tag[:cut] or None
    return orjson.dumps(values)


# The largest token count or cost (nano-units) a record is stored with: the usage parser's own bound on
# a figure an upstream reports (``gateway.protocol.usage.TOKEN_LIMIT``), so nothing real is clamped, and
# far enough below 2**63 that a sum over a window (a budget's spend, a summary) of up to 1024 records
# clamped to it still fits the 64-bit integers SQLite sums in (an overflow there fails the whole query).
MAX_FIGURE = 2**53
_SQL_INT = 2**31 - 1  # an SQL INTEGER: 32 bits on PostgreSQL
_MS = float(MAX_FIGURE)
_FIGURES = tuple(
    map(
        UsageRecord._fields.index,
        ("prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens", "cost_nanos"),
    )
)
_SMALL = tuple(map(UsageRecord._fields.index, ("status", "attempts")))
_TIMES = tuple(map(UsageRecord._fields.index, ("latency_ms", "ttfb_ms")))
_COUNTERS = tuple(map(UsageRecord._fields.index, ("budget_keys", "key_budget_keys")))
_U64 = 2**64


def counter_key(value: object) -> bool:
    """Whether a budget key list's entry can name a live spend counter: an integer in (0, 2**64)."""
    return type(value) is int and 0 < value < _U64


def _live_counters(keys: Sequence[Any]) -> bool:
    """Whether every entry of a budget key list can name a live spend counter. The decoder checks only
    that the list is a list; the spend counters hash and compare its entries."""
    if len(keys) == 1:  # the usual case, one budget per owner: ``counter_key`` inline
        key = keys[0]
        return type(key) is int and 0 < key < _U64
    return all(map(counter_key, keys))


def bound_record(record: UsageRecord) -> tuple[UsageRecord, tuple[str, ...]]:
    """``record`` with its figures clamped into their columns' bounds (see the module's docstring), and the
    names of the fields that were; ``record`` itself and ``()`` when all were in bounds (most records: one
    quick check). ValueError when its end time is not a finite number."""
    r = record
    if (
        0 <= r.prompt_tokens <= MAX_FIGURE
        and 0 <= r.completion_tokens <= MAX_FIGURE
        and 0 <= r.cached_tokens <= MAX_FIGURE
        and 0 <= r.total_tokens <= MAX_FIGURE
        and 0 <= r.cost_nanos <= MAX_FIGURE
        and 0 <= r.status <= _SQL_INT
        and 0 <= r.attempts <= _SQL_INT
        and 0.0 <= r.latency_ms <= _MS  # False for NaN
        and (r.ttfb_ms is None or 0.0 <= r.ttfb_ms <= _MS)
        and math.isfinite(r.ts)
        and (r.budget_keys is None or _live_counters(r.budget_keys))
        and (r.key_budget_keys is None or _live_counters(r.key_budget_keys))
    ):
        return record, ()
    if not math.isfinite(r.ts):
        raise ValueError("usage record field ts is not a finite number")
    values: list[Any] = list(record)
    clamped: list[str] = []
    for at, top in [*((i, MAX_FIGURE) for i in _FIGURES), *((i, _SQL_INT) for i in _SMALL)]:
        value = values[at]
        if not 0 <= value <= top:
            values[at] = 0 if value < 0 else top
            clamped.append(UsageRecord._fields[at])
    for at in _TIMES:
        value = values[at]
        if value is not None and not 0.0 <= value <= _MS:
            values[at] = _MS if value > _MS else 0.0  # NaN and negative ones to 0
            clamped.append(UsageRecord._fields[at])
    for at in _COUNTERS:
        keys = values[at]
        if keys is not None and not _live_counters(keys):
            # An entry no counter can have held no spend: the window's base counts the record instead.
            values[at] = list(filter(counter_key, keys)) or None
            clamped.append(UsageRecord._fields[at])
    return _new(UsageRecord, values), tuple(clamped)


_TAG = 1 + UsageRecord._fields.index("tag")  # where the tag is in an encoded record (after the version)
_TRACE = 1 + UsageRecord._fields.index("trace")


def access_line(record: UsageRecord, principal: str | None = None) -> bytes:
    """One access-log line (JSON, newline-terminated) for a forwarded request, with ``tag`` only when the
    request had one. Identifiers only: the key appears by its id, never its secret or hash; no bodies."""
    line: dict[str, Any] = {
        "ts": record.ts,
        "request_id": record.request_id,
        "principal_id": record.principal_id,
        "principal": principal,
        "key_id": record.key_id,
        "model": record.model,
        "backend": record.backend,
        "status": record.status,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cached_tokens": record.cached_tokens,
        "usage": record.usage_source,
        "latency_ms": record.latency_ms,
        "ttfb_ms": record.ttfb_ms,
        "client_request_id": record.client_request_id,
        "attempts": record.attempts,
    }
    if record.tag is not None:
        line["tag"] = record.tag
    if record.cut is not None:
        line["cut"] = record.cut
    if record.rule is not None:
        line["rule"] = record.rule
    if record.trace is not None and record.attempts > 1:
        line["trace"] = record.trace  # only after a failover: what an operator reads the log for
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def to_signed64(value: int | None) -> int | None:
    if value is None:
        return None
    return value - (1 << 64) if value >= 1 << 63 else value


def to_unsigned64(value: int | None) -> int | None:
    if value is None:
        return None
    return value + (1 << 64) if value < 0 else value
