"""Routing through a running gateway: rules, pools, prefix affinity across workers, engine-aware gates,
active health with the deployment-wide fallback, and the dry run that shares the request path's decision."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.fixtures.processes import Gateway, MockEngine, free_port, wait_until

ROLES = """
[[roles]]
name = "user"
permissions = ["model/*"]

[[roles]]
name = "ops"
permissions = ["config:read"]

[[principals]]
name = "alice"
roles = ["user"]

[[principals]]
name = "robot"
roles = ["user"]

[[principals]]
name = "ops"
roles = ["ops"]
"""


def backend(name: str, url: str, extra: str = "") -> str:
    return (
        f'[[backends]]\nname = "{name}"\nurl = "{url}"\nconnect_timeout = 1.0\nfirst_byte_timeout = 10.0\n'
        f'{extra}\n[[provider_models]]\nname = "pm-{name}"\n'
        f'backends = [{{ backend = "{name}", model = "m" }}]\n\n'
    )


class Env:
    def __init__(self, tmp: Path, config: str, workers: int = 2) -> None:
        self.admin_port = free_port()
        self.gw = Gateway(
            tmp,
            config + ROLES,
            workers=workers,
            extra=(
                "--admin-port",
                str(self.admin_port),
                "--engine-scrape-interval",
                "0.2",
                "--backend-cool-down",
                "0",
            ),
        )
        self.key = {p: self.gw.create_key(p) for p in ("alice", "robot", "ops")}
        wait_until(lambda: self.admin("GET", "/admin/whoami").status_code == 200, what="keys published")
        for key in self.key.values():  # in every worker: one answer says only that its worker has it
            self.gw.wait_key_live(key)
        wait_until(lambda: self.post(model="chat").status_code != 401, what="keys published")

    def post(
        self, principal: str = "alice", headers: dict[str, str] | None = None, **body: Any
    ) -> httpx.Response:
        payload = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
        return httpx.post(
            self.gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.key[principal]}", **(headers or {})},
            json=payload,
            timeout=30,
        )

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(
            method,
            f"http://127.0.0.1:{self.admin_port}{path}",
            headers={"authorization": f"Bearer {self.key['ops']}"},
            timeout=10,
            **kw,
        )

    def backend_view(self, name: str) -> dict[str, Any]:
        hosts = self.admin("GET", "/admin/fleet").json()["hosts"]
        view: dict[str, Any] = hosts[0]["backends"].get(name, {})
        return view


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MockEngine]]:
    tmp = tmp_path_factory.mktemp("routing-engines")
    mocks = [MockEngine(tmp) for _ in range(3)]
    yield mocks
    for m in mocks:
        m.stop()


@pytest.fixture
def fresh(engines: list[MockEngine]) -> list[MockEngine]:
    for e in engines:
        e.reset()
    return engines


def completions(engine: MockEngine) -> list[dict[str, Any]]:
    """What the engine was asked to generate."""
    return [r for r in engine.requests() if r["path"] == "/v1/chat/completions"]


def served_by(engines: list[MockEngine]) -> list[int]:
    return [len(completions(e)) for e in engines]


RULES = """
[[pools]]
name = "both"
policy = "round_robin"
members = ["pm-a", "pm-b"]

[[models]]
name = "chat"
chain = ["pm-a"]

[[models.rules]]
name = "free tier"
when = { headers = { x-tier = "free" } }
refuse = { status = 429, message = "upgrade to use chat" }

[[models.rules]]
name = "robots"
when = { principals = ["robot"] }
delegate = "batch"

[[models.rules]]
name = "spread streams"
when = { stream = true }
route = ["both"]

[[models]]
name = "batch"
chain = ["pm-c"]

[[models]]
name = "sticky"
chain = ["pm-a"]

[[models.rules]]
route = ["affine"]

[[pools]]
name = "affine"
policy = "prefix_affinity"
members = ["pm-a", "pm-b", "pm-c"]
prefix_bytes = 100

[[models]]
name = "cached"
chain = ["pm-a"]

[[models.rules]]
route = ["kv"]

