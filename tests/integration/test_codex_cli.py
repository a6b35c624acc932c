"""The real Codex CLI (npm ``@openai/codex``) through the gateway, unmodified: ``codex exec`` with a custom
provider pointed at the gateway (``wire_api = "responses"``) runs a task to its end — the mock engine
calls Codex's shell tool, Codex runs it and sends the output back, the engine answers with text — and
every request is billed.

The binary comes from ``CODEX_BIN``, else the project's agent folder (``scripts/install-agents``), else
``PATH``. Without it the tests are skipped, unless ``GATEWAY_TEST_STRICT=1`` makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from tests.fixtures.processes import ROOT, Gateway, MockEngine, wait_until

CODEX_TIMEOUT = 120  # seconds for one `codex exec`; a run here takes a few


def codex_binary() -> str | None:
    for candidate in (
        os.environ.get("CODEX_BIN"),
        str(ROOT / ".agents" / "node_modules" / ".bin" / "codex"),
        shutil.which("codex"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def codex() -> str:
    binary = codex_binary()
    if binary is None:
        if os.environ.get("GATEWAY_TEST_STRICT") == "1":
            pytest.fail(
                "the Codex CLI is not installed (CODEX_BIN, .agents/, PATH) and GATEWAY_TEST_STRICT=1"
            )
        pytest.skip(
            "the Codex CLI is not installed (set CODEX_BIN or install it with scripts/install-agents)"
        )
    return binary


def config(vllm: str) -> str:
    return "\n".join(
        [
            "[[backends]]",
            'name = "vllm"',
            f'url = "{vllm}"',
            "responses_api = true",
            "",
            "[[provider_models]]",
            'name = "pm-vllm"',
            'backends = [{ backend = "vllm", model = "upstream-vllm" }]',
            "",
            '[[models]]\nname = "agent"\nchain = ["pm-vllm"]\n',
            '[[roles]]\nname = "user"\npermissions = ["model/*"]\n',
            '[[principals]]\nname = "alice"\nroles = ["user"]\n',
        ]
    )


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.engine = MockEngine(tmp)
        self.gw = Gateway(tmp, config(self.engine.url), workers=1)
        self.key = self.gw.create_key("alice")
        self.gw.wait_key_live(self.key)

    def stop(self) -> None:
        self.gw.stop()
        self.engine.stop()

    def usage_count(self) -> int:
        with open_store(Settings(data_dir=self.gw.data_dir)) as store:
            return len(store.usage.records(limit=10_000))

    def run_codex(self, codex: str, model: str, prompt: str) -> subprocess.CompletedProcess[str]:
        """``codex exec`` as the operations guide sets it up, in a throwaway HOME and CODEX_HOME."""
        home = self.tmp / f"home-{time.monotonic_ns()}"
        codex_home = home / ".codex"
        work = home / "work"
        codex_home.mkdir(parents=True)
        work.mkdir()
        (codex_home / "config.toml").write_text(
            f'model = "{model}"\n'
            'model_provider = "gateway"\n'
            "[model_providers.gateway]\n"
            'name = "LLM gateway"\n'
            f'base_url = "{self.gw.url}/v1"\n'
            'env_key = "GATEWAY_API_KEY"\n'
            'wire_api = "responses"\n'
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "CODEX_HOME": str(codex_home),
            "GATEWAY_API_KEY": self.key,
        }
        cmd = [codex, "exec", "--skip-git-repo-check", "--sandbox", "read-only", prompt]
        return subprocess.run(
            cmd,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=CODEX_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("codex"))
    yield e
    e.stop()


def test_codex_exec_completes_a_task_through_a_native_responses_backend(codex: str, env: Env) -> None:
    env.engine.reset()
    before = env.usage_count()
    done = env.run_codex(codex, "agent", "run a shell command, then tell me what it printed")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "tok tok" in done.stdout  # the engine's closing answer
    assert "mock-engine" in done.stderr  # the command the engine asked for, run by Codex
    asked = [r for r in env.engine.requests() if r["path"] == "/v1/responses"]
    assert len(asked) == 2, [r["path"] for r in env.engine.requests()]
    first, second = (orjson.loads(r["body"]) for r in asked)
    assert first["model"] == "upstream-vllm" and first["stream"] is True
    outputs: list[Any] = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and "mock-engine" in str(outputs[0]["output"])
    assert env.key not in str(asked[0]["headers"])  # the client's key is never forwarded
    wait_until(lambda: env.usage_count() >= before + 2, timeout=20, what="both requests billed")
    with open_store(Settings(data_dir=env.gw.data_dir)) as store:
        recs = sorted(store.usage.records(limit=10_000), key=lambda r: r.ts)[-2:]
    assert all(r.model == "agent" and r.status == 200 and r.usage_source == "reported" for r in recs)
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in recs)
