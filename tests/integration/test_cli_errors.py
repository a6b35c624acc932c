"""What a new operator sees when something is wrong: one line, exit status 2, no traceback, and no worker
started for a port the gateway cannot have (issue 20, items 1 and 2). Real ``gateway`` processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import PY, ROOT, Gateway, MockEngine, basic_config, free_port

pytestmark = pytest.mark.slow


def gateway(tmp_path: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return gateway(tmp_path, "serve", "--data-dir", str(tmp_path / "data"), "--workers", "1", *args)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_port_another_program_holds_is_one_line_before_any_worker(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = serve(tmp_path, "--port", str(port))
    assert one_line_error(done) == (
        f"gateway serve: error: the proxy port 127.0.0.1:{port} is already in use by another process"
        " (another gateway?)"
    )
    assert not (tmp_path / "data" / "run" / "supervisor.json").exists()  # no worker was started


def test_a_taken_admin_port_is_refused_too(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        admin = other.getsockname()[1]
        done = serve(tmp_path, "--port", str(free_port()), "--admin-port", str(admin))
    assert one_line_error(done) == (
        f"gateway serve: error: the admin port 127.0.0.1:{admin} is already in use by another process"
        " (another gateway?)"
    )


def test_a_second_gateway_on_the_same_port_exits_and_the_first_keeps_every_request(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    first = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2)
    try:
        key = first.create_key("alice")
        first.wait_key_live(key)
        done = serve(tmp_path, "--port", str(first.port))
        assert one_line_error(done) == (
            f"gateway serve: error: the proxy port 127.0.0.1:{first.port} is already in use by another"
            " process (another gateway?)"
        )
        for _ in range(10):  # fresh connections, all answered by the first gateway, which still runs
            r = httpx.get(first.url + "/v1/models", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200
        assert first.proc.poll() is None
    finally:
        assert first.stop() == 0


def test_the_claim_holds_while_the_gateways_own_workers_restart(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    """With every proxy worker gone at once, the port is still this gateway's: a plain bind fails."""
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1)
    try:
        os.kill(gw.worker_pids()[0], signal.SIGKILL)
        with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", gw.port))
        gw.wait_ready()
    finally:
        gw.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--port", "70000"), "argument --port: 70000 is not a port number (1-65535)"),
        (("--port", "0"), "argument --port: 0 is not a port number (1-65535)"),
        (("--workers", "0"), "argument --workers: must be at least 1, not 0"),
        (("--workers", "many"), "argument --workers: 'many' is not a whole number"),
    ],
)
def test_bad_flags_are_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    line = one_line_error(serve(tmp_path, *args))
    assert line == f"gateway serve: error: {message} (see 'gateway serve --help')"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "{file}: cannot read: No such file or directory"),
        ("[[backends]\n", "{file}:1:11: invalid TOML: Expected ']]' at the end of an array declaration"),
        (
            '[[backends]]\nname = "a"\nurl = "http://127.0.0.1:9"\ncolour = "red"\n',
            "{file}:4: backends[0].colour: unknown field (expected one of: api_key, api_key_env,",
        ),
        ('[[backends]]\nname = "a"\nurl = "ftp://x"\n', "{file}:3: backends[0].url: must be an http://"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "apply"])
def test_config_file_errors_are_one_line_naming_file_and_line(
    tmp_path: Path, command: str, text: str | None, message: str
) -> None:
    path = tmp_path / "gw.toml"
    if text is not None:
        path.write_text(text)
    if command == "serve":
        done = serve(tmp_path, "--port", str(free_port()), "--config", str(path))
    else:
        done = gateway(tmp_path, "apply", str(path), "--data-dir", str(tmp_path / "data"))
    line = one_line_error(done)
    assert line.startswith(f"gateway {command}: error: " + message.format(file=path)), line


def test_an_admin_certificate_that_does_not_load_is_refused_before_any_worker(tmp_path: Path) -> None:
    pem = tmp_path / "cert.pem"
    pem.write_text("not a certificate\n")
    done = serve(
        tmp_path,
        *("--port", str(free_port()), "--admin-port", str(free_port())),
        *("--admin-tls-cert", str(pem), "--admin-tls-key", str(pem)),
    )
    line = one_line_error(done)
    assert line.startswith(f"gateway serve: error: --admin-tls-cert {pem} with --admin-tls-key {pem}: "), line
    assert not (tmp_path / "data" / "run" / "supervisor.json").exists()


def test_a_store_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    done = gateway(tmp_path, "keys", "list", "--database", "postgresql://gw:secret@127.0.0.1:1/gw")
    line = one_line_error(done)
    assert line.startswith("gateway keys: error: cannot connect to PostgreSQL at postgresql://gw:***@"), line
    assert "secret" not in line


def test_version_and_help_are_written_for_users(tmp_path: Path) -> None:
    from importlib import metadata

    version = gateway(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout == f"gateway {metadata.version('llm-gateway')}\n"
    top = gateway(tmp_path, "--help")
    assert top.returncode == 0
    assert "gateway serve --config gateway.toml" in top.stdout
    assert "``" not in top.stdout and "I/O" not in top.stdout  # not a module docstring
    mock = gateway(tmp_path, "mock-engine", "--help")
    assert mock.returncode == 0
    assert "A stand-in for a vLLM engine" in mock.stdout and "``" not in mock.stdout
    bare = gateway(tmp_path)
    assert one_line_error(bare) == (
        "gateway: error: the following arguments are required: COMMAND (see 'gateway --help')"
    )
    unknown = gateway(tmp_path, "frobnicate")
    assert one_line_error(unknown).startswith(
        "gateway: error: argument COMMAND: invalid choice: 'frobnicate'"
    )


FAILING_WORKERS = textwrap.dedent(
    """
    import logging, sys, time
    from gateway.supervisor.process import Supervisor, WorkerSpec

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    mode = sys.argv[1]
    flag = sys.argv[2]

    def fails_the_same_way() -> int:
        raise RuntimeError("Address already in use (os error 98)\\n\\nStack backtrace:\\n   0: <unknown>")

    def fails_once() -> int:
        import os
        if not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError("first start fails")
        time.sleep(60)
        return 0

    main = fails_the_same_way if mode == "same" else fails_once
    Supervisor.block_signals()
    sup = Supervisor([WorkerSpec("proxy-1", "proxy", main)], grace_period=1, state_file=None)
    if mode == "once":
        import threading, os, signal
        threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    sys.exit(sup.run())
    """
)


def test_a_worker_failing_at_start_the_same_way_twice_stops_the_gateway(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [PY, "-c", FAILING_WORKERS, "same", str(tmp_path / "flag")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 10
    assert done.stderr.count("worker proxy-1 crashed") == 2
    assert (
        "proxy worker proxy-1 failed at start twice in a row: RuntimeError: Address already in use (os error"
        " 98); stopping the gateway" in done.stderr
    )


def test_a_worker_that_fails_once_is_restarted(tmp_path: Path) -> None:
    done = subprocess.run(
        [PY, "-c", FAILING_WORKERS, "once", str(tmp_path / "flag")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("worker proxy-1 crashed") == 1
    assert "failed at start twice" not in done.stderr
    assert done.stderr.count("started proxy worker proxy-1") == 2
