"""Usage records and budgets end to end: every forwarded request becomes exactly one stored record, also
across a control-worker crash; budgets refuse the request after the one that crossed them, also after the
whole gateway restarts; a stream's usage is asked for when the client did not ask."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until

BUDGETED = """
[[principals]]
name = "capped"
roles = ["chatter"]
budget = {{ {budget} }}
"""


def records(gw: Gateway, database: str | None = None) -> list[UsageRecord]:
    with open_store(Settings(data_dir=gw.data_dir, database=database)) as store:
        return store.usage.records(limit=100_000)


def wait_for_records(gw: Gateway, n: int, database: str | None = None) -> list[UsageRecord]:
    wait_until(lambda: len(records(gw, database)) >= n, timeout=20, what=f"{n} usage records")
    time.sleep(0.3)  # and no more than that arrive
    return records(gw, database)


def chat(gw: Gateway, key: str, max_tokens: int, **extra: object) -> httpx.Response:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": max_tokens,
        **extra,
    }
    # A fresh connection each time, so that SO_REUSEPORT spreads requests over every worker.
    return httpx.post(
        gw.url + "/v1/chat/completions",
        content=orjson.dumps(body),
        timeout=30,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )


def ready_key(gw: Gateway, principal: str) -> str:
    key = gw.create_key(principal)
    gw.wait_key_live(key)
    return key


def test_every_request_is_recorded_once_across_a_control_worker_crash(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    gw = Gateway(
        tmp_path, basic_config({"a": mock_engine.url}, price="{ input = 1.0, output = 2.0 }"), workers=4
    )
    try:
        key = ready_key(gw, "alice")
        mock_engine.configure(delay=0.01)
        n = 600

        def one(i: int) -> httpx.Response:
            return chat(gw, key, 1 + i % 7, stream=i % 3 == 0)

        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(one, i) for i in range(n)]
            time.sleep(0.5)
            control = gw.worker_pids("control")[0]
            os.kill(control, signal.SIGKILL)  # mid-burst: the rings keep what it had not stored
            responses = [f.result() for f in futures]
        assert all(r.status_code == 200 for r in responses)
        wait_until(lambda: gw.worker_pids("control") not in ([], [control]), what="control worker respawned")
        got = wait_for_records(gw, n)
        assert len(got) == n
        assert len({r.request_id for r in got}) == n
        ids = {r.headers["x-request-id"] for r in responses}
        assert ids == {r.request_id for r in got}
        by_id = {r.request_id: r for r in got}
        for i, resp in enumerate(responses):
            rec = by_id[resp.headers["x-request-id"]]
            completion = 1 + i % 7
            assert (rec.prompt_tokens, rec.completion_tokens, rec.total_tokens) == (
                1,
                completion,
                1 + completion,
            )
            assert rec.usage_source == "reported"  # streams too: the gateway asked for their usage
            assert (rec.status, rec.model, rec.backend) == (200, "chat", "a")
            assert rec.cost_nanos == 1 * 1000 + completion * 2000  # $1 and $2 per million tokens
            assert rec.latency_ms >= 0 and rec.ttfb_ms is not None and rec.ttfb_ms <= rec.latency_ms
        assert gw.stop() == 0
    finally:
        gw.stop()


def test_budget_refuses_the_request_after_the_one_that_crossed_it(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    config = basic_config(
        {"a": mock_engine.url}, extra=BUDGETED.format(budget='period = "day", tokens = 1000')
    )
    gw = Gateway(tmp_path, config, workers=4)
    try:
        key = ready_key(gw, "capped")
        mock_engine.configure(tokens=1000)
        # One prompt token ("q") + 399 completion tokens: 400 per request.
        for i in range(3):
            r = chat(gw, key, 399)
            assert r.status_code == 200, (i, r.text)
        refused = chat(gw, key, 399)
        assert refused.status_code == 402
        error = refused.json()["error"]
        assert error["code"] == "budget_exceeded" and error["type"] == "insufficient_quota"
        assert "1200 of 1000 tokens" in error["message"]
        posted = [r for r in mock_engine.requests() if r["method"] == "POST"]
        assert len(posted) == 3  # the refused request never reached the engine
        wait_for_records(gw, 3)
        status = orjson.loads(gw.cli("budgets", "--json").stdout)
        assert status == [
            {
                "scope": "principal",
                "principal": "capped",
                "key": None,
                "period": "day",
                "window_start": pytest.approx(status[0]["window_start"]),
                "window_end": status[0]["window_start"] + 86400,
                "tokens": 1200,
                "tokens_limit": 1000,
                "cost": 0.0,
                "cost_limit": None,
                "exceeded": True,
                "alerts": [],
            }
        ]
        other = ready_key(gw, "alice")  # other principals are not affected
        assert chat(gw, other, 5).status_code == 200
    finally:
        gw.stop()
    # A new gateway on the same store (a new bucket table) still knows what was spent.
    gw = Gateway(tmp_path, None, workers=2, extra=("--data-dir", str(gw.data_dir)))
    try:
        wait_until(lambda: chat(gw, key, 1).status_code == 402, what="budget remembered after a restart")
    finally:
        gw.stop()


def test_cost_budget_counts_prices(tmp_path: Path, mock_engine: MockEngine) -> None:
    config = basic_config(
        {"a": mock_engine.url},
        price="{ input = 1000.0, output = 1000.0 }",  # a thousandth of a unit per token
        extra=BUDGETED.format(budget='period = "1h", cost = 0.5'),
    )
    gw = Gateway(tmp_path, config, workers=2)
    try:
        key = ready_key(gw, "capped")
        mock_engine.configure(tokens=1000)
        assert chat(gw, key, 249).status_code == 200  # 250 tokens: 0.25
        assert chat(gw, key, 249).status_code == 200  # 0.50: crosses
        r = chat(gw, key, 1)
        assert r.status_code == 402 and "0.500000 of 0.500000 (cost)" in r.json()["error"]["message"]
    finally:
        gw.stop()


def test_stream_usage_is_asked_for_and_estimated_when_the_client_opts_out(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1)
    try:
        key = ready_key(gw, "alice")
        asked = chat(gw, key, 5, stream=True)
        # Asked for by the gateway, not by the client: read, and withheld from it (test_stream_usage.py).
        assert b'"usage"' not in asked.content and asked.content.endswith(b"data: [DONE]\n\n")
        sent = mock_engine.requests()[-1]
        assert sent["path"] == "/v1/chat/completions"
        assert orjson.loads(sent["body"])["stream_options"] == {"include_usage": True}
        opted_out = chat(gw, key, 5, stream=True, stream_options={"include_usage": False})
        assert b'"usage":{' not in opted_out.content
        assert orjson.loads(mock_engine.requests()[-1]["body"])["stream_options"] == {"include_usage": False}
        got = {r.request_id: r for r in wait_for_records(gw, 2)}
        assert got[asked.headers["x-request-id"]].usage_source == "reported"
        estimated = got[opted_out.headers["x-request-id"]]
        assert estimated.usage_source == "estimated"
        assert estimated.completion_tokens == 5  # max_tokens, reserved before dispatch
    finally:
        gw.stop()


def test_without_usage_records_nothing_is_recorded(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1, extra=("--no-usage-records",))
    try:
        key = ready_key(gw, "alice")
        r = chat(gw, key, 5, stream=True)
        assert r.status_code == 200 and "x-request-id" not in r.headers
        assert b'"usage":{' not in r.content  # nothing to account: the body is forwarded as sent
        time.sleep(0.5)
        assert records(gw) == []
    finally:
        gw.stop()


def test_errors_and_client_disconnects_are_recorded(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1)
    try:
        key = ready_key(gw, "alice")
        mock_engine.configure(fail_status=400, fail_count=1)
        assert chat(gw, key, 5).status_code == 400
        mock_engine.configure(delay=3.0)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "q"}]},
                headers={"authorization": f"Bearer {key}"},
                timeout=1.0,
            )
        got = sorted(wait_for_records(gw, 2), key=lambda r: r.ts)
        assert [(r.status, r.usage_source, r.total_tokens) for r in got] == [
            (400, "none", 0),
            (499, "none", 0),
        ]
        # The client left after 1 s: the gateway noticed, gave the upstream call up and recorded the 499
        # then, not when the engine would have answered (3 s).
        assert got[1].latency_ms < 2500
        summary = orjson.loads(gw.cli("usage", "--by", "model", "--json").stdout)
        assert summary["groups"] == [
            {
                "group": "chat",
                "requests": 2,
                "errors": 2,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
                "cost": 0.0,
            }
        ]
    finally:
        gw.stop()


def test_access_log_has_a_line_per_request_and_no_key_material(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    from gateway.config import load_hash_key
    from gateway.keys import hash_secret

    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}),
        workers=2,
        extra=("--access-log", "--log-format", "json"),
    )
    try:
        key = ready_key(gw, "alice")
        ids = {chat(gw, key, 2).headers["x-request-id"] for _ in range(12)}
        wait_for_records(gw, 12)
        hashed = hash_secret(key, load_hash_key(gw.data_dir)).hex()
    finally:
        gw.stop()
    text = gw.log.read_text()
    lines = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    access = [line for line in lines if "request_id" in line]
    assert {line["request_id"] for line in access} == ids and len(access) == 12
    assert all(line["principal"] == "alice" and line["status"] == 200 for line in access)
    assert any(line.get("logger") == "gateway.supervisor" for line in lines)  # the other logs are JSON too
    assert key not in text and key[6:] not in text and hashed not in text


def test_a_client_request_id_is_returned_and_recorded(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1)
    try:
        key = ready_key(gw, "alice")
        body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
        sent = {"authorization": f"Bearer {key}", "x-request-id": "trace-abc-1"}
        first = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=sent, timeout=10)
        again = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=sent, timeout=10)  # a retry
        assert first.headers["x-request-id"] == again.headers["x-request-id"] == "trace-abc-1"
        ours = {first.headers["x-gateway-request-id"], again.headers["x-gateway-request-id"]}
        assert len(ours) == 2  # two requests, two records, whatever the client calls them
        assert mock_engine.requests()[-1]["headers"]["x-request-id"] == "trace-abc-1"  # forwarded upstream
        bad = httpx.post(
            gw.url + "/v1/chat/completions",
            json=body,
            headers={**sent, "x-request-id": "has space"},
            timeout=10,
        )
        assert bad.headers["x-request-id"] != "has space" and "x-gateway-request-id" not in bad.headers
        got = {r.request_id: r for r in wait_for_records(gw, 3)}
        assert {got[i].client_request_id for i in ours} == {"trace-abc-1"}
        assert got[bad.headers["x-request-id"]].client_request_id is None
    finally:
        gw.stop()


def test_records_count_the_targets_a_request_tried(tmp_path: Path, mock_engines: list[MockEngine]) -> None:
    first, second = mock_engines[:2]
    admin_port = free_port()
    config = basic_config({"a": first.url, "b": second.url})
    gw = Gateway(tmp_path, config, workers=1, extra=("--admin-port", str(admin_port)))
    try:
        key = ready_key(gw, "alice")
        assert chat(gw, key, 2).status_code == 200
        first.configure(fail_status=503, fail_count=1)
        assert chat(gw, key, 2).status_code == 200
        got = sorted(wait_for_records(gw, 2), key=lambda r: r.ts)
        assert [(r.backend, r.attempts) for r in got] == [("a", 1), ("b", 2)]
        metrics = httpx.get(f"http://127.0.0.1:{admin_port}/metrics").text
        assert 'gateway_failovers_total{model="chat"} 1' in metrics
    finally:
        gw.stop()


WINDOWS = """
[[principals]]
name = "daily"
roles = ["chatter"]
budgets = [{ period = "day", tokens = 1000 }, { period = "month", tokens = 5000 }]

