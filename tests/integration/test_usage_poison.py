"""No usage record stops a process: an upstream that reports usage figures no column can hold (2^63 and
more, 1e30, negative ones) or that price into a cost past 64 bits leaves the gateway serving, its record
stored with every figure in bounds; the requests after it are stored as usual."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import MAX_FIGURE, UsageRecord, encode_record
from tests.fixtures.processes import Gateway, basic_config, free_port, wait_until
from tests.fixtures.upstream import OK, RawUpstream
from tests.integration.test_metrics import scrape, total
from tests.integration.test_usage import chat, ready_key, records

TOKENS = 2**53  # the largest figure the gateway's usage parser takes from an upstream


def answer(usage: bytes) -> bytes:
    body = (
        b'{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":' + usage + b"}"
    )
    return OK % len(body) + body


def test_usage_figures_no_column_holds_leave_the_gateway_serving(tmp_path: Path) -> None:
    upstream = RawUpstream()
    admin_port = free_port()
    # 2^53 prompt and 2^53 completion tokens at 1e3 nano-units each would cost 1.8e19, past a signed 64-bit
    # column (on e8f5beb the control worker died on it twice and the supervisor stopped). The proxy now caps
    # a request's cost at MAX_FIGURE (gateway.budget.Price.cost) and the usage parser every count, so the
    # record reaches the control worker in bounds; the control worker's own clamp, for what a remote host's
    # batch may carry, is tested on both stores in tests/unit/test_usage_pipeline.py.
    config = basic_config({"a": upstream.url}, price="{ input = 1.0, output = 1.0 }")
    gw = Gateway(tmp_path, config, workers=1, extra=("--admin-port", str(admin_port)))
    try:
        key = ready_key(gw, "alice")
        hostile = {
            "2^53": b'{"prompt_tokens":%d,"completion_tokens":%d}' % (TOKENS, TOKENS),
            "2^63": b'{"prompt_tokens":9223372036854775808,"completion_tokens":18446744073709551616}',
            "1e30": b'{"prompt_tokens":1,"completion_tokens":1e30,"total_tokens":1e30}',
            "negative": b'{"prompt_tokens":-5,"completion_tokens":-1,"total_tokens":-6}',
        }
        ids = {}
        for name, usage in hostile.items():
            upstream.answer = answer(usage)
            r = chat(gw, key, 5)
            assert r.status_code == 200, (name, r.text)
            ids[name] = r.headers["x-request-id"]
        upstream.answer = answer(b'{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}')
        ids["after"] = chat(gw, key, 5).headers["x-request-id"]

        def stored() -> dict[str, UsageRecord]:
            return {r.request_id: r for r in records(gw)}

        wait_until(lambda: set(ids.values()) <= set(stored()), timeout=20, what="every record stored")
        got = stored()
        dear = got[ids["2^53"]]
        figures = (dear.prompt_tokens, dear.completion_tokens, dear.total_tokens, dear.cost_nanos)
        assert figures == (TOKENS, TOKENS, MAX_FIGURE, MAX_FIGURE)
        after = got[ids["after"]]
        assert (after.prompt_tokens, after.completion_tokens, after.total_tokens) == (3, 4, 7)
        # Figures the usage parser cannot take (past 2^53, not integers, negative) count as unreported: the
        # others of the same usage object stand, or the request's estimate; never one out of bounds.
        for name in ("2^63", "1e30", "negative"):
            record = got[ids[name]]
            figures = (*record[7:11], record.cost_nanos)
            assert all(0 <= f <= MAX_FIGURE for f in figures), (name, record)

        with open_store(Settings(data_dir=gw.data_dir)) as store:
            assert store.usage.clamped(limit=10) == []  # nothing out of bounds reached the store
        listed = orjson.loads(gw.cli("usage", "rejected", "--json").stdout)
        assert listed["clamped"] == [] and listed["rejected"] == []
        metrics = scrape(f"http://127.0.0.1:{admin_port}")
        assert not total(metrics, "gateway_usage_records_clamped_total")

        # And it goes on serving and storing.
        more = [chat(gw, key, 5) for _ in range(3)]
        assert [r.status_code for r in more] == [200, 200, 200]
        wait_until(
            lambda: {r.headers["x-request-id"] for r in more} <= set(stored()),
            timeout=20,
            what="later records",
        )
        state = gw.state()
        assert state["fatal"] is None
        control = [w for w in state["workers"] if w["kind"] == "control"]
        assert control and control[0]["restarts"] == 0
        status = gw.cli("status", check=False)
        assert status.returncode == 0 and "stopped because" not in status.stdout
        assert httpx.get(gw.url + "/readyz", timeout=5).status_code == 200
    finally:
        gw.stop()
        upstream.stop()


TOKEN = "t" * 32
CLUSTER_AUTH = {"authorization": f"Bearer {TOKEN}"}


def control_plane(tmp_path: Path, extra: str = "") -> tuple[Gateway, str]:
    """A control-role gateway taking proxy hosts' batches (``POST /cluster/usage``), once it answers; and
    its admin URL."""
    admin_port = free_port()
    gw = Gateway(
        tmp_path,
        basic_config({"a": "http://127.0.0.1:1"}, extra=extra),
        workers=1,
        extra=("--role", "control", "--admin-port", str(admin_port)),
        env={"GATEWAY_CLUSTER_TOKEN": TOKEN, "GATEWAY_HASH_KEY": "ab" * 32},
        wait=False,
    )
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        wait_until(
            lambda: httpx.get(admin + "/cluster/healthz", headers=CLUSTER_AUTH, timeout=2).status_code == 200,
            what="control plane",
        )
    except BaseException:
        gw.stop()
        raise
    return gw, admin


def test_a_hostile_cluster_batch_is_stored_clamped_or_set_aside(tmp_path: Path) -> None:
    """What a remote proxy host (or anyone holding the cluster token) sends is not bounded by this host's
    proxies: figures past a signed 64-bit column, records of the wrong shape. The control plane stores the
    batch's good records, clamps and flags what no column holds, sets the rest aside, and goes on."""
    gw, admin = control_plane(tmp_path)
    auth = CLUSTER_AUTH
    try:
        now = time.time()

        def record(request_id: str, prompt: int, cost: int) -> list[object]:
            fields = UsageRecord(
                request_id, now, "p", "k", "m", "b", 200, prompt, 1, 0, 2, "reported", cost, 1.0, 1.0, None
            )
            return list(orjson.loads(encode_record(fields)))

        batch = [
            record("fine", 3, 10),
            record("huge", 2**63 + 5, 2**64 - 1),  # fits the batch's JSON, not a signed 64-bit column
            ["not", "a", "record"],
            "garbage",
        ]
        resp = httpx.post(admin + "/cluster/usage", content=orjson.dumps(batch), headers=auth, timeout=10)
        assert resp.status_code == 200, resp.text
        with open_store(Settings(data_dir=gw.data_dir)) as store:
            stored = {r.request_id: r for r in store.usage.records(limit=10)}
            assert stored["fine"].prompt_tokens == 3
            assert (stored["huge"].prompt_tokens, stored["huge"].cost_nanos) == (MAX_FIGURE, MAX_FIGURE)
            assert [c[0] for c in store.usage.clamped(limit=10)] == ["huge"]
        listed = orjson.loads(gw.cli("usage", "rejected", "--json").stdout)
        assert len(listed["rejected"]) == 2 and {r["source"] for r in listed["rejected"]} == {"cluster"}
        metrics = scrape(admin)
        assert total(metrics, "gateway_usage_records_rejected_total") == 2
        # The same batch again adds nothing: stored once, set aside once.
        resp = httpx.post(admin + "/cluster/usage", content=orjson.dumps(batch), headers=auth, timeout=10)
        assert resp.status_code == 200
        with open_store(Settings(data_dir=gw.data_dir)) as store:
            assert len(store.usage.records(limit=10)) == 2
        assert len(orjson.loads(gw.cli("usage", "rejected", "--json").stdout)["rejected"]) == 2
        assert httpx.get(admin + "/cluster/healthz", headers=auth, timeout=2).status_code == 200
    finally:
        gw.stop()


