"""The real Codex CLI (npm ``@openai/codex``) through the gateway, unmodified: ``codex exec`` with a custom
provider pointed at the gateway (``wire_api = "responses"``) runs a task to its end — the mock engine
calls Codex's shell tool, Codex runs it and sends the output back, the engine answers with text — and
every request is billed; against a backend that serves the Responses API itself and against the three
kinds the gateway translates it for (chat completions, Anthropic Messages, Gemini).

The binary comes from ``CODEX_BIN``, else the project's agent folder (``.agents/``, installed by
``scripts/agents.sh``), else ``PATH``. Without it the tests are skipped, unless ``GATEWAY_TEST_STRICT=1``
makes that a failure.
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
        pytest.skip("the Codex CLI is not installed (set CODEX_BIN or install it with scripts/agents.sh)")
    return binary


# model -> (backend, its protocol, serves /v1/responses itself, the path the backend is asked on)
KINDS = {
    "native": ("vllm", "openai", True, "/v1/responses"),
    "chat": ("chatonly", "openai", False, "/v1/chat/completions"),
    "claude": ("claude", "anthropic", False, "/v1/messages"),
    "gem": ("gem", "gemini", False, "/v1beta/models/upstream-gem:streamGenerateContent"),
}


def config(urls: dict[str, str]) -> str:
    lines = []
    for model, (backend, protocol, native, _) in KINDS.items():
        lines += [
            "[[backends]]",
            f'name = "{backend}"',
            f'url = "{urls[backend]}"',
            f'protocol = "{protocol}"',
            *(["responses_api = true"] if native else []),
            "",
            "[[provider_models]]",
            f'name = "pm-{backend}"',
            f'backends = [{{ backend = "{backend}", model = "upstream-{backend}" }}]',
            "",
            f'[[models]]\nname = "{model}"\nchain = ["pm-{backend}"]\n',
        ]
    lines += [
        '[[roles]]\nname = "user"\npermissions = ["model/*"]\n',
        '[[principals]]\nname = "alice"\nroles = ["user"]\n',
    ]
    return "\n".join(lines)


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.engines = {backend: MockEngine(tmp) for backend, _, _, _ in KINDS.values()}
        self.gw = Gateway(tmp, config({n: e.url for n, e in self.engines.items()}), workers=1)
        self.key = self.gw.create_key("alice")
        self.gw.wait_key_live(self.key)

    def stop(self) -> None:
        self.gw.stop()
        for e in self.engines.values():
            e.stop()

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


def tool_turns(model: str, bodies: list[dict[str, Any]]) -> tuple[str, str]:
    """From the engine's second request: the command the engine asked Codex to run, and its output as Codex
    sent it back (in each protocol's shape)."""
    second = bodies[1]
    if model == "native":
        (call,) = [i for i in second["input"] if i.get("type") == "function_call"]
        (output,) = [i for i in second["input"] if i.get("type") == "function_call_output"]
        return str(orjson.loads(call["arguments"])), str(output["output"])
    if model == "chat":
        (call,) = [c for m in second["messages"] for c in m.get("tool_calls") or ()]
        (output,) = [m for m in second["messages"] if m["role"] == "tool"]
        return str(orjson.loads(call["function"]["arguments"])), str(output["content"])
    if model == "claude":
        blocks = [b for m in second["messages"] if isinstance(m["content"], list) for b in m["content"]]
        (call,) = [b for b in blocks if b["type"] == "tool_use"]
        (output,) = [b for b in blocks if b["type"] == "tool_result"]
        return str(call["input"]), str(output["content"])
    parts = [p for c in second["contents"] for p in c["parts"]]
    (call,) = [p["functionCall"] for p in parts if "functionCall" in p]
    (output,) = [p["functionResponse"] for p in parts if "functionResponse" in p]
    return str(call["args"]), str(output["response"])


@pytest.mark.parametrize("model", list(KINDS))
def test_codex_exec_completes_a_task(codex: str, env: Env, model: str) -> None:
    backend, _, _, path = KINDS[model]
    engine = env.engines[backend]
    engine.reset()
    before = env.usage_count()
    done = env.run_codex(codex, model, "run a shell command, then tell me what it printed")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "tok tok" in done.stdout  # the engine's closing answer
    asked = [r for r in engine.requests() if r["path"] == path]
    assert len(asked) == 2, [r["path"] for r in engine.requests()]  # a tool call, then the answer
    bodies = [orjson.loads(r["body"]) for r in asked]
    command, output = tool_turns(model, bodies)
    assert "Process exited with code 0" in output  # Codex ran what the engine asked for, and said so
    assert env.key not in str(asked[0]["headers"])  # the client's key is never forwarded
    wait_until(lambda: env.usage_count() >= before + 2, timeout=20, what="both turns billed")
    with open_store(Settings(data_dir=env.gw.data_dir)) as store:
        recs = sorted(store.usage.records(limit=10_000), key=lambda r: r.ts)[-2:]
    assert all(
        (r.model, r.backend, r.status, r.usage_source) == (model, backend, 200, "reported") for r in recs
    )
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in recs), (command, recs)
