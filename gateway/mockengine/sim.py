"""A simulated vLLM engine: prefix cache, continuous-batching scheduler and step-time model. Sans-I/O.

``Engine`` holds the state of one engine: sequences waiting (FIFO) and running (at most ``batch``), and a
KV cache of ``cache_blocks`` blocks of ``block_tokens`` tokens. The caller drives it: ``submit`` a
``Sequence``, then repeatedly ``plan`` a step (admission happens there), wait ``Step.duration`` seconds,
and ``commit`` the step, which advances prefill, emits one token per decoding sequence and finishes
sequences. ``cancel`` frees a sequence whose client went away. Nothing here sleeps, reads a clock or
touches a socket: times are passed in, so tests can check every figure.

Tokens are not real tokens: one token is 4 bytes of the prompt's UTF-8 rendering (``render_chat``), and
a KV block is ``4 * block_tokens`` bytes. Block hashes are chained as vLLM's are (the hash of the
previous block's hash and this block's bytes), so a block is a hit only when everything before it is
too. The prompt is hashed once, on arrival; the answer's blocks once, when the sequence finishes.

Cache accounting: every block is either in the cache (keyed by its hash, with a count of the running
sequences that pin it; unpinned ones sit in an LRU order and are evicted oldest first) or private to a
running sequence (the blocks it reserved for the part of its prompt and answer that was not a hit).
A sequence reserves blocks for its whole prompt and answer on admission, so the engine never preempts;
a waiting sequence is admitted only when those blocks fit beside the pinned ones.

With ``record_events``, the engine notes what vLLM's ``--kv-events-config`` publishes
(``gateway.protocol.kv_events``): ``BlockStored`` when blocks enter the cache (with their token ids, each
4-byte piece of the prompt read as a little-endian integer, or the real ids when the prompt was given as
token ids), ``BlockRemoved`` when eviction takes one, ``AllBlocksCleared`` on ``reset_cache``. The driver
takes them with ``take_events``. A block's published hash is the first 8 bytes of its chained hash.

A prompt may also be given as token ids instead of text: ``pack_tokens`` makes them 4 bytes each, so a
"byte" of the engine's arithmetic is then a quarter of a real token and everything above holds unchanged.
"""

from __future__ import annotations

import enum
import hashlib
import random
import struct
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

__all__ = [
    "BYTES_PER_TOKEN",
    "TTFT_BUCKETS",
    "Engine",
    "Sequence",
    "SimConfig",
    "SimStats",
    "State",
    "Step",
    "answer_text",
    "pack_tokens",
    "render_chat",
    "tokens_in",
    "unpack_tokens",
]

BYTES_PER_TOKEN = 4
# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TTFT_KEPT = 4096  # recent first-token times kept for the percentiles in /mock/stats
_FALLBACK_WORDS = ("tok",)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The knobs; the CLI's ``--sim-*`` flags, with the same defaults."""

    batch: int = 16
    block_tokens: int = 16
    cache_blocks: int = 2048
    chunk_tokens: int = 512
    step_ms: float = 15.0
    seq_ms: float = 0.2
    prefill_ms: float = 0.05
    output_tokens: int | None = None
    """Completion length; ``None``: the request's ``max_tokens``, else the mock's ``--tokens``."""

    def __post_init__(self) -> None:
        for name in ("batch", "block_tokens", "cache_blocks", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"sim {name} must be at least 1")
        if min(self.step_ms, self.seq_ms, self.prefill_ms) < 0:
            raise ValueError("sim step times must not be negative")
        if self.output_tokens is not None and self.output_tokens < 0:
            raise ValueError("sim output tokens must not be negative")

    def step_seconds(self, sequences: int, prefilled: int) -> float:
        """The step-time model: step + seq * sequences + prefill * tokens prefilled, in seconds."""
        return (self.step_ms + self.seq_ms * sequences + self.prefill_ms * prefilled) / 1000.0


