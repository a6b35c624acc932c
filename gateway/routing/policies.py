"""Target-selection policies: each orders a list of candidate targets, best first; the rest of the order is
the fallback the forwarder walks if the first fails.

- ``round_robin``: rotate by one per request.
- ``weighted``: smooth weighted round robin (the first pick follows the weights exactly over any window of
  sum-of-weights requests), the others after it in their configured order.
- ``least_inflight``: fewest requests in flight on the host (shared across workers), rotation breaking ties.
- ``prefix_affinity``: rendezvous hashing of the first ``prefix_bytes`` of the raw request body against
  each backend's name: the same prefix picks the same backend in every worker and on every host, and a
  backend that joins or leaves moves only the prefixes it wins or held. When the chosen backend is at its
  ceiling (the pool's ``max_inflight`` or the gate's current ceiling) the least-loaded of the others goes
  first instead.
- ``engine_load``: fewest ``num_requests_waiting``, then fewest running, then least KV-cache use, from the
  engines' own metrics; running is the host's own in-flight count (exact now) plus the other hosts' share
  of the engine's requests (a scrape old), and a backend without metrics is ranked by the in-flight count
  alone.
- ``cache_aware``: the backend whose engine most likely holds the longest prefix of this prompt, weighed
  against its load. The prompt is rendered as the engine sees it (``gateway.routing.prompt_prefix``) and
  cut into ``block_bytes`` blocks with chained hashes; the host's ``PrefixIndex`` says how many leading
  blocks each backend was sent before. Each target costs the bytes it would have to prefill (the prompt
  less its matched blocks) plus ``load_cost`` bytes per request ahead of it (this host's in flight, exact,
  the other hosts' share of the engine's requests, and the engine's waiting queue). The balance rule
  comes first: a target loaded more than ``balance_abs`` requests above the least-loaded and more than
  ``balance_rel`` times it goes after every target that is not. Cheapest first; equal costs to the target
  the index holds least for (the most room in its engine's cache, the same in every worker), then in turn.
  The chosen target's blocks are then noted in the index.
  With a ``tokenizer`` (a model directory), a target whose backend publishes KV events (``kv_events``)
  is matched against the exact pairs instead: what its engine said it caches, mirrored by the host's
  control slot (``gateway.routing.kv_mirror``), looked up with the prompt's token ids as the engine
  tokenizes them (``gateway.routing.chat_tokenizer``). Its matched tokens count as the same share of the
  rendered prompt's bytes (``size * matched_tokens / prompt_tokens``), so that the cost stays in one unit
  across targets read from either side. A body the tokenizer cannot read falls back to the approximate
  pairs for every target.

State (rotation counters, weights' credit) is per worker and per snapshot generation. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blake3 import blake3

from gateway.routing.kv_mirror import BLOCK_TOKENS, exact_key, prompt_blocks
from gateway.routing.load import EngineState, Load
from gateway.routing.prompt_prefix import rendered_prompt

if TYPE_CHECKING:
    from gateway.routing.chat_tokenizer import ChatTokenizer
    from gateway.routing.targets import Target

__all__ = ["POLICIES", "CacheTuning", "Policy", "backend_hash", "engine_load", "make_policy", "target_hash"]

POLICIES = ("round_robin", "weighted", "least_inflight", "prefix_affinity", "engine_load", "cache_aware")
DEFAULT_PREFIX_BYTES = 512
_MASK = (1 << 64) - 1


def backend_hash(name: str) -> int:
    return int.from_bytes(blake3(name.encode()).digest(8), "little")


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit mix for rendezvous scores."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


class Policy:
    """Orders ``targets`` (a tuple fixed at construction) for one request."""

    __slots__ = ("cursor", "name", "targets")

    def __init__(self, name: str, targets: tuple[Target, ...]) -> None:
        self.name = name
        self.targets = targets
        self.cursor = 0

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        raise NotImplementedError

    def _rotated(self) -> tuple[Target, ...]:
        targets = self.targets
        n = len(targets)
        i = self.cursor % n
        self.cursor = i + 1
        return targets[i:] + targets[:i]


class RoundRobin(Policy):
    __slots__ = ()

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        return self._rotated()


class Weighted(Policy):
    __slots__ = ("credit", "total", "weights")

    def __init__(self, name: str, targets: tuple[Target, ...], weights: Sequence[int]) -> None:
        super().__init__(name, targets)
        self.weights = tuple(weights)
        self.total = sum(self.weights)
        self.credit = [0] * len(targets)

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        credit, weights = self.credit, self.weights
        best = 0
        for i, w in enumerate(weights):
            credit[i] += w
            if credit[i] > credit[best]:
                best = i
        credit[best] -= self.total
        targets = self.targets
        return (targets[best], *targets[:best], *targets[best + 1 :])


class LeastInFlight(Policy):
    __slots__ = ()

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        ranked = sorted(self.targets, key=lambda t: load.in_flight(t.backend.name))
        low = load.in_flight(ranked[0].backend.name)
        ties = [t for t in ranked if load.in_flight(t.backend.name) == low]
        if len(ties) > 1:  # spread equal loads in turn rather than always to the first configured
            pick = ties[self.cursor % len(ties)]
            self.cursor += 1
            ranked.remove(pick)
            ranked.insert(0, pick)
        return tuple(ranked)


class PrefixAffinity(Policy):
    __slots__ = ("hashes", "max_inflight", "prefix_bytes")

    def __init__(
        self, name: str, targets: tuple[Target, ...], prefix_bytes: int, max_inflight: int | None
    ) -> None:
        super().__init__(name, targets)
        self.prefix_bytes = prefix_bytes
        self.max_inflight = max_inflight
        self.hashes = tuple(backend_hash(t.backend.name) for t in targets)

    def ranked(self, body: bytes) -> tuple[Target, ...]:
        """Every target by its rendezvous score for this body's prefix, highest first."""
        h = int.from_bytes(blake3(body[: self.prefix_bytes]).digest(8), "little")
        scores = [_mix(h ^ bh) for bh in self.hashes]
        order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
        return tuple(self.targets[i] for i in order)

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        ranked = self.ranked(body)
        chosen = ranked[0].backend.name
        ceiling = self.max_inflight
        if ceiling is None:
            state = load.engine(chosen)
            ceiling = state.ceiling if state is not None else None
        if ceiling is not None and load.in_flight(chosen) >= ceiling:
            rest = sorted(ranked[1:], key=lambda t: load.in_flight(t.backend.name))
            return (*rest, ranked[0])
        return ranked


