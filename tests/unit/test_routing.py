"""Routing rules and pool policies, decided on snapshots built from configuration files (no sockets)."""

from __future__ import annotations

import calendar
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.snapshot_build import build_snapshot_doc
from gateway.controlplane.store import Store, open_store
from gateway.errors import ConfigError
from gateway.routing.load import EngineState, StaticLoad
from gateway.routing.policies import CacheTuning, make_policy
from gateway.routing.rules import Facts
from gateway.snapshot import Backend, Principal, Snapshot, Target

BACKENDS = "".join(
    f'[[backends]]\nname = "{n}"\nurl = "http://127.0.0.1:{9000 + i}"\n\n'
    f'[[provider_models]]\nname = "pm-{n}"\nbackends = ["{n}"]\n\n'
    for i, n in enumerate(["a", "b", "c", "d"])
)
PEOPLE = """
[[roles]]
name = "batch"
permissions = ["model/*"]

[[roles]]
name = "staff"
permissions = ["model/*"]

[[principals]]
name = "alice"
roles = ["staff"]

[[principals]]
name = "robot"
roles = ["batch"]
"""


def snapshot(tmp_path: Path, config: str) -> Snapshot:
    cfg = parse_config(tomllib.loads(BACKENDS + config + PEOPLE), "test")
    store = open_store(Settings(data_dir=tmp_path))
    store.apply_config(cfg, actor="test")
    doc = build_snapshot_doc(store)
    store.close()
    assert doc["skipped"] == 0
    return Snapshot.from_doc(doc, 1)


def facts(snap: Snapshot, principal: str = "alice", **kw: Any) -> Facts:
    p = next(p for p in snap.principals.values() if p.name == principal)
    values: dict[str, Any] = {
        "headers": {},
        "user": None,
        "prompt_tokens": 10,
        "max_tokens": None,
        "stream": False,
        "body": b'{"model":"chat"}',
    }
    values.update(kw)
    return Facts(p, **values)


def backends_of(decision: Any) -> list[str]:
    return [t.backend.name for t in decision.targets]


RULES = """
[[models]]
name = "chat"
chain = ["pm-a", "pm-b"]
aliases = ["gpt"]

[[models.rules]]
name = "free streams"
when = { headers = { X-Tier = "free" }, stream = true }
refuse = { status = 429, message = "streaming is for paid plans" }

[[models.rules]]
name = "robots"
when = { roles = ["batch"] }
delegate = "cheap"

[[models.rules]]
name = "long"
when = { prompt_tokens_min = 1000 }
route = ["pm-c"]
tag = "long"

[[models.rules]]
name = "big answers"
when = { max_tokens_min = 2000, max_tokens_max = 8000 }
route = ["pm-d", "pm-c"]

[[models.rules]]
name = "team"
when = { principals = ["alice"], user = ["u1", "u2"] }
route = ["pm-b"]

[[models]]
name = "cheap"
chain = ["pm-d"]
"""


def test_rules_are_terminal_and_ordered(tmp_path: Path) -> None:
    snap = snapshot(tmp_path, RULES)
    route, load = snap.routes["chat"], StaticLoad()
    # No rule matches: the chain.
    d = snap.decide(route, facts(snap), load)
    assert d.rule is None and backends_of(d) == ["a", "b"]
    # A refusal: status and message; nothing to try.
    d = snap.decide(route, facts(snap, headers={"x-tier": "free"}, stream=True), load)
    assert d.refused == (429, "streaming is for paid plans") and d.targets == ()
    # The header alone is not enough: every condition of a rule must hold.
    assert snap.decide(route, facts(snap, headers={"x-tier": "free"}), load).rule is None
    # The first match wins even when a later rule also matches.
    d = snap.decide(route, facts(snap, prompt_tokens=5000, max_tokens=4000), load)
    assert d.rule is not None and d.rule.name == "long" and backends_of(d) == ["c"] and d.tag == "long"
    d = snap.decide(route, facts(snap, max_tokens=4000), load)
    assert backends_of(d) == ["d", "c"]
    assert snap.decide(route, facts(snap, max_tokens=9000), load).rule is None


def test_delegation_restarts_with_the_other_models_rules(tmp_path: Path) -> None:
    snap = snapshot(tmp_path, RULES)
    d = snap.decide(snap.routes["chat"], facts(snap, "robot", prompt_tokens=5000), StaticLoad())
    assert d.model == "cheap" and backends_of(d) == ["d"]
    # Aliases carry the model's rules.
    d = snap.decide(snap.routes["gpt"], facts(snap, "robot"), StaticLoad())
    assert d.model == "cheap"


