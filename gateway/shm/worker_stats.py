"""Per-worker statistics in shared memory: each proxy worker publishes a small JSON document about itself
(in-flight requests, backends' answers and failures) about once a second, and the host's control slot
reads them all for health reports. Nothing on the request path touches this segment.

Each proxy worker's slot also holds its heartbeat: its event loop stamps the slot with its pid and the time
(``CLOCK_MONOTONIC``, which every process of the host shares) every ``HEARTBEAT_INTERVAL``, and the
supervisor replaces a worker whose stamp grew older than its heartbeat timeout (a stopped or wedged
process). Two aligned 8-byte words, written time first: a reader that sees a new pid sees its time.

Layout: ``workers`` slots of ``SLOT_BYTES``; each slot is
``[u64 seq][u64 length][u64 heartbeat pid][f64 heartbeat time][document]``. A slot has one writer (its
worker); ``seq`` is odd while the writer is inside the document, and a reader keeps a copy only if it saw
the same even ``seq`` before and after. I/O: none beyond the mapping.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

__all__ = [
    "HEARTBEAT_INTERVAL",
    "SLOT_BYTES",
    "WorkerStats",
    "backend_totals",
    "region_bytes",
    "sum_backends",
]

SLOT_BYTES = 16384
HEARTBEAT_INTERVAL = 0.5  # seconds between a worker's stamps: a tenth of the default timeout
_HEADER = struct.Struct("<QQ")
_BEAT = struct.Struct("<Qd")
_BEAT_AT = _HEADER.size
_DOC_AT = _BEAT_AT + _BEAT.size


def region_bytes(workers: int) -> int:
    """One slot per proxy worker, then one for the engines' figures (the host's scraper writes it, the
    workers read it for routing), and a last one for the host: what its control slot tells the workers
    (on proxy-role hosts, their shares of rate limits)."""
    return (max(1, workers) + 2) * SLOT_BYTES


class WorkerStats:
    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self.slots = len(buf) // SLOT_BYTES

    def write(self, index: int, document: bytes) -> bool:
        """Publish ``document`` in slot ``index``; False when it does not fit (nothing is written)."""
        if len(document) > SLOT_BYTES - _DOC_AT or not 0 <= index < self.slots:
            return False
        buf, base = self._buf, index * SLOT_BYTES
        seq = _HEADER.unpack_from(buf, base)[0]
        seq += 1 if seq % 2 == 0 else 0  # odd: inside (a writer that died inside leaves it odd: go on)
        struct.pack_into("<Q", buf, base, seq)
        start = base + _DOC_AT
        buf[start : start + len(document)] = document
        struct.pack_into("<QQ", buf, base, seq, len(document))
        struct.pack_into("<Q", buf, base, seq + 1)
        return True

    def beat(self, index: int, pid: int, now: float) -> None:
        """Stamp slot ``index`` with a heartbeat of process ``pid`` at monotonic time ``now``."""
        base = index * SLOT_BYTES + _BEAT_AT
        struct.pack_into("<d", self._buf, base + 8, now)
        struct.pack_into("<Q", self._buf, base, pid)

    def last_beat(self, index: int, pid: int) -> float | None:
        """When process ``pid`` last stamped slot ``index`` (monotonic), or None if the stamp is not its."""
        if not 0 <= index < self.slots:
            return None
        stamped, at = _BEAT.unpack_from(self._buf, index * SLOT_BYTES + _BEAT_AT)
        return float(at) if stamped == pid else None

    @property
    def host_slot(self) -> int:
        """The last slot: the host's own document, written by its control slot (see ``region_bytes``)."""
        return self.slots - 1

    @property
    def engine_slot(self) -> int:
        """The engines' document (``controlplane.fleet.engines``): load, gate ceilings, probe results."""
        return self.slots - 2

    def documents(self) -> list[tuple[int, dict[str, Any]]]:
        """Every proxy worker's last document, with its slot: ``[(index, document), ...]``."""
        out = []
        for index in range(self.engine_slot):
            raw = self.read(index)
            if raw is not None:
                out.append((index, orjson.loads(raw)))
        return out

    def read(self, index: int, attempts: int = 100) -> bytes | None:
        """Slot ``index``'s last document, or None when it has none (or its writer keeps writing)."""
        buf, base = self._buf, index * SLOT_BYTES
        for _ in range(attempts):
            seq, length = _HEADER.unpack_from(buf, base)
            if seq == 0:
                return None
            if seq % 2 or length > SLOT_BYTES - _DOC_AT:
                continue
            data = bytes(buf[base + _DOC_AT : base + _DOC_AT + length])
            if _HEADER.unpack_from(buf, base)[0] == seq:
                return data
        return None


def backend_totals() -> dict[str, Any]:
    """A backend's counters before any worker reported on it."""
    return {
        "answered": 0,
        "failed": 0,
        "in_flight": 0,
        "last_error": None,
        "last_error_at": None,
        "prefix_bytes": 0,
        "prefix_matched_bytes": 0,
    }


def sum_backends(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The workers' per-backend counters added up, with the latest failure any of them saw."""
    total: dict[str, dict[str, Any]] = {}
    for doc in documents:
        for name, b in doc.get("backends", {}).items():
            t = total.get(name) or total.setdefault(name, backend_totals())
            t["answered"] += b["answered"]
            t["failed"] += b["failed"]
            t["in_flight"] += b["in_flight"]
            if b.get("last_error_at") and (t["last_error_at"] or 0) < b["last_error_at"]:
                t["last_error"], t["last_error_at"] = b["last_error"], b["last_error_at"]
        for name, (sent, matched) in (doc.get("prefixes") or {}).items():  # cache_aware pools' choices
            t = total.get(name) or total.setdefault(name, backend_totals())
            t["prefix_bytes"] += sent
            t["prefix_matched_bytes"] += matched
    return total
