"""vLLM's KV-cache events: decoding messages built per vLLM's encodings (msgpack of msgspec structs, in the
array form of the 0.9-0.11 releases and the map form of main), and the simulated engine publishing them as
its cache changes. No sockets."""

from __future__ import annotations

import msgpack
import pytest

from gateway.mockengine.sim import Engine, SimConfig, pack_tokens, published_hash
from gateway.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventError,
    decode_batch,
    decode_sequence,
    encode_batch,
    encode_message,
)


def test_the_array_form_of_vllm_0_9_without_medium_decodes() -> None:
    # msgspec array_like=True, tag=True: [tag, *fields]; the batch [ts, events].
    payload = msgpack.packb(
        [
            1.5,
            [
                ["BlockStored", [11, 12], None, list(range(32)), 16, None],
                ["BlockRemoved", [11]],
                ["AllBlocksCleared"],
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.data_parallel_rank is None
    assert batch.events == (
        BlockStored((11, 12), None, tuple(range(32)), 16, None, None),
        BlockRemoved((11,), None),
        AllBlocksCleared(),
    )


def test_the_array_form_with_medium_and_rank_decodes() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                ["BlockStored", [b"\x01" * 32], b"\x02" * 32, [5] * 16, 16, 3, "GPU"],
                ["BlockRemoved", [7], "CPU"],
            ],
            1,
        ]
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank == 1
    assert batch.events == (
        BlockStored((b"\x01" * 32,), b"\x02" * 32, (5,) * 16, 16, 3, "GPU"),
        BlockRemoved((7,), "CPU"),
    )


def test_the_map_form_of_vllm_main_decodes_and_unknown_fields_are_ignored() -> None:
    stored = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": 9,
        "token_ids": [1] * 16,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }
    payload = msgpack.packb(
        {"ts": 3.0, "events": [stored, {"type": "AllBlocksCleared"}], "data_parallel_rank": 0}
    )
    batch = decode_batch(payload)
    assert batch.events == (BlockStored((1,), 9, (1,) * 16, 16, None, "GPU", group_idx=0), AllBlocksCleared())
    salted = {**stored, "extra_keys": [["salt"]], "lora_name": "adapter", "group_idx": 1}
    (event,) = decode_batch(msgpack.packb({"ts": 3.0, "events": [salted]})).events
    assert isinstance(event, BlockStored) and event.salted and event.lora_name == "adapter"
    assert event.group_idx == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb([1.0]),
        msgpack.packb(["x", []]),
        msgpack.packb([1.0, [["Nope"]]]),
        msgpack.packb([1.0, [["BlockStored", ["x"], None, [], 16, None]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0, None]]]),
    ],
)
def test_what_is_not_a_batch_is_refused(payload: bytes) -> None:
    with pytest.raises(KVEventError):
        decode_batch(payload)


def test_our_encoding_round_trips_and_the_sequence_is_eight_bytes_big_endian() -> None:
    batch = EventBatch(
        1.0, (BlockStored((1, 2), 0, tuple(range(32)), 16), BlockRemoved((1,)), AllBlocksCleared()), 0
    )
    topic, seq, payload = encode_message(b"kv", 258, batch)
    assert (topic, seq) == (b"kv", b"\x00\x00\x00\x00\x00\x00\x01\x02")
    assert decode_sequence(seq) == 258
    assert decode_batch(payload) == batch
    # The array form, field by field as vLLM's msgspec encoder writes it.
    assert msgpack.unpackb(encode_batch(batch))[1][0] == [
        "BlockStored",
        [1, 2],
        0,
        list(range(32)),
        16,
        None,
        "GPU",
    ]


def test_the_simulated_engine_publishes_stored_removed_and_cleared() -> None:
    e = Engine(SimConfig(block_tokens=4, cache_blocks=8), record_events=True)

    def run(prompt: bytes) -> None:
        seq = e.sequence("m", prompt, 0, 0.0)
        e.submit(seq)
        while (step := e.plan()) is not None:
            e.commit(step, 0.0)

    first = pack_tokens(list(range(100, 113)))  # 13 tokens: three full blocks of 4
    run(first)
    events = e.take_events()
    assert len(events) == 1 and isinstance(events[0], BlockStored)
    stored = events[0]
    assert stored.parent_block_hash is None and stored.block_size == 4
    assert stored.token_ids == tuple(range(100, 112))
    assert len(stored.block_hashes) == 3
    # A prompt sharing the first two blocks stores only what follows them, chained to the second.
    run(pack_tokens([*range(100, 108), *range(200, 205)]))
    (again,) = e.take_events()
    assert isinstance(again, BlockStored)
    assert again.parent_block_hash == stored.block_hashes[1] and again.token_ids == tuple(range(200, 204))
    # Room for 8 blocks: a prompt of 6 new blocks evicts the least recently used ones.
    run(pack_tokens(list(range(300, 325))))
    events = e.take_events()
    removed = [h for ev in events if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert removed and set(removed) <= {*stored.block_hashes, *again.block_hashes}
    assert all(isinstance(h, int) for h in removed)
    assert e.reset_cache()
    assert e.take_events() == [AllBlocksCleared()]
    assert e.used == 0 and not e.cache


def test_published_hashes_are_the_first_eight_bytes_of_the_chained_ones() -> None:
    assert published_hash(bytes(range(16))) == int.from_bytes(bytes(range(8)), "big")
