"""The one module that talks to the C extension ``gateway._gateway_native``; it turns return codes into
exceptions and C structs into Python values.

What it offers:

- ``parse_usage`` and ``TailBuffer``: token usage from the last bytes of a response (rules in
  ``gateway.protocol.usage``, which is also the pure-Python implementation);
- ``AtomicWords``: 64-bit atomics on a shared buffer;
- ``BucketTable``: lock-free GCRA rate buckets and concurrency gauges in a shared region;
- ``UsageRing`` and ``ring_region_size``: single-producer/single-consumer rings of small records (usage
  records) in a shared region, one ring per producing worker and one consumer for all rings.

Like psycopg, the environment variable ``GATEWAY_PURE_PYTHON=1`` (read once, at import) selects the
pure-Python usage parser and tail buffer, and the module then imports even where the extension is not
built. Buckets, atomics and rings have no pure-Python fallback: they need real atomic instructions on
memory shared between processes, so they raise ``NativeUnavailable`` without the extension.

Objects here are not thread-safe (the C calls release the GIL, and each object reuses one output struct);
use one per thread, which is what one event loop per worker process gives. I/O: none; the bucket
operations read CLOCK_MONOTONIC.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, NoReturn, Self, TypeAlias

from gateway.protocol import usage as _usage
from gateway.protocol.json_members import count_top_members
from gateway.protocol.openai_request import find_model_span
from gateway.protocol.usage import DEFAULT_TAIL_CAPACITY, TailWindow, Usage
from gateway.shm.bucket_keys import bucket_key

__all__ = [
    "DEFAULT_TAIL_CAPACITY",
    "HAVE_NATIVE",
    "IMPLEMENTATION",
    "LIMIT_CONCURRENCY",
    "LIMIT_REQUESTS",
    "LIMIT_TOKENS",
    "PURE_PYTHON",
    "AdmissionPlan",
    "AtomicWords",
    "BucketTable",
    "BucketTableFull",
    "NativeError",
    "NativeUnavailable",
    "Peek",
    "RegionError",
    "TailBuffer",
    "TakeOutcome",
    "Usage",
    "UsageRing",
    "bucket_key",
    "model_span",
    "model_span_c",
    "parse_usage",
    "parse_usage_c",
    "region_size",
    "ring_region_size",
    "top_members",
    "top_members_c",
]

PURE_PYTHON: Final = os.environ.get("GATEWAY_PURE_PYTHON", "") not in ("", "0")

try:
    from gateway._gateway_native import ffi as _ffi
    from gateway._gateway_native import lib as _lib
except ImportError as _exc:
    if not PURE_PYTHON:
        raise ImportError(
            "gateway._gateway_native is not built: run `make native` "
            "(or set GATEWAY_PURE_PYTHON=1 to use the pure-Python usage parser)"
        ) from _exc
    _ffi = _lib = None

IMPLEMENTATION: Final[Literal["c", "python"]] = "python" if PURE_PYTHON else "c"
HAVE_NATIVE: Final = _lib is not None

Bytes: TypeAlias = bytes | bytearray | memoryview
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap


class NativeError(Exception):
    """An error reported by the C extension."""


class NativeUnavailable(NativeError):
    """The extension is not built (only possible with ``GATEWAY_PURE_PYTHON=1``)."""


class RegionError(NativeError):
    """The shared region is misaligned, too small, not initialised, or already closed."""


class BucketTableFull(NativeError):
    """No free slot is left for a new key: the table's capacity is too small for the keys in use."""


def _native() -> Any:
    if _lib is None:
        raise NativeUnavailable("gateway._gateway_native is not built; run `make native`")
    return _lib


def _raise(rc: int) -> NoReturn:
    if rc == _lib.GW_EINVAL:
        raise ValueError("argument out of range (rate must be finite and > 0, counts >= 0, key != 0)")
    if rc == _lib.GW_EFULL:
        raise BucketTableFull("bucket table is full")
    if rc == _lib.GW_EREGION:
        raise RegionError("region is not an initialised bucket table of this size (or was closed)")
    raise NativeError(f"unexpected return code {rc}")


