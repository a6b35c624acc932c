"""``cache_aware`` with a tokenizer: a target whose backend publishes KV events is matched against what its
engine said it caches (the exact pairs a ``BackendMirror`` keeps), the others against what they were sent;
a cleared engine stops being preferred though it was sent the conversation; the matched tokens count as
the same share of the rendered prompt's bytes. Real ``PrefixIndex``, tiny trained tokenizer, no sockets."""

from __future__ import annotations

import orjson
import pytest

from gateway.native import PrefixIndex
from gateway.protocol.kv_events import AllBlocksCleared, BlockStored, EventBatch
from gateway.routing.chat_tokenizer import ChatTokenizer
from gateway.routing.kv_mirror import BackendMirror, exact_key
from gateway.routing.load import StaticLoad
from gateway.routing.policies import CacheTuning, make_policy
from gateway.routing.prompt_prefix import rendered_prompt
from gateway.snapshot import Backend, Target
from tests.fixtures.tiny_tokenizer import write_tiny_model

SYSTEM = "You are a careful assistant who answers questions about the history of castles. " * 12


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer.load(str(write_tiny_model(tmp_path_factory.mktemp("tok") / "tiny")))


def targets(events: dict[str, bool]) -> tuple[Target, ...]:
    return tuple(
        Target(
            f"pm-{n}",
            Backend(n, f"http://{n}", None, "openai", 1, 1, 1, kv_events="tcp://127.0.0.1:1" if on else None),
            "m",
        )
        for n, on in events.items()
    )


def body(question: str) -> bytes:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return orjson.dumps({"model": "m", "messages": messages})


def engine_caches(mirror: BackendMirror, ids: list[int], sequence: int) -> None:
    """What the engine publishes once it has prefilled ``ids``: a BlockStored of every whole block."""
    whole = len(ids) // 16
    event = BlockStored(tuple(range(1000, 1000 + whole)), None, tuple(ids[: whole * 16]), 16)
    mirror.apply(sequence, EventBatch(0.0, (event,)))


def test_the_exact_pairs_decide_and_a_cleared_engine_loses_the_conversation(tokenizer: ChatTokenizer) -> None:
    index = PrefixIndex.private()
    load = StaticLoad(index=index)
    policy = make_policy(
        "cache_aware", targets({"a": True, "b": True}), tuning=CacheTuning(), tokenizer=tokenizer
    )
    first = body("Who built Harlech?")
    ids = tokenizer.request_ids(first)
    assert ids is not None and len(ids) > 64
    assert policy.order(first, load)[0].backend.name == "a"  # nothing held anywhere: in turn
    mirror_a = BackendMirror(index, exact_key("a"))
    engine_caches(mirror_a, ids, 0)
    again = body("Who built Conwy?")  # the same system prompt: a holds its blocks
    assert [policy.order(again, load)[0].backend.name for _ in range(3)] == ["a", "a", "a"]
    stats = index.stats()
    assert stats.exact >= 4 and stats.exact_held == 3
    # a's engine restarts: its events clear its pairs. The approximate pairs still say a was sent the
    # conversation, but a target with events is read from the exact side only: a holds nothing now.
    mirror_a.apply(1, EventBatch(0.0, (AllBlocksCleared(),)))
    mirror_b = BackendMirror(index, exact_key("b"))
    engine_caches(mirror_b, ids, 0)
    assert policy.order(again, load)[0].backend.name == "b"


def test_matched_tokens_count_as_their_share_of_the_rendered_bytes(tokenizer: ChatTokenizer) -> None:
    index = PrefixIndex.private()
    load = StaticLoad(index=index)
    policy = make_policy("cache_aware", targets({"a": True}), tuning=CacheTuning(), tokenizer=tokenizer)
    request = body("Who built Harlech?")
    ids = tokenizer.request_ids(request)
    assert ids is not None
    engine_caches(BackendMirror(index, exact_key("a")), ids, 0)
    policy.order(request, load)
    size = len(rendered_prompt(request))
    sent, matched = load.prefixes["a"]
    assert sent == size and matched == size * (len(ids) // 16 * 16) // len(ids)


def test_without_events_or_without_a_tokenizer_the_approximate_pairs_decide(tokenizer: ChatTokenizer) -> None:
    index = PrefixIndex.private()
    load = StaticLoad(index=index)
    mixed = make_policy(
        "cache_aware", targets({"a": True, "b": False}), tuning=CacheTuning(), tokenizer=tokenizer
    )
    first = body("Who built Harlech?")
    assert mixed.order(first, load)[0].backend.name == "a"
    assert mixed.order(body("Who built Conwy?"), load)[0].backend.name == "b"  # a's engine said nothing
    # b was sent the system prompt: the approximate pairs keep it there.
    assert mixed.order(body("Who built Caernarfon?"), load)[0].backend.name == "b"
    plain = make_policy("cache_aware", targets({"a": True, "b": True}), tuning=CacheTuning())
    assert plain.exact_keys == (0, 0)  # no tokenizer: events are not read on the request path
    assert index.stats().exact_held == 0
