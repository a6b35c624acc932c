"""``PrefixIndex``: chained hashes of a prompt's blocks, and which backend was sent which of them, in a
bounded region a host's proxy workers share (``native/prefix_index.c``). What prefix-cache-aware routing
reads and writes. The same table holds the exact pairs a host's control slot mirrors from engines' KV
events (``pinned``, removed by ``forget`` and ``forget_target``). I/O: none."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from gateway.native._ffi import RegionError, WritableBuffer, raise_for, require_native
from gateway.native._ffi import ffi as _ffi
from gateway.native._ffi import lib as _lib
from gateway.native._shared import SharedBuffer

__all__ = ["MAX_BLOCKS", "Blocks", "IndexStats", "PrefixIndex", "prefix_region_size"]

MAX_BLOCKS: Final = 16384  # blocks hashed per prompt: 1 MiB of prompt at 64-byte blocks; the rest is not


def prefix_region_size(entries: int) -> int:
    """Bytes a ``PrefixIndex`` of ``entries`` slots needs (a power of two in [8, 2**28])."""
    size: int = require_native().gw_pix_region_size(entries) if 0 < entries < 2**64 else 0
    if size == 0:
        raise ValueError(f"entries {entries} is not a power of two in [8, 2**28]")
    return size


class IndexStats(NamedTuple):
    inserts: int  # insert calls: requests whose blocks were noted
    pairs: int  # (block, backend) pairs noted or refreshed
    evictions: int  # pairs pushed out of a full set
    exact: int  # routing decisions that took the chosen target's prefix from exact pairs
    exact_held: int  # of those, the ones where the exact pairs held at least one block


class Blocks:
    """One prompt's chained block hashes (a C array owned here; ``count`` of them are valid)."""

    __slots__ = ("count", "hashes")

    def __init__(self, hashes: Any, count: int) -> None:
        self.hashes = hashes
        self.count = count

    @classmethod
    def of(cls, hashes: list[int]) -> Blocks:
        """Hashes an index gave before (kept as ints), to ``forget`` them."""
        return cls(_ffi.new("uint64_t[]", hashes or [0]), len(hashes))

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.count:
            raise IndexError(i)
        value: int = self.hashes[i]
        return value

    def values(self, start: int = 0, end: int | None = None) -> list[int]:
        """The hashes ``start`` to ``end`` as ints."""
        end = self.count if end is None else min(end, self.count)
        return [int(self.hashes[i]) for i in range(start, end)]


class PrefixIndex(SharedBuffer):
    """A set-associative table of (block hash, backend) pairs with least-recently-used eviction per set.
    Each method is one C call; ``match`` reads only, ``insert`` writes."""

    __slots__ = ("_out",)

    def __init__(self, buf: WritableBuffer) -> None:
        """Attach to a region that ``create_layout`` initialised."""
        super().__init__(buf)
        if _lib.gw_pix_entries(self._base, self._size) < 0:
            self.close()
            raise RegionError("region is not an initialised prefix index (or is smaller than it says)")
        self._out = _ffi.new("uint64_t[5]")

    @classmethod
    def create_layout(cls, buf: WritableBuffer, entries: int, secret: int) -> PrefixIndex:
        """Zero and initialise a region (before other processes use it) and attach to it. ``secret``
        seeds the block hashes, so that nobody outside the host can choose prompts whose blocks collide."""
        size = prefix_region_size(entries)
        with memoryview(buf) as view:
            if view.nbytes < size:
                raise RegionError(f"an index of {entries} entries needs {size} bytes, not {view.nbytes}")
        with _ffi.from_buffer("char[]", buf, require_writable=True) as base:
            rc = _lib.gw_pix_init(base, len(base), entries, secret & (2**64 - 1))
        if rc != _lib.GW_OK:
            raise_for(rc)
        return cls(buf)

    @classmethod
    def private(cls, entries: int = 4096) -> PrefixIndex:
        """An index in this process's own memory (tests, the dry run, a worker without a host segment)."""
        return cls.create_layout(bytearray(prefix_region_size(entries)), entries, 0x5EED)

    @property
    def entries(self) -> int:
        entries: int = _lib.gw_pix_entries(self._base, self._size)
        if entries < 0:
            raise_for(entries)
        return entries

    def blocks(self, data: bytes, block: int) -> Blocks:
        """The chained hashes of ``data``'s whole ``block``-byte blocks (at most ``MAX_BLOCKS``)."""
        wanted = min(len(data) // block, MAX_BLOCKS) if block > 0 else 0
        out = _ffi.new("uint64_t[]", max(1, wanted))
        n = _lib.gw_pix_hash_blocks(self._base, self._size, data, len(data), block, out, wanted)
        if n < 0:
            raise_for(n)
        return Blocks(out, n)

    def blocks_after(self, previous: int, data: bytes, block: int) -> Blocks:
        """As ``blocks``, the chain continuing after ``previous`` (a hash this index gave) instead of
        starting at ``data``'s first byte: what a prompt's later blocks hash to."""
        wanted = min(len(data) // block, MAX_BLOCKS) if block > 0 else 0
        out = _ffi.new("uint64_t[]", max(1, wanted))
        n = _lib.gw_pix_hash_after(self._base, self._size, previous, data, len(data), block, out, wanted)
        if n < 0:
            raise_for(n)
        return Blocks(out, n)

    def match(self, blocks: Blocks, target: int) -> int:
        """How many leading ``blocks`` the index holds for ``target``."""
        n: int = _lib.gw_pix_match(self._base, self._size, blocks.hashes, blocks.count, target)
        if n < 0:
            raise_for(n)
        return n

    def insert(self, blocks: Blocks, target: int, pinned: bool = False) -> int:
        """Note that ``target`` was sent ``blocks`` (``pinned``: that its engine holds them, which the
        noting of prompts sent does not push out); the number of older pairs that made room."""
        n: int = _lib.gw_pix_insert_pinned(
            self._base, self._size, blocks.hashes, blocks.count, target, int(pinned)
        )
        if n < 0:
            raise_for(n)
        return n

    def forget(self, blocks: Blocks, target: int) -> int:
        """Remove the pairs of ``blocks`` and ``target``; how many the index held."""
        n: int = _lib.gw_pix_forget(self._base, self._size, blocks.hashes, blocks.count, target)
        if n < 0:
            raise_for(n)
        return n

    def forget_target(self, target: int) -> int:
        """Remove every pair of ``target`` (a scan of the table: for an engine that lost its cache, not for
        the request path); how many."""
        n: int = _lib.gw_pix_forget_target(self._base, self._size, target)
        if n < 0:
            raise_for(n)
        return n

    def count_exact(self, held: bool) -> None:
        """Count a routing decision that took its prefix from exact pairs (``held``: they held a block)."""
        rc = _lib.gw_pix_count_exact(self._base, self._size, int(held))
        if rc < 0:
            raise_for(rc)

    def held(self, target: int) -> int:
        """How many (block, ``target``) pairs the index holds now: what it believes ``target``'s engine
        caches of what it was sent."""
        n: int = _lib.gw_pix_held(self._base, self._size, target)
        if n < 0:
            raise_for(n)
        return n

    def stats(self) -> IndexStats:
        out = self._out
        rc = _lib.gw_pix_stats(self._base, self._size, out)
        if rc < 0:
            raise_for(rc)
        return IndexStats(int(out[0]), int(out[1]), int(out[2]), int(out[3]), int(out[4]))