[[principals]]
name = "monthly"
roles = ["chatter"]
budget = { period = "day", tokens = 5000 }
budgets = [{ period = "month", tokens = 1000 }]
"""


def _store_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """``--database URL`` for the PostgreSQL variant of a test, nothing for SQLite."""
    if request.param == "postgres":
        return ("--database", request.getfixturevalue("postgres_url"))
    return ()


@pytest.fixture(params=["sqlite", "postgres"])
def store_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return _store_args(request)


def _database(store_args: tuple[str, ...]) -> str | None:
    return store_args[1] if store_args else None


def _resets(period: str) -> str:
    """When the current window of ``period`` ends, as a refusal says it."""
    from gateway.budget import period_window

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(period_window(period, time.time())[1]))


def test_a_day_and_a_month_budget_each_refuse_when_they_run_out(
    tmp_path: Path, mock_engine: MockEngine, store_args: tuple[str, ...]
) -> None:
    """Two principals with a day and a month budget each: the smaller one refuses, whichever it is, with
    its own period and reset time; both windows count every request, also after a restart."""
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}, extra=WINDOWS), workers=2, extra=store_args)
    try:
        keys = {
            name: gw.cli("keys", "create", "--principal", name, *store_args).stdout.strip()
            for name in WINDOWS_OF
        }
        for key in keys.values():
            gw.wait_key_live(key)
        mock_engine.configure(tokens=1000)
        for name, key in keys.items():
            for i in range(3):  # one prompt token and 399 completion tokens: 400 a request
                assert chat(gw, key, 399).status_code == 200, (name, i)
            refused = chat(gw, key, 399)
            assert refused.status_code == 402, name
            period = WINDOWS_OF[name]
            assert refused.json()["error"]["message"] == (
                f"Budget exceeded: this principal has used 1200 of 1000 tokens in its {period} budget "
                f"period, which resets at {_resets(period)}."
            )
        assert len([r for r in mock_engine.requests() if r["method"] == "POST"]) == 6
        got = wait_for_records(gw, 6, _database(store_args))
        # Each request names the live counters of both its principal's windows.
        assert all(r.budget_keys is not None and len(r.budget_keys) == 2 for r in got)
        assert all(r.key_budget_keys is None for r in got)
        report = orjson.loads(gw.cli("budgets", "--json", *store_args).stdout)
        assert [
            (b["principal"], b["period"], b["tokens"], b["tokens_limit"], b["exceeded"]) for b in report
        ] == [
            ("daily", "day", 1200, 1000, True),
            ("daily", "month", 1200, 5000, False),
            ("monthly", "day", 1200, 5000, False),  # the single form comes first
            ("monthly", "month", 1200, 1000, True),
        ]
    finally:
        gw.stop()
    # A new gateway on the same store (a new bucket table) still knows both windows' spend.
    gw = Gateway(tmp_path, None, workers=2, extra=("--data-dir", str(gw.data_dir), *store_args))
    try:
        for name, key in keys.items():
            wait_until(
                lambda k=key: chat(gw, k, 1).status_code == 402, what=f"{name}'s budget after a restart"
            )
            assert f"in its {WINDOWS_OF[name]} budget period" in chat(gw, key, 1).json()["error"]["message"]
    finally:
        gw.stop()


WINDOWS_OF = {"daily": "day", "monthly": "month"}  # the window that runs out first

KEY_BUDGETS = """
[[roles]]
name = "operator"
permissions = ["key:create", "config:read", "usage:read"]

