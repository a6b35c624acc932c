"""The prefix index (``native/prefix_index.c`` through ``gateway.native.PrefixIndex``): chained block
hashes, leading-block matches per target, the bound on what it holds and least-recently-used eviction,
and one region shared by two attachments (as two workers map one segment)."""

from __future__ import annotations

import struct

import pytest

from gateway.native import PrefixIndex, RegionError, prefix_region_size

HEADER = 64 + 256 * 16  # the header and the targets' counts


def used_slots(buf: bytearray, entries: int) -> int:
    keys = struct.unpack_from(f"<{2 * entries}Q", buf, HEADER)[::2]
    return sum(1 for k in keys if k)


def test_hashes_are_chained_so_one_names_the_whole_prefix() -> None:
    index = PrefixIndex.private()
    a = index.blocks(b"a" * 64 + b"b" * 64 + b"c" * 64 + b"xyz", 64)
    b = index.blocks(b"a" * 64 + b"b" * 64 + b"d" * 64, 64)
    c = index.blocks(b"z" + b"a" * 63 + b"b" * 64, 64)
    assert a.count == 3  # whole blocks only
    assert list(a.hashes[0:2]) == list(b.hashes[0:2]) and a.hashes[2] != b.hashes[2]
    assert a.hashes[1] != c.hashes[1]  # the second block is the same bytes, after a different first


def test_a_target_holds_the_leading_blocks_it_was_sent() -> None:
    index = PrefixIndex.private()
    conversation = b"system prompt " * 40
    turn1 = index.blocks(conversation + b"question one " * 10, 64)
    turn2 = index.blocks(conversation + b"question one " * 10 + b"question two " * 10, 64)
    assert index.match(turn2, 1) == 0
    index.insert(turn1, 1)
    assert index.match(turn1, 1) == turn1.count
    assert index.match(turn2, 1) == turn1.count  # the new turn's prefix, not its new blocks
    assert index.match(turn2, 2) == 0  # another target was sent none of it
    other = index.blocks(b"another prompt " * 40, 64)
    assert index.match(other, 1) == 0


def test_the_index_holds_at_most_its_entries_and_evicts_the_least_recently_used() -> None:
    entries = 64
    buf = bytearray(prefix_region_size(entries))
    index = PrefixIndex.create_layout(buf, entries, 7)
    prompts = [index.blocks(bytes([n]) * 64 * 16, 64) for n in range(40)]  # 40 x 16 blocks >> 64 slots
    keep = prompts[0]
    for n, prompt in enumerate(prompts[1:], 1):
        index.insert(prompt, 1)
        if n % 2 == 0:
            index.insert(keep, 1)  # used again and again: never the least recently used
        assert used_slots(buf, entries) <= entries
    assert index.match(keep, 1) == keep.count
    assert index.match(prompts[-1], 1) == prompts[-1].count  # the newest is whole
    assert index.match(prompts[1], 1) == 0  # an old one, never used again, made room
    stats = index.stats()
    assert stats.inserts == 39 + 19 and stats.evictions > 0


def test_two_attachments_of_one_region_see_each_others_choices() -> None:
    buf = bytearray(prefix_region_size(1024))
    first = PrefixIndex.create_layout(buf, 1024, 99)
    second = PrefixIndex(buf)
    prompt = b"shared across workers " * 30
    first.insert(first.blocks(prompt, 64), 5)
    assert second.match(second.blocks(prompt, 64), 5) == len(prompt) // 64


def test_a_secret_changes_every_hash() -> None:
    one = PrefixIndex.create_layout(bytearray(prefix_region_size(8)), 8, 1)
    two = PrefixIndex.create_layout(bytearray(prefix_region_size(8)), 8, 2)
    assert one.blocks(b"x" * 64, 64).hashes[0] != two.blocks(b"x" * 64, 64).hashes[0]


def test_regions_are_checked() -> None:
    with pytest.raises(ValueError):
        prefix_region_size(100)  # not a power of two
    with pytest.raises(ValueError):
        prefix_region_size(4)  # fewer than one set
    with pytest.raises(RegionError):
        PrefixIndex(bytearray(prefix_region_size(8)))  # never laid out
    with pytest.raises(RegionError):
        PrefixIndex.create_layout(bytearray(100), 8, 1)
    index = PrefixIndex.private(8)
    assert index.entries == 8
    assert index.blocks(b"short", 64).count == 0


def test_the_pairs_each_target_holds_are_counted_through_evictions() -> None:
    entries = 64
    buf = bytearray(prefix_region_size(entries))
    index = PrefixIndex.create_layout(buf, entries, 3)
    assert index.held(1) == 0
    first = index.blocks(b"a" * 64 * 10, 64)
    index.insert(first, 1)
    index.insert(first, 1)  # refreshed, not counted again
    assert index.held(1) == 10 and index.held(2) == 0
    for n in range(30):  # target 2 floods the 64 slots: target 1's pairs are the least recently used
        index.insert(index.blocks(bytes([n]) * 64 * 8, 64), 2)
    held_one, held_two = index.held(1), index.held(2)
    assert held_one < 10
    assert held_one + held_two == used_slots(buf, entries) <= entries
