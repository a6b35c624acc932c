"""The control worker's admin port: the admin API (``/admin/``, see ``admin``) and what a control plane
serves to the proxy-role hosts of its cluster (``/cluster/``):

- ``GET /cluster/snapshot``: the current snapshot document, with ``ETag: "<revision>"``; a request whose
  ``If-None-Match`` names the current revision gets ``304`` and no body, so polling costs a header.
- ``POST /cluster/usage``: a JSON array of usage records (each the array a proxy worker encoded); written
  idempotently by request id, answered ``{"accepted": n}`` (n counts the records set aside too). A record
  that does not decode, or that the store cannot hold, is set aside in the store (``usage_rejected``, see
  ``usage.sink``) and the rest of the batch stored; a body that is not a JSON array gets 400 (the sender
  keeps it aside in its spool). While more records from proxy hosts wait for the store than
  ``--ingest-queue-max``, a batch gets ``503`` ``ingest_busy`` with ``Retry-After`` (seconds: about the
  time the store takes to write what waits, 1 to 30), before its body is read: the host keeps it in its
  spool and sends it again then.
- ``POST /cluster/bodies``: a JSON array of logged bodies, already redacted by the proxy host that logged
  them (each a ``bodies.stored.StoredBodies`` row); written idempotently by request id, answered
  ``{"accepted": n}``. A row that does not read fails the batch with 400.
- ``POST /cluster/report``: a proxy host's health report (``fleet.host_report``), kept for the fleet view;
  answered with the host's shares of the rate limits for the next window (``fleet.Fleet.record``) and the
  budgets' base spend from the store. A report whose ``traffic`` is not request counts per scope gets 400
  and is not kept. The bases wait at most ``REPORT_BASES_WAIT`` for the store thread: behind a store that
  fell behind, the report is answered without them (the host keeps the bases it has until a later report),
  so that a proxy host, which reports, syncs and ships usage in turn, does not stall on the store.
- ``GET /cluster/healthz``: ``{"status": "ok", "revision": …}``.

And, without authentication, ``GET /metrics``: Prometheus text (``usage.metrics``), and the admin web UI's
static files under ``/ui/`` (``ui``; ``/`` redirects there), which hold no data: the pages ask the admin
API.

Bodies are read no further than their limit (``request_body``): 16 KiB for a request nobody is
authenticated on yet (``POST /admin/login``), 8 MiB for an admin write, 64 MiB for a usage batch; past it
the answer is 413 at once. Every ``/cluster/`` route needs ``Authorization: Bearer <cluster token>``
(``GATEWAY_CLUSTER_TOKEN``, the same on every host), compared in constant time, before its body is read.
Without a token configured the routes answer 503: a control plane never serves its snapshot, which holds
backend keys, to anyone who asks. Errors use the OpenAI envelope like every gateway error.
I/O: the client connection; the store, through the ``UsageSink`` the control worker owns, on its store
thread (never on the event loop that answers snapshot polls).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol, TypeVar

import orjson

from gateway.controlplane import ui
from gateway.controlplane.api.admin import AdminApi
from gateway.controlplane.api.request_body import read_body
from gateway.controlplane.bodies.stored import StoredBodies
from gateway.controlplane.store import StoreError
from gateway.controlplane.store._usage import RejectedRecord
from gateway.errors import BadRequest, GatewayError, IngestBusy, NotFound, ServiceUnavailable, Unauthorized
from gateway.usage_record import UsageRecord, record_from_values

__all__ = ["ClusterApp", "SnapshotSource"]

log = logging.getLogger("gateway.controlplane")

_JSON = [("content-type", "application/json")]
# Admin answers hold keys' secrets and the configuration: never cached, never sniffed into something else.
_ADMIN_HEADERS = [("x-content-type-options", "nosniff"), ("cache-control", "no-store")]
MAX_USAGE_BODY = 64 * 1024 * 1024  # a proxy host's batch of usage records
MAX_REPORT_BODY = 1024 * 1024  # a proxy host's health report
REPORT_BASES_WAIT = 1.0  # seconds a report waits for its budget bases behind the store thread's work
_T = TypeVar("_T")


class SnapshotSource(Protocol):
    """The control worker: the last snapshot it built, and where usage records go. ``current_snapshot``
    and ``record_report`` answer from memory, on the event loop; the others touch the store or the usage
    sink and run on ``store_calls`` (admin requests on ``admin_calls``), so that a store that hangs never
    holds up a proxy host's poll."""

    store_calls: Executor
    admin_calls: Executor

    def current_snapshot(self) -> tuple[int, bytes] | None: ...

    def store_usage(self, records: list[UsageRecord], rejected: list[RejectedRecord]) -> None: ...

    def store_bodies_rows(self, rows: list[StoredBodies]) -> None: ...

    def record_report(self, report: dict[str, Any]) -> dict[str, Any]: ...

    def budget_bases(self, report: dict[str, Any]) -> dict[str, list[int]] | None: ...

    def metrics_text(self) -> bytes: ...


