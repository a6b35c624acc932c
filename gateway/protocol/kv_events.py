"""vLLM's KV-cache events on the wire: what an engine started with ``--kv-events-config`` publishes on a
ZeroMQ PUB socket, decoded and encoded. Sans-I/O: bytes in, events out (and back).

Each message is three frames: ``[topic, sequence, payload]``. ``sequence`` is an 8-byte big-endian
counter, one per batch, that lets a subscriber see that it missed some; ``payload`` is a msgpack
``KVEventBatch``. The types are vLLM's ``vllm/distributed/kv_events.py``:

- commit b4e69e0af33f4698e157a262cc787fe61983cd3d (vLLM 0.9) encodes with msgspec ``array_like=True``:
  a batch is ``[ts, events]`` and each event an array whose first element is its tag (the class name),
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id]``,
  ``["BlockRemoved", block_hashes]``, ``["AllBlocksCleared"]``. Later releases append ``medium`` to
  both and ``data_parallel_rank`` to the batch (``[ts, events, data_parallel_rank]``).
- commit 0181ea3173e53eea8cf04a86891488e3dc89bb34 (main, 2026) dropped ``array_like``: a batch is a map
  ``{"ts", "events", "data_parallel_rank"}`` and each event a map tagged ``"type": "BlockStored"``, with
  ``lora_name``, ``extra_keys``, ``group_idx`` and the cache-spec fields after ``medium``.

``decode_batch`` reads both shapes, field by position or by name (``lora_name``, ``extra_keys`` and
``group_idx`` too, at their places in main's order), and ignores fields it does not know.
``encode_batch`` writes the array form with ``medium`` and ``data_parallel_rank`` (what the releases that
llm-d's kv-cache-manager reads send), for the simulated engine. A block hash is an int (64-bit) or
bytes, as vLLM's ``ExternalBlockHash``; a token id is an int.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEvent",
    "KVEventError",
    "decode_batch",
    "decode_sequence",
    "encode_batch",
    "encode_message",
]

BlockHash = int | bytes
MEDIUM_GPU: Final = "GPU"


class KVEventError(ValueError):
    """A message that is not a KV event batch as vLLM encodes it."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks the engine computed and cached: ``token_ids`` holds all of them, ``block_size`` each, in order;
    the first one's parent is ``parent_block_hash`` (None: it starts a prompt)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    salted: bool = False
    """Some block's ``extra_keys`` entry is set: its hash covers more than its tokens (images, a cache
    salt, prompt embeddings), which a prompt's tokens alone cannot meet."""
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


_STORED_FIELDS: Final = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS: Final = ("block_hashes", "medium", "group_idx")


def decode_sequence(frame: bytes) -> int:
    """A message's sequence frame: 8 bytes, big-endian."""
    if len(frame) != 8:
        raise KVEventError(f"a sequence frame is 8 bytes, not {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(payload: bytes) -> EventBatch:
    """A batch from its msgpack payload; raises ``KVEventError`` if it is not one."""
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except ValueError as exc:  # msgpack's own errors (truncated, extra data, bad format) are ValueErrors
        raise KVEventError(f"not msgpack: {exc}") from None
    if isinstance(doc, list) and len(doc) >= 2:
        ts, events, rank = doc[0], doc[1], doc[2] if len(doc) > 2 else None
    elif isinstance(doc, dict):
        ts, events, rank = doc.get("ts"), doc.get("events"), doc.get("data_parallel_rank")
    else:
        raise KVEventError("a batch is an array [ts, events, ...] or a map")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(events, list):
        raise KVEventError("a batch needs a number ts and a list of events")
    return EventBatch(float(ts), tuple(_event(e) for e in events), rank if isinstance(rank, int) else None)


def _fields(raw: Any, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        return raw[0], dict(zip(names, raw[1:], strict=False))
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"], raw
    raise KVEventError("an event is an array or a map tagged with its type")


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if not isinstance(value, list) or not all(_is_hash(h) for h in value):
        raise KVEventError("block_hashes must be a list of ints or bytes")
    return tuple(value)


def _is_hash(value: Any) -> bool:
    return isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool))


def _event(raw: Any) -> KVEvent:
    tag, _ = _fields(raw, ())
    if tag == "BlockStored":
        _, f = _fields(raw, _STORED_FIELDS)
        parent = f.get("parent_block_hash")
        tokens = f.get("token_ids")
        size = f.get("block_size")
        if parent is not None and not _is_hash(parent):
            raise KVEventError("parent_block_hash must be an int, bytes or nil")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise KVEventError("token_ids must be a list of ints")
        if not isinstance(size, int) or size < 1:
            raise KVEventError("block_size must be a positive int")
        lora = f.get("lora_id")
        medium = f.get("medium")
        lora_name = f.get("lora_name")
        extra = f.get("extra_keys")
        group = f.get("group_idx")
        return BlockStored(
            _hashes(f.get("block_hashes")),
            parent,
            tuple(tokens),
            size,
            lora if isinstance(lora, int) else None,
            medium if isinstance(medium, str) else None,
            lora_name if isinstance(lora_name, str) else None,
            isinstance(extra, list) and any(k is not None for k in extra),
            group if isinstance(group, int) else None,
        )
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED_FIELDS)
        medium = f.get("medium")
        group = f.get("group_idx")
        return BlockRemoved(
            _hashes(f.get("block_hashes")),
            medium if isinstance(medium, str) else None,
            group if isinstance(group, int) else None,
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise KVEventError(f"unknown event type {tag!r}")


def _encoded(event: KVEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            event.lora_id,
            event.medium,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    return ["AllBlocksCleared"]


def encode_batch(batch: EventBatch) -> bytes:
    """The msgpack payload of ``batch``, in the array form (see the module's docstring)."""
    body = [batch.ts, [_encoded(e) for e in batch.events], batch.data_parallel_rank]
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def encode_message(topic: bytes, sequence: int, batch: EventBatch) -> tuple[bytes, bytes, bytes]:
    """The three frames vLLM's ``ZmqEventPublisher`` sends for one batch."""
    return topic, sequence.to_bytes(8, "big"), encode_batch(batch)