[[principals]]
name = "ops"
roles = ["operator"]

[[principals]]
name = "team"
roles = ["chatter"]
budget = { period = "day", tokens = 2000 }

[[keys]]
name = "ci"
principal = "team"
secret = "sk-gw-ci-key-0123456789"
budgets = [{ period = "day", tokens = 800 }, { period = "1h", tokens = 5000 }]
"""


def test_a_key_budget_narrower_than_its_principal_s(
    tmp_path: Path, mock_engine: MockEngine, store_args: tuple[str, ...]
) -> None:
    """A key's own budgets (from the config file, the CLI and the admin API) refuse that key alone; its
    principal's budget still covers all its keys together. The dry run says which budget would refuse."""
    admin_port = free_port()
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}, extra=KEY_BUDGETS),
        workers=2,
        extra=("--admin-port", str(admin_port), *store_args),
    )
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        ci = "sk-gw-ci-key-0123456789"
        day_1200 = '{ period = "day", tokens = 1200 }'
        create = ("keys", "create", *store_args, "--principal")
        laptop = gw.cli(*create, "team", "--name", "laptop", "--budget", day_1200).stdout.strip()
        plain = gw.cli(*create, "team").stdout.strip()
        ops = {"authorization": f"Bearer {gw.cli(*create, 'ops').stdout.strip()}"}
        wait_until(lambda: httpx.get(admin + "/admin/whoami", headers=ops).status_code == 200, what="ops key")
        made = httpx.post(
            admin + "/admin/keys",
            headers=ops,
            json={
                "principal": "team",
                "name": "api",
                "budgets": [{"period": "day", "tokens": 400, "alerts": [1]}],
            },
            timeout=10,
        )
        assert made.status_code == 201, made.text
        api = made.json()["secret"]
        bad = httpx.post(
            admin + "/admin/keys",
            headers=ops,
            json={"principal": "team", "budgets": [{"period": "week", "tokens": 1}]},
            timeout=10,
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["message"].startswith("budgets[0].period: must be")
        for key in (ci, laptop, plain, api):
            gw.wait_key_live(key)
        listed = {k["name"]: k["budgets"] for k in httpx.get(admin + "/admin/keys", headers=ops).json()}
        assert listed["ci"] == [
            {"period": "day", "tokens": 800, "cost": None, "alerts": []},
            {"period": "1h", "tokens": 5000, "cost": None, "alerts": []},
        ]
        assert listed["api"] == [{"period": "day", "tokens": 400, "cost": None, "alerts": [1.0]}]
        assert "day:tokens=1200" in gw.cli("keys", "list", *store_args).stdout

        mock_engine.configure(tokens=1000)
        assert chat(gw, ci, 399).status_code == 200
        assert chat(gw, ci, 399).status_code == 200  # 800: the key's day budget is used up
        refused = chat(gw, ci, 399)
        assert refused.status_code == 402
        assert refused.json()["error"]["message"] == (
            "Budget exceeded: this API key has used 800 of 800 tokens in its day budget period, which resets "
            f"at {_resets('day')}."
        )
        assert chat(gw, api, 399).status_code == 200  # the API key's 400: crossed
        assert "this API key has used 400 of 400 tokens" in chat(gw, api, 1).json()["error"]["message"]
        # The dry run: the key's budgets and its principal's, with what each window holds.
        dry = httpx.post(
            admin + "/admin/routing/dry-run",
            headers=ops,
            json={"model": "chat", "key": "ci", "body": {"messages": [{"role": "user", "content": "q"}]}},
            timeout=10,
        )
        assert dry.status_code == 200, dry.text
        answer = dry.json()
        assert [
            (b["scope"], b["period"], b["tokens"], b["tokens_limit"], b["refuses"]) for b in answer["budgets"]
        ] == [
            ("principal", "day", 1200, 2000, False),
            ("key", "day", 800, 800, True),
            ("key", "1h", 800, 5000, False),
        ]
        assert answer["budget_refusal"] == refused.json()["error"]["message"]
        # Other keys of the principal go on, until the principal's own budget (all keys together) is used.
        assert chat(gw, laptop, 399).status_code == 200  # team: 1600
        assert chat(gw, plain, 399).status_code == 200  # team: 2000
        for key in (plain, laptop):
            message = chat(gw, key, 1).json()["error"]["message"]
            assert message.startswith(
                "Budget exceeded: this principal has used 2000 of 2000 tokens in its day"
            )
        dry = httpx.post(
            admin + "/admin/routing/dry-run",
            headers=ops,
            json={"model": "chat", "principal": "team"},
            timeout=10,
        ).json()
        assert [b["scope"] for b in dry["budgets"]] == ["principal"]
        assert dry["budget_refusal"].startswith(
            "Budget exceeded: this principal has used 2000 of 2000 tokens"
        )

        got = {r.request_id: r for r in wait_for_records(gw, 5, _database(store_args))}
        ci_records = [
            r for r in got.values() if r.key_budget_keys is not None and len(r.key_budget_keys) == 2
        ]
        assert len(ci_records) == 2 and all(r.budget_keys and len(r.budget_keys) == 1 for r in ci_records)
        report = orjson.loads(gw.cli("budgets", "--json", *store_args).stdout)
        assert [
            (b["scope"], b["principal"], b["key"], b["period"], b["tokens"], b["exceeded"]) for b in report
        ] == [
            ("principal", "team", None, "day", 2000, True),
            ("key", "team", "ci", "day", 800, True),
            ("key", "team", "ci", "1h", 800, False),
            ("key", "team", "laptop", "day", 400, False),
            ("key", "team", "api", "day", 400, True),
        ]
        assert httpx.get(admin + "/admin/budgets", headers=ops).json() == report
    finally:
        gw.stop()
    # A new gateway on the same store (a new bucket table) knows every window's spend again.
    admin_port = free_port()
    extra = ("--data-dir", str(gw.data_dir), "--admin-port", str(admin_port), *store_args)
    gw = Gateway(tmp_path, None, workers=1, extra=extra)
    try:
        wait_until(lambda: chat(gw, ci, 1).status_code == 402, what="the budgets after a restart")
        assert "this principal has used 2000 of 2000" in chat(gw, ci, 1).json()["error"]["message"]
        dry = httpx.post(
            f"http://127.0.0.1:{admin_port}/admin/routing/dry-run",
            headers=ops,
            json={"model": "chat", "key": "ci"},
            timeout=10,
        ).json()
        assert [(b["period"], b["tokens"], b["refuses"]) for b in dry["budgets"]] == [
            ("day", 2000, True),
            ("day", 800, True),
            ("1h", 800, False),
        ]
    finally:
        gw.stop()