[[pools]]
name = "kv"
policy = "cache_aware"
members = ["pm-a", "pm-b", "pm-c"]
load_cost = 64
balance_abs = 1
"""


@pytest.fixture(scope="module")
def rules_env(tmp_path_factory: pytest.TempPathFactory, engines: list[MockEngine]) -> Iterator[Env]:
    a, b, c = engines
    config = backend("a", a.url) + backend("b", b.url) + backend("c", c.url) + RULES
    env = Env(tmp_path_factory.mktemp("routing"), config)
    yield env
    env.gw.stop()


def test_refuse_rule_answers_in_the_openai_envelope(rules_env: Env, fresh: list[MockEngine]) -> None:
    resp = rules_env.post(headers={"x-tier": "free"})
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["message"] == "upgrade to use chat"
    assert resp.json()["error"]["code"] == "routing_refused"
    assert served_by(fresh) == [0, 0, 0]


def test_delegate_and_default_chain(rules_env: Env, fresh: list[MockEngine]) -> None:
    assert rules_env.post("robot").status_code == 200
    assert served_by(fresh) == [0, 0, 1]
    assert rules_env.post().status_code == 200
    assert served_by(fresh) == [1, 0, 1]


def test_pool_round_robin_spreads_streams(rules_env: Env, fresh: list[MockEngine]) -> None:
    for _ in range(20):
        with httpx.Client() as client:  # a new connection each: both workers take part
            resp = client.post(
                rules_env.gw.url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {rules_env.key['alice']}"},
                json={"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": True},
                timeout=30,
            )
            assert resp.status_code == 200 and "[DONE]" in resp.text
    a, b, c = served_by(fresh)
    assert a + b == 20 and c == 0
    assert 6 <= a <= 14  # each worker alternates; together within ±4 of even


def test_prefix_affinity_holds_across_workers(rules_env: Env, fresh: list[MockEngine]) -> None:
    prefixes = [f"tenant-{i}-system-prompt" for i in range(6)]
    for round_ in range(4):
        for p in prefixes:
            with httpx.Client() as client:  # new connections land on either worker
                resp = client.post(
                    rules_env.gw.url + "/v1/chat/completions",
                    headers={"authorization": f"Bearer {rules_env.key['alice']}"},
                    content=f'{{"model":"sticky","messages":[{{"role":"system","content":"{p}"}},'
                    f'{{"role":"user","content":"question {round_}"}}]}}',
                    timeout=30,
                )
                assert resp.status_code == 200
    where: dict[str, set[int]] = {}
    for i, e in enumerate(fresh):
        for rec in completions(e):
            prefix = rec["body"].split(b'"content":"')[1].split(b'"')[0].decode()
            where.setdefault(prefix, set()).add(i)
    assert set(where) == set(prefixes)
    assert all(len(engines) == 1 for engines in where.values()), where
    assert len({next(iter(e)) for e in where.values()}) >= 2  # and the prefixes do spread


def test_cache_aware_keeps_each_conversation_on_one_engine_across_workers(
    rules_env: Env, fresh: list[MockEngine]
) -> None:
    """Six conversations of four turns, the six turns of a round sent at once, each on a new connection (so
    on either worker): every turn of a conversation reaches the engine its first went to, though the first
    512 bytes of every body are the same (one long shared system prompt); and the first turns, which all
    match that system prompt, spread as the engine holding it fills (the balance rule)."""

    def counters() -> tuple[float, float, float]:
        """Answers relayed, prompt bytes sent to cache_aware pools, and of those the bytes expected to hit,
        summed over every backend and every worker's last published document."""
        text = rules_env.admin("GET", "/metrics").text
        answered = sent = matched = 0.0
        for line in text.splitlines():
            if line.startswith("gateway_backend_answers_total{"):
                answered += float(line.split()[-1])
            elif line.startswith("gateway_backend_prefix_bytes_total{"):
                sent += float(line.split()[-1])
            elif line.startswith("gateway_backend_prefix_matched_bytes_total{"):
                matched += float(line.split()[-1])
        return answered, sent, matched

    def settled() -> tuple[float, float, float]:
        """The counters once every worker has published all it counted: two reads a publish apart (each
        worker writes its document every second) that agree. The test before this one may have answers
        still unpublished, and a baseline without them would let this test's wait end early."""
        last = counters()
        while True:
            time.sleep(1.2)
            now = counters()
            if now == last:
                return now
            last = now

    answered_before, sent_before, matched_before = settled()
    for e in fresh:
        e.configure(delay=0.3)
    system = "You are a careful assistant. " * 40
    histories: dict[int, list[dict[str, str]]] = {
        c: [{"role": "system", "content": system}] for c in range(6)
    }

    def ask(c: int) -> None:
        history = histories[c]
        with httpx.Client() as client:
            resp = client.post(
                rules_env.gw.url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {rules_env.key['alice']}"},
                json={"model": "cached", "messages": history, "max_tokens": 4},
                timeout=30,
            )
        assert resp.status_code == 200, resp.text
        history.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for turn in range(4):
            for c, history in histories.items():
                history.append({"role": "user", "content": f"conversation {c} asks question {turn} " * 8})
            if turn == 0:
                # The first turns start 20 ms apart, all six in flight together (each takes 0.3 s): each is
                # decided seeing the ones before it, so they spread 2/2/2. Two workers deciding in the same
                # instant may both see an engine as emptiest; the 3/2/1 that follows would have the balance
                # rule move a conversation later, as it should, which is not what this test is about.
                started = []
                for c in histories:
                    started.append(pool.submit(ask, c))
                    time.sleep(0.02)
                for f in started:
                    f.result()
            else:
                list(pool.map(ask, histories))
    where: dict[int, list[int]] = {}
    for i, e in enumerate(fresh):
        for rec in completions(e):
            sent = orjson.loads(rec["body"])["messages"]
            conversation = int(sent[1]["content"].split()[1])
            where.setdefault(conversation, []).append(i)
    assert sorted(where) == list(range(6))
    assert all(len(turns) == 4 and len(set(turns)) == 1 for turns in where.values()), where
    assert len({turns[0] for turns in where.values()}) >= 2

    # Each worker publishes its counts now and then; a worker counts a request's prefix bytes before its
    # answer, so once the 24 answers show, so do all 24 prefix counts. Every turn after a conversation's
    # first was held whole but for its new user turn; the first turns after the first held the system prompt.
    wait_until(lambda: counters()[0] >= answered_before + 24, what="every worker's answers in /metrics")
    _, sent, matched = settled()
    sent, matched = sent - sent_before, matched - matched_before
    assert 0.5 < matched / sent < 1
    assert "gateway_prefix_index_pairs_total" in rules_env.admin("GET", "/metrics").text

    # The dry run reads the host's index: conversation 0's next turn is expected on its engine, most of
    # it held; and it notes nothing: a prompt nobody sent matches nothing, however often it is tried.
    def dry(messages: list[dict[str, str]]) -> dict[str, Any]:
        resp = rules_env.admin(
            "POST", "/admin/routing/dry-run", json={"model": "cached", "body": {"messages": messages}}
        )
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    follow_up = [*histories[0], {"role": "user", "content": "one more question"}]
    # The scraper's figures lag by up to 0.2 s: until they show the engines idle again, the balance rule
    # (balance_abs 1 here) may still count the last round's requests.
    wait_until(
        lambda: dry(follow_up)["targets"][0]["backend"] == "abc"[where[0][0]],
        what="the dry run ordering conversation 0's engine first",
    )
    answer = dry(follow_up)
    assert answer["prefix"]["backend"] == "abc"[where[0][0]]
    assert answer["prefix"]["matched_bytes"] > answer["prefix"]["prompt_bytes"] // 2
    novel = [{"role": "system", "content": "A prompt no engine was sent. " * 20}]
    assert [dry(novel)["prefix"]["matched_bytes"] for _ in range(2)] == [0, 0]


