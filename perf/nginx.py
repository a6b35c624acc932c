"""nginx configuration rendering for the benchmark: the mock engine and the reference reverse proxy.

Pure text rendering plus one ``nginx -V`` probe (cached) to learn which temp-path directives this build
knows. Every path an nginx started from these configs writes (pid, error log, temp dirs) lives under the
prefix directory it is started with (``nginx -p <prefix>``), so no root-owned path is touched.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess

__all__ = ["MOCK_COMPLETION", "nginx_binary", "nginx_version", "render_proxy", "render_upstream"]

# A small, fixed OpenAI chat.completion: what a non-streamed answer of a few tokens looks like.
MOCK_COMPLETION: bytes = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "mock-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
    },
    separators=(",", ":"),
).encode()

_TEMP_KINDS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def nginx_binary() -> str:
    """The nginx executable: on PATH, or Debian's /usr/sbin (often not on a non-root PATH)."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise FileNotFoundError("nginx not found: run ./scripts/system-deps.sh bench")
    return found


@functools.cache
def _build_flags() -> str:
    return subprocess.run([nginx_binary(), "-V"], capture_output=True, text=True, check=True).stderr


def nginx_version() -> str:
    m = re.search(r"nginx/(\S+)", _build_flags())
    return m.group(1) if m else "unknown"


def _temp_paths() -> str:
    """Temp-path directives pointing under the prefix, for each temp-using module this build has.

    Naming a module's directive when it is compiled out is a config error, and leaving one at its
    compiled-in default (/var/lib/nginx/...) fails for a non-root user, so ask the binary."""
    flags = _build_flags()
    lines = []
    for kind in _TEMP_KINDS:
        module = "http" if kind == "client_body" else f"http_{kind}"
        option = "client-body" if kind == "client_body" else kind
        if f"--without-{module}_module" in flags:
            continue
        if kind == "client_body" or f"--http-{option}-temp-path" in flags:
            lines.append(f"    {kind}_temp_path tmp/{kind};")
    return "\n".join(lines)


def _nginx_string(text: bytes) -> str:
    """``text`` as a single-quoted nginx string; ``$`` would start a variable, so refuse it."""
    s = text.decode()
    if "$" in s or "\n" in s:
        raise ValueError("body must not contain '$' or newlines")
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _main_block(workers: int) -> str:
    return f"""\
worker_processes {workers};
pid nginx.pid;
error_log error.log warn;
events {{
    worker_connections 4096;
    multi_accept on;
}}
"""


def render_upstream(port: int, body: bytes = MOCK_COMPLETION, workers: int = 1) -> str:
    """The mock engine: every request, whatever its method and path, gets ``body`` as JSON."""
    return (
        _main_block(workers)
        + f"""\
http {{
    access_log off;
{_temp_paths()}
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        default_type application/json;
        location / {{
            return 200 {_nginx_string(body)};
        }}
    }}
}}
"""
    )


def render_proxy(port: int, upstream_port: int, workers: int = 2) -> str:
    """The reference reverse proxy: keep-alive to the upstream, no buffering to disk, no logs."""
    return (
        _main_block(workers)
        + f"""\
http {{
    access_log off;
{_temp_paths()}
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream engine {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        # reuseport: one listening socket per worker, so the kernel spreads connections over the workers
        # as it does for the gateway's (without it one worker can accept all of a few connections).
        listen 127.0.0.1:{port} backlog=4096 reuseport;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    )
