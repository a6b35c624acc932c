"""``UsageRing``: single-producer/single-consumer rings of small records (usage records) in a region
shared by processes, one ring per producing worker and one consumer for all (``native/usage_ring.c``);
``SpanRing``, the same rings carrying records longer than a slot (body logs).
I/O: none."""

from __future__ import annotations

import struct
from typing import Any, NoReturn

from gateway.native._ffi import Bytes, RegionError, WritableBuffer, raise_for, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib
from gateway.native._shared import SharedBuffer

__all__ = ["SpanRing", "UsageRing", "ring_region_size"]


def ring_region_size(rings: int, slots: int, slot_bytes: int) -> int:
    """Bytes a ``UsageRing`` region needs: ``rings`` rings (1 to 4096) of ``slots`` slots (a power of two in
    [2, 2**20]) of ``slot_bytes`` bytes (a multiple of 64 in [64, 65536]); a record holds at most
    ``slot_bytes - 8`` bytes."""
    lib = require_native()
    valid = all(0 < v < 2**64 for v in (rings, slots, slot_bytes))
    size: int = lib.gw_ring_region_size(rings, slots, slot_bytes) if valid else 0
    if size == 0:
        raise ValueError(
            f"invalid ring geometry ({rings}, {slots}, {slot_bytes}): rings must be in [1, 4096], slots a"
            " power of two in [2, 2**20], slot_bytes a multiple of 64 in [64, 65536]"
        )
    return size


# read() copies into one buffer per object, sized for the records asked for but at most this many bytes
# (and at least one maximal record); a read whose records need more returns fewer of them.
_READ_BUFFER_MAX = 1 << 20
_unpack_length = struct.Struct("=I").unpack_from


def _split(buffer: Any, n: int) -> list[bytes]:
    """The ``n`` records a read laid out in ``buffer``, each a 4-byte native length then its bytes."""
    records = []
    end = 0
    for _ in range(n):
        (length,) = _unpack_length(buffer, end)
        start = end + 4
        end = start + length
        records.append(buffer[start:end])
    return records


