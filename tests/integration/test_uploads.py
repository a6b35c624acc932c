"""Issue 18, item 8 (the proxy port's part): concurrent large uploads are held against each worker's body
budget, so the workers grow by less than what was uploaded, and nothing is refused for it."""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.fixtures.processes import Gateway, basic_config
from tests.fixtures.upstream import OK, RawUpstream

UPLOADS = int(os.environ.get("EDGE_UPLOADS", "8"))
SIZE = 30 * 1000 * 1000
BOUNDARY = "edge-upload-boundary"


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def multipart(size: int) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\nchat\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    return head + os.urandom(size - len(head) - len(tail)) + tail


def test_concurrent_uploads_grow_the_workers_by_less_than_was_uploaded(tmp_path: Path) -> None:
    answer = b'{"text":"ok"}'
    raw = RawUpstream(OK % len(answer) + answer)
    gw = Gateway(tmp_path, basic_config({"raw": raw.url}), workers=2, extra=("--engine-scrape-interval", "0"))
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        workers = gw.worker_pids()
        before = {p: status_kib(p, "VmRSS") for p in workers}
        body = multipart(SIZE)
        head = (
            f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()

        def upload(_: int) -> bytes:
            with socket.create_connection(("127.0.0.1", gw.port), timeout=60) as s:
                s.sendall(head)
                view = memoryview(body)
                try:
                    for i in range(0, len(body), 1 << 20):
                        s.sendall(view[i : i + (1 << 20)])
                except OSError:  # answered (and closed) before the whole body was sent: read why
                    pass
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            return got

        started = time.monotonic()
        with ThreadPoolExecutor(UPLOADS) as pool:
            answers = list(pool.map(upload, range(UPLOADS)))
        took = time.monotonic() - started
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:80] for a in answers]
        forwarded = [r for r in raw.received if r.target.endswith("/audio/transcriptions")]
        spliced = len(body) + len("mock-model") - len("chat")  # the provider's name for the model
        assert len(forwarded) == UPLOADS and all(len(r.body) == spliced for r in forwarded)
        raw.received.clear()
        grown = sum(status_kib(p, "VmHWM") - before[p] for p in workers) * 1024
        uploaded = UPLOADS * len(body)
        print(
            f"\n{UPLOADS} concurrent uploads of {len(body) / 1e6:.0f} MB in {took:.1f}s: "
            f"the workers' peak RSS grew by {grown / 2**20:.0f} MiB in all, "
            f"for {uploaded / 2**20:.0f} MiB uploaded"
        )
        assert grown < uploaded
    finally:
        gw.stop()
        raw.stop()