def test_a_cluster_batch_naming_counters_no_table_can_have_is_stored_and_counted(tmp_path: Path) -> None:
    """A proxy host's batch for a principal with a budget whose records name budget keys no live counter
    can have (a string, a list, an object, a float): before, they raised out of the spend counters, the
    batch got a 500 on every retry and the host's spool stopped there. Now each record is stored once with
    the field flagged, its spend is in the principal's window, and the batch after it goes in as usual."""
    budget = (
        '[[principals]]\nname = "team"\nroles = ["chatter"]\nbudget = { period = "day", tokens = 1000000 }\n'
    )
    gw, admin = control_plane(tmp_path, budget)
    auth = CLUSTER_AUTH
    try:
        with open_store(Settings(data_dir=gw.data_dir)) as store:
            [team] = [p.id for p in store.principals() if p.name == "team"]
        now = time.time()

        def record(request_id: str, keys: object) -> list[object]:
            fields = UsageRecord(
                request_id, now, team, "k", "m", "b", 200, 3, 2, 0, 5, "reported", 50, 1.0, 1.0, None
            )
            values = list(orjson.loads(encode_record(fields)))
            values[16] = keys  # budget_keys, after the version
            return values

        odd = [["x"], [[7]], [{"k": 7}], [1.5], [7, "x"]]
        batch = [record(f"odd-{i}", keys) for i, keys in enumerate(odd)]
        resp = httpx.post(admin + "/cluster/usage", content=orjson.dumps(batch), headers=auth, timeout=10)
        assert resp.status_code == 200, resp.text
        after = [record("after", [7])]
        resp = httpx.post(admin + "/cluster/usage", content=orjson.dumps(after), headers=auth, timeout=10)
        assert resp.status_code == 200, resp.text
        with open_store(Settings(data_dir=gw.data_dir)) as store:
            stored = {r.request_id: r for r in store.usage.records(limit=10)}
            assert sorted(stored) == ["after", *(f"odd-{i}" for i in range(5))]
            assert [stored[f"odd-{i}"].budget_keys for i in range(5)] == [None, None, None, None, [7]]
            assert sorted(c[0] for c in store.usage.clamped(limit=10)) == [f"odd-{i}" for i in range(5)]
            spent = {s.owner_id: s.tokens for s in store.usage.spend(now - 1, now + 1)}
            assert spent == {team: 30}
        assert not orjson.loads(gw.cli("usage", "rejected", "--json").stdout)["rejected"]
        assert httpx.get(admin + "/cluster/healthz", headers=auth, timeout=2).status_code == 200
    finally:
        gw.stop()
