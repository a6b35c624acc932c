"""Publication of the snapshot through shared memory: one writer, many lock-free readers.

Layout of the segment (all words little-endian u64, 8-aligned)::

    0   magic            "GWSNAP01"
    8   seq              seqlock sequence: odd while a publication is being switched in
    16  generation       bumped by every publication; readers compare it to what they hold
    24  revision         config revision of the published document (publication is monotonic in it)
    32  active           0 or 1: which slot holds the published document
    40  length[0]        byte length of slot 0's document
    48  length[1]        byte length of slot 1's document
    56  published_at     unix time (f64) of the last publication
    64  control_state    where the document comes from: 0 the local store, 1 a remote control plane that
                         answers, 2 a remote control plane that does not (serving the last one known)
    72  control_seen_at  unix time (f64) the remote control plane last answered
    80  store_failing    0, or 1 while the control worker cannot write to its store (usage records then
                         wait in the rings): ``/healthz`` says degraded
    88  store_failing_at unix time (f64) the store started failing
    96  store_reason     length (u64), then up to 1,024 bytes at 104: the store's error, UTF-8
    HEADER .. HEADER+S           slot 0
    HEADER+S .. HEADER+2S        slot 1

The writer fills the inactive slot, then flips ``active`` inside an odd/even ``seq`` window. A reader
copies the active slot and keeps the copy only if ``seq`` did not move meanwhile, so it never sees a
half-written document and never blocks the writer. Words are read and written as aligned 8-byte
accesses, which are single loads and stores on the platforms we run on; on x86 stores are not reordered
with other stores nor loads with loads, which is all a seqlock needs. I/O: none beyond the mapping.
"""

from __future__ import annotations

import struct
import time

__all__ = [
    "CONTROL_LOCAL",
    "CONTROL_REACHABLE",
    "CONTROL_STORE_DOWN",
    "CONTROL_UNREACHABLE",
    "HEADER_BYTES",
    "PublishRefused",
    "SnapshotPublisher",
    "SnapshotReader",
    "region_bytes",
]

MAGIC = int.from_bytes(b"GWSNAP01", "little")
HEADER_BYTES = 4096
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_OFF_MAGIC, _OFF_SEQ, _OFF_GEN, _OFF_REV, _OFF_ACTIVE, _OFF_LEN0, _OFF_LEN1, _OFF_AT = range(0, 64, 8)
_OFF_CONTROL_STATE, _OFF_CONTROL_SEEN = 64, 72
_OFF_STORE_FAILING, _OFF_STORE_AT, _OFF_STORE_REASON = 80, 88, 96
_REASON_BYTES = 1024
CONTROL_LOCAL, CONTROL_REACHABLE, CONTROL_UNREACHABLE = 0, 1, 2
CONTROL_STORE_DOWN = 3  # a local control worker whose store does not answer (it serves what it has)


class PublishRefused(Exception):
    """The document is older than what is published, or does not fit its slot."""


def region_bytes(slot_bytes: int) -> int:
    """The segment's size for documents of up to ``slot_bytes`` bytes: the header, then two slots."""
    return HEADER_BYTES + 2 * slot_bytes


def _slot_bytes(buf: memoryview) -> int:
    return (len(buf) - HEADER_BYTES) // 2


