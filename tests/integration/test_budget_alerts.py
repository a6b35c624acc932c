"""Budget alerts through a running gateway: when the spend in any window of a principal's or a key's
budgets crosses one of its thresholds, the control worker says so once per threshold and window, in a log
line, in the Prometheus gauges, and in a JSON POST to the webhook (a real HTTP server of the test's own on
loopback)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway.controlplane.usage import budget_alerts
from tests.fixtures.dribbler import Dribbler
from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, wait_until
from tests.integration.test_metrics import scrape
from tests.integration.test_usage import chat, ready_key

BUDGETED = """
[[principals]]
name = "capped"
roles = ["chatter"]
budget = { period = "day", tokens = 1000, alerts = [0.5, 0.9, 1.0] }
"""


class Webhook:
    """A loopback HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                hook.received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.stop()


def test_thresholds_alert_once_each_by_log_gauge_and_webhook(
    tmp_path: Path, mock_engine: MockEngine, webhook: Webhook
) -> None:
    admin_port = free_port()
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}, extra=BUDGETED),
        extra=("--admin-port", str(admin_port), "--budget-alert-webhook", webhook.url),
    )
    try:
        key = ready_key(gw, "capped")
        mock_engine.configure(tokens=1000)
        # One prompt token + 299 completion tokens: 300 a request; 600 after two (past 50%).
        for _ in range(2):
            assert chat(gw, key, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 1, what="the 50% alert")
        alert = webhook.received[0]
        assert (alert["event"], alert["principal"], alert["period"]) == ("budget_threshold", "capped", "day")
        assert (alert["threshold"], alert["tokens"], alert["tokens_limit"]) == (0.5, 600, 1000)
        assert alert["message"].startswith(
            "budget alert: principal capped has used 60% of its day budget (600 of 1000 tokens), past its "
            "50% threshold"
        )
        metrics = scrape(f"http://127.0.0.1:{admin_port}")
        assert metrics["gateway_budget_used_ratio"] == [({"principal": "capped", "period": "day"}, 0.6)]
        assert metrics["gateway_budget_alert_threshold"] == [({"principal": "capped", "period": "day"}, 0.5)]
        # 900 tokens: 90%; 1,200: 100%.
        assert chat(gw, key, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 2, what="the 90% alert")
        assert chat(gw, key, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 3, what="the 100% alert")
        assert [a["threshold"] for a in webhook.received] == [0.5, 0.9, 1.0]
        assert webhook.received[2]["tokens"] == 1200
        assert chat(gw, key, 299).status_code == 402  # the budget itself, as before
        wait_until(
            lambda: gw.log.read_text().count("budget alert: principal capped") == 3, what="three log lines"
        )
        assert len(webhook.received) == 3  # nothing more for thresholds already reported
    finally:
        gw.stop()


WINDOWED = """
[[principals]]
name = "team"
roles = ["chatter"]
budgets = [
    { period = "day", tokens = 2000, alerts = [0.5, 1.0] },
    { period = "month", tokens = 10000, alerts = [0.1] },
]

[[keys]]
name = "ci"
principal = "team"
secret = "sk-gw-ci-alerts-0123456789"
budgets = [{ period = "day", tokens = 1000, alerts = [0.5, 0.9] }]
"""


