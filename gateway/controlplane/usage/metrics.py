"""Prometheus metrics for a whole host (or a whole cluster, at its control plane), in the text format.

Request metrics are counted by the control worker from the usage records it stores — every forwarded
request exactly once, whichever worker or host served it — so a scrape never sees one random worker and
the request path pays nothing for them. Host-level figures (requests in flight, refusals the gateway
made itself, backend failures, worker restarts, the snapshot) are read from the proxy workers' statistics
slots and the supervisor's state when scraped. Counters start at zero when the control worker starts,
which Prometheus treats as a counter reset. Pure apart from what ``render`` is handed.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import reduce
from itertools import chain, repeat
from operator import add, itemgetter, truediv
from typing import Any

from gateway.dataplane.flow import PRIORITIES, WAIT_BUCKETS
from gateway.usage_record import UsageRecord

__all__ = ["LATENCY_BUCKETS", "Metrics"]

# Seconds: from a cached short answer to a long generation.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Histogram:
    __slots__ = ("counts", "n", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.n += 1
        self.total += seconds
        i = bisect_left(LATENCY_BUCKETS, seconds)  # the first bound >= seconds; past the last: only +Inf
        if i < len(LATENCY_BUCKETS):
            self.counts[i] += 1

    def observe_many(self, seconds: list[float]) -> None:
        """``observe`` each of ``seconds`` in turn, with the same sum (added in the same order)."""
        self.n += len(seconds)
        self.total = reduce(add, seconds, self.total)
        if self.total != self.total:  # a NaN somewhere, which no order sorts: one at a time
            for value in seconds:
                i = bisect_left(LATENCY_BUCKETS, value)
                if i < len(LATENCY_BUCKETS):
                    self.counts[i] += 1
            return
        ordered = sorted(seconds)
        counts, below = self.counts, 0
        for i, bound in enumerate(LATENCY_BUCKETS):  # bucket i holds bound[i - 1] < seconds <= bound[i]
            upto = bisect_right(ordered, bound)
            counts[i] += upto - below
            below = upto


def _escape(value: str) -> str:
    """A label value as the text format wants it: backslash, newline and double quote escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[Any, ...]) -> str:
    return ",".join(f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True))


def _getter(rows: list[int] | None) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """What takes the values at ``rows`` out of a column (all of them when None)."""
    if rows is None:
        return _all
    if len(rows) == 1:
        return itemgetter(slice(rows[0], rows[0] + 1))
    return itemgetter(*rows)


