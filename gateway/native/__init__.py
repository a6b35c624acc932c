"""The one interface to the C extension ``gateway._gateway_native``: it turns return codes into exceptions
and C structs into Python values. Callers import from here; the private modules split it by concept
(``_ffi`` loads the extension and maps its return codes, ``_usage``, ``_json``, ``_shared``, ``_buckets``,
``_rings``).

What it offers:

- ``parse_usage`` and ``TailBuffer``: token usage from the last bytes of a response (rules in
  ``gateway.protocol.usage``, which is also the pure-Python implementation);
- ``strip_usage_nulls``: a stream's ``"usage":null`` members taken out, for a client that did not ask for
  usage (rules in ``gateway.protocol.stream_usage``, also its pure-Python implementation);
- ``whole_chunks``: the whole chunks of a chunked body's read, unframed (rules in
  ``gateway.protocol.http1``, also its pure-Python implementation);
- ``AtomicWords``: 64-bit atomics on a shared buffer;
- ``BucketTable``: lock-free GCRA rate buckets, concurrency gauges and budget spend in a shared region;
  ``AdmissionPlan`` and ``BudgetWindows``, what one request's admission and settling walk in one C call
  each;
- ``UsageRing`` and ``ring_region_size``: single-producer/single-consumer rings of small records (usage
  records) in a shared region, one ring per producing worker and one consumer for all rings; ``SpanRing``,
  the same rings carrying records longer than a slot (body logs);
- ``PrefixIndex``: chained hashes of a prompt's blocks and a bounded, shared index of which backend was
  sent which of them (what prefix-cache-aware routing reads).

Like psycopg, the environment variable ``GATEWAY_PURE_PYTHON=1`` (read once, at import) selects the
pure-Python usage parser and tail buffer, and the package then imports even where the extension is not
built. Buckets, atomics and rings have no pure-Python fallback: they need real atomic instructions on
memory shared between processes, so they raise ``NativeUnavailable`` without the extension.

Objects here are not thread-safe (each object reuses one output struct, read after its C call returns);
use one per thread, which is what one event loop per worker process gives. I/O: none; the bucket
operations read CLOCK_MONOTONIC.
"""

from __future__ import annotations

from gateway.native._buckets import (
    ADMITTED,
    LIMIT_CONCURRENCY,
    LIMIT_REQUESTS,
    LIMIT_TOKENS,
    OVER_BUDGET,
    REFUSED,
    AdmissionPlan,
    BucketTable,
    BudgetWindows,
    Peek,
    TakeOutcome,
    region_size,
)
from gateway.native._ffi import (
    HAVE_NATIVE,
    IMPLEMENTATION,
    PURE_PYTHON,
    BucketTableFull,
    NativeError,
    NativeUnavailable,
    RegionError,
)
from gateway.native._http1 import whole_chunks, whole_chunks_c
from gateway.native._json import model_span, model_span_c, top_members, top_members_c
from gateway.native._prefix import Blocks, IndexStats, PrefixIndex, prefix_region_size
from gateway.native._rings import SpanRing, UsageRing, ring_region_size
from gateway.native._shared import AtomicWords
from gateway.native._usage import (
    TailBuffer,
    parse_usage,
    parse_usage_c,
    strip_usage_nulls,
    strip_usage_nulls_c,
)
from gateway.protocol.usage import DEFAULT_TAIL_CAPACITY, Usage
from gateway.shm.bucket_keys import bucket_key

__all__ = [
    "ADMITTED",
    "DEFAULT_TAIL_CAPACITY",
    "HAVE_NATIVE",
    "IMPLEMENTATION",
    "LIMIT_CONCURRENCY",
    "LIMIT_REQUESTS",
    "LIMIT_TOKENS",
    "OVER_BUDGET",
    "PURE_PYTHON",
    "REFUSED",
    "AdmissionPlan",
    "AtomicWords",
    "Blocks",
    "BucketTable",
    "BucketTableFull",
    "BudgetWindows",
    "IndexStats",
    "NativeError",
    "NativeUnavailable",
    "Peek",
    "PrefixIndex",
    "RegionError",
    "SpanRing",
    "TailBuffer",
    "TakeOutcome",
    "Usage",
    "UsageRing",
    "bucket_key",
    "model_span",
    "model_span_c",
    "parse_usage",
    "parse_usage_c",
    "prefix_region_size",
    "region_size",
    "ring_region_size",
    "strip_usage_nulls",
    "strip_usage_nulls_c",
    "top_members",
    "top_members_c",
    "whole_chunks",
    "whole_chunks_c",
]
