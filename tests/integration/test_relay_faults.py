"""Hostile and unlucky traffic on the relay: client-caused failures never count against a backend,
abandoned and cut streams are billed and told apart, slow readers hold a bounded buffer (issue 18: items 2,
4, 5, the streams of 8, and the backend named in the health log line)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import orjson

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, basic_config, wait_until
from tests.fixtures.streaming_upstream import StreamingUpstream

PRICED = "{ input = 1000.0, output = 1000.0 }"  # a thousandth of a unit per token
BUDGETED = """
[[principals]]
name = "capped"
roles = ["chatter"]
budget = { period = "1h", tokens = 60 }
"""


def records(gw: Gateway) -> list[UsageRecord]:
    with open_store(Settings(data_dir=gw.data_dir)) as store:
        return store.usage.records(limit=1000)


def record_of(gw: Gateway, request_id: str) -> UsageRecord:
    def find() -> UsageRecord | None:
        return next((r for r in records(gw) if r.request_id == request_id), None)

    wait_until(lambda: find() is not None, timeout=20, what=f"the record of {request_id}")
    found = find()
    assert found is not None
    return found


def body(stream: bool = False, max_tokens: int = 300, model: str = "chat") -> bytes:
    doc = {"model": model, "messages": [{"role": "user", "content": "q"}], "max_tokens": max_tokens}
    return orjson.dumps({**doc, "stream": True} if stream else doc)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


# -- item 2 and 10: what a client caused never takes a backend away ------------------------------------------


def test_client_caused_failures_never_cool_a_backend(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=1)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        # Paths the upstream client cannot write (a space, CR LF): a 400 in the API's envelope, every time.
        for path in ["/v1/chat%20completions"] * 6 + ["/v1/chat/completions%0d%0aX-Evil:%201"] * 3:
            r = httpx.post(gw.url + path, content=body(), headers=auth(key), timeout=10)
            assert r.status_code == 400, (path, r.status_code, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"
        # A backend's own 4xx answers are the client's business too.
        mock_engine.configure(fail_status=400, fail_count=8)
        for _ in range(8):
            assert (
                httpx.post(gw.url + "/v1/chat/completions", content=body(), headers=auth(key)).status_code
                == 400
            )
        # Every other caller is still served, by the same backend.
        for _ in range(5):
            r = httpx.post(gw.url + "/v1/chat/completions", content=body(max_tokens=3), headers=auth(key))
            assert r.status_code == 200, r.text
        assert "marked unhealthy" not in gw.log.read_text()
    finally:
        gw.stop()


def test_the_unhealthy_log_line_names_the_backend(tmp_path: Path, mock_engine: MockEngine) -> None:
    mock_engine.configure(fail_status=500, fail_count=3)
    gw = Gateway(tmp_path, basic_config({"flaky": mock_engine.url}), workers=1)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        mock_engine.configure(fail_status=500, fail_count=3)
        for _ in range(3):
            assert (
                httpx.post(gw.url + "/v1/chat/completions", content=body(), headers=auth(key)).status_code
                == 500
            )
        wait_until(lambda: "backend flaky marked unhealthy" in gw.log.read_text(), timeout=5, what="log line")
    finally:
        gw.stop()


# -- item 4: an abandoned stream is billed -------------------------------------------------------------------


def test_an_abandoned_stream_is_counted_priced_charged_and_names_its_backend(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    config = basic_config({"a": mock_engine.url}, price=PRICED, extra=BUDGETED)
    gw = Gateway(tmp_path, config, workers=1)
    try:
        key = gw.create_key("capped")
        gw.wait_key_live(key)
        mock_engine.configure(tokens=300, token_delay=0.01)
        read = 0
        with httpx.stream(
            "POST", gw.url + "/v1/chat/completions", content=body(stream=True), headers=auth(key), timeout=30
        ) as r:
            assert r.status_code == 200
            request_id = r.headers["x-request-id"]
            for line in r.iter_lines():
                if '"content":" tok"' in line or '"content":"tok"' in line:
                    read += 1
                if read >= 100:
                    break  # and leave: the connection closes with the block
        rec = record_of(gw, request_id)
        assert (rec.status, rec.cut, rec.backend, rec.usage_source) == (200, "client", "a", "estimated")
        # Tokens relayed before the disconnect: at least what the client read, not all 300.
        assert read <= rec.completion_tokens < 300, rec
        assert rec.prompt_tokens > 0 and rec.total_tokens == rec.prompt_tokens + rec.completion_tokens
        assert rec.cost_nanos == rec.total_tokens * 1_000_000  # priced: a thousandth a token
        assert rec.budget_keys is not None and len(rec.budget_keys) == 1
        # Charged to the budget (60 tokens): the next request is refused.
        r2 = httpx.post(gw.url + "/v1/chat/completions", content=body(max_tokens=3), headers=auth(key))
        assert r2.status_code == 402, r2.text
    finally:
        gw.stop()


# -- item 5: a stream cut by the upstream is told apart ------------------------------------------------------


def _stream(gw: Gateway, key: str, path: str, content: bytes) -> tuple[int, str, bytes]:
    got = b""
    headers = {**auth(key), "x-api-key": key, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", gw.url + path, content=content, headers=headers, timeout=30) as r:
        status, rid = r.status_code, r.headers["x-request-id"]
        for chunk in r.iter_raw():
            got += chunk
    return status, rid, got


def test_an_upstream_cut_ends_the_stream_with_an_error_event(
    tmp_path: Path, streaming_upstream: StreamingUpstream
) -> None:
    config = basic_config({"a": streaming_upstream.url}, price=PRICED)
    gw = Gateway(tmp_path, config, workers=1)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        streaming_upstream.mode, streaming_upstream.chunks = "cut-openai", 40
        status, rid, got = _stream(gw, key, "/v1/chat/completions", body(stream=True))
        assert status == 200 and b"[DONE]" not in got
        assert got.count(b'"content":" tok"') == 40
        last = got.rstrip().rsplit(b"\n\n", 1)[-1]
        assert last.startswith(b"data: ")
        error = orjson.loads(last[6:])["error"]
        assert error["code"] == "upstream_stream_cut" and error["type"] == "server_error"
        rec = record_of(gw, rid)
        assert (rec.status, rec.cut, rec.backend, rec.usage_source) == (200, "upstream", "a", "estimated")
        assert 30 <= rec.completion_tokens <= 50 and rec.cost_nanos > 0  # 40 chunks of " tok"
    finally:
        gw.stop()


def test_an_upstream_cut_ends_an_anthropic_stream_with_its_error_event(
    tmp_path: Path, streaming_upstream: StreamingUpstream
) -> None:
    config = basic_config({"a": streaming_upstream.url}).replace(
        f'url = "{streaming_upstream.url}"', f'url = "{streaming_upstream.url}"\nprotocol = "anthropic"'
    )
    gw = Gateway(tmp_path, config, workers=1)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        streaming_upstream.mode, streaming_upstream.chunks = "cut-anthropic", 20
        status, rid, got = _stream(gw, key, "/v1/messages", body(stream=True, max_tokens=100))
        assert status == 200 and b"message_stop" not in got
        last = got.rstrip().rsplit(b"\n\n", 1)[-1]
        assert last.startswith(b"event: error\ndata: "), last
        assert orjson.loads(last.split(b"data: ", 1)[1])["error"]["type"] == "api_error"
        rec = record_of(gw, rid)
        assert (rec.status, rec.cut, rec.backend) == (200, "upstream", "a")
        assert rec.prompt_tokens == 7 and 15 <= rec.completion_tokens <= 25, rec  # message_start's input
        # The same backend through a translation (an OpenAI client): the translation's own error event.
        status, rid, got = _stream(gw, key, "/v1/chat/completions", body(stream=True, max_tokens=100))
        last = got.rstrip().rsplit(b"\n\n", 1)[-1]
        assert status == 200 and b"error" in last and b"[DONE]" not in got
        assert record_of(gw, rid).cut == "upstream"
    finally:
        gw.stop()


# -- item 8, streams: backpressure, and whole answers held once --------------------------------------------


def _request(gw: Gateway, key: str, stream: bool) -> bytes:
    doc = body(stream=stream)
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(doc)}\r\n\r\n"
    ).encode() + doc


def _slow_reader(
    gw: Gateway, key: str, streaming_upstream: StreamingUpstream, stream: bool, size: int
) -> tuple[int, int, int, bytes]:
    """Send a request, read nothing for a while (the upstream can send all of it meanwhile), note the
    worker's growth and what the upstream sent by then, then read it all; (growth in KiB, upstream bytes
    sent while the client stalled, bytes read, the start of the answer)."""
    pid = gw.worker_pids()[0]
    before = rss_kib(pid)
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        sock.sendall(_request(gw, key, stream))
        time.sleep(0.3)
        first = sock.recv(4096)
        time.sleep(1.7)  # the client stalls; an unbounded relay holds the whole answer by now
        growth, sent = rss_kib(pid) - before, streaming_upstream.sent
        got = len(first)
        sock.settimeout(20)
        while True:
            data = sock.recv(1 << 20)
            if not data:
                break
            got += len(data)
            if first.startswith(b"HTTP/1.1 200") and stream and data.endswith(b"0\r\n\r\n"):
                break
            if not stream and got >= size:
                break
        return growth, sent, got, first
    finally:
        sock.close()


def test_a_slow_reader_holds_a_bounded_buffer(tmp_path: Path, streaming_upstream: StreamingUpstream) -> None:
    size = 64 << 20
    gw = Gateway(tmp_path, basic_config({"a": streaming_upstream.url}), workers=1)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        streaming_upstream.mode, streaming_upstream.size = "bulk", size
        growth, sent, got, first = _slow_reader(gw, key, streaming_upstream, True, size)
        print(f"64 MiB stream, client stalled 2 s: worker +{growth} KiB, upstream sent {sent >> 10} KiB")
        assert first.startswith(b"HTTP/1.1 200")
        assert sent < size // 4, sent  # the upstream is read only as the client drains
        assert growth < 16 * 1024, f"worker grew by {growth} KiB for a stalled 64 MiB stream"
        assert got > size  # everything arrived once the client read (framing included)
        # A whole answer with a length (48 MiB): relayed as it comes, so a stalled client holds the worker
        # to a window of it too, and nothing is copied twice.
        streaming_upstream.mode, streaming_upstream.size = "whole", 48 << 20
        growth, sent, got, first = _slow_reader(gw, key, streaming_upstream, False, 48 << 20)
        print(f"48 MiB answer, client stalled 2 s: worker +{growth} KiB, upstream sent {sent >> 10} KiB")
        assert first.startswith(b"HTTP/1.1 200") and b"content-length: 50331648" in first.lower()
        assert growth < 16 * 1024, f"worker grew by {growth} KiB for a stalled 48 MiB answer"
        assert got >= 48 << 20
    finally:
        gw.stop()


def test_a_client_that_reads_nothing_is_cut_after_the_stall_timeout(
    tmp_path: Path, streaming_upstream: StreamingUpstream
) -> None:
    gw = Gateway(
        tmp_path,
        basic_config({"a": streaming_upstream.url}),
        workers=1,
        extra=("--stream-stall-timeout", "1"),
    )
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        streaming_upstream.mode, streaming_upstream.size = "bulk", 64 << 20
        sock = socket.create_connection(("127.0.0.1", gw.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        try:
            sock.sendall(_request(gw, key, True))
            time.sleep(0.3)
            rid = next(
                line.split(b":", 1)[1].strip().decode()
                for line in sock.recv(4096).split(b"\r\n")
                if line.lower().startswith(b"x-request-id:")
            )
            rec = record_of(gw, rid)  # written once the stall timeout cut the stream
        finally:
            sock.close()
        assert (rec.status, rec.cut, rec.backend) == (200, "client", "a")
        assert rec.latency_ms < 10_000
    finally:
        gw.stop()


def test_a_huge_error_answer_is_not_held_and_failover_goes_on(
    tmp_path: Path, streaming_upstream: StreamingUpstream, mock_engine: MockEngine
) -> None:
    config = basic_config(
        {"bad": streaming_upstream.url, "good": mock_engine.url}, chain=["pm-bad", "pm-good"]
    )
    gw = Gateway(tmp_path, config, workers=1)
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        streaming_upstream.mode, streaming_upstream.size = "huge-error", 256 << 20
        pid = gw.worker_pids()[0]
        before = rss_kib(pid, "VmHWM")
        r = httpx.post(
            gw.url + "/v1/chat/completions", content=body(max_tokens=3), headers=auth(key), timeout=30
        )
        assert r.status_code == 200, r.text  # the next target's answer
        growth = rss_kib(pid, "VmHWM") - before
        assert growth < 16 * 1024, f"worker peak grew by {growth} KiB for a 256 MiB error body"
        assert streaming_upstream.sent < 32 << 20  # the rest of it was never read
    finally:
        gw.stop()


def test_the_drain_reads_a_connection_by_its_addresses_even_on_a_wildcard_listener() -> None:
    """What the drain asks the kernel, on a real loopback connection of this process: its state and every
    byte written to it, named as granian names it (the listener's address, ``0.0.0.0:PORT``, included)."""
    from gateway.dataplane.drain import _request, connection_state

    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))  # accepts only the connection made below, from 127.0.0.1
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        with client, served:
            served.sendall(b"x" * 100_000)
            peer = "{}:{}".format(*served.getpeername())
            for local in (f"127.0.0.1:{port}", f"0.0.0.0:{port}"):
                assert connection_state(_request(local, peer)) == (1, 100_000)
            assert connection_state(_request(f"127.0.0.1:{port}", "127.0.0.1:1")) is None  # no such one
            assert _request("unix:/run/gw.sock", peer) is None