class SnapshotPublisher:
    """The control worker's side. Only one publisher may write a segment at a time."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._slot = _slot_bytes(buf)
        if _U64.unpack_from(buf, _OFF_MAGIC)[0] != MAGIC:
            _U64.pack_into(buf, _OFF_MAGIC, MAGIC)
        seq = _U64.unpack_from(buf, _OFF_SEQ)[0]
        if seq & 1:
            # A previous publisher died inside the switch window; the active slot is still whole
            # (the switch only writes header words), so closing the window is safe.
            _U64.pack_into(buf, _OFF_SEQ, seq + 1)

    @property
    def generation(self) -> int:
        return int(_U64.unpack_from(self._buf, _OFF_GEN)[0])

    @property
    def revision(self) -> int:
        return int(_U64.unpack_from(self._buf, _OFF_REV)[0])

    def publish(self, blob: bytes, revision: int) -> int:
        """Publish ``blob`` as the document for ``revision``; return the new generation.

        Raises PublishRefused for a revision lower than the published one, so an older snapshot never
        replaces a newer one, whatever order builds finish in.
        """
        buf = self._buf
        published = self.generation
        if published and revision < self.revision:
            raise PublishRefused(f"revision {revision} is older than published {self.revision}")
        if len(blob) > self._slot:
            raise PublishRefused(f"snapshot of {len(blob)} bytes exceeds the {self._slot}-byte slot")
        active = _U64.unpack_from(buf, _OFF_ACTIVE)[0] if published else 1
        target = 1 - active
        start = HEADER_BYTES + target * self._slot
        buf[start : start + len(blob)] = blob
        _U64.pack_into(buf, _OFF_LEN0 + 8 * target, len(blob))
        seq = _U64.unpack_from(buf, _OFF_SEQ)[0]
        _U64.pack_into(buf, _OFF_SEQ, seq + 1)
        _U64.pack_into(buf, _OFF_ACTIVE, target)
        _U64.pack_into(buf, _OFF_REV, revision)
        _U64.pack_into(buf, _OFF_GEN, published + 1)
        _F64.pack_into(buf, _OFF_AT, time.time())
        _U64.pack_into(buf, _OFF_SEQ, seq + 2)
        return published + 1

    def set_control_state(self, state: int, seen_at: float | None = None) -> None:
        """Say whether the remote control plane answers (proxy-role hosts), or whether the local control
        worker's store does; read by ``/healthz``."""
        _U64.pack_into(self._buf, _OFF_CONTROL_STATE, state)
        if seen_at is not None:
            _F64.pack_into(self._buf, _OFF_CONTROL_SEEN, seen_at)

    def set_store_state(self, failing: bool, reason: str = "") -> None:
        """Say whether the store takes writes (read by ``/healthz``). The reason is written before the
        flag, so a reader that sees the flag sees its reason (a reader racing a second outage's reason
        may see a mix of two messages, which is harmless)."""
        if failing:
            text = reason.encode()[:_REASON_BYTES]
            start = _OFF_STORE_REASON + 8
            self._buf[start : start + len(text)] = text
            _U64.pack_into(self._buf, _OFF_STORE_REASON, len(text))
            _F64.pack_into(self._buf, _OFF_STORE_AT, time.time())
        _U64.pack_into(self._buf, _OFF_STORE_FAILING, 1 if failing else 0)


class SnapshotReader:
    """A worker's side: cheap generation checks, and a consistent copy when it changed."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._slot = _slot_bytes(buf)

    def generation(self) -> int:
        return int(_U64.unpack_from(self._buf, _OFF_GEN)[0])

    def published_at(self) -> float:
        return float(_F64.unpack_from(self._buf, _OFF_AT)[0])

    def control_state(self) -> tuple[int, float]:
        """``(CONTROL_LOCAL | CONTROL_REACHABLE | CONTROL_UNREACHABLE, unix time last seen)``."""
        return (
            int(_U64.unpack_from(self._buf, _OFF_CONTROL_STATE)[0]),
            float(_F64.unpack_from(self._buf, _OFF_CONTROL_SEEN)[0]),
        )

    def store_state(self) -> tuple[bool, float, str]:
        """``(failing, since when (unix time), the store's error)`` as the control worker last said."""
        buf = self._buf
        if not _U64.unpack_from(buf, _OFF_STORE_FAILING)[0]:
            return False, 0.0, ""
        length = min(int(_U64.unpack_from(buf, _OFF_STORE_REASON)[0]), _REASON_BYTES)
        start = _OFF_STORE_REASON + 8
        reason = bytes(buf[start : start + length]).decode(errors="replace")
        return True, float(_F64.unpack_from(buf, _OFF_STORE_AT)[0]), reason

    def read(self, attempts: int = 1000) -> tuple[int, bytes] | None:
        """The published (generation, document), or None when nothing was published yet.

        Retries while a publication races the copy; gives up (None) only if the writer keeps switching
        for ``attempts`` rounds, which in practice means it died mid-switch: the caller keeps what it has.
        """
        buf = self._buf
        for _ in range(attempts):
            seq = _U64.unpack_from(buf, _OFF_SEQ)[0]
            if seq & 1:
                time.sleep(0.0005)
                continue
            generation = _U64.unpack_from(buf, _OFF_GEN)[0]
            if generation == 0:
                return None
            active = _U64.unpack_from(buf, _OFF_ACTIVE)[0]
            length = _U64.unpack_from(buf, _OFF_LEN0 + 8 * active)[0]
            if active > 1 or length > self._slot:
                continue
            start = HEADER_BYTES + active * self._slot
            blob = bytes(buf[start : start + length])
            if _U64.unpack_from(buf, _OFF_SEQ)[0] == seq:
                return int(generation), blob
        return None
