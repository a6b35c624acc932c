"""Usage retention: the control worker purges records past --usage-retention-days (in batches, audited),
never those a budget's current window counts, and `gateway usage prune` does it from the command line;
summaries reaching back before the purge say from when they are complete."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until

DAY = 86400.0
BUDGET = """
[[principals]]
name = "carol"
roles = ["chatter"]
budget = { period = "day", tokens = 1000000 }
"""


def _record(i: int, ts: float, principal: str) -> UsageRecord:
    return UsageRecord(
        f"old-{i}", ts, principal, "k1", "chat", "a", 200, 4, 6, 0, 10, "reported", 1000, 1.5, 1.0, None,
        None, 1, None,
    )  # fmt: skip


def test_the_control_worker_and_the_cli_purge_old_usage_but_keep_budget_windows(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    config = basic_config({"a": mock_engine.url}, extra=BUDGET)
    gw = Gateway(tmp_path, config, workers=1)
    now = time.time()
    day_start = now // DAY * DAY
    settings = Settings(data_dir=gw.data_dir)
    with open_store(settings) as store:
        carol = next(p.id for p in store.principals() if p.name == "carol")
        old = [_record(i, now - 400 * DAY - i, "p-gone") for i in range(2500)]  # more than one batch
        recent = [_record(5000 + i, now - 3 * DAY - i, "p-gone") for i in range(5)]
        today = [_record(9000, day_start + 1, carol)]
        store.usage.insert(old + recent + today)
        spent = store.usage.spend(day_start, now + 1, [carol])
    assert gw.stop() == 0

    # A restart with a retention of 365 days: the worker purges the 2,500 old ones, batch by batch.
    gw = Gateway(tmp_path, config, workers=1, port=gw.port, extra=("--usage-retention-days", "365"))
    try:
        with open_store(settings) as store:
            wait_until(lambda: store.usage.count() == 6, timeout=20, what="old records purged")
            entry = next(e for e in store.audit_log(10) if e.action == "usage.purge")
            assert entry.actor == "gateway (retention 365 days)"
            assert orjson.loads(entry.after or "")["rows"] == 2500
        # The CLI: 0.001 days (86 s) would reach into carol's budget day, which is kept.
        pruned = gw.cli("usage", "prune", "--older-than", "0.001")
        assert pruned.stdout.strip() == "5"
        assert "a budget's current window still counts them" in pruned.stderr
        with open_store(settings) as store:
            assert [r.request_id for r in store.usage.records()] == ["old-9000"]
            assert store.usage.spend(day_start, now + 1, [carol]) == spent
            assert store.audit_log(1)[0].actor.startswith("cli:")
        summary = gw.cli("usage", "--since", "500d", "--json")
        assert "were purged" in summary.stderr
        assert orjson.loads(summary.stdout)["complete_since"] >= now - 400 * DAY
        refused = gw.cli("usage", "prune", check=False)
        assert refused.returncode != 0 and "--older-than" in refused.stderr
    finally:
        gw.stop()
