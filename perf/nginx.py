"""nginx configuration rendering for the benchmark: the mock engine and the reference reverse proxy.

The mock engine answers every path with a fixed OpenAI ``chat.completion`` and, on paths given their own
body (``/v1/messages``), with that body instead. The reverse proxy is the reference every ratio is taken
against; for SSE upstreams it is rendered with ``proxy_buffering off`` (how nginx is set up in front of
a streaming engine), and one key can be put under ``limit_req`` to compare the cost of refusing.

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
from collections.abc import Mapping

__all__ = [
    "MOCK_COMPLETION",
    "MOCK_MESSAGE",
    "nginx_binary",
    "nginx_version",
    "render_proxy",
    "render_upstream",
]

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

# The same answer as an Anthropic Messages backend gives it, for /v1/messages (native passthrough).
MOCK_MESSAGE: bytes = json.dumps(
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-mock",
        "content": [{"type": "text", "text": "Hello! How can I help you today?"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 9},
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


def render_upstream(
    port: int,
    body: bytes = MOCK_COMPLETION,
    workers: int = 1,
    locations: Mapping[str, bytes] | None = None,
) -> str:
    """The mock engine: every request, whatever its method and path, gets ``body`` as JSON, except the
    exact paths in ``locations``, which get their own body."""
    own = "".join(
        f"""\
        location = {path} {{
            return 200 {_nginx_string(text)};
        }}
"""
        for path, text in (locations or {}).items()
    )
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
{own}        location / {{
            return 200 {_nginx_string(body)};
        }}
    }}
}}
"""
    )


def render_proxy(
    port: int,
    upstream_port: int,
    workers: int = 2,
    *,
    streaming: bool = False,
    limited_key: str | None = None,
    limited_rpm: int = 600,
) -> str:
    """The reference reverse proxy: keep-alive to the upstream, no buffering to disk, no logs.

    ``streaming``: ``proxy_buffering off``, so SSE events are relayed as they come rather than when a
    buffer fills. ``limited_key``: requests with ``Authorization: Bearer <limited_key>`` go through
    ``limit_req`` at ``limited_rpm`` per minute with an equal burst (as the gateway's token bucket), refused
    with 429; every other request has an empty zone key, which ``limit_req`` does not account.
    """
    limit_http = limit_loc = ""
    if limited_key is not None:
        if '"' in limited_key or "$" in limited_key:
            raise ValueError("limited_key must not contain '\"' or '$'")
        limit_http = f"""\
    map $http_authorization $bench_limited {{
        "Bearer {limited_key}" $http_authorization;
        default "";
    }}
    limit_req_zone $bench_limited zone=bench_limited:1m rate={limited_rpm}r/m;
    limit_req_status 429;
"""
        limit_loc = f"            limit_req zone=bench_limited burst={limited_rpm} nodelay;\n"
    buffering = "            proxy_buffering off;\n" if streaming else ""
    return (
        _main_block(workers)
        + f"""\
http {{
    access_log off;
{_temp_paths()}
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    # Large (100 KB) prompts stay in memory instead of going to a temp file, as the gateway keeps them.
    client_body_buffer_size 1m;
{limit_http}    upstream engine {{
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
{buffering}{limit_loc}        }}
    }}
}}
"""
    )