# ---- usage ----------------------------------------------------------------------------------------------


def parse_usage_c(tail: Bytes) -> Usage | None:
    """``gateway.protocol.usage.parse_usage`` in C. ``bytes`` are passed without a copy; so is a
    ``memoryview`` slice such as ``memoryview(body)[-4096:]``."""
    lib = _native()
    out = _ffi.new("gw_usage *")
    if type(tail) is bytes:
        found = lib.gw_usage_parse(tail, len(tail), out)
    else:
        with _ffi.from_buffer(tail) as view:
            found = lib.gw_usage_parse(view, len(view), out)
    return _usage_of(out) if found else None


def _usage_of(out: Any) -> Usage:
    return Usage(out.prompt_tokens, out.completion_tokens, out.total_tokens, out.cached_tokens)


parse_usage: Final = _usage.parse_usage if PURE_PYTHON else parse_usage_c


def model_span_c(body: bytes) -> tuple[int, int] | None:
    """``gateway.protocol.openai_request.find_model_span`` in C (``native/json_member.c``)."""
    out = _ffi.new("int64_t[2]")
    if not _native().gw_json_member_span(body, len(body), b"model", 5, out):
        return None
    return out[0], out[1]


model_span: Final = find_model_span if PURE_PYTHON else model_span_c


def top_members_c(body: bytes) -> int:
    """``gateway.protocol.json_members.count_top_members`` in C (``native/json_member.c``)."""
    members: int = (_lib or _native()).gw_json_top_members(body, len(body))
    return members


top_members: Final = count_top_members if PURE_PYTHON else top_members_c