class UsageRing(SharedBuffer):
    """Single-producer/single-consumer rings of byte records in a region shared by processes.

    Ring ``i`` has one producer at a time (worker ``i``; a respawned worker continues from the ring's head,
    which lives in the region), and one process consumes every ring. ``push`` copies a record in and
    publishes it only once completely copied, so a producer killed mid-push leaves nothing visible. The
    consumer ``read``s pending records without consuming them and ``advance``s once it is done with them
    (say, written them to a database), so a consumer that dies in between reads the same records again.
    Neither side blocks: a full ring makes ``push`` return ``False``. Each call is one C call that
    re-validates the region; a scribbled-over region yields wrong records, never an out-of-bounds access.
    """

    __slots__ = ("_counters", "_out", "_out_buffer", "_out_cap", "_rings", "_slot_bytes", "_slots")

    def __init__(self, buf: WritableBuffer) -> None:
        """Attach to a region that ``create_layout`` initialised."""
        super().__init__(buf)
        geometry = _ffi.new("uint64_t[3]")
        if _lib.gw_ring_geometry(self._base, self._size, geometry) != _lib.GW_OK:
            self.close()
            raise RegionError("region is not an initialised usage ring region (or is smaller than it says)")
        self._rings: int = geometry[0]
        self._slots: int = geometry[1]
        self._slot_bytes: int = geometry[2]
        self._counters: Any = _ffi.new("uint64_t[2]")
        self._out: Any = _ffi.NULL
        self._out_buffer: Any = None
        self._out_cap = 0

    @classmethod
    def create_layout(cls, buf: WritableBuffer, rings: int, slots: int, slot_bytes: int) -> UsageRing:
        """Zero and initialise a region (before other processes use it) and attach to it."""
        size = ring_region_size(rings, slots, slot_bytes)
        with memoryview(buf) as view:
            if view.nbytes < size:
                raise RegionError(
                    f"{rings} rings of {slots} slots of {slot_bytes} bytes need {size} bytes,"
                    f" not {view.nbytes}"
                )
        with _ffi.from_buffer("char[]", buf, require_writable=True) as base:
            rc = _lib.gw_ring_init(base, len(base), rings, slots, slot_bytes)
        if rc != _lib.GW_OK:
            raise_for(rc)
        return cls(buf)

    @property
    def rings(self) -> int:
        return self._rings

    @property
    def slots(self) -> int:
        """Records a ring holds."""
        return self._slots

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def max_record(self) -> int:
        """The longest record ``push`` accepts, in bytes."""
        return self._slot_bytes - 8

    def push(self, ring: int, record: Bytes) -> bool:
        """Producer of ``ring``: append a copy of ``record``; ``False`` (nothing written) when the ring is
        full. ``bytes`` go to C without a copy; other buffers through ``ffi.from_buffer``."""
        try:
            rc: int = _lib.gw_ring_push(self._base, self._size, ring, record, len(record))
        except TypeError:  # cffi passes only bytes to `const char *` directly
            rc = self._push_buffer(ring, record)
        except OverflowError:
            rc = _lib.GW_EINVAL
        if rc == 1:
            return True
        if rc == 0:
            return False
        self._fail(rc, ring, f"record of {len(record)} bytes is longer than {self.max_record}")

    def _push_buffer(self, ring: int, record: Bytes) -> int:
        with _ffi.from_buffer(record) as view:
            try:
                rc: int = _lib.gw_ring_push(self._base, self._size, ring, view, len(view))
            except OverflowError:
                rc = _lib.GW_EINVAL
        return rc

    def read(self, ring: int, max_records: int = 1024) -> list[bytes]:
        """Consumer: copies of up to ``max_records`` pending records of ``ring``, oldest first, without
        consuming them (see ``advance``). Fewer come back when their bytes exceed the read buffer (1 MiB,
        or one maximal record if that is larger); ``pending`` says how many remain."""
        if max_records <= 0:
            if max_records < 0:
                raise ValueError("max_records must be >= 0")
            return []
        want = min(max_records, self._slots)
        if want * (4 + self.max_record) > self._out_cap and self._out_cap < _READ_BUFFER_MAX:
            self._grow(want)
        try:
            n: int = _lib.gw_ring_read(self._base, self._size, ring, self._out, self._out_cap, want)
        except OverflowError:
            n = _lib.GW_EINVAL
        if n < 0:
            self._fail(n, ring, "")
        buffer = self._out_buffer
        return _split(buffer, n)

    def _grow(self, want: int) -> None:
        entry = 4 + self.max_record
        cap = max(min(want * entry, _READ_BUFFER_MAX), entry)
        if cap > self._out_cap:
            self._out = _ffi.new("char[]", cap)
            self._out_buffer = _ffi.buffer(self._out)  # slices of a cffi buffer are bytes
            self._out_cap = cap

    def advance(self, ring: int, n: int) -> None:
        """Consumer: consume the ``n`` oldest pending records of ``ring`` (after handling what ``read``
        returned); ``ValueError`` when fewer than ``n`` are pending."""
        try:
            rc: int = _lib.gw_ring_advance(self._base, self._size, ring, n)
        except OverflowError:
            rc = _lib.GW_EINVAL
        if rc != _lib.GW_OK:
            self._fail(rc, ring, f"cannot advance by {n}: {self.pending(ring)} records are pending")

    def counters(self, ring: int) -> tuple[int, int]:
        """``(head, tail)``: records ever pushed to and ever consumed from ``ring``."""
        out = self._counters
        try:
            rc: int = _lib.gw_ring_counters(self._base, self._size, ring, out)
        except OverflowError:
            rc = _lib.GW_EINVAL
        if rc != _lib.GW_OK:
            self._fail(rc, ring, "")
        return out[0], out[1]

    def pending(self, ring: int) -> int:
        """Records pushed to ``ring`` and not yet consumed."""
        head, tail = self.counters(ring)
        return min((head - tail) % 2**64, self._slots)  # clamped like the C side, should tail pass head

    def _fail(self, rc: int, ring: int, detail: str) -> NoReturn:
        if rc == _lib.GW_EREGION:
            raise RegionError("region is not an initialised usage ring region of this size (or was closed)")
        if rc == _lib.GW_EINVAL:
            if not 0 <= ring < self._rings:
                raise ValueError(f"ring {ring!r} is not in [0, {self._rings})")
            raise ValueError(detail or "argument out of range")
        raise_for(rc)


