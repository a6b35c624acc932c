"""The processes a benchmark runs: the upstreams (the nginx mock, the Python mock engine, which can trickle
tokens, and ``perf.paced``, which paces thousands of streams like a busy vLLM), the nginx reverse proxy,
the floor (``perf/floor.py`` under granian's CLI), the gateway and, when installed under perf/.peers/
(``scripts/bench-peers.sh``), the peers: LiteLLM's proxy, Portkey's Node gateway and SGLang Model
Gateway (``smg``, a Rust router).

Each ``Service`` is a subprocess started from this checkout, owned by PID: ``stop()`` sends SIGTERM to the
process it started, then SIGKILL to every PID of its process tree that is still alive. ``ProcessTree``
reads /proc to account CPU time and peak RSS over a process and all its descendants.
I/O: subprocesses, loopback sockets, files under the temp directory each service is given, /proc.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.mockengine.responses import models_list
from perf.nginx import MOCK_MESSAGE, nginx_binary, render_proxy, render_upstream

__all__ = [
    "BENCH_KEY",
    "BENCH_MODEL",
    "CLK_TCK",
    "LIMITED_KEY",
    "LIMITED_RPM",
    "PACED_MODEL",
    "PEERS",
    "ROOT",
    "STREAM_MODEL",
    "FloorService",
    "GatewayService",
    "LiteLLMService",
    "MockEngineService",
    "NginxService",
    "PacedEngineService",
    "PortkeyService",
    "ProcessTree",
    "Service",
    "SmgService",
    "TreeSample",
    "free_port",
    "gateway_config",
    "http_request",
    "machine_cpu_ticks",
    "smg_command",
]

ROOT = Path(__file__).resolve().parents[1]
BENCH_MODEL = "bench-model"
BENCH_KEY = "sk-gw-bench-0000000000000000000000"
STREAM_MODEL = "stream-model"  # the gateway's model on the Python mock engine
PACED_MODEL = "paced-model"  # the gateway's model on perf.paced
PEERS = ROOT / "perf" / ".peers"  # where scripts/bench-peers.sh installs the peers (git-ignored)
# A key allowed far fewer requests than the benchmark offers: what answering 429 costs.
LIMITED_KEY = "sk-gw-bench-limited-000000000000000"
LIMITED_RPM = 600
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_request(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One request on a fresh loopback connection; (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def die_with_parent() -> None:
    """Runs in the child before exec: if the benchmark dies without tearing down, the kernel sends
    SIGTERM to the child (PR_SET_PDEATHSIG), so nothing is left listening."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class TreeSample:
    """CPU ticks per PID at one instant, and the summed peak RSS and current PSS of those processes.

    RSS sums count pages shared between forked workers once per process; PSS divides each shared page
    among its sharers, so the PSS sum is what the processes take together (at the sampling instant)."""

    ticks: dict[int, int]
    peak_rss_bytes: int
    pss_bytes: int
    at: float

    def cpu_seconds_since(self, before: TreeSample) -> float:
        # A PID present only before (a process that exited mid-cell) loses its last ticks; a PID present
        # only after (a respawned worker) counts from zero. Both are rare and reported by `pids` changing.
        delta = sum(t - before.ticks.get(pid, 0) for pid, t in self.ticks.items())
        return delta / CLK_TCK

    def cpu_seconds_by_pid(self, before: TreeSample) -> dict[int, float]:
        return {pid: (t - before.ticks.get(pid, 0)) / CLK_TCK for pid, t in self.ticks.items()}


