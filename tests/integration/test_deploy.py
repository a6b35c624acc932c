"""The files under deploy/: the systemd units verify, and name only flags the gateway knows."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import ROOT

UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))


def test_there_is_a_unit_per_role() -> None:
    assert {u.name for u in UNITS} == {"gateway.service", "gateway-proxy.service", "gateway-control.service"}
    for unit in UNITS:
        text = unit.read_text()
        assert "Type=notify" in text and "WatchdogSec=" in text and "LimitNOFILE=" in text


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_exec_start_flags_are_ones_serve_accepts(unit: Path) -> None:
    (exec_start,) = re.findall(r"^ExecStart=\S+ (.*)$", unit.read_text(), flags=re.M)
    args = exec_start.replace("${", "").replace("}", "").split()
    assert args[0] == "serve"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--help"], capture_output=True, text=True
    )
    for flag in (a for a in args if a.startswith("--")):
        assert flag in done.stdout, flag


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    # The unit points at /opt/gateway; verify a copy that points at this checkout's entry point.
    copy = tmp_path / unit.name
    copy.write_text(
        unit.read_text().replace("/opt/gateway/.venv/bin/gateway", str(ROOT / ".venv/bin/gateway"))
    )
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
    problems = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0 and not problems, problems
