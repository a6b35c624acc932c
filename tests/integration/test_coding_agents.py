"""The real Claude Code CLI (npm, pinned in .agents/, installed by scripts/agents.sh) runs ``claude -p``
through the gateway, tools on as it ships, against the mock engine behind both kinds of backend: one
that speaks OpenAI (the request is translated) and one that speaks Anthropic (relayed untouched). Its
model names reach the right backend through pattern aliases. The CLI's tests are skipped when it is not
installed, unless ``GATEWAY_TEST_STRICT=1`` (``make test``), where that is a failure."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from gateway.config import Settings
from gateway.controlplane.store import open_store
from tests.fixtures.processes import ROOT, Gateway, MockEngine, wait_until

CLAUDE = ROOT / ".agents" / "node_modules" / ".bin" / "claude"
RUN_TIMEOUT = 90  # seconds; a run takes about one against the mock engine


def config(translated: str, native: str) -> str:
    return f"""
[[backends]]
name = "vllm"
url = "{translated}"

[[backends]]
name = "claude"
url = "{native}"
protocol = "anthropic"
api_key = "sk-ant-upstream"

[[provider_models]]
name = "pm-vllm"
backends = [{{ backend = "vllm", model = "mock-model" }}]

[[provider_models]]
name = "pm-claude"
backends = [{{ backend = "claude", model = "mock-model" }}]

[[models]]
name = "via-openai"
chain = ["pm-vllm"]
aliases = ["claude-*"]          # whatever else Claude Code asks for (its small fast model too)

[[models]]
name = "via-anthropic"
chain = ["pm-claude"]
aliases = ["claude-sonnet-*"]   # longer, so it wins over claude-* for these names

[[roles]]
name = "coder"
permissions = ["model/via-openai", "model/via-anthropic"]

[[principals]]
name = "dev"
roles = ["coder"]
"""


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.vllm, self.claude = MockEngine(tmp), MockEngine(tmp)
        self.gw = Gateway(tmp, config(self.vllm.url, self.claude.url), workers=1)
        self.key = self.gw.create_key("dev")
        self.gw.wait_key_live(self.key, probes=2)

    def stop(self) -> None:
        self.gw.stop()
        self.vllm.stop()
        self.claude.stop()

    def claude_code(self, prompt: str, *flags: str) -> subprocess.CompletedProcess[str]:
        """``claude -p`` as a user runs it, in a throwaway HOME, told to contact nothing but the gateway."""
        home, work = self.tmp / "home", self.tmp / "work"
        home.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        (work / "notes.txt").write_text("hello\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
        env |= {
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": self.gw.url,
            "ANTHROPIC_API_KEY": self.key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        return subprocess.run(
            [str(CLAUDE), "-p", prompt, *flags],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )

    def records(self) -> list[Any]:
        with open_store(Settings(data_dir=self.gw.data_dir)) as store:
            return store.usage.records(limit=1000)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("agents"))
    yield e
    e.stop()


@pytest.fixture
def claude_code() -> None:
    if not CLAUDE.exists():
        if os.environ.get("GATEWAY_TEST_STRICT") == "1":
            pytest.fail(f"Claude Code is not installed at {CLAUDE}: run scripts/agents.sh")
        pytest.skip("Claude Code is not installed (scripts/agents.sh installs it)")


def bodies(engine: MockEngine, path: str) -> list[dict[str, Any]]:
    return [orjson.loads(r["body"]) for r in engine.requests() if r["path"] == path]


@pytest.mark.usefixtures("claude_code")
def test_claude_code_through_a_translated_openai_backend(env: Env) -> None:
    env.vllm.reset()
    before = len(env.records())
    run = env.claude_code("list the files here")  # its default model (claude-opus-…), as a user runs it
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tok tok" in run.stdout  # the mock's final answer, after the tool's result
    sent = bodies(env.vllm, "/v1/chat/completions")
    assert len(sent) >= 2
    first, last = sent[0], sent[-1]
    assert first["model"] == "mock-model" and first["tools"] and first["stream"] is True
    # Claude Code's system turn inside messages arrived as an OpenAI system message, in its place.
    roles = [m["role"] for m in first["messages"]]
    assert roles[0] == "system" and "system" in roles[1:], roles
    # The mock called a tool (Claude Code's Bash, "ls"), Claude Code ran it and sent back the result.
    assert any(m["role"] == "tool" for m in last["messages"])
    calls = [c for m in last["messages"] for c in m.get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] == "Bash"
    assert not bodies(env.claude, "/v1/messages")
    wait_until(lambda: len(env.records()) >= before + len(sent), what="usage records")
    recs = env.records()[: len(env.records()) - before]
    assert len({r.model for r in recs}) == 1 and recs[0].model.startswith("claude-opus-")
    assert all(r.status == 200 and r.usage_source == "reported" for r in recs)


@pytest.mark.usefixtures("claude_code")
def test_claude_code_through_a_native_anthropic_backend(env: Env) -> None:
    env.claude.reset()
    env.vllm.reset()
    run = env.claude_code("list the files here", "--model", "claude-sonnet-5-5")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tok tok" in run.stdout
    recorded = [r for r in env.claude.requests() if r["path"] == "/v1/messages"]
    assert len(recorded) >= 2
    first = recorded[0]
    # Relayed untouched: its query string, its beta and version headers, the backend's own key, and
    # every field and block the gateway does not read (the model's value spliced, nothing else).
    assert first["query"] == "beta=true"
    headers = first["headers"]
    assert "claude-code-" in headers["anthropic-beta"] and headers["anthropic-version"] == "2023-06-01"
    assert headers["x-api-key"] == "sk-ant-upstream"
    body = orjson.loads(first["body"])
    assert body["model"] == "mock-model"
    assert {"thinking", "context_management", "metadata", "system", "tools"} <= set(body)
    assert "system" in [m["role"] for m in body["messages"]]
    assert b"cache_control" in first["body"]
    last = orjson.loads(recorded[-1]["body"])
    results = [b for m in last["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert any(b["type"] == "tool_result" for b in results)
    assert not env.vllm.requests()  # claude-sonnet-* won over claude-*


@pytest.mark.parametrize(
    ("model", "backend"), [("claude-haiku-4-5", "vllm"), ("claude-sonnet-4-5-20250929", "claude")]
)
def test_the_sdk_through_pattern_aliases_reads_the_request_id(env: Env, model: str, backend: str) -> None:
    """The official SDK, no CLI needed: a name only a pattern matches reaches its backend, and the answer
    carries the id where the SDK reads it."""
    engine = env.vllm if backend == "vllm" else env.claude
    engine.reset()
    client = anthropic.Anthropic(base_url=env.gw.url, api_key=env.key, max_retries=0)
    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    message = raw.parse()
    assert message.content[0].type == "text"
    # A translated answer names the model called; a relayed one is the backend's, bytes untouched.
    assert message.model == (model if backend == "vllm" else "mock-model")
    assert raw.headers["request-id"] == raw.headers["x-request-id"]
    assert message._request_id == raw.headers["request-id"]
    assert len(engine.requests()) == 1
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.body["error"] == {"type": "not_found_error", "message": "model: gpt-4o"}