class SpanRing(UsageRing):
    """A ``UsageRing`` whose records may be longer than a slot (body logs): ``push`` copies one across as
    many consecutive slots as it needs and publishes them at once, ``read_records`` joins them again.

    A record the ring has no room for, or could never hold, is not pushed: ``push`` returns ``False`` and
    the ring counts it in shared memory (``dropped``), where the count outlives the producing process. The
    consumer advances by slots, not records: ``read_records`` says how many its records took. The inherited
    ``read`` shows the slots' fragments as they lie."""

    __slots__ = ("_dropped", "_span_buffer", "_span_out", "_span_slots")

    def __init__(self, buf: WritableBuffer) -> None:
        super().__init__(buf)
        self._dropped: Any = _ffi.new("uint64_t[1]")
        self._span_slots: Any = _ffi.new("uint64_t[1]")
        self._span_out: Any = _ffi.NULL
        self._span_buffer: Any = None

    @property
    def max_record(self) -> int:
        """The longest record the ring could ever hold: every slot's payload."""
        return self._slots * (self._slot_bytes - 8)

    def push(self, ring: int, record: Bytes) -> bool:
        """Producer of ``ring``: append a copy of ``record``; ``False`` (nothing written, one more counted
        as dropped) when the ring has no room for it."""
        try:
            rc: int = _lib.gw_ring_push_span(self._base, self._size, ring, record, len(record))
        except TypeError:  # cffi passes only bytes to `const char *` directly
            with _ffi.from_buffer(record) as view:
                rc = _lib.gw_ring_push_span(self._base, self._size, ring, view, len(view))
        except OverflowError:
            rc = _lib.GW_EINVAL
        if rc == 1:
            return True
        if rc == 0:
            return False
        self._fail(rc, ring, "")

    def read_records(self, ring: int, max_records: int = 64) -> tuple[list[bytes], int]:
        """Consumer: copies of up to ``max_records`` pending records of ``ring``, oldest first, each joined
        again, and the slots they took (what ``advance`` then consumes), without consuming them."""
        if max_records <= 0:
            if max_records < 0:
                raise ValueError("max_records must be >= 0")
            return [], 0
        if self._span_buffer is None:
            # Room for everything a ring can hold (every slot's payload and a length per record), so that
            # a record never waits for a larger buffer and a read is never cut short by this one.
            self._span_out = _ffi.new("char[]", self._slots * (self._slot_bytes - 4))
            self._span_buffer = _ffi.buffer(self._span_out)
        cap = len(self._span_buffer)
        try:
            n: int = _lib.gw_ring_read_spans(
                self._base, self._size, ring, self._span_out, cap, max_records, self._span_slots
            )
        except OverflowError:
            n = _lib.GW_EINVAL
        if n < 0:
            self._fail(n, ring, "")
        buffer = self._span_buffer
        return _split(buffer, n), int(self._span_slots[0])

    def dropped(self, ring: int) -> int:
        """Records the producers of ``ring`` could not push, ever (since the region was made)."""
        try:
            rc: int = _lib.gw_ring_dropped(self._base, self._size, ring, self._dropped)
        except OverflowError:
            rc = _lib.GW_EINVAL
        if rc != _lib.GW_OK:
            self._fail(rc, ring, "")
        return int(self._dropped[0])
