"""The exact side of the prefix index: an engine's KV events mirrored into the host's ``PrefixIndex`` as
pinned pairs (stored, removed, cleared, forgotten on a sequence gap), and a prompt's token ids meeting
them; and the C operations under it (chaining after a known hash, forgetting pairs and a target,
pinned pairs that the noting of prompts does not evict)."""

from __future__ import annotations

from gateway.native import PrefixIndex
from gateway.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from gateway.routing.kv_mirror import BackendMirror, exact_key, prompt_blocks

PROMPT = list(range(1000, 1000 + 16 * 5 + 3))  # five whole blocks of 16 tokens and 3 more


def batch(*events: object) -> EventBatch:
    return EventBatch(0.0, tuple(events), 0)  # type: ignore[arg-type]


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], size: int = 16, **kw: object
) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), size, **kw)  # type: ignore[arg-type]


def matched(index: PrefixIndex, backend: str, ids: list[int] = PROMPT) -> int:
    return index.match(prompt_blocks(index, ids), exact_key(backend))


def test_stored_blocks_in_two_events_chain_into_the_prompts_hashes() -> None:
    index = PrefixIndex.private()
    mirror = BackendMirror(index, exact_key("a"))
    mirror.apply(0, batch(stored([11, 12], None, PROMPT[:32])))
    assert matched(index, "a") == 2
    mirror.apply(1, batch(stored([13, 14], 12, PROMPT[32:64])))
    assert matched(index, "a") == 4 and matched(index, "b") == 0
    # The same tokens after a different first block are no match.
    assert matched(index, "a", [7] * 16 + PROMPT[16:]) == 0
    assert mirror.counts.stored == 4 and mirror.counts.batches == 2


def test_an_engine_block_of_32_tokens_is_two_of_ours() -> None:
    index = PrefixIndex.private()
    mirror = BackendMirror(index, exact_key("a"))
    mirror.apply(0, batch(stored([1, 2], None, PROMPT[:64], size=32)))
    assert matched(index, "a") == 4
    mirror.apply(1, batch(BlockRemoved((2,))))
    assert matched(index, "a") == 2


def test_removed_cuts_the_match_at_the_block_and_cleared_forgets_the_backend() -> None:
    index = PrefixIndex.private()
    a, b = BackendMirror(index, exact_key("a")), BackendMirror(index, exact_key("b"))
    a.apply(0, batch(stored([11, 12, 13], None, PROMPT[:48])))
    b.apply(0, batch(stored([21, 22, 23], None, PROMPT[:48])))
    a.apply(1, batch(BlockRemoved((12,))))
    assert matched(index, "a") == 1 and a.counts.removed == 1
    a.apply(2, batch(AllBlocksCleared()))
    assert matched(index, "a") == 0 and not a.blocks and a.counts.cleared == 1
    assert matched(index, "b") == 3  # the other backend keeps its pairs


def test_a_sequence_gap_forgets_the_backends_pairs_and_later_events_refill_them() -> None:
    index = PrefixIndex.private()
    mirror = BackendMirror(index, exact_key("a"))
    mirror.apply(5, batch(stored([11, 12], None, PROMPT[:32])))  # a first message may start anywhere
    mirror.apply(6, batch(stored([13], 12, PROMPT[32:48])))
    assert matched(index, "a") == 3
    mirror.apply(8, batch())  # 7 was lost: it may have removed blocks
    assert matched(index, "a") == 0 and mirror.counts.gaps == 1
    # A child of a block it no longer knows cannot be placed: skipped, never guessed.
    mirror.apply(9, batch(stored([14], 13, PROMPT[48:64])))
    assert mirror.counts.skipped == 1 and matched(index, "a") == 0
    mirror.apply(10, batch(stored([11, 12], None, PROMPT[:32])))
    assert matched(index, "a") == 2
    mirror.apply(0, batch())  # the engine restarted: its counter did too
    assert mirror.counts.gaps == 2 and matched(index, "a") == 0


def test_lora_other_media_and_odd_block_sizes_are_left_out() -> None:
    index = PrefixIndex.private()
    mirror = BackendMirror(index, exact_key("a"))
    mirror.apply(0, batch(stored([1], None, PROMPT[:16], lora_id=3)))
    mirror.apply(1, batch(stored([2], None, PROMPT[:16], medium="CPU")))
    mirror.apply(2, batch(stored([3], None, PROMPT[:8], size=8)))
    mirror.apply(3, batch(stored([5], None, PROMPT[:16], salted=True)))
    mirror.apply(4, batch(stored([6], None, PROMPT[:16], group_idx=1)))
    assert matched(index, "a") == 0 and mirror.counts.skipped == 5
    mirror.apply(5, batch(stored([4], None, PROMPT[:16])))
    mirror.apply(6, batch(BlockRemoved((4,), "CPU")))  # the CPU tier let go of its copy; the GPU's stays
    assert matched(index, "a") == 1


def test_pinned_pairs_survive_a_flood_of_noted_prompts_in_a_small_table() -> None:
    index = PrefixIndex.private(entries=64)
    mirror = BackendMirror(index, exact_key("a"))
    mirror.apply(0, batch(stored([1, 2, 3], None, PROMPT[:48])))
    for i in range(200):  # far more approximate pairs than the table holds
        index.insert(index.blocks(i.to_bytes(4, "little") * 64, 64), 77)
    assert matched(index, "a") == 3
    assert index.stats().evictions > 0


def test_forget_and_forget_target_keep_the_held_count() -> None:
    index = PrefixIndex.private()
    blocks = index.blocks(b"x" * 64 * 4, 64)
    index.insert(blocks, 5)
    index.insert(blocks, 6)
    assert index.held(5) == 4
    assert index.forget(blocks, 5) == 4 and index.held(5) == 0 and index.match(blocks, 6) == 4
    assert index.forget(blocks, 5) == 0
    assert index.forget_target(6) == 4 and index.held(6) == 0 and index.match(blocks, 6) == 0
    # Chaining after a block's hash is the same as hashing the whole.
    after = index.blocks_after(blocks[1], b"x" * 64 * 2, 64)
    assert after.values() == blocks.values(2)


def test_decisions_from_exact_pairs_are_counted() -> None:
    index = PrefixIndex.private()
    index.count_exact(True)
    index.count_exact(False)
    stats = index.stats()
    assert (stats.exact, stats.exact_held) == (2, 1)
