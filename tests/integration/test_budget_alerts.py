"""Budget alerts through a running gateway: when a principal's spend crosses a threshold of its budget,
the control worker says so once per threshold and window, in a log line, in the Prometheus gauges, and
in a JSON POST to the webhook (a real HTTP server of the test's own on loopback)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

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
