"""A proxy host's on-disk usage spool: the records its rings gave up while the control plane was away.

One file per batch (``<time_ns>.json``, a JSON array of records in the wire format of
``POST /cluster/usage``), written to a temporary name, fsynced and renamed, so that a file present is a
file whole: a host killed at any moment leaves either the batch or nothing, and the rings' tails move only
after the rename. The spool is bounded (``--usage-spool-max-mb``): once full it takes no more, the rings
and then the proxy workers' backlogs hold the records, and the state says so (``full``), which the
host's ``/healthz`` and health report show. I/O: the spool directory.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SpoolState", "UsageSpool"]

log = logging.getLogger("gateway.controlplane")

# What one resend gathers from the spool into one POST: large enough that a long outage's backlog of small
# files goes back in a few round trips, small enough to stay far below the control plane's body limit.
SEND_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SpoolState:
    batches: int
    bytes: int
    full: bool

    def as_dict(self) -> dict[str, object]:
        return {"batches": self.batches, "bytes": self.bytes, "full": self.full}


class UsageSpool:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.path.mkdir(parents=True, exist_ok=True)
        for leftover in self.path.glob("*.tmp"):  # a batch whose writer died before the rename
            leftover.unlink(missing_ok=True)
        files = list(self.path.glob("*.json"))
        self.batches = len(files)
        self.bytes = sum(f.stat().st_size for f in files)
        self.full = False

    @property
    def empty(self) -> bool:
        return self.batches == 0

    def state(self) -> SpoolState:
        return SpoolState(self.batches, self.bytes, self.full)

    def room_for(self, size: int) -> bool:
        """Whether a batch of ``size`` bytes fits under the bound; the first refusal (per filling) is
        logged, and ``full`` stays set until the spool has room again."""
        fits = self.bytes + size <= self.max_bytes
        if not fits and not self.full:
            log.error(
                "usage spool full (%d batches, %d bytes of %d): records wait in shared memory, then in the "
                "proxy workers' memory, until the control plane answers",
                self.batches,
                self.bytes,
                self.max_bytes,
            )
        self.full = not fits
        return fits

    def write(self, body: bytes) -> None:
        """Keep one batch, durably, before its records leave the rings."""
        path = self.path / f"{time.time_ns():020d}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.batches += 1
        self.bytes += len(body)

    def oldest(self) -> tuple[list[Path], bytes]:
        """The oldest batches, joined into one array of at most about ``SEND_BYTES`` (at least one batch)."""
        paths: list[Path] = []
        parts: list[bytes] = []
        size = 0
        for path in sorted(self.path.glob("*.json")):
            blob = path.read_bytes().strip()
            if paths and size + len(blob) > SEND_BYTES:
                break
            paths.append(path)
            inner = blob[1:-1].strip()
            if inner:
                parts.append(inner)
            size += len(blob)
        return paths, b"[" + b",".join(parts) + b"]"

    def remove(self, paths: list[Path]) -> None:
        """Forget batches the control plane took."""
        for path in paths:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            self.batches -= 1
            self.bytes -= size
        if self.full and self.bytes < self.max_bytes:
            self.full = False
            log.info("usage spool has room again (%d batches, %d bytes)", self.batches, self.bytes)