class EngineLoad(Policy):
    __slots__ = ()

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        def rank(target: Target) -> tuple[int, int, float]:
            name = target.backend.name
            state = load.engine(name)
            flying = load.in_flight(name)
            if state is None or state.waiting is None:
                return (0, flying, 0.0)
            return (state.waiting, running_now(state, flying), state.kv_cache or 0.0)

        return tuple(sorted(self._rotated(), key=rank))


@dataclass(frozen=True, slots=True)
class CacheTuning:
    """``cache_aware``'s knobs (the pool's fields of the same names)."""

    block_bytes: int = 64  # about 16 tokens: an engine's KV block
    load_cost: int = 1024  # bytes of prefill one request in flight is worth
    balance_abs: int = 32
    balance_rel: float = 1.5


def target_hash(target: Target) -> int:
    """What names a target in the prefix index: its backend and the model it is asked for there (an engine
    caches per model)."""
    name = f"{target.backend.name}\0{target.upstream_model}".encode()
    return int.from_bytes(blake3(name).digest(8), "little")


def running_now(state: EngineState, flying: int) -> int:
    """The requests an engine holds now, as this host can tell: its own in flight (``flying``, exact now)
    plus the other hosts' share of what the engine held at the last scrape (its running and waiting
    requests less this host's in flight at that moment: this host's requests queued in the engine are in
    its in-flight count too). A scrape that did not note this host's share gives the larger of the running
    count and ``flying``: that keeps a burst between scrapes off one engine, and still sees other hosts'
    requests."""
    running = state.running or 0
    if state.host_in_flight is not None:
        others = running + (state.waiting or 0) - state.host_in_flight
        return flying + others if others > 0 else flying
    return running if running > flying else flying


def engine_load(target: Target, load: Load) -> int:
    """Requests ahead of a new one on ``target``'s engine: those it runs now (``running_now``) plus its
    waiting queue; this host's in flight alone for a backend without engine metrics."""
    name = target.backend.name
    flying = load.in_flight(name)
    state = load.engine(name)
    if state is None or state.waiting is None:
        return flying
    return running_now(state, flying) + state.waiting


