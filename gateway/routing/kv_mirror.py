"""The exact side of the prefix index: what each engine publishing vLLM's KV events says it caches, mirrored
into the host's ``PrefixIndex`` as pinned pairs, and how a prompt's tokens are looked up there.

The unit is a block of ``BLOCK_TOKENS`` (16) token ids, each packed as 4 little-endian bytes, with hashes
chained and keyed by the host's secret as the approximate pairs are (``PrefixIndex.blocks``): a prompt's
first n blocks are held when the pairs of all n are. An engine's block of ``k`` x 16 tokens is ``k`` of
ours (its hash maps to the last of them, what its children chain from); an engine whose blocks are not a
multiple of 16 tokens is not mirrored. The engine's own hashes (seeded by its own process, and since vLLM
0.10 a SHA-256 of things we do not see, such as a cache salt) are only names here, the keys of
``BackendMirror.blocks``: we hash the token ids ourselves so that a request's prompt, tokenized on the
request path, meets the same hashes.

``BackendMirror`` applies one backend's batches in order: ``BlockStored`` inserts (the parent must be
known: a block whose parent was never seen is skipped, as it could never be matched anyway),
``BlockRemoved`` forgets, ``AllBlocksCleared`` forgets the backend's every pair. A sequence number that
is not the last plus one means messages were lost (or the engine restarted): the backend's exact pairs
are forgotten, and until its events refill them, routing reads that backend from the approximate pairs.
Blocks stored with a LoRA adapter, with ``extra_keys`` (images, a cache salt: their hash covers more than
their tokens), in another medium than the GPU (CPU offload tiers), or in a KV-cache group other than the
first (hybrid models' sliding-window groups), are counted and left out: a prompt's tokens alone cannot
say whether it meets them. No I/O here.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from blake3 import blake3

from gateway.native import Blocks, PrefixIndex
from gateway.protocol.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch

__all__ = ["BLOCK_TOKENS", "MAX_MIRRORED", "BackendMirror", "MirrorCounts", "exact_key", "prompt_blocks"]

BLOCK_TOKENS: Final = 16
_BLOCK_BYTES: Final = 4 * BLOCK_TOKENS
# Engine blocks remembered per backend (about 200 bytes each): more than a GPU's cache holds (8M tokens at
# 16 a block); past it, a stream that never removes anything, so start over (see apply).
MAX_MIRRORED: Final = 1 << 19


def exact_key(backend: str) -> int:
    """What names a backend's exact pairs in the index: apart from its approximate targets (which are per
    backend and model), as an engine's cache is one whatever model name a request uses."""
    return int.from_bytes(blake3(b"kv-events\0" + backend.encode()).digest(8), "little")


def _packed(ids: Sequence[int]) -> bytes:
    """Token ids as 4 little-endian bytes each. Raises ``OverflowError`` for an id outside uint32."""
    packed = array("I", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def prompt_blocks(index: PrefixIndex, ids: Sequence[int]) -> Blocks:
    """The exact-side hashes of a prompt's whole blocks of token ids."""
    return index.blocks(_packed(ids), _BLOCK_BYTES)


@dataclass(slots=True)
class MirrorCounts:
    """What one backend's subscription saw, for ``/metrics`` and ``gateway status``."""

    batches: int = 0
    events: int = 0
    gaps: int = 0  # sequence numbers skipped or restarted: the backend's exact pairs were forgotten
    stored: int = 0  # engine blocks mirrored
    removed: int = 0
    cleared: int = 0  # AllBlocksCleared received
    skipped: int = 0  # engine blocks left out: unknown parent, LoRA, another medium, odd block size
    undecodable: int = 0


@dataclass(slots=True)
class BackendMirror:
    """One backend's exact pairs: what its engine's events said, applied to ``index`` under ``key``."""

    index: PrefixIndex
    key: int
    blocks: dict[BlockHash, tuple[int, ...]] = field(default_factory=dict)
    """Engine block hash -> our hashes of its 16-token pieces (the last one is what children chain from)."""
    last: int | None = None
    counts: MirrorCounts = field(default_factory=MirrorCounts)

    def forget_all(self) -> None:
        """Drop every exact pair of the backend (a gap, a reconnect, a cleared cache)."""
        self.index.forget_target(self.key)
        self.blocks.clear()

    def restart(self) -> None:
        """A new subscription: what was missed before it is unknown, so start from nothing."""
        self.forget_all()
        self.last = None

    def apply(self, sequence: int, batch: EventBatch) -> None:
        counts = self.counts
        if self.last is not None and sequence != self.last + 1:
            counts.gaps += 1
            self.forget_all()
        self.last = sequence
        counts.batches += 1
        for event in batch.events:
            counts.events += 1
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event)
            elif isinstance(event, AllBlocksCleared):
                counts.cleared += 1
                self.forget_all()
        if len(self.blocks) > MAX_MIRRORED:  # bigger than any engine's cache: a stream that never removes
            counts.gaps += 1
            self.forget_all()

    def _stored(self, event: BlockStored) -> None:
        n = len(event.block_hashes)
        per, odd = divmod(event.block_size, BLOCK_TOKENS)
        if (
            odd
            or per == 0
            or event.lora_id is not None
            or event.lora_name is not None
            or event.salted
            or event.group_idx not in (None, 0)
            or event.medium not in (None, "GPU")
            or len(event.token_ids) != n * event.block_size
        ):
            self.counts.skipped += n
            return
        try:
            data = _packed(event.token_ids)
        except OverflowError:  # not a token id of any vocabulary
            self.counts.skipped += n
            return
        if event.parent_block_hash is None:
            hashes = self.index.blocks(data, _BLOCK_BYTES)
        else:
            parent = self.blocks.get(event.parent_block_hash)
            if parent is None:
                self.counts.skipped += n
                return
            hashes = self.index.blocks_after(parent[-1], data, _BLOCK_BYTES)
        if hashes.count != n * per:  # past MAX_BLOCKS: keep what was hashed whole
            n = hashes.count // per
        for i in range(n):
            self.blocks[event.block_hashes[i]] = tuple(hashes.values(i * per, (i + 1) * per))
        self.index.insert(hashes, self.key, pinned=True)
        self.counts.stored += n

    def _removed(self, event: BlockRemoved) -> None:
        if event.medium not in (None, "GPU") or event.group_idx not in (None, 0):
            return
        gone: list[int] = []
        for h in event.block_hashes:
            ours = self.blocks.pop(h, None)
            if ours is not None:
                gone.extend(ours)
                self.counts.removed += 1
        if gone:
            self.index.forget(Blocks.of(gone), self.key)