class TailBuffer:
    """The last ``capacity`` bytes of a response, parsed once at the end for usage.

    ``TailBuffer(capacity)`` returns the C-backed implementation, or the pure-Python one when
    ``GATEWAY_PURE_PYTHON=1`` or ``pure=True``; both are instances of this class.
    """

    __slots__ = ()

    def __new__(cls, capacity: int = DEFAULT_TAIL_CAPACITY, *, pure: bool | None = None) -> TailBuffer:
        if cls is TailBuffer:
            cls = _PyTailBuffer if (PURE_PYTHON if pure is None else pure) else _CTailBuffer
        return super().__new__(cls)

    @property
    def capacity(self) -> int:
        raise NotImplementedError

    def append(self, chunk: Bytes) -> None:
        """Keep ``chunk``'s bytes, dropping the oldest beyond capacity; copies at most capacity bytes."""
        raise NotImplementedError

    def usage(self) -> Usage | None:
        """Parse the kept bytes (see ``gateway.protocol.usage``)."""
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def getvalue(self) -> bytes:
        """A copy of the kept bytes, oldest first."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class _CTailBuffer(TailBuffer):
    # Sliding window in 2 * capacity bytes of C memory: appends are one memcpy, compaction (one memmove of
    # at most capacity bytes) happens at most once per capacity bytes appended.
    __slots__ = ("_capacity", "_mem", "_out", "_state")

    def __init__(self, capacity: int = DEFAULT_TAIL_CAPACITY, *, pure: bool | None = None) -> None:
        _native()
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._mem = _ffi.new("char[]", 2 * capacity)
        self._state = _ffi.new("gw_tail *", {"buf": self._mem, "cap": capacity, "len": 0})
        self._out = _ffi.new("gw_usage *")

    @property
    def capacity(self) -> int:
        return self._capacity

    def append(self, chunk: Bytes) -> None:
        try:
            _lib.gw_tail_append(self._state, chunk, len(chunk))
        except TypeError:  # cffi passes only bytes to `const char *` directly
            with _ffi.from_buffer(chunk) as view:
                _lib.gw_tail_append(self._state, view, len(view))

    def usage(self) -> Usage | None:
        out = self._out
        return _usage_of(out) if _lib.gw_tail_usage(self._state, out) else None

    def clear(self) -> None:
        self._state.len = 0

    def getvalue(self) -> bytes:
        start = _lib.gw_tail_start(self._state)
        data: bytes = _ffi.unpack(self._mem + start, self._state.len - start)
        return data

    def __len__(self) -> int:
        return min(int(self._state.len), self._capacity)


class _PyTailBuffer(TailBuffer):
    __slots__ = ("_window",)

    def __init__(self, capacity: int = DEFAULT_TAIL_CAPACITY, *, pure: bool | None = None) -> None:
        self._window = TailWindow(capacity)

    @property
    def capacity(self) -> int:
        return self._window.capacity

    def append(self, chunk: Bytes) -> None:
        self._window.append(chunk)

    def usage(self) -> Usage | None:
        return self._window.usage()

    def clear(self) -> None:
        self._window.clear()

    def getvalue(self) -> bytes:
        return self._window.getvalue()

    def __len__(self) -> int:
        return len(self._window)


# ---- shared memory ----------------------------------------------------------------------------------------


class _SharedBuffer:
    """A writable buffer pinned as a C pointer until ``close()``; ``close()`` must come before the buffer's
    owner is detached or resized (``memoryview.release()``, ``seg.detach()``), which raise otherwise."""

    __slots__ = ("_base", "_size")

    def __init__(self, buf: WritableBuffer) -> None:
        _native()
        self._base: Any = _ffi.from_buffer("char[]", buf, require_writable=True)
        self._size: int = len(self._base)
        if int(_ffi.cast("uintptr_t", self._base)) % 8:
            self.close()
            raise RegionError("buffer is not 8-byte aligned")

    def close(self) -> None:
        """Release the buffer; later operations raise ``RegionError``. Idempotent."""
        if self._base is not _ffi.NULL:
            _ffi.release(self._base)
            self._base, self._size = _ffi.NULL, 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AtomicWords(_SharedBuffer):
    """Sequentially consistent 64-bit operations on the words of a shared buffer, by byte offset."""

    __slots__ = ()

    def _check(self, offset: int) -> None:
        if self._base is _ffi.NULL:
            raise RegionError("closed")
        if offset % 8:
            raise ValueError(f"offset {offset} is not a multiple of 8")
        if not 0 <= offset <= self._size - 8:
            raise IndexError(f"offset {offset} is outside the {self._size}-byte buffer")

    def load(self, offset: int) -> int:
        self._check(offset)
        value: int = _lib.gw_load_u64(self._base, offset)
        return value

    def store(self, offset: int, value: int) -> None:
        """Store an unsigned 64-bit value."""
        self._check(offset)
        _lib.gw_store_u64(self._base, offset, value)

    def fetch_add(self, offset: int, delta: int) -> int:
        """Add a signed 64-bit delta (wrapping); return the previous value read as signed 64-bit."""
        self._check(offset)
        previous: int = _lib.gw_fetch_add_i64(self._base, offset, delta)
        return previous

    def compare_exchange(self, offset: int, expected: int, desired: int) -> bool:
        """Store ``desired`` if the word equals ``expected``; say whether it did."""
        self._check(offset)
        return bool(_lib.gw_cas_u64(self._base, offset, expected, desired))


class TakeOutcome(NamedTuple):
    """The outcome of ``take``. ``retry_after_s`` is 0 when admitted and ``inf`` when ``n > burst``."""

    admitted: bool
    retry_after_s: float
    remaining: int


# tuple.__new__ builds a NamedTuple in half the time of its generated __new__; take() is on the request path.
_tuple_new = tuple.__new__


class Peek(NamedTuple):
    """A bucket's state: units admissible now, and seconds until it is full again."""

    remaining: int
    reset_after_s: float


