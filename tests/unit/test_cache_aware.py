"""``cache_aware``: the prompt rendered as an engine caches it, and the score that weighs each target's
matched prefix against its load, with the balance rule, over a real ``PrefixIndex`` (no sockets)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.native import PrefixIndex
from gateway.routing.load import EngineState, StaticLoad
from gateway.routing.policies import CacheTuning, engine_load, make_policy
from gateway.routing.prompt_prefix import rendered_prompt
from gateway.snapshot import Backend, Target

SYSTEM = "You answer questions about the fleet. " * 60  # 2,280 bytes: 35 blocks


def targets(*names: str) -> tuple[Target, ...]:
    return tuple(Target(f"pm-{n}", Backend(n, f"http://{n}", None, "openai", 1, 1, 1), "m") for n in names)


def chat(*turns: str, **extra: Any) -> bytes:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return orjson.dumps({"model": "m", "messages": messages, **extra})


def first(order: tuple[Target, ...]) -> str:
    return order[0].backend.name


# -- the rendering -----------------------------------------------------------------------------------------


def test_a_conversations_turns_render_as_growing_prefixes() -> None:
    one = rendered_prompt(chat("What is up?"))
    two = rendered_prompt(chat("What is up?", "Nothing much.", "And now?"))
    assert two.startswith(one) and len(two) > len(one)


def test_what_is_not_the_prompt_does_not_change_it() -> None:
    plain = rendered_prompt(chat("hi"))
    assert rendered_prompt(chat("hi", temperature=0.2, stream=True, max_tokens=9)) == plain
    reordered = orjson.dumps(
        {"messages": [{"content": SYSTEM, "role": "system"}, {"content": "hi", "role": "user"}], "model": "x"}
    )
    assert rendered_prompt(reordered) == plain


def test_every_protocol_renders_a_shared_system_prompt_alike() -> None:
    openai = rendered_prompt(chat("hi"))
    anthropic = rendered_prompt(
        orjson.dumps({"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "hi"}]})
    )
    blocks = rendered_prompt(
        orjson.dumps(
            {
                "model": "m",
                "system": [{"type": "text", "text": SYSTEM}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            }
        )
    )
    responses = rendered_prompt(orjson.dumps({"model": "m", "instructions": SYSTEM, "input": "hi"}))
    assert openai == anthropic == blocks == responses


def test_bodies_without_a_prompt_render_empty() -> None:
    assert rendered_prompt(b"not json") == b""
    assert rendered_prompt(b"[1, 2]") == b""
    assert rendered_prompt(b'{"model": "m"}') == b""
    assert rendered_prompt(b'{"prompt": "complete this"}') == b"complete this"


# -- the score -----------------------------------------------------------------------------------------


def policy(**tuning: Any) -> Any:
    return make_policy("cache_aware", targets("a", "b", "c"), tuning=CacheTuning(**tuning))


def test_a_conversation_returns_to_the_target_that_holds_it() -> None:
    p, load = policy(), StaticLoad(index=PrefixIndex.private())
    chosen = first(p.order(chat("question one"), load))
    for n in range(5):  # rotation would move it; the prefix holds it
        assert first(p.order(chat("question one", "answer", f"follow-up {n}"), load)) == chosen


def test_without_a_prefix_anywhere_targets_take_turns() -> None:
    p, load = policy(), StaticLoad(index=PrefixIndex.private())
    picks = [first(p.order(orjson.dumps({"prompt": f"{n} " + "x" * 200}), load)) for n in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_load_outweighs_a_short_match_but_not_a_long_one() -> None:
    p = policy(load_cost=256, balance_abs=100)
    index = PrefixIndex.private()
    assert first(p.order(chat("q"), StaticLoad(index=index))) == "a"
    # "a" holds the 2.3 kB system prompt: worth more than 8 requests in flight at 256 bytes each
    assert first(p.order(chat("r"), StaticLoad(flights={"a": 8}, index=index))) == "a"
    # ... but not 10 of them
    assert first(p.order(chat("s"), StaticLoad(flights={"a": 10}, index=index))) != "a"


def test_the_balance_rule_moves_a_conversation_off_a_hot_target() -> None:
    p = policy(load_cost=1, balance_abs=4, balance_rel=1.5)
    index = PrefixIndex.private()
    assert first(p.order(chat("q"), StaticLoad(index=index))) == "a"
    busy = {"a": 6, "b": 2, "c": 3}  # 6 > max(2 + 4, 2 * 1.5) is false: a is not hot
    assert first(p.order(chat("q", "x", "y"), StaticLoad(flights=busy, index=index))) == "a"
    hot = {"a": 7, "b": 2, "c": 3}  # 7 > 6: hot, whatever it holds
    order = p.order(chat("q", "x", "y", "z", "w"), StaticLoad(flights=hot, index=index))
    assert [t.backend.name for t in order] == ["b", "c", "a"]


def test_the_engines_queue_counts_as_load() -> None:
    p = policy(load_cost=256, balance_abs=100)
    index = PrefixIndex.private()
    assert first(p.order(chat("q"), StaticLoad(index=index))) == "a"
    queued = {"a": EngineState(kind="vllm", waiting=12, running=16)}
    assert first(p.order(chat("q", "x", "y"), StaticLoad(engines=queued, index=index))) != "a"


def test_a_scrape_counts_other_hosts_requests_not_this_hosts_finished_ones() -> None:
    """The engine's running count is a scrape old. Taken while this host had 3 requests on "a" that have
    since ended, it must not keep "a" hot until the next scrape: only the other hosts' share of it (the
    running count less this host's in flight at that moment) adds to this host's live in flight."""
    p = policy(load_cost=1, balance_abs=1)
    index = PrefixIndex.private()
    assert first(p.order(chat("q"), StaticLoad(index=index))) == "a"
    stale = {"a": EngineState(kind="vllm", waiting=0, running=3, host_in_flight=3)}
    assert first(p.order(chat("q", "x", "y"), StaticLoad(engines=stale, index=index))) == "a"
    # Without this host's share noted, the count is taken whole (an older document): "a" looks hot.
    unknown = {"a": EngineState(kind="vllm", waiting=0, running=3)}
    assert first(p.order(chat("q", "x", "y", "z", "w"), StaticLoad(engines=unknown, index=index))) != "a"
    # Two of the three were another host's: they still count, on top of this host's live in flight.
    shared = {"a": EngineState(kind="vllm", waiting=0, running=3, host_in_flight=1)}
    load = StaticLoad(flights={"a": 1}, engines=shared, index=index)
    assert engine_load(p.targets[0], load) == 3
    assert first(p.order(chat("q", "x", "y", "z", "w", "v"), load)) != "a"
    # This host's requests queued in the engine are in its in-flight count: six of its own (four running,
    # two waiting) are no other host's; the queue still counts once more, as a queue.
    queued = {"a": EngineState(kind="vllm", waiting=2, running=4, host_in_flight=6)}
    assert engine_load(p.targets[0], StaticLoad(flights={"a": 6}, engines=queued, index=index)) == 8
    # Two running and one waiting of another host's count on top of this host's live six.
    mixed = {"a": EngineState(kind="vllm", waiting=2, running=6, host_in_flight=5)}
    assert engine_load(p.targets[0], StaticLoad(flights={"a": 6}, engines=mixed, index=index)) == 6 + 3 + 2


def test_a_target_that_is_down_goes_last_and_is_not_noted() -> None:
    p, index = policy(), PrefixIndex.private()
    order = p.order(chat("q"), StaticLoad(down={"a"}, index=index))
    assert order[-1].backend.name == "a"
    prompt = index.blocks(rendered_prompt(chat("q")), 64)
    keys = p.keys
    assert index.match(prompt, keys[0]) == 0 and index.match(prompt, keys[1]) == prompt.count


def test_an_engine_seen_restarted_holds_nothing_it_held_before() -> None:
    p, index = policy(), PrefixIndex.private()
    load = StaticLoad(index=index, prefixes={})
    assert first(p.order(chat("q"), load)) == "a"
    assert first(p.order(chat("q", "x", "y"), load)) == "a"  # it holds the conversation
    load.prefixes.clear()
    # The scraper saw a's prompt-token counter go down: a new epoch; the index's old pairs no longer count.
    load.engines["a"] = EngineState(kind="vllm", waiting=0, running=0, epoch=1_765_000_000)
    p.order(chat("q", "x", "y", "z", "w"), load)
    assert load.prefixes and all(matched == 0 for _, matched in load.prefixes.values())
    # What the new process is sent from now on is held under its new name.
    chosen = first(p.order(chat("q2"), load))
    load.prefixes.clear()
    assert first(p.order(chat("q2", "x", "y"), load)) == chosen
    assert load.prefixes[chosen][1] > 0


def test_without_an_index_the_least_loaded_goes_first() -> None:
    p = policy()
    assert first(p.order(chat("q"), StaticLoad(flights={"a": 3, "b": 1, "c": 2}))) == "b"