def test_principal_and_user_conditions(tmp_path: Path) -> None:
    snap = snapshot(tmp_path, RULES)
    route = snap.routes["chat"]
    assert backends_of(snap.decide(route, facts(snap, user="u2"), StaticLoad())) == ["b"]
    assert snap.decide(route, facts(snap, user="u3"), StaticLoad()).rule is None


@pytest.mark.parametrize(
    ("hours", "days", "when", "matches"),
    [
        ("09:00-17:00", None, "2026-11-30 10:00", True),
        ("09:00-17:00", None, "2026-11-30 17:00", False),
        ("22:00-06:00", None, "2026-11-30 23:30", True),
        ("22:00-06:00", None, "2026-11-30 05:59", True),
        ("22:00-06:00", None, "2026-11-30 12:00", False),
        (None, ["sat", "sun"], "2026-11-29 12:00", True),  # a Sunday
        (None, ["sat", "sun"], "2026-11-30 12:00", False),  # a Monday
        ("22:00-06:00", ["sun"], "2026-11-30 01:00", True),  # Monday 01:00 belongs to Sunday's night
        ("22:00-06:00", ["mon"], "2026-11-30 01:00", False),
    ],
)
def test_time_windows(
    tmp_path: Path, hours: str | None, days: list[str] | None, when: str, matches: bool
) -> None:
    cond = []
    if hours:
        cond.append(f'hours = "{hours}"')
    if days:
        cond.append("days = [" + ", ".join(f'"{d}"' for d in days) + "]")
    config = f"""
[[models]]
name = "chat"
chain = ["pm-a"]

[[models.rules]]
when = {{ {", ".join(cond)} }}
route = ["pm-b"]
"""
    snap = snapshot(tmp_path, config)
    now = calendar.timegm(__import__("time").strptime(when, "%Y-%m-%d %H:%M"))
    d = snap.decide(snap.routes["chat"], facts(snap, now=float(now)), StaticLoad())
    assert (backends_of(d) == ["b"]) is matches


def test_max_inflight_per_backend_overflows_to_the_next_rule(tmp_path: Path) -> None:
    config = """
[[models]]
name = "chat"
chain = ["pm-c"]

[[models.rules]]
name = "cheap while it has room"
when = { max_inflight_per_backend = 4 }
route = ["pm-a", "pm-b"]

[[models.rules]]
route = ["pm-d"]
"""
    snap = snapshot(tmp_path, config)
    route = snap.routes["chat"]
    assert backends_of(snap.decide(route, facts(snap), StaticLoad({"a": 4, "b": 3}))) == ["a", "b"]
    d = snap.decide(route, facts(snap), StaticLoad({"a": 4, "b": 4}))
    assert backends_of(d) == ["d"]


def test_unhealthy_targets_are_dropped_then_the_fallback_then_503(tmp_path: Path) -> None:
    config = """
[[models]]
name = "chat"
chain = ["pm-a", "pm-b"]

[[models]]
name = "spare"
chain = ["pm-c"]

[routing]
fallback = "spare"
"""
    snap = snapshot(tmp_path, config)
    route = snap.routes["chat"]
    assert backends_of(snap.decide(route, None, StaticLoad(down={"a"}))) == ["b"]
    d = snap.decide(route, None, StaticLoad(engines={"a": EngineState(healthy=False)}, down={"b"}))
    assert backends_of(d) == ["c"] and d.fallback
    d = snap.decide(route, None, StaticLoad(down={"a", "b", "c"}))
    assert d.refused is not None and d.refused[0] == 503 and d.targets == ()


# -- pool policies --------------------------------------------------------------------------------------


def targets(*names: str) -> tuple[Target, ...]:
    return tuple(Target(f"pm-{n}", Backend(n, f"http://{n}", None, "openai", 1, 1, 1), "m") for n in names)


def first_picks(policy: Any, n: int, load: StaticLoad | None = None, body: bytes = b"") -> Counter[str]:
    return Counter(policy.order(body, load or StaticLoad())[0].backend.name for _ in range(n))


def test_round_robin_is_exact_and_keeps_the_rest_as_fallback() -> None:
    policy = make_policy("round_robin", targets("a", "b", "c"))
    assert first_picks(policy, 300) == {"a": 100, "b": 100, "c": 100}
    order = policy.order(b"", StaticLoad())
    assert sorted(t.backend.name for t in order) == ["a", "b", "c"]


def test_weighted_follows_the_weights_over_each_window() -> None:
    policy = make_policy("weighted", targets("a", "b", "c"), [5, 3, 2])
    for _ in range(5):
        assert first_picks(policy, 10) == {"a": 5, "b": 3, "c": 2}