def region_size(capacity: int) -> int:
    """Bytes a ``BucketTable`` of ``capacity`` slots needs (a power of two up to 2**24)."""
    size: int = _native().gw_bt_region_size(capacity) if 0 < capacity < 2**64 else 0
    if size == 0:
        raise ValueError(f"capacity {capacity} is not a power of two in [1, 2**24]")
    return size


class BucketTable(_SharedBuffer):
    """GCRA rate buckets and concurrency gauges, keyed by ``bucket_key``, in a region shared by processes.

    A bucket's only state is its TAT (theoretical arrival time), so ``rate_per_second`` and ``burst`` are
    arguments of every call: changing a limit keeps what was consumed. Emission interval
    ``T = 1e9 / rate`` ns (rounded; at least 1 ns), tolerance ``burst * T``; spans saturate at 2**61 ns
    (73 years), so a limit whose burst takes longer than that to refill admits less than its burst. Slots
    are claimed for good: size the table for every key a process lifetime will see. Each method is one C
    call; the ``*_at`` variants take ``now_ns`` on ``time.monotonic_ns()``'s clock (CLOCK_MONOTONIC)
    instead of reading it.
    """

    __slots__ = ("_out",)

    def __init__(self, buf: WritableBuffer) -> None:
        """Attach to a region that ``create_layout`` initialised."""
        super().__init__(buf)
        if _lib.gw_bt_capacity(self._base, self._size) < 0:
            self.close()
            raise RegionError("region is not an initialised bucket table (or is smaller than it says)")
        self._out = _ffi.new("int64_t[6]")

    @classmethod
    def create_layout(cls, buf: WritableBuffer, capacity: int) -> BucketTable:
        """Zero and initialise a region (before other processes use it) and attach to it."""
        size = region_size(capacity)
        with memoryview(buf) as view:
            if view.nbytes < size:
                raise RegionError(f"a table of {capacity} slots needs {size} bytes, not {view.nbytes}")
        with _ffi.from_buffer("char[]", buf, require_writable=True) as base:
            rc = _lib.gw_bt_init(base, len(base), capacity)
        if rc != _lib.GW_OK:
            _raise(rc)
        return cls(buf)

    @property
    def capacity(self) -> int:
        capacity: int = _lib.gw_bt_capacity(self._base, self._size)
        if capacity < 0:
            _raise(capacity)
        return capacity

    def take(self, key: int, rate_per_second: float, burst: int, n: int = 1) -> TakeOutcome:
        """Admit ``n`` units if they fit within ``burst`` at ``rate_per_second``; otherwise say when."""
        out = self._out
        try:
            rc = _lib.gw_bt_take(self._base, self._size, key, rate_per_second, burst, n, -1, out)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc == 1:
            return _tuple_new(TakeOutcome, (True, 0.0, out[1]))
        return self._refusal(rc, out)

    def take_at(self, key: int, rate_per_second: float, burst: int, n: int, now_ns: int) -> TakeOutcome:
        """``take`` at an explicit time on CLOCK_MONOTONIC."""
        out = self._out
        try:
            rc = _lib.gw_bt_take(self._base, self._size, key, rate_per_second, burst, n, _now(now_ns), out)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc == 1:
            return _tuple_new(TakeOutcome, (True, 0.0, out[1]))
        return self._refusal(rc, out)

    @staticmethod
    def _refusal(rc: int, out: Any) -> TakeOutcome:
        if rc == 0:
            return _tuple_new(TakeOutcome, (False, out[0] / 1e9, out[1]))
        if rc == 2:
            return _tuple_new(TakeOutcome, (False, math.inf, out[1]))
        _raise(rc)

    def settle(self, key: int, rate_per_second: float, delta_units: int) -> None:
        """Charge (``delta_units > 0``, debt allowed) or refund (< 0, never beyond a full bucket) units
        without an admission check, e.g. once a response's real token count is known."""
        self._settle(key, rate_per_second, delta_units, -1)

    def settle_at(self, key: int, rate_per_second: float, delta_units: int, now_ns: int) -> None:
        self._settle(key, rate_per_second, delta_units, _now(now_ns))

    def _settle(self, key: int, rate_per_second: float, delta_units: int, now_ns: int) -> None:
        try:
            rc = _lib.gw_bt_settle(self._base, self._size, key, rate_per_second, delta_units, now_ns)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            _raise(rc)

    def peek(self, key: int, rate_per_second: float, burst: int) -> Peek:
        """Read-only state; an unknown key reads as a full bucket (and is not claimed)."""
        return self._peek(key, rate_per_second, burst, -1)

    def peek_at(self, key: int, rate_per_second: float, burst: int, now_ns: int) -> Peek:
        return self._peek(key, rate_per_second, burst, _now(now_ns))

    def _peek(self, key: int, rate_per_second: float, burst: int, now_ns: int) -> Peek:
        out = self._out
        try:
            rc = _lib.gw_bt_peek(self._base, self._size, key, rate_per_second, burst, now_ns, out)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            _raise(rc)
        return Peek(out[0], out[1] / 1e9)

    def acquire(self, key: int, limit: int) -> bool:
        """Take one of ``limit`` concurrent places; ``False`` when all are taken."""
        try:
            rc: int = _lib.gw_bt_acquire(self._base, self._size, key, limit)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            _raise(rc)
        return rc == 1

    def release(self, key: int) -> int:
        """Give a place back; returns the new count, which never goes below 0."""
        return self._gauge_call(_lib.gw_bt_release, key)

    def gauge(self, key: int) -> int:
        """Places currently taken (0 for an unknown key)."""
        return self._gauge_call(_lib.gw_bt_gauge, key)

    def spend_add(self, key: int, tokens: int, cost: int) -> None:
        """Add to a budget window's live spend (tokens and cost in nano-units)."""
        try:  # ``_spend_call``, inline: once per request
            rc: int = _lib.gw_bt_spend_add(self._base, self._size, key, tokens, cost)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            _raise(rc)

    def spend_set_base(self, key: int, tokens: int, cost: int) -> None:
        """Set a budget window's base spend: what the live counter does not hold."""
        self._spend_call(_lib.gw_bt_spend_set_base, key, tokens, cost)

    def spend(self, key: int) -> tuple[int, int]:
        """A budget window's spend, live plus base: ``(tokens, cost)``; zeros for an unknown key."""
        out = self._out
        rc = _lib.gw_bt_spend_read(self._base, self._size, key, out)
        if rc != 0:
            _raise(rc)
        return out[0] + out[2], out[1] + out[3]

    def spend_parts(self, key: int) -> tuple[int, int, int, int]:
        """``(live tokens, live cost, base tokens, base cost)`` of a budget window."""
        out = self._out
        rc = _lib.gw_bt_spend_read(self._base, self._size, key, out)
        if rc != 0:
            _raise(rc)
        return out[0], out[1], out[2], out[3]

    def _spend_call(self, fn: Any, key: int, tokens: int, cost: int) -> None:
        try:
            rc: int = fn(self._base, self._size, key, tokens, cost)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc != 0:
            _raise(rc)

    def _gauge_call(self, fn: Any, key: int) -> int:
        try:
            rc: int = fn(self._base, self._size, key)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            _raise(rc)
        return rc

    # -- noted places and admission plans: one C call each ---------------------------------------------
    def enter(self, key: int, limit: int, notes: AtomicWords | None, note: int) -> bool:
        """``acquire``, with the place noted in word 0 of the block at byte offset ``note`` of ``notes``
        (written before the place is taken; cleared again when it was not). ``note < 0``: not noted."""
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        try:
            rc: int = _lib.gw_bt_enter(self._base, self._size, key, limit, base, size, note)
        except OverflowError as exc:
            raise ValueError(str(exc)) from exc
        if rc < 0:
            _raise(rc)
        return rc == 1

    def leave(self, key: int, notes: AtomicWords | None, note: int) -> int:
        """``release``, clearing the place's note; returns the gauge's new value."""
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        rc: int = _lib.gw_bt_leave(self._base, self._size, key, base, size, note)
        if rc < 0:
            _raise(rc)
        return rc

    def admit(self, plan: AdmissionPlan, tokens: int, notes: AtomicWords | None, note: int) -> Any:
        """Take what one request needs from every limit of ``plan``, all or nothing (see ``gw_bt_admit``).
        Returns the C call's six outcome words, valid until the next call on this table: ``[0]`` is -1
        when admitted, else the refusing limit's index, and ``[1]`` its wait in ns (-1: never); ``[2],
        [3]`` and ``[4], [5]`` are the index and remaining units of the requests and tokens buckets with
        the fewest left (index -1: none)."""
        out = self._out
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        rc = _lib.gw_bt_admit(self._base, self._size, plan.limits, plan.n, tokens, base, size, note, -1, out)
        if rc < 0:
            _raise(rc)
        return out

    def finish(
        self, plan: AdmissionPlan, tokens: int, used: int, notes: AtomicWords | None, note: int
    ) -> None:
        """End a request ``admit`` let in with ``tokens``: settle its token buckets to ``used`` (none when
        ``used < 0``), give its gauge places back and clear their notes."""
        base, size = (notes._base, notes._size) if notes is not None else (_ffi.NULL, 0)
        rc = _lib.gw_bt_finish(
            self._base, self._size, plan.limits, plan.n, tokens, used, base, size, note, -1
        )
        if rc < 0:
            _raise(rc)