def tokens_in(data: bytes) -> int:
    """Tokens in ``data``: one per 4 bytes, a last partial one counting as a whole."""
    return -(-len(data) // BYTES_PER_TOKEN)


def pack_tokens(ids: Seq[int]) -> bytes:
    """Token ids as the engine's prompt bytes: 4 bytes each, little-endian."""
    return struct.pack(f"<{len(ids)}I", *ids)


def unpack_tokens(data: bytes) -> list[int]:
    """``pack_tokens``'s inverse (a last partial piece is left out)."""
    return list(struct.unpack(f"<{len(data) // 4}I", data[: len(data) // 4 * 4]))


def published_hash(h: bytes) -> int:
    """A block's hash as the engine publishes it in KV events: a 64-bit int (vLLM's ``ExternalBlockHash``)."""
    return int.from_bytes(h[:8], "big")


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def render_chat(messages: Iterable[Mapping[str, Any]]) -> bytes:
    """The prompt as a chat template would render it: ``<|ROLE|>\\n`` + text + ``\\n`` per message, then
    the generation prompt ``<|assistant|>\\n``."""
    parts = []
    for m in messages:
        role = m.get("role")
        parts.append(f"<|{role if isinstance(role, str) else 'user'}|>\n{_text_of(m.get('content'))}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts).encode()


def answer_text(prompt: bytes, tokens: int) -> str:
    """``tokens`` four-byte ASCII pieces made of words from the prompt, chosen by a seed from its hash.

    ASCII keeps every piece exactly 4 bytes, so the answer sent back as an assistant message renders to
    the same bytes (and blocks) the engine cached. It neither starts nor ends with a space, which
    clients tend to strip.
    """
    if tokens <= 0:
        return ""
    seed = int.from_bytes(hashlib.blake2b(prompt, digest_size=8).digest(), "big")
    words = [w for w in prompt.decode(errors="replace").split()[-256:] if w.isascii() and "<|" not in w]
    rng = random.Random(seed)
    pool: Seq[str] = words or _FALLBACK_WORDS
    want = tokens * BYTES_PER_TOKEN
    out: list[str] = []
    size = 0
    while size <= want:  # size counts a space after each word; the joined text has one fewer
        word = rng.choice(pool)
        out.append(word)
        size += len(word) + 1
    text = " ".join(out)[:want]
    if text[-1] == " ":
        text = text[:-1] + "."
    return text


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine. ``listener`` is the driver's (what to wake when it progresses)."""

    model: str
    prompt: bytes
    prompt_tokens: int
    output_tokens: int
    answer: str
    hashes: list[bytes]
    """Chained hashes of the prompt's full blocks."""
    arrival: float
    state: State = State.WAITING
    cached_tokens: int = 0
    prefilled: int = 0
    """Prompt tokens computed so far, the cached ones included."""
    generated: int = 0
    first_token_at: float | None = None
    held: list[bytes] = field(default_factory=list)
    """Cache blocks this sequence pins, in prompt order."""
    pieces: Seq[str] | None = None
    """Given token ids: each answer token's text (``answer_ids`` holds the ids, packed)."""
    answer_ids: bytes = b""
    private: int = 0
    """Reserved blocks not (yet) in the cache."""
    listener: Any = None

    @property
    def done(self) -> bool:
        return self.state is State.FINISHED or self.state is State.CANCELLED

    def piece(self, i: int) -> str:
        """The text of generated token ``i``."""
        if self.pieces is not None:
            return self.pieces[i]
        return self.answer[i * BYTES_PER_TOKEN : (i + 1) * BYTES_PER_TOKEN]

    def text(self) -> str:
        """The answer generated so far."""
        if self.pieces is not None:
            return "".join(self.pieces[: self.generated])
        return self.answer[: self.generated * BYTES_PER_TOKEN]

    def generated_data(self) -> bytes:
        """The generated tokens as the engine's bytes (what the answer's blocks are hashed over)."""
        if self.pieces is not None:
            return self.answer_ids[: self.generated * BYTES_PER_TOKEN]
        return self.answer[: self.generated * BYTES_PER_TOKEN].encode()


@dataclass(frozen=True, slots=True)
class Step:
    """What one step does: prompt tokens given to each prefilling sequence, and who emits a token."""

    duration: float
    """Seconds, from ``SimConfig.step_seconds``."""
    prefill: tuple[tuple[Sequence, int], ...]
    decode: tuple[Sequence, ...]
    sequences: int
    prefilled: int


@dataclass(slots=True)
class SimStats:
    requests: int = 0
    prompt_tokens: int = 0
    queried_tokens: int = 0
    """Prompt tokens of admitted sequences: what the prefix cache was asked for."""
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    generation_tokens: int = 0
    success: int = 0
    cancelled: int = 0
    max_waiting: int = 0
    """Most requests waiting at once, not counting arrivals an idle engine admits at its next step."""
    evictions: int = 0
    ttft_count: int = 0
    ttft_sum: float = 0.0
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_recent: deque[float] = field(default_factory=lambda: deque(maxlen=_TTFT_KEPT))

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_count += 1
        self.ttft_sum += seconds
        self.ttft_recent.append(seconds)
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_buckets[i] += 1
                break

    def ttft_quantile(self, q: float) -> float | None:
        if not self.ttft_recent:
            return None
        ordered = sorted(self.ttft_recent)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Engine:
    def __init__(self, config: SimConfig, record_events: bool = False) -> None:
        self.config = config
        self.block_bytes = config.block_tokens * BYTES_PER_TOKEN
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cache: dict[bytes, int] = {}
        """Block hash -> how many running sequences pin it."""
        self.lru: OrderedDict[bytes, None] = OrderedDict()
        """Unpinned cached blocks, least recently used first: what eviction takes."""
        self.used = 0
        """Blocks in use: cached ones plus running sequences' private ones."""
        self.stats = SimStats()
        self.events: list[KVEvent] | None = [] if record_events else None
        """What the cache did since ``take_events``, as vLLM's KV events; None: not recorded."""

    def take_events(self) -> list[KVEvent]:
        """The KV events recorded since the last call (none when not recorded)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    def reset_cache(self) -> bool:
        """Drop every cached block no running sequence pins, as vLLM's ``reset_prefix_cache`` does (and
        what an engine restart does to all of them): False, and nothing done, while sequences run."""
        if self.running:
            return False
        self.used -= len(self.cache)
        self.cache.clear()
        self.lru.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())
        return True

    # -- sequences -------------------------------------------------------------------------------

    def sequence(
        self,
        model: str,
        prompt: bytes,
        output_tokens: int,
        now: float,
        answer: tuple[bytes, Seq[str]] | None = None,
    ) -> Sequence:
        """A new sequence for ``prompt`` (hashed here, once). Raises ``ValueError`` if it can never fit.
        ``answer``: the answer's packed token ids and their texts, when the prompt is token ids."""
        tokens = tokens_in(prompt)
        if self._blocks_for(tokens + output_tokens) > self.config.cache_blocks:
            raise ValueError(
                f"{tokens} prompt tokens and {output_tokens} output tokens need more than the "
                f"{self.config.cache_blocks} KV blocks of this engine"
            )
        return Sequence(
            model=model,
            prompt=prompt,
            prompt_tokens=tokens,
            output_tokens=output_tokens,
            answer=answer_text(prompt, output_tokens) if answer is None else "",
            hashes=self._chain(b"", prompt, 0, len(prompt) // self.block_bytes),
            arrival=now,
            pieces=answer[1] if answer is not None else None,
            answer_ids=answer[0] if answer is not None else b"",
        )

    def submit(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += seq.prompt_tokens
        if self.running:  # mid-step: it waits at least until the next one (an idle engine admits at once)
            stats.max_waiting = max(stats.max_waiting, len(self.waiting))

    def cancel(self, seq: Sequence) -> None:
        """The client went away: drop the sequence, keeping what it put in the cache."""
        if seq.state is State.WAITING:
            self.waiting.remove(seq)
        elif seq.state is State.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        else:
            return
        seq.state = State.CANCELLED
        self.stats.cancelled += 1

    # -- steps -----------------------------------------------------------------------------------

    def plan(self) -> Step | None:
        """Admit what fits and decide the next step; ``None`` when there is nothing to do."""
        self._admit()
        # Counted after admission: a request admitted at the next step never waited.
        self.stats.max_waiting = max(self.stats.max_waiting, len(self.waiting))
        if not self.running:
            return None
        budget = self.config.chunk_tokens
        prefill: list[tuple[Sequence, int]] = []
        decode: list[Sequence] = []
        prefilled = 0
        for seq in self.running:  # oldest first
            left = seq.prompt_tokens - seq.prefilled
            if left > 0:
                give = min(left, budget)
                if give == 0:
                    continue
                budget -= give
                prefilled += give
                prefill.append((seq, give))
                if give == left and seq.output_tokens > 0:
                    decode.append(seq)  # the first token comes in the step its prefill completes
            elif seq.generated < seq.output_tokens:
                decode.append(seq)
        sequences = len(prefill) + sum(1 for s in decode if s.prefilled == s.prompt_tokens)
        return Step(
            self.config.step_seconds(sequences, prefilled),
            tuple(prefill),
            tuple(decode),
            sequences,
            prefilled,
        )

    def commit(self, step: Step, now: float) -> list[Sequence]:
        """Apply a planned step that ended at ``now``; the sequences that emitted a token or finished."""
        stats = self.stats
        touched: list[Sequence] = []
        for seq, give in step.prefill:
            if seq.state is not State.RUNNING:
                continue  # cancelled during the step
            seq.prefilled += give
            stats.prefilled_tokens += give
            if seq.prefilled == seq.prompt_tokens:
                self._register(seq, seq.hashes[len(seq.held) :], seq.prompt)
                if seq.output_tokens == 0:
                    self._finish(seq)
                    touched.append(seq)
        for seq in step.decode:
            if seq.state is not State.RUNNING:
                continue
            seq.generated += 1
            stats.generation_tokens += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                stats.observe_ttft(now - seq.arrival)
            if seq.generated == seq.output_tokens:
                self._finish(seq)
            touched.append(seq)
        if any(s.state is not State.RUNNING for s in self.running):
            self.running = [s for s in self.running if s.state is State.RUNNING]
        return touched

    # -- cache -----------------------------------------------------------------------------------

    @property
    def pinned(self) -> int:
        return self.used - len(self.lru)

    def usage(self) -> float:
        """``vllm:kv_cache_usage_perc``: pinned blocks over capacity."""
        return self.pinned / self.config.cache_blocks

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_tokens)

    def _chain(self, previous: bytes, data: bytes, start: int, end: int) -> list[bytes]:
        """Chained hashes of blocks ``start`` to ``end`` of ``data``, ``previous`` being block start-1's."""
        size = self.block_bytes
        out = []
        for i in range(start, end):
            previous = hashlib.blake2b(previous + data[i * size : (i + 1) * size], digest_size=16).digest()
            out.append(previous)
        return out

    def _admit(self) -> None:
        config = self.config
        while self.waiting and len(self.running) < config.batch:
            seq = self.waiting[0]
            # vLLM leaves at least the last prompt token to compute, so a hit is at most tokens - 1.
            most = (seq.prompt_tokens - 1) // config.block_tokens
            hits = 0
            hits_unpinned = 0
            for h in seq.hashes[:most]:
                if h not in self.cache:
                    break
                hits += 1
                hits_unpinned += h in self.lru
            new = self._blocks_for(seq.prompt_tokens + seq.output_tokens) - hits
            free = config.cache_blocks - self.used
            if new > free + len(self.lru) - hits_unpinned:
                break  # FIFO: the head waits for room, and so does everything behind it
            self.waiting.popleft()
            for h in seq.hashes[:hits]:
                self._pin(h)
            seq.held = seq.hashes[:hits]
            removed = []
            for _ in range(new - free):
                evicted, _none = self.lru.popitem(last=False)
                del self.cache[evicted]
                self.used -= 1
                self.stats.evictions += 1
                removed.append(published_hash(evicted))
            if removed and self.events is not None:
                self.events.append(BlockRemoved(tuple(removed)))
            seq.private = new
            self.used += new
            seq.cached_tokens = seq.prefilled = hits * config.block_tokens
            seq.state = State.RUNNING
            self.running.append(seq)
            self.stats.queried_tokens += seq.prompt_tokens
            self.stats.cached_tokens += seq.cached_tokens

    def _pin(self, h: bytes) -> None:
        count = self.cache[h]
        if count == 0:
            del self.lru[h]
        self.cache[h] = count + 1

    def _register(self, seq: Sequence, hashes: Seq[bytes], data: bytes) -> None:
        """Put ``seq``'s newly computed full blocks in the cache, pinned by it: ``hashes`` are those of the
        blocks of ``data`` that follow the ones it holds."""
        size = self.block_bytes
        run: list[bytes] = []  # blocks new to the cache, published as one BlockStored each run
        run_start = 0
        for h in hashes:
            seq.private -= 1
            if h in self.cache:
                self._pin(h)  # another sequence computed the same block meanwhile: share it
                self.used -= 1
                self._publish_stored(seq, run, run_start, data, size)
                run = []
            else:
                self.cache[h] = 1
                if not run:
                    run_start = len(seq.held)
                run.append(h)
            seq.held.append(h)
        self._publish_stored(seq, run, run_start, data, size)

    def _publish_stored(self, seq: Sequence, run: list[bytes], start: int, data: bytes, size: int) -> None:
        if not run or self.events is None:
            return
        piece = data[start * size : (start + len(run)) * size]
        self.events.append(
            BlockStored(
                tuple(published_hash(h) for h in run),
                published_hash(seq.held[start - 1]) if start > 0 else None,
                struct.unpack(f"<{len(piece) // 4}I", piece),
                self.config.block_tokens,
            )
        )

    def _finish(self, seq: Sequence) -> None:
        full = (len(seq.prompt) + seq.generated * BYTES_PER_TOKEN) // self.block_bytes
        start = len(seq.hashes)
        if full > start:
            data = seq.prompt + seq.generated_data()
            self._register(seq, self._chain(seq.hashes[-1] if seq.hashes else b"", data, start, full), data)
        seq.state = State.FINISHED
        self.stats.success += 1
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        # Last block first, as vLLM frees them: a prefix outlives the blocks that extend it.
        for h in reversed(seq.held):
            count = self.cache[h] - 1
            self.cache[h] = count
            if count == 0:
                self.lru[h] = None
        seq.held = []
        self.used -= seq.private
        seq.private = 0