def _all(column: Sequence[Any]) -> Sequence[Any]:
    return column


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str, str], int] = defaultdict(
            int
        )  # model, backend, status, principal
        self.tokens: dict[tuple[str, str, str], int] = defaultdict(int)  # model, principal, kind
        self.cost: dict[tuple[str, str], int] = defaultdict(int)  # model, principal -> nano-units
        self.latency: dict[str, _Histogram] = defaultdict(_Histogram)  # model
        self.ttfb: dict[str, _Histogram] = defaultdict(_Histogram)
        self.failovers: dict[str, int] = defaultdict(int)  # model -> targets tried past the first
        # Usage records the control worker set aside (by the class of reason), and figures it clamped.
        self.rejected: dict[str, int] = defaultdict(int)
        self.clamped: dict[str, int] = defaultdict(int)  # by field

    def count_rejected(self, reason: str) -> None:
        self.rejected[reason] += 1

    def count_clamped(self, field: str) -> None:
        self.clamped[field] += 1

    def observe(self, records: Iterable[UsageRecord], principal_names: dict[str, str]) -> None:
        """Count a batch of records: column by column, summing each column over the records that share
        their labels, rather than record by record (the same figures, and the same float sums)."""
        flat = list(chain.from_iterable(records))  # the columns as slices of this: few allocations
        if not flat:
            return
        width = len(UsageRecord._fields)
        columns: list[list[Any]] = [flat[i::width] for i in range(width)]
        del flat
        pids, models, latency, ttfb, attempts = columns[2], columns[4], columns[13], columns[14], columns[17]
        names = {pid: principal_names.get(pid, pid) for pid in dict.fromkeys(pids)}
        requests = self.requests
        for (model, backend, status, pid), n in Counter(
            zip(models, columns[5], columns[6], pids, strict=True)
        ).items():
            requests[(model, backend or "", str(status), names[pid])] += n
        # The records of each (model, principal) and of each model, in order: None for all of them.
        by_pair: Mapping[tuple[str, str], list[int] | None]
        by_model: Mapping[str, list[int] | None]
        size = len(models)
        if models.count(models[0]) == size and pids.count(pids[0]) == size:
            by_pair, by_model = {(models[0], pids[0]): None}, {models[0]: None}
        else:
            grouped: dict[tuple[str, str], list[int]] = {}
            for i, pair in enumerate(zip(models, pids, strict=True)):
                rows = grouped.get(pair)
                if rows is None:
                    grouped[pair] = [i]
                else:
                    rows.append(i)
            parts: dict[str, list[list[int]]] = {}
            for (model, _), part in grouped.items():
                parts.setdefault(model, []).append(part)
            by_pair = grouped
            if len(parts) == 1:
                by_model = {models[0]: None}
            else:
                by_model = {m: p[0] if len(p) == 1 else sorted(chain(*p)) for m, p in parts.items()}
        tokens, cost = self.tokens, self.cost
        for (model, pid), rows in by_pair.items():
            principal, pick = names[pid], _getter(rows)
            for kind, column in (("prompt", columns[7]), ("completion", columns[8]), ("cached", columns[9])):
                values = pick(column)
                if any(values):
                    tokens[(model, principal, kind)] += sum(values)
            values = pick(columns[12])
            if any(values):
                cost[(model, principal)] += sum(values)
        for model, rows in by_model.items():
            pick = _getter(rows)
            self.latency[model].observe_many(list(map(truediv, pick(latency), repeat(1000))))
            values = pick(ttfb)
            nones = values.count(None)
            if nones < len(values):
                present = [v for v in values if v is not None] if nones else values
                self.ttfb[model].observe_many(list(map(truediv, present, repeat(1000))))
            values = pick(attempts)
            if max(values) > 1:  # targets tried past the first: attempts - 1 where attempts > 1
                self.failovers[model] += sum(map(max, values, repeat(1))) - len(values)

    def render(self, host: dict[str, Any]) -> str:
        """The exposition text; ``host`` is a host report (``fleet.host_report``) plus snapshot figures."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        family(
            "gateway_requests_total", "counter", "Requests forwarded upstream, by the status the client got."
        )
        for request_key, n in sorted(self.requests.items()):
            labels = _labels(("model", "backend", "status", "principal"), request_key)
            out.append(f"gateway_requests_total{{{labels}}} {n}")
        family(
            "gateway_tokens_total", "counter", "Tokens of forwarded requests (prompt, completion, cached)."
        )
        for token_key, n in sorted(self.tokens.items()):
            out.append(f"gateway_tokens_total{{{_labels(('model', 'principal', 'kind'), token_key)}}} {n}")
        family("gateway_cost_total", "counter", "Cost of forwarded requests in the operator's currency.")
        for cost_key, n in sorted(self.cost.items()):
            out.append(f"gateway_cost_total{{{_labels(('model', 'principal'), cost_key)}}} {n / 1e9:.9f}")
        for name, source, help_text in (
            ("gateway_request_duration_seconds", self.latency, "From the request to the end of its answer."),
            ("gateway_time_to_first_byte_seconds", self.ttfb, "From the request to the first byte answered."),
        ):
            family(name, "histogram", help_text)
            for model, h in sorted(source.items()):
                running = 0
                for bound, count in zip(LATENCY_BUCKETS, h.counts, strict=True):
                    running += count
                    out.append(f'{name}_bucket{{model="{_escape(model)}",le="{bound:g}"}} {running}')
                out.append(f'{name}_bucket{{model="{_escape(model)}",le="+Inf"}} {h.n}')
                out.append(f'{name}_sum{{model="{_escape(model)}"}} {h.total:.6f}')
                out.append(f'{name}_count{{model="{_escape(model)}"}} {h.n}')
        family("gateway_failovers_total", "counter", "Targets tried after the first, for forwarded requests.")
        for model, n in sorted(self.failovers.items()):
            out.append(f'gateway_failovers_total{{model="{_escape(model)}"}} {n}')
        family(
            "gateway_usage_records_rejected_total",
            "counter",
            "Usage records set aside (usage_rejected), by reason: invalid, undecodable, refused.",
        )
        for reason, n in sorted(self.rejected.items()):
            out.append(f'gateway_usage_records_rejected_total{{reason="{_escape(reason)}"}} {n}')
        family(
            "gateway_usage_records_clamped_total",
            "counter",
            "Figures of usage records clamped into their columns' bounds before they were stored, by field.",
        )
        for field, n in sorted(self.clamped.items()):
            out.append(f'gateway_usage_records_clamped_total{{field="{_escape(field)}"}} {n}')
        family("gateway_in_flight_requests", "gauge", "Requests this host's proxy workers are serving now.")
        out.append(f"gateway_in_flight_requests {host.get('in_flight', 0)}")
        family(
            "gateway_refusals_total",
            "counter",
            "Requests this host refused itself (401, 402, 403, 404, 429...).",
        )
        refusals: dict[str, int] = defaultdict(int)
        for worker in host.get("proxy_workers", []):
            for status, n in (worker.get("refused") or {}).items():
                refusals[status] += n
        for status, n in sorted(refusals.items()):
            out.append(f'gateway_refusals_total{{status="{_escape(status)}"}} {n}')
        _render_flow(host, out, family)
        family("gateway_backend_answers_total", "counter", "Upstream answers this host relayed, by backend.")
        family(
            "gateway_backend_failures_total", "counter", "Connect errors, timeouts, 429 and 5xx, by backend."
        )
        family("gateway_backend_in_flight", "gauge", "Upstream requests in flight, by backend.")
        for name, b in sorted(host.get("backends", {}).items()):
            out.append(f'gateway_backend_answers_total{{backend="{_escape(name)}"}} {b["answered"]}')
            out.append(f'gateway_backend_failures_total{{backend="{_escape(name)}"}} {b["failed"]}')
            out.append(f'gateway_backend_in_flight{{backend="{_escape(name)}"}} {b["in_flight"]}')
        family(
            "gateway_backend_prefix_bytes_total",
            "counter",
            "Prompt bytes cache_aware pools sent each backend (the prompt as rendered for the prefix index).",
        )
        family(
            "gateway_backend_prefix_matched_bytes_total",
            "counter",
            "Of those, the bytes the host's prefix index said the backend already held: the expected hits.",
        )
        for name, b in sorted(host.get("backends", {}).items()):
            if b.get("prefix_bytes"):
                label = f'{{backend="{_escape(name)}"}}'
                out.append(f"gateway_backend_prefix_bytes_total{label} {b['prefix_bytes']}")
                out.append(f"gateway_backend_prefix_matched_bytes_total{label} {b['prefix_matched_bytes']}")
        _render_kv_events(host, out, family)
        index = host.get("prefix_index")
        if index:
            family(
                "gateway_prefix_index_evictions_total",
                "counter",
                "(block, backend) pairs the host's prefix index let go to make room: past a few per insert, "
                "it is smaller than the engines' caches (--prefix-index-entries).",
            )
            out.append(f"gateway_prefix_index_evictions_total {index['evictions']}")
            family(
                "gateway_prefix_index_pairs_total", "counter", "(block, backend) pairs noted or refreshed."
            )
            out.append(f"gateway_prefix_index_pairs_total {index['pairs']}")
            family(
                "gateway_prefix_exact_decisions_total",
                "counter",
                "cache_aware decisions whose chosen backend's prefix came from its engine's KV events "
                "(the exact pairs) rather than from what it was sent.",
            )
            out.append(f"gateway_prefix_exact_decisions_total {index.get('exact', 0)}")
            family(
                "gateway_prefix_exact_matches_total",
                "counter",
                "Of those, the decisions where the engine's KV events said it held at least one block.",
            )
            out.append(f"gateway_prefix_exact_matches_total {index.get('exact_held', 0)}")
        family("gateway_worker_restarts_total", "counter", "Times the supervisor restarted each worker.")
        for w in host.get("supervisor", {}).get("workers", []):
            worker = _escape(str(w.get("name")))
            out.append(f'gateway_worker_restarts_total{{worker="{worker}"}} {w.get("restarts") or 0}')
        family(
            "gateway_snapshot_revision", "gauge", "Config revision of the snapshot the control worker built."
        )
        out.append(f"gateway_snapshot_revision {host.get('revision', 0)}")
        family("gateway_snapshot_age_seconds", "gauge", "Seconds since that snapshot was built.")
        age = host.get("snapshot_age_s")
        out.append(f"gateway_snapshot_age_seconds {age if age is not None and math.isfinite(age) else 'NaN'}")
        family("gateway_usage_pending", "gauge", "Usage records waiting to reach the store from this host.")
        out.append(f"gateway_usage_pending {host.get('usage_pending', 0)}")
        return "\n".join(out) + "\n"


def _render_kv_events(host: dict[str, Any], out: list[str], family: Callable[[str, str, str], None]) -> None:
    """The host's subscriptions to its engines' KV events (``controlplane.fleet.kv_events``), by backend."""
    subscribed = {n: b["kv_events"] for n, b in host.get("backends", {}).items() if b.get("kv_events")}
    if not subscribed:
        return
    series = (
        ("gateway_backend_kv_event_batches_total", "counter", "batches", "KV-event batches received."),
        (
            "gateway_backend_kv_events_total",
            "counter",
            "events",
            "KV events applied (stored, removed, cleared).",
        ),
        (
            "gateway_backend_kv_event_gaps_total",
            "counter",
            "gaps",
            "Sequence gaps, restarts and undecodable batches: each forgot the backend's exact pairs.",
        ),
        (
            "gateway_backend_kv_blocks",
            "gauge",
            "blocks",
            "Engine blocks the exact pairs hold for the backend.",
        ),
        (
            "gateway_backend_kv_events_connected",
            "gauge",
            "connected",
            "1 while the subscription is connected.",
        ),
    )
    for name, kind, key, help_text in series:
        family(name, kind, help_text)
        for backend, counts in sorted(subscribed.items()):
            out.append(f'{name}{{backend="{_escape(backend)}"}} {int(counts.get(key) or 0)}')


def _render_flow(host: dict[str, Any], out: list[str], family: Callable[[str, str, str], None]) -> None:
    """Flow control's figures per priority, the host's proxy workers' added up (their ``"flow"``)."""
    depth = dict.fromkeys(PRIORITIES, 0)
    dispatched = dict.fromkeys(PRIORITIES, 0)
    refused: dict[tuple[str, str], int] = defaultdict(int)
    counts = {p: [0] * len(WAIT_BUCKETS) for p in PRIORITIES}
    sums = dict.fromkeys(PRIORITIES, 0.0)
    for worker in host.get("proxy_workers", []):
        for prio, f in (worker.get("flow") or {}).items():
            if prio not in depth:
                continue
            depth[prio] += f.get("depth", 0)
            dispatched[prio] += f.get("dispatched", 0)
            for reason, n in (f.get("refused") or {}).items():
                refused[prio, reason] += n
            wait = f.get("wait") or {}
            for i, n in enumerate((wait.get("counts") or [])[: len(WAIT_BUCKETS)]):
                counts[prio][i] += n
            sums[prio] += wait.get("sum", 0.0)
    family("gateway_flow_queue_depth", "gauge", "Requests waiting in flow control's queues, by priority.")
    for prio in PRIORITIES:
        out.append(f'gateway_flow_queue_depth{{priority="{prio}"}} {depth[prio]}')
    family(
        "gateway_flow_wait_seconds",
        "histogram",
        "How long requests that waited for a saturated backend waited before dispatch, by priority.",
    )
    for prio in PRIORITIES:
        running = 0
        for bound, n in zip(WAIT_BUCKETS, counts[prio], strict=True):
            running += n
            out.append(f'gateway_flow_wait_seconds_bucket{{priority="{prio}",le="{bound:g}"}} {running}')
        out.append(f'gateway_flow_wait_seconds_bucket{{priority="{prio}",le="+Inf"}} {dispatched[prio]}')
        out.append(f'gateway_flow_wait_seconds_sum{{priority="{prio}"}} {sums[prio]:.6f}')
        out.append(f'gateway_flow_wait_seconds_count{{priority="{prio}"}} {dispatched[prio]}')
    family(
        "gateway_flow_dispatched_total",
        "counter",
        "Requests flow control dispatched, by priority.",
    )
    for prio in PRIORITIES:
        out.append(f'gateway_flow_dispatched_total{{priority="{prio}"}} {dispatched[prio]}')
    family(
        "gateway_flow_refused_total",
        "counter",
        "Requests flow control answered 429, by priority and reason: queue_full, timeout, shed.",
    )
    for (prio, reason), n in sorted(refused.items()):
        out.append(f'gateway_flow_refused_total{{priority="{prio}",reason="{_escape(reason)}"}} {n}')
