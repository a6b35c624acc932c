"""A newcomer's first five minutes: `make run` in a fresh clone answers the README's example request and
prints the web UI's address and a demo admin key that the admin API accepts."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import ROOT, free_port, wait_until

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class DemoAdmin:
    url: str
    key: str


def demo_admin(printed: str) -> DemoAdmin:
    """The web UI's address and the demo admin key, as scripts/run-demo.sh prints them."""
    found = re.search(
        r"web UI on (http://\S+/ui/) : sign in with the demo admin key\n\s+(sk-gw-\S+)\n", printed
    )
    assert found, printed
    return DemoAdmin(found.group(1), found.group(2))


def readme_request(port: int) -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(curl http://127\.0\.0\.1:8080/v1/chat/completions.*?)\n```", text, re.S)
    assert block, "README.md must show the first request as a curl command"
    command = block.group(1).replace("\\\n", " ").replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    return shlex.split(command)


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make")
def test_make_run_in_a_fresh_clone_answers_the_readme_request(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    port, mock_port, admin_port = free_port(), free_port(), free_port()
    log = (tmp_path / "make-run.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    proc = subprocess.Popen(
        ["make", "run", f"PORT={port}", f"MOCK_PORT={mock_port}", f"ADMIN_PORT={admin_port}"],
        cwd=clone,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError((tmp_path / "make-run.log").read_text()[-3000:])
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200

        wait_until(up, timeout=600, interval=0.5, what="make run serving")
        if shutil.which("curl"):
            out = subprocess.run(readme_request(port), capture_output=True, text=True, check=True).stdout
        else:  # the same request, sent by httpx
            argv = readme_request(port)
            headers = dict(h.split(": ", 1) for h in argv[argv.index("-H") + 1 :: 2] if ": " in h)
            out = httpx.post(argv[1], headers=headers, content=argv[-1]).text
        assert '"choices"' in out and '"assistant"' in out, out
        printed = (tmp_path / "make-run.log").read_text()
        ui = demo_admin(printed)
        assert ui.url == f"http://127.0.0.1:{admin_port}/ui/"
        assert httpx.get(ui.url).status_code == 200
        whoami = httpx.get(
            f"http://127.0.0.1:{admin_port}/admin/whoami", headers={"authorization": f"Bearer {ui.key}"}
        )
        assert whoami.status_code == 200 and whoami.json()["principal"] == "demo-admin"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