def test_least_inflight_picks_the_least_loaded_and_spreads_ties() -> None:
    policy = make_policy("least_inflight", targets("a", "b", "c"))
    assert first_picks(policy, 50, StaticLoad({"a": 5, "b": 1, "c": 3})) == {"b": 50}
    assert first_picks(policy, 90, StaticLoad({"a": 2, "b": 2, "c": 9})) == {"a": 45, "b": 45}


def test_prefix_affinity_is_sticky_spread_and_stable_when_a_backend_joins() -> None:
    system = "x" * 600  # longer than the hashed prefix (512 bytes)
    bodies = [
        f'{{"messages":[{{"role":"system","content":"tenant {i} {system}"}}]}}'.encode() for i in range(2000)
    ]
    four = make_policy("prefix_affinity", targets("a", "b", "c", "d"))
    picks = {body: four.order(body, StaticLoad())[0].backend.name for body in bodies}
    # Sticky: the same prefix, the same backend, whatever comes after the hashed prefix.
    long = bodies[7][:520] + b"a different conversation after the shared prefix"
    other = make_policy("prefix_affinity", targets("a", "b", "c", "d"))  # another worker, same answer
    assert other.order(long, StaticLoad())[0].backend.name == picks[bodies[7]]
    # Spread: each backend gets a quarter, within 20%.
    for count in Counter(picks.values()).values():
        assert 400 <= count <= 600
    # A fifth backend takes about a fifth of the prefixes, and only prefixes move to it.
    five = make_policy("prefix_affinity", targets("a", "b", "c", "d", "e"))
    moved = [b for b in bodies if five.order(b, StaticLoad())[0].backend.name != picks[b]]
    assert all(five.order(b, StaticLoad())[0].backend.name == "e" for b in moved)
    assert 300 <= len(moved) <= 500


def test_prefix_affinity_falls_back_to_least_loaded_over_the_ceiling() -> None:
    policy = make_policy("prefix_affinity", targets("a", "b", "c"), max_inflight=8)
    body = b'{"messages":"same prefix"}'
    chosen = policy.order(body, StaticLoad())[0].backend.name
    others = [n for n in "abc" if n != chosen]
    load = StaticLoad({chosen: 8, others[0]: 5, others[1]: 1})
    order = [t.backend.name for t in policy.order(body, load)]
    assert order == [others[1], others[0], chosen]


def test_engine_load_ranks_by_waiting_then_running_then_cache() -> None:
    policy = make_policy("engine_load", targets("a", "b", "c"))
    engines = {
        "a": EngineState("vllm", waiting=2, running=1, kv_cache=0.1),
        "b": EngineState("vllm", waiting=0, running=7, kv_cache=0.9),
        "c": EngineState("vllm", waiting=0, running=7, kv_cache=0.2),
    }
    order = [t.backend.name for t in policy.order(b"", StaticLoad(engines=engines))]
    assert order == ["c", "b", "a"]
    # Without metrics a backend ranks by the host's in-flight count, as its running requests.
    del engines["c"]
    order = [t.backend.name for t in policy.order(b"", StaticLoad({"c": 3}, engines))]
    assert order == ["c", "b", "a"]


def test_pools_as_rule_targets_and_rule_policies(tmp_path: Path) -> None:
    config = """
[[pools]]
name = "gpu"
policy = "weighted"
members = ["pm-a", "pm-b"]
weights = [3, 1]

[[models]]
name = "chat"
chain = ["pm-c"]

[[models.rules]]
when = { stream = true }
route = ["gpu", "pm-c"]

[[models.rules]]
route = ["pm-a", "pm-b", "pm-c"]
policy = "least_inflight"
"""
    snap = snapshot(tmp_path, config)
    route = snap.routes["chat"]
    firsts = Counter(
        backends_of(snap.decide(route, facts(snap, stream=True), StaticLoad()))[0] for _ in range(8)
    )
    assert firsts == {"a": 6, "b": 2}
    assert backends_of(snap.decide(route, facts(snap, stream=True), StaticLoad()))[-1] == "c"
    d = snap.decide(route, facts(snap), StaticLoad({"a": 3, "b": 0, "c": 1}))
    assert backends_of(d) == ["b", "c", "a"]