LIMIT_REQUESTS: Final = 0
LIMIT_TOKENS: Final = 1
LIMIT_CONCURRENCY: Final = 2


class AdmissionPlan:
    """The limits one request is admitted against, as the C array ``gw_bt_admit`` walks: ``(kind, key,
    limit, rate per second)`` each, ``kind`` one of ``LIMIT_REQUESTS``, ``LIMIT_TOKENS`` (``limit`` is the
    burst) or ``LIMIT_CONCURRENCY`` (``limit`` places; the rate is unused). Immutable once built."""

    __slots__ = ("gauges", "limits", "n")

    def __init__(self, limits: list[tuple[int, int, int, float]]) -> None:
        _native()
        if len(limits) > _lib.GW_PLAN_MAX:
            raise ValueError(f"a plan has at most {_lib.GW_PLAN_MAX} limits")
        self.n = len(limits)
        self.limits: Any = _ffi.new("gw_limit[]", max(1, self.n))
        for i, (kind, key, limit, rate) in enumerate(limits):
            entry = self.limits[i]
            entry.kind, entry.key, entry.limit = kind, key, limit
            entry.rate_per_s = rate if kind != LIMIT_CONCURRENCY else 1.0
        self.gauges = sum(1 for kind, *_ in limits if kind == LIMIT_CONCURRENCY)


def _now(now_ns: int) -> int:
    if now_ns < 0:
        raise ValueError("now_ns must be >= 0")
    return now_ns


# ---- usage rings ------------------------------------------------------------------------------------------


def ring_region_size(rings: int, slots: int, slot_bytes: int) -> int:
    """Bytes a ``UsageRing`` region needs: ``rings`` rings (1 to 4096) of ``slots`` slots (a power of two in
    [2, 2**20]) of ``slot_bytes`` bytes (a multiple of 64 in [64, 65536]); a record holds at most
    ``slot_bytes - 8`` bytes."""
    lib = _native()
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


class UsageRing(_SharedBuffer):
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
            _raise(rc)
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
        records = []
        end = 0
        for _ in range(n):
            (length,) = _unpack_length(buffer, end)
            start = end + 4
            end = start + length
            records.append(buffer[start:end])
        return records

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
        _raise(rc)