def _epoch_key(key: int, state: EngineState | None) -> int:
    """A target's name in the prefix index for its engine's current process: after a restart the scraper
    gives the engine a new epoch, and what the index holds under the old name no longer matches."""
    if state is None or not state.epoch:
        return key
    return int.from_bytes(
        blake3(key.to_bytes(8, "little") + state.epoch.to_bytes(8, "little")).digest(8), "little"
    )


class CacheAware(Policy):
    __slots__ = ("exact_keys", "keys", "tokenizer", "tuning")

    def __init__(
        self,
        name: str,
        targets: tuple[Target, ...],
        tuning: CacheTuning,
        tokenizer: ChatTokenizer | None = None,
    ) -> None:
        super().__init__(name, targets)
        self.tuning = tuning
        self.keys = tuple(target_hash(t) for t in targets)
        # Per target, the key of its backend's exact pairs; 0: read the approximate ones.
        self.exact_keys = tuple(
            exact_key(t.backend.name) if tokenizer is not None and t.backend.kv_events else 0 for t in targets
        )
        self.tokenizer = tokenizer if any(self.exact_keys) else None

    def order(self, body: bytes, load: Load) -> tuple[Target, ...]:
        targets, tuning = self.targets, self.tuning
        keys = [_epoch_key(k, load.engine(t.backend.name)) for k, t in zip(self.keys, targets, strict=True)]
        n = len(targets)
        start = self.cursor % n
        self.cursor = start + 1
        index = load.prefix_index()
        prompt = rendered_prompt(body) if index is not None else b""
        blocks = index.blocks(prompt, tuning.block_bytes) if index is not None and prompt else None
        block = tuning.block_bytes
        loads = [engine_load(t, load) for t in targets]
        usable = [load.available(t.backend.name) for t in targets] if load.degraded else [True] * n
        low = min((x for x, ok in zip(loads, usable, strict=True) if ok), default=0)
        hot_above = max(low + tuning.balance_abs, low * tuning.balance_rel)
        size = len(prompt)
        matched = [0] * n
        exact = None
        tokenized = self.tokenizer.request_prompt(body) if self.tokenizer and blocks is not None else None
        if tokenized is not None and tokenized.ids and index is not None:
            exact = prompt_blocks(index, tokenized.ids)
            # bytes of the rendered prompt per matched token: its share of the prompt, in the same unit
            per_token = size * tokenized.share / len(tokenized.ids)
        exact_keys = self.exact_keys
        ranks = []
        for i in range(n):
            if exact is not None and exact_keys[i]:
                assert index is not None
                matched[i] = min(size, int(index.match(exact, exact_keys[i]) * BLOCK_TOKENS * per_token))
            elif index is not None and blocks is not None:
                matched[i] = index.match(blocks, keys[i]) * block
            cost = size - matched[i] + tuning.load_cost * loads[i]
            # Equal costs (often: a prompt no target holds, equal loads) go where the index holds least,
            # the engine with the most room, as every worker sees it; then in turn.
            room = index.held(keys[i]) if index is not None else 0
            ranks.append((not usable[i], loads[i] > hot_above, cost, room, (i - start) % n))
        order = sorted(range(n), key=ranks.__getitem__)
        best = order[0]
        if index is not None and blocks is not None and usable[best]:
            if blocks.count:
                index.insert(blocks, keys[best])
            if exact is not None and exact_keys[best]:
                index.count_exact(matched[best] > 0)
            load.note_prefix(targets[best].backend.name, size, matched[best])
        return tuple(targets[i] for i in order)


def make_policy(
    name: str,
    targets: tuple[Target, ...],
    weights: Sequence[int] = (),
    prefix_bytes: int = DEFAULT_PREFIX_BYTES,
    max_inflight: int | None = None,
    tuning: CacheTuning | None = None,
    tokenizer: ChatTokenizer | None = None,
) -> Policy:
    if not targets:
        raise ValueError("a policy needs at least one target")
    if name == "round_robin":
        return RoundRobin(name, targets)
    if name == "weighted":
        return Weighted(name, targets, weights or [1] * len(targets))
    if name == "least_inflight":
        return LeastInFlight(name, targets)
    if name == "prefix_affinity":
        return PrefixAffinity(name, targets, prefix_bytes, max_inflight)
    if name == "engine_load":
        return EngineLoad(name, targets)
    if name == "cache_aware":
        return CacheAware(name, targets, tuning or CacheTuning(), tokenizer)
    raise ValueError(f"unknown policy {name!r}")
