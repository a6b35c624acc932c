"""The admin API's reports on what the gateway did and is doing: usage (``?by=``, ``?bucket=``, as JSON or
CSV), the usage records set aside or clamped, spend against budgets, requests in flight and the last
finished ones (the flight recorder, then the store; a request's logged bodies for a caller holding
``bodies:read``), and the fleet's hosts. I/O: the store and the control worker's memory, through the
context.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Any

from gateway.controlplane.api.calls import Access, Call, Reply, ok, one
from gateway.controlplane.store import StoreError
from gateway.controlplane.usage.rejected import rejected_report
from gateway.controlplane.usage.requests_view import request_doc
from gateway.controlplane.usage.spend import budget_report, usage_groups
from gateway.controlplane.usage.time_range import since_arg
from gateway.errors import BadRequest, ConfigError, NotFound, ServiceUnavailable

__all__ = ["budgets", "fleet", "rejected", "request_one", "requests", "usage"]

_BUCKETS = {"minute": 60, "hour": 3600, "day": 86400}


def usage(call: Call) -> Reply:
    query, store = call.query, call.ctx.store
    now = time.time()
    try:
        start = since_arg(one(query, "since") or "24h", now)
        until = one(query, "until")
        end = since_arg(until, now) if until else now + 1
    except ConfigError as exc:
        raise BadRequest(exc.message, param="since") from None
    by = one(query, "by") or "principal"
    if by not in ("principal", "model", "key", "backend", "tag"):
        raise BadRequest("by must be principal, model, key, backend or tag", param="by")
    bucket_name = one(query, "bucket")
    bucket = _BUCKETS.get(bucket_name) if bucket_name else None
    if bucket_name and bucket is None:
        raise BadRequest("bucket must be minute, hour or day", param="bucket")
    form = one(query, "format") or "json"
    if form not in ("json", "csv"):
        raise BadRequest("format must be json or csv", param="format")
    try:
        rows = store.usage.summary(start, end, by, bucket)
        purged_before = store.usage.purged_before()
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
    groups = usage_groups(rows)
    if form == "csv":
        disposition = f'attachment; filename="usage-by-{by}.csv"'
        headers = [("content-type", "text/csv; charset=utf-8"), ("content-disposition", disposition)]
        return 200, headers, _usage_csv(by, groups).encode()
    answer = {"since": start, "until": end, "by": by, "bucket": bucket_name, "groups": groups}
    if start < purged_before:  # usage retention purged records of this range: say what is whole
        answer["complete_since"] = purged_before
    return ok(answer)


def budgets(call: Call) -> Reply:
    try:
        return ok(budget_report(call.ctx.store, time.time()))
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None


def rejected(call: Call) -> Reply:
    raw = one(call.query, "limit") or "100"
    if not raw.isdigit() or not 0 < int(raw) <= 1000:
        raise BadRequest("limit must be an integer in 1..1000", param="limit")
    try:
        return ok(rejected_report(call.ctx.store, int(raw)))
    except StoreError as exc:
        raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None


def requests(call: Call) -> Reply:
    query, ctx = call.query, call.ctx
    raw = one(query, "limit") or "50"
    if not raw.isdigit() or not 0 < int(raw) <= 1000:
        raise BadRequest("limit must be an integer in 1..1000", param="limit")
    status = one(query, "status")
    if status is not None and status != "error" and not (status.isdigit() and len(status) == 3):
        raise BadRequest("status must be an HTTP status or 'error'", param="status")
    failover = one(query, "failover") in ("1", "true")
    recorder = ctx.recent_requests()
    names = ctx.principal_names()
    recent = recorder.latest(int(raw), model=one(query, "model"), status=status, failover=failover)
    live = ctx.live_requests()
    for item in live:
        item["principal"] = names.get(str(item.get("principal_id")))
    return ok(
        {
            "live": live,
            "recent": [request_doc(r, names) for r in recent],
            "recorder_size": recorder.records.maxlen,
        }
    )


def request_one(call: Call) -> Reply:
    ctx = call.ctx
    wanted = call.params["id"]
    found = ctx.recent_requests().find(wanted)
    if not found:
        try:
            found = ctx.store.usage.find(wanted)
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
    if not found:
        raise NotFound(f"no finished request with id {wanted!r} (in flight, or not recorded)")
    names = ctx.principal_names()
    doc = request_doc(found[0], names)
    doc["same_id"] = [r.request_id for r in found[1:]]  # a client that reused its x-request-id
    if call.who.holds(Access.BODIES_READ.value):  # bodies are sensitive: a permission of their own
        try:
            stored = ctx.store.bodies.get(found[0].request_id)
        except StoreError as exc:
            raise ServiceUnavailable(f"the store is unavailable: {exc.message}") from None
        doc["bodies"] = stored.as_doc() if stored is not None else None
    return ok(doc)


def fleet(call: Call) -> Reply:
    return ok({"hosts": call.ctx.fleet_view()})


_CSV_FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost")


def _usage_csv(by: str, groups: list[dict[str, Any]]) -> str:
    """One row per group (and bucket), the bucket as a UTC ISO 8601 time. A name that a spreadsheet would
    read as a formula (``=``, ``+``, ``-``, ``@``) gets a leading ``'``: names come from callers' configs."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["bucket_start", by, *_CSV_FIELDS])
    for g in groups:
        start = g.get("bucket_start")
        when = "" if start is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        name = "'" + g["group"] if g["group"][:1] in ("=", "+", "-", "@") else g["group"]
        writer.writerow([when, name, *(g[f] for f in _CSV_FIELDS)])
    return out.getvalue()