class ClusterApp:
    """The RSGI application of the control worker's admin port."""

    def __init__(
        self,
        source: SnapshotSource,
        token: str | None,
        admin: AdminApi | None = None,
        *,
        ingest_max: int = 200_000,
    ) -> None:
        self.source = source
        self.token = token.encode() if token else None
        self.admin = admin
        # Batches that arrived while the store thread was writing the previous ones: written together in
        # one transaction, so that 500 hosts each shipping every second do not queue 500 transactions.
        self._waiting: list[tuple[list[UsageRecord], list[RejectedRecord], asyncio.Future[None]]] = []
        self._writing = False
        # Backpressure: records waiting for the store or in its hands. Past ``ingest_max`` a batch is
        # answered 503 (``IngestBusy``) with a Retry-After of about the time the store takes to write what
        # waits (``_rate``, records a second, from its recent writes), and stays in its host's spool:
        # what the store cannot keep up with waits on the proxy hosts' disks, not in this process's
        # memory, and the store writes at its pace instead of drowning in batches that time out and come
        # back.
        self.ingest_max = ingest_max
        self._pending = 0
        self._rate = 0.0
        self.refused_busy = 0

    def __rsgi_init__(self, loop: Any) -> None:
        pass

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        try:
            status, headers, body = await self.handle(scope, proto)
        except GatewayError as exc:
            status, headers, body = exc.status, _JSON + list(exc.headers.items()), exc.openai_body()
        if scope.path.startswith("/admin/"):
            headers = [*headers, *_ADMIN_HEADERS]
        proto.response_bytes(status, headers, body)

    async def handle(self, scope: Any, proto: Any) -> tuple[int, list[tuple[str, str]], bytes]:
        path, method = scope.path, scope.method
        if path == "/metrics" and method == "GET":
            text = await _on(self.source.store_calls, self.source.metrics_text) + self._ingest_metrics()
            return 200, [("content-type", "text/plain; version=0.0.4; charset=utf-8")], text
        if self.admin is not None:
            if path.startswith("/admin/"):
                # Route and caller first, from the head: a stranger's body is read no further than the
                # few KiB a login takes, and an admin's no further than MAX_BODY.
                admission = self.admin.admit(method, path, scope.headers)
                body = b""
                if method in ("POST", "PUT", "PATCH"):
                    body = await read_body(proto, scope.headers, admission.body_limit)
                secure = scope.scheme == "https"
                respond = partial(self.admin.answer, secure=secure)
                return await _on(self.source.admin_calls, respond, admission, scope.query_string, body)
            if path in ("/", "/ui") and method in ("GET", "HEAD"):
                return 308, [("location", "/ui/")], b""
            if path.startswith("/ui/"):
                return ui.serve(method, path, scope.headers.get("if-none-match"))
        if not path.startswith("/cluster/"):
            raise NotFound(f"no route for {path}")
        self.authorise(scope.headers.get("authorization"))
        if path == "/cluster/snapshot" and method == "GET":
            return self.snapshot(scope.headers.get("if-none-match"))
        if path == "/cluster/usage" and method == "POST":
            if self._pending >= self.ingest_max:
                raise self._busy()  # before reading what would only wait
            return await self.usage(await read_body(proto, scope.headers, MAX_USAGE_BODY))
        if path == "/cluster/bodies" and method == "POST":
            return await self.bodies(await read_body(proto, scope.headers, MAX_USAGE_BODY))
        if path == "/cluster/report" and method == "POST":
            try:
                report = orjson.loads(await read_body(proto, scope.headers, MAX_REPORT_BODY))
            except orjson.JSONDecodeError as exc:
                raise BadRequest(f"report is not JSON: {exc}") from None
            if not isinstance(report, dict):
                raise BadRequest("a report is a JSON object")
            answer = self.source.record_report(report)
            try:
                bases = await asyncio.wait_for(
                    _on(self.source.store_calls, self.source.budget_bases, report), REPORT_BASES_WAIT
                )
            except TimeoutError:  # the store thread is held up (a store behind): bases with a later report
                bases = None
            if bases is not None:
                answer["budget_bases"] = bases
            return 200, _JSON, orjson.dumps(answer)
        if path == "/cluster/healthz" and method == "GET":
            current = self.source.current_snapshot()
            health = {"status": "ok" if current else "starting", "revision": current[0] if current else None}
            return 200, _JSON, orjson.dumps(health)
        raise NotFound(f"no route for {method} {path}")

    async def _store(self, records: list[UsageRecord], rejected: list[RejectedRecord]) -> None:
        """Have ``records`` written and ``rejected`` set aside, together with whatever other hosts' batches
        wait meanwhile. Raises StoreError when their transaction failed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((records, rejected, done))
        if not self._writing:
            self._writing = True
            try:
                while self._waiting:
                    batches, self._waiting = self._waiting, []
                    joined = [r for recs, _, _ in batches for r in recs]
                    aside = [r for _, recs, _ in batches for r in recs]
                    began = time.monotonic()
                    try:
                        await _on(self.source.store_calls, self.source.store_usage, joined, aside)
                        rate = len(joined) / max(time.monotonic() - began, 1e-3)
                        self._rate = rate if not self._rate else 0.8 * self._rate + 0.2 * rate
                    except StoreError as exc:
                        for _, _, waiting in batches:
                            waiting.set_exception(exc)
                    else:
                        for _, _, waiting in batches:
                            waiting.set_result(None)
            finally:
                self._writing = False
        await done

    def authorise(self, authorization: str | None) -> None:
        if self.token is None:
            raise ServiceUnavailable("this control plane has no cluster token (GATEWAY_CLUSTER_TOKEN)")
        if not authorization or not authorization.startswith("Bearer "):
            raise Unauthorized("missing cluster token")
        if not hmac.compare_digest(authorization[7:].strip().encode(), self.token):
            raise Unauthorized("incorrect cluster token")

    def snapshot(self, if_none_match: str | None) -> tuple[int, list[tuple[str, str]], bytes]:
        current = self.source.current_snapshot()
        if current is None:
            raise ServiceUnavailable("no snapshot built yet")
        revision, blob = current
        etag = f'"{revision}"'
        if if_none_match == etag:
            return 304, [("etag", etag)], b""
        return 200, [*_JSON, ("etag", etag)], blob

    async def usage(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        values = _batch(body, "usage", "record", _value)
        # One batch larger than the bound is taken when nothing waits, so that no batch is refused forever.
        # Checked before the records are decoded and checked (a few µs each, on the event loop): under
        # overload many batches are refused here, and their records were read only to be thrown away.
        if self._pending and self._pending + len(values) > self.ingest_max:
            raise self._busy()
        records: list[UsageRecord] = []
        rejected: list[RejectedRecord] = []
        for value in values:
            try:
                records.append(record_from_values(value))
            except ValueError as exc:  # set aside by the sink, which counts and logs them
                rejected.append(RejectedRecord.of(orjson.dumps(value), "cluster", f"invalid: {exc}"))
        self._pending += len(values)
        try:
            await self._store(records, rejected)
        except StoreError as exc:
            log.error("usage batch of %d records not stored: %s", len(values), exc)
            raise ServiceUnavailable("the store is unavailable; send the batch again later") from None
        finally:
            self._pending -= len(values)
        return 200, _JSON, orjson.dumps({"accepted": len(values)})

    def _busy(self) -> IngestBusy:
        self.refused_busy += 1
        seconds = math.ceil(self._pending / self._rate) if self._rate > 0 else 1
        return IngestBusy(
            f"{self._pending} usage records wait for the store (--ingest-queue-max {self.ingest_max}); "
            "send the batch again later",
            min(max(seconds, 1), 30),
        )

    def _ingest_metrics(self) -> bytes:
        return (
            "# HELP gateway_cluster_usage_busy_total Usage batches from proxy hosts answered 503 "
            "ingest_busy (more records waited for the store than --ingest-queue-max); they stay spooled.\n"
            "# TYPE gateway_cluster_usage_busy_total counter\n"
            f"gateway_cluster_usage_busy_total {self.refused_busy}\n"
            "# HELP gateway_cluster_usage_pending_records Usage records from proxy hosts waiting for the "
            "store or being written.\n"
            "# TYPE gateway_cluster_usage_pending_records gauge\n"
            f"gateway_cluster_usage_pending_records {self._pending}\n"
        ).encode()

    async def bodies(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        rows = _batch(body, "bodies", "row", StoredBodies.from_wire)
        try:
            await _on(self.source.store_calls, self.source.store_bodies_rows, rows)
        except StoreError as exc:
            log.error("bodies batch of %d rows not stored: %s", len(rows), exc)
            raise ServiceUnavailable("the store is unavailable") from None
        return 200, _JSON, orjson.dumps({"accepted": len(rows)})


def _value(value: Any) -> Any:
    return value


async def _on(executor: Executor, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` on ``executor``'s thread, awaited from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)


def _batch(body: bytes, what: str, item: str, decode: Callable[[Any], _T]) -> list[_T]:
    """A batch a proxy host sent (``POST /cluster/usage``, ``/cluster/bodies``): a JSON array, each of its
    items decoded; 400 naming the batch for anything else."""
    try:
        values = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} batch is not JSON: {exc}") from None
    if not isinstance(values, list):
        raise BadRequest(f"{what} batch must be a JSON array of {item}s")
    try:
        return [decode(v) for v in values]
    except ValueError as exc:
        raise BadRequest(f"{what} batch holds an unreadable {item}: {exc}") from None
