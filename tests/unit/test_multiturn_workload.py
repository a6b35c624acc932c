"""The routing-quality benchmark's workload (perf.multiturn): the same seed gives the same sessions, another
seed other ones, and its shape is the documented one, so the benchmark's workload cannot silently change."""

from __future__ import annotations

import hashlib

from perf.multiturn import (
    ANSWER_TOKENS,
    BYTES_PER_TOKEN,
    SYSTEM_TOKENS,
    TURNS,
    USER_TOKENS,
    Workload,
    make_workload,
    rendered_tokens,
    working_set_tokens,
)


def _digest(w: Workload) -> str:
    h = hashlib.sha256()
    for text in w.systems:
        h.update(text.encode())
    for s in w.sessions:
        h.update(f"{s.index}/{s.system}/{s.start!r}".encode())
        for t in s.turns:
            h.update(f"{t.user}/{t.max_tokens}/{t.think!r}".encode())
    return h.hexdigest()


def test_same_seed_same_workload_other_seed_another() -> None:
    assert _digest(make_workload(200, seed=1)) == _digest(make_workload(200, seed=1))
    assert _digest(make_workload(200, seed=1)) != _digest(make_workload(200, seed=2))


def test_fewer_sessions_are_the_first_sessions_of_the_full_run() -> None:
    # The system prompts are drawn first and sessions one after another: a run with fewer sessions sends
    # the full run's first ones, over the same prompts.
    small, full = make_workload(20, seed=1), make_workload(200, seed=1)
    assert small.systems == full.systems
    assert small.sessions == full.sessions[:20]


def test_the_benchmarks_workload_is_pinned() -> None:
    # The figures in perf/README were measured on this workload (200 sessions, seed 1). A change to the
    # generator changes this digest: re-measure, and say so beside the figures, before updating it.
    pinned = "4774c78aa67dd4a428e53d831a7007d302c130a61a5e6fde20b810280c828a9b"
    assert _digest(make_workload(200, seed=1)) == pinned


def test_shape() -> None:
    w = make_workload(200, seed=1)
    assert len(w.systems) == 4
    assert len(w.sessions) == 200
    assert [s.index for s in w.sessions] == list(range(200))
    for text in w.systems:
        assert text.isascii()
        tokens = len(text) // BYTES_PER_TOKEN
        assert len(text) % BYTES_PER_TOKEN == 0
        assert SYSTEM_TOKENS[0] <= tokens <= SYSTEM_TOKENS[1]
    assert {s.system for s in w.sessions} == {0, 1, 2, 3}  # every system prompt is used
    starts = [s.start for s in w.sessions]
    assert starts[0] == 0.0 and starts == sorted(starts)  # staggered, in order
    for s in w.sessions:
        assert TURNS[0] <= len(s.turns) <= TURNS[1]
        for t in s.turns:
            assert t.user.isascii() and len(t.user) % BYTES_PER_TOKEN == 0
            assert USER_TOKENS[0] <= len(t.user) // BYTES_PER_TOKEN <= USER_TOKENS[1]
            assert ANSWER_TOKENS[0] <= t.max_tokens <= ANSWER_TOKENS[1]
            assert t.think > 0
    assert w.requests == sum(len(s.turns) for s in w.sessions)
    # Think times are exponential of mean 1 (in means of the load's think time): about 1 over ~1,300.
    thinks = [t.think for s in w.sessions for t in s.turns]
    assert 0.85 < sum(thinks) / len(thinks) < 1.15


def test_quick_turns_and_working_set() -> None:
    w = make_workload(20, seed=1, turns=(2, 2))
    assert all(len(s.turns) == 2 for s in w.sessions)
    systems = sum(len(t) // BYTES_PER_TOKEN for t in w.systems)
    assert working_set_tokens(w, 0) == systems
    assert working_set_tokens(w, 10) > working_set_tokens(w, 5) > systems


def test_rendered_tokens_counts_the_chat_template() -> None:
    # "<|user|>\n" (9 bytes) + 8 bytes + "\n" + "<|assistant|>\n" (14 bytes) = 32 bytes = 8 tokens.
    assert rendered_tokens([{"role": "user", "content": "abcdefgh"}]) == 8
    assert rendered_tokens([{"role": "user", "content": "abcdefghi"}]) == 9  # a partial token counts
