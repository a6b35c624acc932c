"""The simulated engine's sans-I/O core: prefix hits in whole chained blocks, LRU eviction that spares running
sequences, FIFO admission by batch size and KV room, chunked prefill, the step-time model, and an answer
that comes back next turn as a cached prefix. Times are passed in; nothing sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.mockengine.sim import Engine, Sequence, SimConfig, State, answer_text, render_chat, tokens_in

BT = 4  # tokens per block in these tests: 16 bytes
BB = BT * 4


def engine(**knobs: Any) -> Engine:
    knobs = {"block_tokens": BT, "step_ms": 10.0, "seq_ms": 1.0, "prefill_ms": 0.5, **knobs}
    return Engine(SimConfig(**knobs))


def run_all(e: Engine, now: float = 0.0) -> float:
    """Step ``e`` until idle; the simulated time it took."""
    while (step := e.plan()) is not None:
        now += step.duration
        e.commit(step, now)
    return now


def submit(e: Engine, prompt: bytes, out: int = 2) -> Sequence:
    seq = e.sequence("m", prompt, out, 0.0)
    e.submit(seq)
    return seq


def test_tokens_are_four_bytes_and_a_partial_one_counts() -> None:
    assert [tokens_in(b"x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_the_chat_rendering_follows_the_template() -> None:
    rendered = render_chat(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]
    )
    assert rendered == b"<|system|>\nbe brief\n<|user|>\nab\n<|assistant|>\n"


def test_a_second_request_sharing_a_prefix_hits_its_full_blocks() -> None:
    e = engine()
    shared = b"s" * (BB * 5 + 7)  # five full blocks and a bit
    first = submit(e, shared + b"first question")
    run_all(e)
    assert first.state is State.FINISHED and first.cached_tokens == 0
    second = submit(e, shared + b"another question")
    run_all(e)
    assert second.cached_tokens == 5 * BT
    assert second.prompt_tokens == tokens_in(shared + b"another question")
    # Only the tokens past the hit were prefilled.
    assert e.stats.prefilled_tokens == first.prompt_tokens + second.prompt_tokens - 5 * BT
    queried = first.prompt_tokens + second.prompt_tokens
    assert (e.stats.queried_tokens, e.stats.cached_tokens) == (queried, 5 * BT)


def test_a_hit_is_chained_a_block_matches_only_after_the_same_prefix() -> None:
    e = engine()
    submit(e, b"a" * BB + b"b" * BB + b"tail")
    run_all(e)
    # The same second block after a different first one is not a hit.
    other = submit(e, b"c" * BB + b"b" * BB + b"tail")
    run_all(e)
    assert other.cached_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    e = engine()
    prompt = b"p" * (BB * 3)  # exactly three blocks
    submit(e, prompt)
    run_all(e)
    again = submit(e, prompt)
    run_all(e)
    assert again.cached_tokens == 2 * BT  # vLLM leaves at least one token to compute: the last block


def test_the_answer_sent_back_next_turn_is_a_cached_prefix() -> None:
    e = engine()
    turn1 = [{"role": "user", "content": "tell me about dragons and the knights who fought them"}]
    seq = submit(e, render_chat(turn1), out=9)
    run_all(e)
    answer = seq.answer[: seq.generated * 4]
    assert seq.generated == 9 and len(answer.encode()) == 36 and answer == answer.strip()
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    prompt2 = render_chat(turn2)
    assert prompt2.startswith(render_chat(turn1) + answer.encode())
    nxt = submit(e, prompt2)
    run_all(e)
    assert nxt.cached_tokens == (len(render_chat(turn1)) + 36) // BB * BT
    assert nxt.cached_tokens > seq.prompt_tokens  # the answer's blocks were hits too


def test_the_answer_is_deterministic_and_made_of_the_prompts_words() -> None:
    prompt = render_chat([{"role": "user", "content": "alpha beta gamma delta"}])
    text = answer_text(prompt, 20)
    assert text == answer_text(prompt, 20) and len(text) == 80
    # Whole words, but the last may be cut (and a trailing space becomes a full stop).
    *words, last = text.split()
    assert set(words) <= {"alpha", "beta", "gamma", "delta"}
    assert any(w.startswith(last.rstrip(".")) for w in ("alpha", "beta", "gamma", "delta"))


def test_lru_eviction_drops_the_oldest_unpinned_blocks_and_never_a_running_sequences() -> None:
    e = engine(cache_blocks=8, batch=4, chunk_tokens=16)
    old = submit(e, b"o" * BB * 2 + b"x", out=1)  # 9 tokens + 1 out: 3 blocks reserved, 2 full cached
    run_all(e)
    newer = submit(e, b"n" * BB * 2 + b"y", out=1)
    run_all(e)
    assert e.used == 4 and e.pinned == 0 and len(e.lru) == 4
    # A running sequence pins its blocks: 3 reserved (9 prompt tokens + 3 out), its 2 full prompt blocks
    # go into the cache when its prefill completes.
    runner = submit(e, b"r" * BB * 2 + b"z", out=3)
    step = e.plan()
    assert step is not None and runner.state is State.RUNNING
    assert e.pinned == 3 and e.used == 7
    # 8 blocks hold the 3 pinned, 4 cached and 1 free; the next needs 2 (5 prompt tokens + 1 out).
    fresh = submit(e, b"f" * BB + b"w", out=1)
    e.commit(step, step.duration)
    step = e.plan()
    assert step is not None and fresh.state is State.RUNNING
    assert e.stats.evictions == 1 and e.used == 8
    assert all(e.cache.get(h) == 1 for h in runner.hashes)  # its two prompt blocks: cached, pinned, kept
    # The oldest finished sequence lost a block: its last, as vLLM frees a chain tail first, so its
    # prefix outlives it. The newer one kept both; the running one is pinned and never a candidate.
    assert old.hashes[0] in e.cache and old.hashes[1] not in e.cache
    assert all(h in e.cache for h in newer.hashes)
    # Now everything unpinned must go for a request of 5 blocks, and the runner's blocks stay.
    run_all(e, step.duration)
    assert all(h in e.cache for h in runner.hashes)
    hog = submit(e, b"h" * BB * 4, out=4)  # 16 + 4 tokens: 5 blocks
    step = e.plan()
    assert step is not None and hog.state is State.RUNNING
    assert old.hashes[0] not in e.cache and e.stats.evictions > 1
    again = submit(e, b"r" * BB * 2 + b"z?", out=1)
    run_all(e, step.duration)
    assert again.cached_tokens == 2 * BT


def test_a_request_waits_until_its_blocks_fit_and_the_queue_stays_fifo() -> None:
    e = engine(cache_blocks=6, batch=8)
    big = submit(e, b"b" * BB * 3, out=4)  # 12 + 4 tokens: 4 blocks
    e.plan()
    second = submit(e, b"s" * BB * 2, out=4)  # 3 blocks: does not fit beside 4 pinned of 6
    small = submit(e, b"t", out=1)  # 1 block would fit, but it is behind the second
    e.plan()
    assert (big.state, second.state, small.state) == (State.RUNNING, State.WAITING, State.WAITING)
    assert len(e.waiting) == 2 and e.stats.max_waiting == 2
    run_all(e)
    assert second.state is small.state is State.FINISHED


def test_a_sequence_that_can_never_fit_is_refused() -> None:
    e = engine(cache_blocks=2)
    with pytest.raises(ValueError, match="KV blocks"):
        e.sequence("m", b"x" * BB * 2, 4, 0.0)


def test_batching_runs_at_most_batch_sequences_and_queues_the_rest() -> None:
    e = engine(batch=2)
    seqs = [submit(e, f"prompt {i}".encode(), out=3) for i in range(3)]
    e.plan()
    assert (len(e.running), len(e.waiting)) == (2, 1)
    assert [s.state for s in seqs] == [State.RUNNING, State.RUNNING, State.WAITING]
    run_all(e)
    assert e.stats.success == 3 and e.used == len(e.lru)


def test_step_time_is_step_plus_seq_per_sequence_plus_prefill_per_token() -> None:
    e = engine(chunk_tokens=10, batch=4)  # 10 ms + 1 ms per sequence + 0.5 ms per prefilled token
    a = submit(e, b"a" * 4 * 6, out=3)  # 6 tokens
    b = submit(e, b"b" * 4 * 7, out=3)  # 7 tokens
    step = e.plan()
    assert step is not None
    # Step 1: a gets all 6 (and emits its first token), b the 4 left of the budget.
    assert [(s, n) for s, n in step.prefill] == [(a, 6), (b, 4)]
    assert step.decode == (a,)
    assert (step.sequences, step.prefilled) == (2, 10)
    assert step.duration == pytest.approx((10 + 1 * 2 + 0.5 * 10) / 1000)
    e.commit(step, step.duration)
    assert (a.generated, b.generated, b.prefilled) == (1, 0, 4)
    assert a.first_token_at == pytest.approx(step.duration)
    # Step 2: a decodes, b finishes its prefill (3 tokens) and emits its first token.
    step = e.plan()
    assert step is not None
    assert step.prefill == ((b, 3),) and step.decode == (a, b)
    assert step.duration == pytest.approx((10 + 1 * 2 + 0.5 * 3) / 1000)
    e.commit(step, 1.0)
    # Step 3: decode only.
    step = e.plan()
    assert step is not None and step.prefilled == 0
    assert step.duration == pytest.approx((10 + 1 * 2) / 1000)
    e.commit(step, 2.0)
    assert a.state is State.FINISHED and b.generated == 2


def test_ttft_is_measured_from_arrival_to_the_first_token() -> None:
    e = engine(chunk_tokens=4)
    seq = e.sequence("m", b"x" * 4 * 8, 1, 100.0)  # 8 tokens: two steps of prefill
    e.submit(seq)
    first = e.plan()
    assert first is not None
    e.commit(first, 100.5)
    assert seq.first_token_at is None
    second = e.plan()
    assert second is not None
    e.commit(second, 101.25)
    assert seq.first_token_at == 101.25 and e.stats.ttft_quantile(0.5) == pytest.approx(1.25)


def test_cancelling_frees_the_sequence_and_its_blocks() -> None:
    e = engine(batch=1)
    running = submit(e, b"r" * BB * 2, out=5)
    waiting = submit(e, b"w", out=5)
    step = e.plan()
    assert step is not None and e.pinned == 4  # 8 + 5 tokens
    e.cancel(waiting)
    e.cancel(running)
    e.commit(step, 1.0)  # the step planned before the cancel changes nothing
    assert running.generated == 0 and e.used == 0 and not e.running and not e.waiting
    assert e.plan() is None
    assert e.stats.cancelled == 2