def test_dry_run_shares_the_request_paths_decision(rules_env: Env, fresh: list[MockEngine]) -> None:
    def dry(**request: Any) -> dict[str, Any]:
        resp = rules_env.admin("POST", "/admin/routing/dry-run", json=request)
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    got = dry(model="chat", headers={"X-Tier": "free"}, body={"messages": []})
    assert got["rule"]["name"] == "free tier" and got["refused"]["status"] == 429 and got["targets"] == []
    got = dry(model="chat", principal="robot", body={"messages": []})
    assert got["model"] == "batch" and [t["backend"] for t in got["targets"]] == ["c"]
    got = dry(model="chat", body={"messages": [], "stream": True})
    assert got["rule"]["name"] == "spread streams" and sorted(t["backend"] for t in got["targets"]) == [
        "a",
        "b",
    ]
    assert served_by(fresh) == [0, 0, 0]  # nothing was sent
    # The exact body: the dry run names the backend the real request then reaches.
    body = '{"model":"sticky","messages":[{"role":"system","content":"tenant-dry-run"}]}'
    backend_named = dry(body=body)["targets"][0]["backend"]
    resp = httpx.post(
        rules_env.gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {rules_env.key['alice']}"},
        content=body,
        timeout=30,
    )
    assert resp.status_code == 200
    counts = dict(zip("abc", served_by(fresh), strict=True))
    assert counts[backend_named] == 1
    # Bad input is named.
    resp = rules_env.admin("POST", "/admin/routing/dry-run", json={"model": "nope"})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"
    resp = rules_env.admin("POST", "/admin/routing/dry-run", json={"model": "chat", "principal": "ghost"})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "principal"