def test_every_window_of_a_principal_and_of_a_key_alerts_once_per_threshold(
    tmp_path: Path, mock_engine: MockEngine, webhook: Webhook
) -> None:
    admin_port = free_port()
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}, extra=WINDOWED),
        extra=("--admin-port", str(admin_port), "--budget-alert-webhook", webhook.url),
    )
    try:
        ci = "sk-gw-ci-alerts-0123456789"
        gw.wait_key_live(ci)
        other = ready_key(gw, "team")
        mock_engine.configure(tokens=1000)

        def fired() -> list[tuple[str, str | None, str, float]]:
            return sorted((a["scope"], a["key"], a["period"], a["threshold"]) for a in webhook.received)

        # 300 tokens a request through ci: the key's day budget passes half at 600, 90% at 900.
        assert chat(gw, ci, 299).status_code == 200
        assert chat(gw, ci, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 1, what="the key's 50% alert")
        assert fired() == [("key", "ci", "day", 0.5)]
        alert = webhook.received[0]
        assert (alert["principal"], alert["tokens"], alert["tokens_limit"]) == ("team", 600, 1000)
        assert alert["key_id"] and alert["message"].startswith(
            "budget alert: key ci (principal team) has used 60% of its day budget (600 of 1000 tokens), past "
            "its 50% threshold"
        )
        assert chat(gw, ci, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 2, what="the key's 90% alert")
        # 1,200: the principal's day passes half, its month a tenth; the key is past its budget.
        assert chat(gw, ci, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 4, what="the principal's alerts")
        assert fired() == [
            ("key", "ci", "day", 0.5),
            ("key", "ci", "day", 0.9),
            ("principal", None, "day", 0.5),
            ("principal", None, "month", 0.1),
        ]
        assert chat(gw, ci, 1).status_code == 402  # the key's own budget
        metrics = scrape(f"http://127.0.0.1:{admin_port}")
        assert sorted(metrics["gateway_budget_used_ratio"], key=lambda m: sorted(m[0].items())) == [
            ({"principal": "team", "key": "ci", "period": "day"}, 1.2),
            ({"principal": "team", "period": "day"}, 0.6),
            ({"principal": "team", "period": "month"}, 0.12),
        ]
        assert {
            (m[0].get("key"), m[0]["period"], m[1]) for m in metrics["gateway_budget_alert_threshold"]
        } == {
            ("ci", "day", 0.9),
            (None, "day", 0.5),
            (None, "month", 0.1),
        }
        # Another key of the team's: only the principal's windows move; its day reaches 100% at 2,100.
        for _ in range(3):
            assert chat(gw, other, 299).status_code == 200
        wait_until(lambda: len(webhook.received) == 5, what="the principal's 100% alert")
        last = webhook.received[-1]
        assert (last["scope"], last["key"], last["period"], last["threshold"]) == (
            "principal",
            None,
            "day",
            1.0,
        )
        assert chat(gw, other, 1).status_code == 402
        wait_until(lambda: gw.log.read_text().count("budget alert: ") == 5, what="five log lines")
        time.sleep(0.5)  # a few more drain intervals: nothing fires twice
        assert len(webhook.received) == 5 and gw.log.read_text().count("budget alert: ") == 5
    finally:
        gw.stop()


def test_a_webhook_that_dribbles_its_answer_fails_at_the_deadline(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    # Status line and headers at once, then a byte every half second for 40 s: httpx's per-read timeout
    # never fires, so only the POST's total deadline ends it.
    hook = Dribbler(interval=0.5, length=40.0, path="/alerts")
    gw = Gateway(
        tmp_path,
        basic_config({"a": mock_engine.url}, extra=BUDGETED),
        extra=("--budget-alert-webhook", hook.url),
    )
    try:
        key = ready_key(gw, "capped")
        mock_engine.configure(tokens=1000)
        for _ in range(2):  # 600 of 1,000 tokens: past 50%
            assert chat(gw, key, 299).status_code == 200
        wait_until(lambda: hook.answered, what="the alert reaching the webhook")
        began = hook.answered[0]
        wait_until(
            lambda: "budget alert webhook failed for capped" in gw.log.read_text(),
            timeout=budget_alerts.WEBHOOK_DEADLINE + 8,
            what="the dribbled POST given up and logged",
        )
        assert time.monotonic() - began < budget_alerts.WEBHOOK_DEADLINE + 8
        assert "budget alert: principal capped has used 60%" in gw.log.read_text()  # the log line stands
    finally:
        gw.stop()
        hook.stop()
