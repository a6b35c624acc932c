"""Behind HAProxy on loopback: a reload (SIGHUP) and a graceful restart of a host under steady load fail
no request. The restart follows the documented sequence: SIGTERM with --drain-delay (readyz goes 503, the
balancer takes the host out, the listener closes, in-flight requests finish), then start it again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Gateway, MockEngine, basic_config, free_port, terminate, wait_until

SECRET = "sk-gw-load-balancer-test-0001"
KEY = f"""
[[keys]]
name = "lb"
principal = "alice"
secret = "{SECRET}"
"""

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None and os.environ.get("GATEWAY_TEST_STRICT") != "1",
    reason="haproxy is not installed",
)


def haproxy_config(port: int, servers: list[int]) -> str:
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    option http-buffer-request",
        "    retries 3",
        "    retry-on conn-failure empty-response",
        "    option redispatch",
        "frontend llm",
        f"    bind 127.0.0.1:{port}",
        "    default_backend gateways",
        "backend gateways",
        "    balance roundrobin",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        "    default-server inter 200ms fall 2 rise 2 check",
    ]
    lines += [f"    server gw{i} 127.0.0.1:{p}" for i, p in enumerate(servers)]
    return "\n".join(lines) + "\n"


def test_reload_and_graceful_restart_behind_haproxy_fail_nothing(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    env = {"GATEWAY_HASH_KEY": "ab" * 32}
    config = basic_config({"a": mock_engine.url}, extra=KEY)
    extra = ("--drain-delay", "1.0", "--grace-period", "10")
    ports = [free_port(), free_port()]
    gws = [Gateway(tmp_path, config, workers=2, extra=extra, env=env, port=p) for p in ports]
    lb_port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(lb_port, ports))
    lb = subprocess.Popen(
        ["haproxy", "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{lb_port}/v1/chat/completions"
    body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    headers = {"authorization": f"Bearer {SECRET}"}
    stop = threading.Event()
    results: list[int | str] = []

    def load() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                try:
                    results.append(client.post(url, json=body, headers=headers).status_code)
                except httpx.HTTPError as exc:
                    results.append(type(exc).__name__)

    try:
        wait_until(
            lambda: httpx.post(url, json=body, headers=headers).status_code == 200, what="through haproxy"
        )
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        for gw in gws:
            gw.signal(signal.SIGHUP)  # reload: re-apply the config file
        time.sleep(1.0)
        # Graceful restart of the first host: drain (readyz 503 for 1 s, then stop accepting), exit, start.
        first = gws[0]
        first.signal(signal.SIGTERM)
        assert first.proc.wait(30) == 0
        gws[0] = Gateway(tmp_path, config, workers=2, extra=extra, env=env, port=ports[0])
        time.sleep(2.0)  # back in rotation (rise 2 x 200 ms), serving again
        stop.set()
        for t in threads:
            t.join(30)
        failures = [r for r in results if r != 200]
        assert len(results) > 200 and failures == [], (len(results), failures[:10])
    finally:
        stop.set()
        terminate(lb)
        for gw in gws:
            gw.stop()
