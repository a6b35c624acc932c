"""``gateway status`` and ``gateway status --json`` against a real gateway, alive and after a kill -9
(issue 20, item 9)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import orjson
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_status_json_then_dead_workers_after_the_supervisor_is_killed(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2)
    try:
        done = gw.cli("status", "--json")
        doc = orjson.loads(done.stdout)
        assert doc["supervisor"] == {
            "pid": gw.proc.pid,
            "running": True,
            "stopping": False,
            "stopped_because": None,
        }
        assert doc["listening"] == f"127.0.0.1:{gw.port}" and doc["role"] == "all"
        assert doc["snapshot"]["generation"] >= 1 and doc["snapshot"]["source"] == "local store"
        workers = {w["name"]: w for w in doc["workers"]}
        assert set(workers) == {"control", "proxy-1", "proxy-2"}
        assert all(
            w["status"] == "running" and w["pid"] and w["uptime"] is not None for w in workers.values()
        )
        pids = [w["pid"] for w in workers.values()]

        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait(10)
        wait_until(lambda: all(_gone(p) for p in pids), what="workers gone with their supervisor")

        text = gw.cli("status", check=False)
        assert text.returncode == 1
        assert f"supervisor pid={gw.proc.pid} not running" in text.stdout
        for name, w in workers.items():
            line = next(x for x in text.stdout.splitlines() if x.strip().startswith(name))
            assert f"DEAD (was pid {w['pid']})" in line and "uptime" not in line, text.stdout
        dead = orjson.loads(gw.cli("status", "--json", check=False).stdout)
        assert dead["supervisor"]["running"] is False
        assert [(w["status"], w["pid"], w["last_pid"]) for w in dead["workers"]] == [
            ("dead", None, w["pid"]) for w in workers.values()
        ]
    finally:
        if gw.proc.poll() is None:
            gw.stop()


def test_status_json_without_a_gateway(tmp_path: Path) -> None:
    gw_dir = tmp_path / "nothing"
    import subprocess

    from tests.fixtures.processes import PY, ROOT

    done = subprocess.run(
        [PY, "-m", "gateway", "status", "--json", "--data-dir", str(gw_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert orjson.loads(done.stdout) == {"running": False, "run_dir": str(gw_dir / "run")}