def test_gate_ceiling_follows_the_engine_queue(tmp_path: Path) -> None:
    engine = MockEngine(tmp_path)
    try:
        flow = "max_concurrency = 4\nwaiting_high_water = 3\nqueue_size = 2\nqueue_timeout = 1.5\n"
        config = backend("a", engine.url, flow) + '[[models]]\nname = "chat"\nchain = ["pm-a"]\n'
        env = Env(tmp_path, config)
        wait_until(lambda: (env.backend_view("a").get("gate") or {}).get("ceiling") == 4, what="gate at 4")
        assert env.backend_view("a")["engine"]["kind"] == "vllm"
        # The engine's queue grows: the ceiling halves each scrape down to one.
        engine.configure(waiting=10)
        wait_until(lambda: env.backend_view("a")["gate"]["ceiling"] == 1, what="ceiling falls to 1")
        assert env.backend_view("a")["engine"]["waiting"] == 10
        time.sleep(0.3)  # the workers re-read the engine document every 0.1 s
        # One request holds the only place for 1 s; two wait in the proxy's queue; the rest get 429 at once.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            slow = pool.submit(env.post, headers={"x-mock-delay": "1.0"})
            wait_until(lambda: env.backend_view("a")["gate"]["in_flight"] == 1, what="first request in")
            rest = [pool.submit(env.post, headers={"x-mock-delay": "0.2"}) for _ in range(6)]
            answers = [f.result() for f in rest]
            assert slow.result().status_code == 200
        statuses = Counter(r.status_code for r in answers)
        assert statuses[429] >= 4 and statuses[200] >= 1, statuses
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["code"] == "backend_saturated"
        # The queue drains: the ceiling grows back by one per scrape.
        engine.configure(waiting=0)
        wait_until(lambda: env.backend_view("a")["gate"]["ceiling"] == 4, what="ceiling recovers")
        assert env.post().status_code == 200
        env.gw.stop()
    finally:
        engine.stop()


def test_active_probes_skip_a_down_backend_then_use_the_fallback(tmp_path: Path) -> None:
    live, spare = MockEngine(tmp_path), MockEngine(tmp_path)
    try:
        config = (
            backend("live", live.url)
            + backend("spare", spare.url)
            + '[[models]]\nname = "chat"\nchain = ["pm-live"]\n\n'
            + '[[models]]\nname = "reserve"\nchain = ["pm-spare"]\n\n[routing]\nfallback = "reserve"\n'
        )
        env = Env(tmp_path, config)
        live.reset()
        assert env.post().status_code == 200 and served_by([live, spare]) == [1, 0]
        # Without engine metrics the probe is GET /health; a 503 there takes the backend out.
        live.configure(metrics_enabled=False, health_status=503)
        wait_until(lambda: env.backend_view("live").get("healthy") is False, what="live marked down")
        assert "503" in env.backend_view("live")["probe_error"]
        time.sleep(0.3)  # the workers re-read the engine document every 0.1 s
        resp = env.post()
        assert resp.status_code == 200 and served_by([live, spare]) == [1, 1]
        # Everything down: 503 from the gateway, nothing sent to a known-failed node.
        spare.configure(metrics_enabled=False, health_status=503)
        wait_until(lambda: env.backend_view("spare").get("healthy") is False, what="spare marked down")
        time.sleep(0.3)
        resp = env.post()
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_healthy_backend"
        assert served_by([live, spare]) == [1, 1]
        # One good probe brings it back.
        live.configure(health_status=200)
        wait_until(lambda: env.backend_view("live").get("healthy") is True, what="live back")
        time.sleep(0.3)
        assert env.post().status_code == 200 and served_by([live, spare]) == [2, 1]
        env.gw.stop()
    finally:
        live.stop()
        spare.stop()


DRY_RUN_TABLE = [
    ("alice", {}, '{"model":"chat","messages":[{"role":"user","content":"plain"}]}'),
    ("robot", {}, '{"model":"chat","messages":[{"role":"user","content":"robot"}]}'),
    ("alice", {"x-tier": "free"}, '{"model":"chat","messages":[]}'),
    *(
        ("alice", {}, f'{{"model":"sticky","messages":[{{"role":"system","content":"tenant {i} prompt"}}]}}')
        for i in range(6)
    ),
]


@pytest.mark.parametrize(("principal", "headers", "body"), DRY_RUN_TABLE)
def test_dry_run_names_the_targets_the_real_path_uses(
    rules_env: Env, fresh: list[MockEngine], principal: str, headers: dict[str, str], body: str
) -> None:
    dry = rules_env.admin(
        "POST", "/admin/routing/dry-run", json={"principal": principal, "headers": headers, "body": body}
    )
    assert dry.status_code == 200, dry.text
    answer = dry.json()
    resp = httpx.post(
        rules_env.gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {rules_env.key[principal]}", **headers},
        content=body,
        timeout=30,
    )
    if answer["refused"] is not None:
        assert resp.status_code == answer["refused"]["status"]
        assert served_by(fresh) == [0, 0, 0]
        return
    assert resp.status_code == 200
    counts = dict(zip("abc", served_by(fresh), strict=True))
    assert counts[answer["targets"][0]["backend"]] == 1 and sum(counts.values()) == 1