# -- configuration --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "place"),
    [
        ('[[models.rules]]\nroute = ["nope"]', "models[0].rules[0].route[0]"),
        ('[[models.rules]]\ndelegate = "chat"', "models[0].rules"),  # a loop
        (
            '[[models.rules]]\nwhen = { hours = "25:00-26:00" }\nroute = ["pm-a"]',
            "models[0].rules[0].when.hours",
        ),
        ('[[models.rules]]\nwhen = { roles = ["ghost"] }\nroute = ["pm-a"]', "models[0].rules[0].when.roles"),
        ('[[models.rules]]\nwhen = { colour = "red" }\nroute = ["pm-a"]', "models[0].rules[0].when.colour"),
        ('[[models.rules]]\nroute = ["pm-a"]\nrefuse = { status = 403 }', "models[0].rules[0]"),
        ("[[models.rules]]\nrefuse = { status = 200 }", "models[0].rules[0].refuse.status"),
        ('[[models.rules]]\nrefuse = { }\npolicy = "weighted"', "models[0].rules[0].policy"),
        ('[[pools]]\nname = "p"\npolicy = "random"\nmembers = ["pm-a"]', "pools[0].policy"),
        ('[[pools]]\nname = "p"\nmembers = ["pm-a"]\nweights = [1]', "pools[0].weights"),
        ('[[pools]]\nname = "p"\nmembers = ["pm-zz"]', "pools[0].members[0]"),
        ('[[pools]]\nname = "pm-a"\nmembers = ["pm-b"]', "pools[0].name"),
        ('[routing]\nfallback = "nope"', "routing.fallback"),
        ('[[pools]]\nname = "p"\nmembers = ["pm-a"]\nload_cost = 9', "pools[0].load_cost"),
        (
            '[[pools]]\nname = "p"\npolicy = "cache_aware"\nmembers = ["pm-a"]\nblock_bytes = 8',
            "pools[0].block_bytes",
        ),
        (
            '[[pools]]\nname = "p"\npolicy = "cache_aware"\nmembers = ["pm-a"]\nbalance_rel = 0.5',
            "pools[0].balance_rel",
        ),
        (
            '[[pools]]\nname = "p"\npolicy = "cache_aware"\nmembers = ["pm-a"]\nbalance_abs = 1.5',
            "pools[0].balance_abs",
        ),
    ],
)
def test_bad_routing_config_names_the_field(snippet: str, place: str) -> None:
    text = BACKENDS + '[[models]]\nname = "chat"\nchain = ["pm-a"]\n\n' + snippet + "\n" + PEOPLE
    with pytest.raises(ConfigError) as exc:
        parse_config(tomllib.loads(text), "t")
    assert exc.value.param == place, str(exc.value)


def test_routing_config_round_trips_through_the_store(tmp_path: Path) -> None:
    text = (
        BACKENDS + RULES + '[[pools]]\nname = "p"\npolicy = "prefix_affinity"\nmembers = ["pm-a", "pm-b"]\n'
    )
    text += 'prefix_bytes = 256\nmax_inflight = 3\n\n[routing]\nfallback = "cheap"\n' + PEOPLE
    text = text.replace(
        'url = "http://127.0.0.1:9000"',
        'url = "http://127.0.0.1:9000"\nmax_concurrency = 8\nresponses_api = true',
    )
    cfg = parse_config(tomllib.loads(text), "t")
    store: Store = open_store(Settings(data_dir=tmp_path))
    store.apply_config(cfg, actor="test")
    assert store.config_doc() == cfg
    doc = build_snapshot_doc(store)
    store.close()
    assert doc["fallback"] == "cheap" and doc["backends"]["a"]["max_concurrency"] == 8
    assert doc["backends"]["a"]["health_path"] == "/health"
    assert doc["backends"]["a"]["responses_api"] is True and "responses_api" not in doc["backends"]["b"]
    assert doc["pools"]["p"]["max_inflight"] == 3
    snap = Snapshot.from_doc(doc, 1)
    assert snap.backends["a"].responses_api and not snap.backends["b"].responses_api
    assert snap.routes["gpt"].rules and snap.routes["gpt"].rules[0].name == "free streams"
    assert isinstance(next(iter(snap.principals.values())), Principal)


def test_cache_aware_knobs_reach_the_policy(tmp_path: Path) -> None:
    text = BACKENDS + RULES + '[[pools]]\nname = "kv"\npolicy = "cache_aware"\nmembers = ["pm-a", "pm-b"]\n'
    text += "block_bytes = 128\nload_cost = 300\nbalance_rel = 2.5\n\n" + PEOPLE
    cfg = parse_config(tomllib.loads(text), "t")
    store: Store = open_store(Settings(data_dir=tmp_path))
    store.apply_config(cfg, actor="test")
    assert store.config_doc() == cfg
    doc = build_snapshot_doc(store)
    store.close()
    assert doc["pools"]["kv"]["cache"] == {"block_bytes": 128, "load_cost": 300, "balance_rel": 2.5}
    policy = Snapshot.from_doc(doc, 1).pools["kv"].policy
    assert policy.tuning == CacheTuning(block_bytes=128, load_cost=300, balance_abs=32, balance_rel=2.5)