class ProcessTree:
    """A root PID and its descendants, found by walking the ppid field of every /proc/<pid>/stat."""

    def __init__(self, root: int) -> None:
        self.root = root

    def pids(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return sorted(found)

    def reset_peaks(self) -> None:
        """Reset every process's VmHWM to its current RSS (``5`` to ``/proc/<pid>/clear_refs``), so the next
        sample's peak is the peak of what came between. Silently a no-op where the kernel refuses."""
        for pid in self.pids():
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                pass

    @staticmethod
    def pss_bytes(pids: Sequence[int]) -> int:
        """The summed PSS of ``pids`` now (a process gone since counts 0)."""
        return sum(_rollup_kib(pid, "Pss:") for pid in pids) * 1024

    def sample(self) -> TreeSample:
        ticks: dict[int, int] = {}
        rss = pss = 0
        for pid in self.pids():
            fields = _stat_fields(pid)
            if fields is None:
                continue
            # After the ")" that ends comm: state=0, ppid=1, ... utime=11, stime=12 (stat(5) fields 14, 15).
            ticks[pid] = int(fields[11]) + int(fields[12])
            rss += _status_kib(pid, "VmHWM:") * 1024
            pss += _rollup_kib(pid, "Pss:") * 1024
        return TreeSample(ticks, rss, pss, time.monotonic())


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: split after the last ")".
    return raw[raw.rindex(b")") + 2 :].decode().split()


def _status_kib(pid: int, label: str) -> int:
    """A kB line of /proc/<pid>/status (VmHWM: the process's peak resident set); 0 if it is gone."""
    return _kib_line(Path(f"/proc/{pid}/status"), label)


def _rollup_kib(pid: int, label: str) -> int:
    return _kib_line(Path(f"/proc/{pid}/smaps_rollup"), label)


def _kib_line(path: Path, label: str) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(label):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def machine_cpu_ticks() -> tuple[int, int]:
    """(busy, steal) ticks summed over all CPUs since boot, from the first line of /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal ...: busy is everything but idle and iowait.
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7], f[7]


class Service:
    """A subprocess started in ``workdir`` and stopped by PID, its descendants included."""

    name = "service"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tree(self) -> ProcessTree:
        assert self.proc is not None
        return ProcessTree(self.proc.pid)

    def start(self) -> Service:
        """Start the process and return once it answers; raises if it exits or times out first."""
        raise NotImplementedError

    def process_labels(self) -> dict[int, str]:
        """A role name for each PID of the tree, for per-process figures."""
        root = self.proc.pid if self.proc else 0
        return {pid: "main" if pid == root else "child" for pid in self.tree().pids()}

    def _spawn(self, argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
            )

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if check():
                    return
            except OSError as exc:  # refused / reset while it starts
                last = exc
            time.sleep(0.05)
        tail = self.log_tail()
        raise TimeoutError(f"{self.name}: {what} not reached in {timeout}s (last error {last!r})\n{tail}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is None:
            return
        pids = ProcessTree(proc.pid).pids() if proc.poll() is None else []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in pids:  # workers that outlived their parent
            if pid != proc.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None


class NginxService(Service):
    """nginx in the foreground (``daemon off``) with its prefix, config and logs in a temp directory."""

    def __init__(self, workdir: Path, name: str, config: Callable[[int], str]) -> None:
        self.name = name
        super().__init__(workdir)
        self.prefix = workdir / name
        (self.prefix / "tmp").mkdir(parents=True)
        self.conf_path = self.prefix / "nginx.conf"
        self.conf_path.write_text(config(self.port))

    @classmethod
    def upstream(cls, workdir: Path) -> NginxService:
        """The mock engine: a chat.completion everywhere, an Anthropic message on ``/v1/messages``."""
        # /v1/models names the model for routers that register a worker by what it serves (smg).
        locations = {"/v1/messages": MOCK_MESSAGE, "/v1/models": models_list([BENCH_MODEL], 0)}
        return cls(workdir, "upstream", lambda port: render_upstream(port, workers=1, locations=locations))

    @classmethod
    def proxy(
        cls,
        workdir: Path,
        upstream_port: int,
        workers: int = 2,
        *,
        name: str = "nginx",
        streaming: bool = False,
    ) -> NginxService:
        """The reference proxy, with ``limit_req`` on ``LIMITED_KEY`` (other keys are not accounted)."""

        def config(port: int) -> str:
            return render_proxy(
                port,
                upstream_port,
                workers=workers,
                streaming=streaming,
                limited_key=LIMITED_KEY,
                limited_rpm=LIMITED_RPM,
            )

        return cls(workdir, name, config)

    def start(self) -> NginxService:
        argv = [nginx_binary(), "-p", str(self.prefix), "-c", str(self.conf_path), "-g", "daemon off;"]
        self._spawn(argv, cwd=self.prefix)
        # Any answer means it listens; whether it proxies is what each scenario's check request asks (a
        # proxy in front of the Python mock engine gets a 404 for "/").
        self._wait(lambda: http_request(self.port, "GET", "/")[0] > 0, 10.0, "an answer to GET /")
        return self

    def process_labels(self) -> dict[int, str]:
        return {
            pid: "master" if label == "main" else "worker" for pid, label in super().process_labels().items()
        }

    def log_tail(self, lines: int = 30) -> str:
        own = super().log_tail(lines)
        err = self.prefix / "error.log"
        return own + ("\n" + err.read_text(errors="replace") if err.exists() else "")


# Limits far above what the benchmark reaches, a budget it never exhausts and a price: every check runs
# on every request and none refuses one.
ACCOUNTED = """
limits = { requests_per_minute = 1000000000, tokens_per_minute = 1000000000000, concurrent_requests = 100000 }
budget = { period = "day", tokens = 1000000000000, cost = 1000000000.0 }
"""


def gateway_config(
    upstream_url: str, accounted: bool = True, engine_url: str | None = None, paced_url: str | None = None
) -> str:
    """The gateway's TOML: the nginx mock as an OpenAI backend (``engine``) and, at the same URL, as an
    Anthropic one (``engine-anthropic``); the Python mock engine (``sse-engine``) when ``engine_url`` is
    given, and perf.paced (``paced-engine``, model ``paced-model``) when ``paced_url`` is. Models:
    ``bench-model`` and ``chat`` (OpenAI backend), ``claude`` (Anthropic backend, native passthrough for
    /v1/messages) and ``stream-model`` (the mock engine). One principal and its key; a
    second key with ``LIMITED_RPM`` requests per minute. With ``accounted``, the principal has rate limits
    and a budget, and every model a price."""
    principal_extra = ACCOUNTED if accounted else ""
    price = "price = { input = 0.15, output = 0.60 }" if accounted else ""
    models = [(BENCH_MODEL, "mock-model"), ("chat", "mock-model"), ("claude", "claude-mock")]
    engine = ""
    if engine_url is not None:
        models.append((STREAM_MODEL, "stream-mock"))
        engine = f"""
[[backends]]
name = "sse-engine"
url = "{engine_url}"

[[provider_models]]
name = "stream-mock"
backends = [{{ backend = "sse-engine", model = "mock-model" }}]
"""
    if paced_url is not None:
        models.append((PACED_MODEL, "paced-mock"))
        engine += f"""
[[backends]]
name = "paced-engine"
url = "{paced_url}"

[[provider_models]]
name = "paced-mock"
backends = [{{ backend = "paced-engine", model = "mock-model" }}]
"""
    frontend = "".join(
        f"""
[[models]]
name = "{name}"
chain = ["{provider}"]
{price}
"""
        for name, provider in models
    )
    return f"""\
[[backends]]
name = "engine"
url = "{upstream_url}"

[[backends]]
name = "engine-anthropic"
url = "{upstream_url}"
protocol = "anthropic"

[[provider_models]]
name = "mock-model"
backends = [{{ backend = "engine", model = "mock-model" }}]

[[provider_models]]
name = "claude-mock"
backends = [{{ backend = "engine-anthropic", model = "claude-mock" }}]
{engine}{frontend}
[[roles]]
name = "bench"
permissions = ["model/*"]

[[principals]]
name = "bench"
roles = ["bench"]
{principal_extra}

[[keys]]
principal = "bench"
name = "bench-key"
secret = "{BENCH_KEY}"

[[keys]]
principal = "bench"
name = "bench-limited"
secret = "{LIMITED_KEY}"
limits = {{ requests_per_minute = {LIMITED_RPM} }}
"""


class GatewayService(Service):
    """``python -m gateway serve`` from this checkout, with its own TOML config and data directory.
    ``accounted=False`` turns off what issue 3 added per request: rate limits, budgets, usage records."""

    name = "gateway"

    def __init__(
        self,
        workdir: Path,
        upstream_url: str,
        workers: int = 2,
        accounted: bool = True,
        engine_url: str | None = None,
        config: str | None = None,
        paced_url: str | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.name = "gateway" if accounted else "gateway-bare"
        super().__init__(workdir)
        self.workers = workers
        self.extra = list(extra)  # more flags for `gateway serve`
        self.accounted = accounted
        suffix = "" if accounted else "-bare"
        self.data_dir = workdir / f"gateway{suffix}-data"
        self.config_path = workdir / f"gateway{suffix}.toml"
        self.config_path.write_text(config or gateway_config(upstream_url, accounted, engine_url, paced_url))

    def start(self, timeout: float = 30.0) -> GatewayService:
        argv = [
            sys.executable, "-m", "gateway", "serve",
            "--config", str(self.config_path),
            "--data-dir", str(self.data_dir),
            "--port", str(self.port),
            "--workers", str(self.workers),
            "--grace-period", "2",
            # The load generator is one address standing for many clients: the per-address cap on
            # requests in flight (4,096 by default) would refuse the 5,000 paced streams' last 904.
            "--client-max-requests", "0",
            *([] if self.accounted else ["--no-usage-records"]),
            *self.extra,
        ]  # fmt: skip
        self._spawn(argv, cwd=ROOT)

        # SO_REUSEPORT spreads fresh connections over the workers: ask several times so each has answered.
        def ready() -> bool:
            return all(http_request(self.port, "GET", "/readyz")[0] == 200 for _ in range(4 * self.workers))

        self._wait(ready, timeout, "/readyz answering 200 from every worker")
        return self

    def process_labels(self) -> dict[int, str]:
        """``supervisor`` and the worker names the supervisor records in its state file."""
        labels = {
            pid: "supervisor" if label == "main" else label for pid, label in super().process_labels().items()
        }
        try:
            state = json.loads((self.data_dir / "run" / "supervisor.json").read_text())
            labels.update({int(w["pid"]): str(w["name"]) for w in state.get("workers", []) if w.get("pid")})
        except (OSError, ValueError, KeyError, TypeError):
            pass  # labels are a convenience; the figures do not depend on them
        return labels


class MockEngineService(Service):
    """``python -m gateway mock-engine``: the project's own mock vLLM, which streams and can trickle
    tokens (``token_delay`` between chunks, set with ``configure``). One process, one event loop: it costs
    CPU of its own, reported as the upstream's in every cell."""

    name = "mock-engine"

    def __init__(
        self, workdir: Path, tokens: int = 256, extra: Sequence[str] = (), name: str = "mock-engine"
    ) -> None:
        self.name = name
        super().__init__(workdir)
        self.tokens = tokens
        self.extra = list(extra)  # more flags: the engine simulator's (--sim ...)

    def start(self, timeout: float = 20.0) -> MockEngineService:
        argv = [
            sys.executable, "-m", "gateway", "mock-engine",
            "--port", str(self.port), "--tokens", str(self.tokens), "--backpressure", "16384", *self.extra,
        ]  # fmt: skip
        self._spawn(argv, cwd=ROOT)
        self._wait(lambda: http_request(self.port, "GET", "/health")[0] == 200, timeout, "GET /health")
        self.configure(record=False)  # no copies of requests kept: they would cost memory and CPU
        return self

    def configure(self, **behaviour: object) -> None:
        """``POST /mock/config``: e.g. ``token_delay=0.2`` for slow streams, ``0`` for fast ones."""
        body = json.dumps(behaviour).encode()
        status, answer = http_request(
            self.port, "POST", "/mock/config", body, {"Content-Type": "application/json"}
        )
        if status != 200:
            raise RuntimeError(f"mock engine refused {behaviour}: {status} {answer[:200]!r}")


def litellm_command() -> list[str] | None:
    """How to start LiteLLM's proxy from this environment: its ``litellm`` script beside this Python or on
    PATH, else its module if it is importable; ``None`` when it is not installed (it is optional and never
    installed into the project's environment; ``scripts/bench-peers.sh`` puts it in perf/.peers/litellm)."""
    import importlib.util
    import shutil

    own = PEERS / "litellm" / "bin" / "litellm"
    if own.exists():
        return [str(own)]
    beside = Path(sys.executable).parent / "litellm"
    if beside.exists():
        return [str(beside)]
    if importlib.util.find_spec("litellm") is not None:
        return [sys.executable, "-m", "litellm.proxy.proxy_cli"]
    on_path = shutil.which("litellm")
    return [on_path] if on_path else None


def litellm_config(upstream_url: str, engine_url: str | None) -> str:
    """LiteLLM's config, equivalent to the bare gateway's: the same model names on the same upstreams, the
    bench key as its master key (no database, so no virtual keys, limits or spend logs). JSON is YAML."""
    models = [
        {
            "model_name": name,
            "litellm_params": {"model": "openai/mock-model", "api_base": f"{url}/v1", "api_key": "none"},
        }
        for name, url in [(BENCH_MODEL, upstream_url), ("chat", upstream_url)]
        + ([(STREAM_MODEL, engine_url)] if engine_url else [])
    ]
    doc = {
        "model_list": models,
        "litellm_settings": {"drop_params": True, "telemetry": False, "set_verbose": False},
        "general_settings": {"master_key": BENCH_KEY, "disable_spend_logs": True},
    }
    return json.dumps(doc, indent=2)


class LiteLLMService(Service):
    """LiteLLM's proxy (a peer Python gateway) with ``workers`` processes, for comparison only. Never a
    dependency of the project: ``LiteLLMService.available()`` says whether it can run."""

    name = "litellm"

    def __init__(self, workdir: Path, upstream_url: str, engine_url: str | None, workers: int = 2) -> None:
        super().__init__(workdir)
        self.workers = workers
        self.config_path = workdir / "litellm.yaml"
        self.config_path.write_text(litellm_config(upstream_url, engine_url))

    @staticmethod
    def available() -> bool:
        return litellm_command() is not None

    def start(self, timeout: float = 300.0) -> LiteLLMService:
        command = litellm_command()
        if command is None:
            raise RuntimeError("litellm: not installed")
        argv = [
            *command, "--config", str(self.config_path), "--host", "127.0.0.1",
            "--port", str(self.port), "--num_workers", str(self.workers),
            # uvicorn kills a worker that has not answered its supervisor's ping within 5 s; LiteLLM's
            # imports alone take longer on a busy 2-core machine, and its workers then die in a loop.
            "--timeout_worker_healthcheck", "300",
        ]  # fmt: skip
        env = {
            **os.environ,
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            "NO_DOCS": "True",
            # Its price list from the package, not from the network (which the benchmark never uses).
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # Every mock token is the same text, and LiteLLM ends a stream with an error after 100 equal
            # chunks in a row ("The model is repeating the same chunk"), a guard for looping models.
            "REPEATED_STREAMING_CHUNK_LIMIT": "1000000",
        }
        self._spawn(argv, cwd=self.workdir, env=env)
        self._wait(
            lambda: http_request(self.port, "GET", "/health/liveliness")[0] == 200,
            timeout,
            "/health/liveliness",
        )
        return self


class PacedEngineService(Service):
    """``python -m perf.paced``: one process, one timer for all its streams (see its docstring); the pacing
    is changed with ``pace`` (``0, 0`` for the check request of a scenario)."""

    name = "paced-engine"

    def __init__(self, workdir: Path, procs: int = 1) -> None:
        super().__init__(workdir)
        self.procs = procs

    def start(self, timeout: float = 20.0) -> PacedEngineService:
        argv = [sys.executable, "-m", "perf.paced", "--port", str(self.port), "--procs", str(self.procs)]
        self._spawn(argv, cwd=ROOT)
        self._wait(lambda: http_request(self.port, "GET", "/health")[0] == 200, timeout, "GET /health")
        return self

    def pace(self, min_ms: float, max_ms: float) -> None:
        body = json.dumps({"min_ms": min_ms, "max_ms": max_ms}).encode()
        status, answer = http_request(self.port, "POST", "/pace", body, {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"perf.paced refused pacing {min_ms}-{max_ms} ms: {status} {answer[:200]!r}")


class FloorService(Service):
    """An app of ``perf/floor.py`` under granian's own CLI, as the gateway's workers run it (RSGI, uvloop,
    HTTP/1 only, no websockets): ``null-app`` answers from memory, ``minimal-proxy`` forwards to
    ``upstream_url`` on the gateway's upstream client."""

    APPS = {"null-app": "perf.floor:null_app", "minimal-proxy": "perf.floor:minimal_proxy"}

    def __init__(
        self, workdir: Path, name: str, upstream_url: str, workers: int = 2, label: str = ""
    ) -> None:
        self.name = label or name
        super().__init__(workdir)
        self.app = self.APPS[name]
        self.upstream_url = upstream_url
        self.workers = workers

    def start(self, timeout: float = 30.0) -> FloorService:
        beside = Path(sys.executable).parent / "granian"
        granian = [str(beside)] if beside.exists() else [sys.executable, "-m", "granian"]
        argv = [
            *granian, "--interface", "rsgi", "--workers", str(self.workers), "--loop", "uvloop",
            "--http", "1", "--no-ws", "--host", "127.0.0.1", "--port", str(self.port),
            "--backpressure", "16384", "--log-level", "warning", self.app,
        ]  # fmt: skip
        env = {**os.environ, "PERF_FLOOR_UPSTREAM": self.upstream_url}
        self._spawn(argv, cwd=ROOT, env=env)
        # Each worker binds with SO_REUSEPORT: ask several times so that both answer.
        self._wait(lambda: http_request(self.port, "GET", "/health")[0] > 0, timeout, "an answer to GET /")
        return self


def portkey_command() -> list[str] | None:
    """``node`` and Portkey's start script from perf/.peers/node (``scripts/bench-peers.sh``); ``None``
    when either is missing."""
    import shutil

    script = PEERS / "node" / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    node = shutil.which("node")
    return [node, str(script)] if node and script.exists() else None


class PortkeyService(Service):
    """Portkey's AI gateway (npm ``@portkey-ai/gateway``), one Node process, for comparison only. Each
    request names its upstream in ``x-portkey-*`` headers (``headers_for``)."""

    name = "portkey"

    @staticmethod
    def available() -> bool:
        return portkey_command() is not None

    @staticmethod
    def headers_for(upstream_url: str) -> dict[str, str]:
        return {"x-portkey-provider": "openai", "x-portkey-custom-host": f"{upstream_url}/v1"}

    def start(self, timeout: float = 60.0) -> PortkeyService:
        command = portkey_command()
        if command is None:
            raise RuntimeError("portkey: not installed")
        self._spawn([*command, f"--port={self.port}", "--headless"], cwd=self.workdir)
        self._wait(lambda: http_request(self.port, "GET", "/")[0] > 0, timeout, "an answer to GET /")
        return self


def smg_command() -> list[str] | None:
    """SGLang Model Gateway's ``smg`` script from perf/.peers/smg (``scripts/bench-peers.sh``: PyPI ``smg``,
    a Rust binary in a wheel, in a virtualenv of its own), else one on PATH; ``None`` when neither."""
    import shutil

    own = PEERS / "smg" / "bin" / "smg"
    if own.exists():
        return [str(own)]
    on_path = shutil.which("smg")
    return [on_path] if on_path else None


class SmgService(Service):
    """``smg launch``: SGLang Model Gateway routing over ``worker_urls`` with ``policy`` and its defaults
    otherwise, for comparison only. Offline as it is: over HTTP workers it needs no tokenizer (its
    cache-aware tree indexes the request's text), and it registers each worker by asking its
    ``/v1/models``; it is ready when ``GET /readiness`` answers 200 and ``GET /workers`` lists them all. Its
    Prometheus listener is put on a free loopback port rather than its fixed 29000."""

    name = "smg"

    def __init__(
        self, workdir: Path, worker_urls: Sequence[str], policy: str = "cache_aware", name: str = "smg"
    ) -> None:
        self.name = name
        super().__init__(workdir)
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.metrics_port = free_port()

    @staticmethod
    def available() -> bool:
        return smg_command() is not None

    def start(self, timeout: float = 60.0) -> SmgService:
        command = smg_command()
        if command is None:
            raise RuntimeError("smg: not installed (scripts/bench-peers.sh smg)")
        argv = [
            *command, "launch", "--worker-urls", *self.worker_urls, "--policy", self.policy,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            # A line per request at info: its logging would be measured as routing.
            "--log-level", "warn",
        ]  # fmt: skip
        self._spawn(argv, cwd=self.workdir)

        # /readiness answers 200 once some worker is healthy: wait for all of them to be registered.
        def ready() -> bool:
            if http_request(self.port, "GET", "/readiness")[0] != 200:
                return False
            status, body = http_request(self.port, "GET", "/workers")
            return status == 200 and json.loads(body).get("total") == len(self.worker_urls)

        self._wait(ready, timeout, "GET /readiness and every worker in GET /workers")
        return self
