"""The 64-bit keys that name token buckets in the shared table. Pure Python, no I/O: the snapshot decoder
precomputes them so that the request path hashes nothing."""

from __future__ import annotations

import hashlib

__all__ = ["backend_keys", "bucket_key"]


def bucket_key(scope: str, kind: str) -> int:
    """A nonzero 64-bit key for one limit (``kind``, e.g. "rpm") of one principal or key (``scope``)."""
    h = hashlib.blake2b(digest_size=8, person=b"gw-bucket-key")
    encoded = scope.encode()
    h.update(len(encoded).to_bytes(8, "little"))  # length prefix: ("ab", "c") != ("a", "bc")
    h.update(encoded)
    h.update(kind.encode())
    return int.from_bytes(h.digest(), "little") or 1


def flow_keys(backend: str) -> tuple[int, int, int]:
    """The gauges of the requests waiting in any of this host's workers' flow queues for ``backend``, one
    per class (critical, standard, sheddable): what lets a worker leave a freed place to another worker's
    waiter of a higher class."""
    return tuple(bucket_key(f"b:{backend}", f"waiting:{c}") for c in range(3))  # type: ignore[return-value]


def backend_keys(backend: str) -> tuple[int, int]:
    """The gauges of one backend: requests in flight on it from this host, and requests waiting for its
    flow-control gate."""
    return bucket_key(f"b:{backend}", "inflight"), bucket_key(f"b:{backend}", "queue")
