"""The holdings segment: each proxy worker's notes of the gauge places (concurrency limits, backends'
in-flight and queue places, per-address limits) it holds, so that the worker the supervisor starts in
place of one killed with ``kill -9`` can give them back.

Layout: one slice of ``HOLD_WORDS`` 64-bit words per proxy worker (slice ``i`` belongs to worker ``i``,
then to whichever process replaces it); a slice is blocks of ``NOTE_WORDS`` words, one block for each
request in flight that holds places, a word for each place held (its bucket key; 0 = free). The C calls
that take and give back places write and clear the words (``gateway.native.BucketTable.admit/finish``,
``enter/leave``); ``Holdings`` hands out the blocks. I/O: none beyond the mapping.
"""

from __future__ import annotations

from gateway.native import AtomicWords, BucketTable

__all__ = ["HOLD_WORDS", "NOTE_WORDS", "Holdings", "region_bytes"]

# Words of one note block: the gauges one request holds from its limits (principal, key, principal and
# model: at most three), or one backend place.
NOTE_WORDS = 4
# Words of shared memory per proxy worker for its notes: 16,384 blocks, each a request in flight.
HOLD_WORDS = 65536


def region_bytes(workers: int) -> int:
    """The segment's size: one slice per proxy worker."""
    return max(1, workers) * HOLD_WORDS * 8


class Holdings:
    """One worker's notes of the gauge places it holds, in its own slice of the segment, which outlives
    the worker."""

    def __init__(self, words: AtomicWords, index: int, slots: int = HOLD_WORDS) -> None:
        self.words = words
        self.base = index * slots * 8
        self.slots = slots
        blocks = slots // NOTE_WORDS
        self.free = [self.base + 8 * NOTE_WORDS * b for b in range(blocks - 1, -1, -1)]
        self.unnoted = 0

    def recover(self, table: BucketTable) -> int:
        """Release every gauge a previous worker in this slice still held; returns how many."""
        released = 0
        for i in range(self.slots):
            offset = self.base + 8 * i
            key = self.words.load(offset)
            if key:
                table.release(key)
                self.words.store(offset, 0)
                released += 1
        return released

    def take(self) -> int:
        """A free block's byte offset in the segment, or -1 when every block is in use (the places are
        then held unnoted: counted in ``unnoted``)."""
        if self.free:
            return self.free.pop()
        self.unnoted += 1
        return -1

    def give(self, block: int) -> None:
        """Hand a block back once the C call has cleared its words."""
        if block >= 0:
            self.free.append(block)
