"""The proxy port's edge against hostile input (issue 18, items 1, 3 and 10): request paths, head and body
timeouts, duplicate members, out-of-range upstream statuses and Connection-named headers, through the real
gateway and a raw upstream of our own that records what reached it."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.fixtures.processes import Gateway, basic_config
from tests.fixtures.upstream import RawUpstream

HEAD_TIMEOUT = 1.5
BODY_TIMEOUT = 1.0
# No probes of the backend's /health and /metrics: the upstream then records only what was forwarded.
QUIET = ("--engine-scrape-interval", "0")
CHAT = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'


CONN_BODY = b'{"id":"x","object":"chat.completion","choices":[]}'
# pm-odd answers a status no HTTP server sends; pm-conn names a header in its Connection header.
ODD = b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
CONN = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close, X-Internal\r\n" + (
    b"X-Internal: secret\r\nX-Public: yes\r\nContent-Length: %d\r\n\r\n%s" % (len(CONN_BODY), CONN_BODY)
)
MAX_BODY = 300_000


@dataclass
class Edge:
    gw: Gateway
    raw: RawUpstream  # behind "chat", under the path prefix /echo
    odd: RawUpstream
    conn: RawUpstream
    key: str  # alice's: "chat"
    direct: str  # bob's: the pm-* models


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    tmp = tmp_path_factory.mktemp("edge")
    raw, odd, conn = RawUpstream(), RawUpstream(ODD), RawUpstream(CONN)
    gw = Gateway(
        tmp,
        basic_config({"raw": raw.url + "/echo", "odd": odd.url, "conn": conn.url}, chain=["pm-raw"]),
        workers=2,
        extra=(
            *QUIET,
            "--head-timeout",
            str(HEAD_TIMEOUT),
            "--body-timeout",
            str(BODY_TIMEOUT),
            "--max-body-bytes",
            str(MAX_BODY),
        ),
    )
    key, direct = gw.create_key("alice"), gw.create_key("bob")
    gw.wait_key_live(key)
    gw.wait_key_live(direct)
    yield Edge(gw, raw, odd, conn, key, direct)
    gw.stop()
    for up in (raw, odd, conn):
        up.stop()


@pytest.fixture
def edge(env: Edge) -> tuple[Gateway, RawUpstream, str]:
    return env.gw, env.raw, env.key


def exchange(gw: Gateway, data: bytes, wait: float = 5.0) -> tuple[bytes, float]:
    """Send raw bytes on a fresh connection; everything the gateway sent until it closed, and when."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.settimeout(wait)
        if data:
            s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pass
    return got, time.monotonic() - started


def post(
    gw: Gateway, key: str, path: str, body: bytes = CHAT, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        gw.url + path,
        content=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})},
        timeout=10,
    )


# -- item 3: paths ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/v1/%2e%2e/%2e%2e/secret",
        "/v1/../../secret",
        "/v1/chat/%2E%2E/completions",
        "/v1/chat%20completions",
        "/v1/chat%0d%0acompletions",
        "/v1/chat%00completions",
        "/v1/chat%5c..%5ccompletions",
        "/v1/%252e%252e/secret",
        "/v1//chat/completions",
    ],
)
def test_unsafe_paths_get_400_and_never_reach_the_upstream(
    edge: tuple[Gateway, RawUpstream, str], path: str
) -> None:
    gw, raw, key = edge
    before = len(raw.received)
    got, _ = exchange(
        gw,
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(CHAT)}\r\nConnection: close\r\n\r\n".encode()
        + CHAT,
    )
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), got
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert len(raw.received) == before, raw.received[before:]


def test_unsafe_path_under_messages_gets_anthropic_envelope(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, _, key = edge
    got, _ = exchange(
        gw,
        f"POST /v1/messages/%2e%2e/x HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\nContent-Length: 2\r\n"
        "Connection: close\r\n\r\n{}".encode(),
    )
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), got
    doc = orjson.loads(body)
    assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"


def test_forwarded_paths_stay_under_the_backend_prefix(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, raw, key = edge
    raw.received.clear()
    assert post(gw, key, "/v1/chat/completions").status_code == 200
    # An encoded "/" arrives decoded from granian: it is a plain "/", and the path is checked as such.
    assert post(gw, key, "/v1/chat%2Fcompletions").status_code == 200
    targets = [r.target for r in raw.received]
    assert targets == ["/echo/v1/chat/completions", "/echo/v1/chat/completions"]


# -- item 1: heads and bodies ----------------------------------------------------------------------------
def test_silent_connection_is_closed_after_the_head_timeout(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, _, _ = edge
    got, took = exchange(gw, b"", wait=HEAD_TIMEOUT + 5)
    assert got == b"" or b"408" in got.split(b"\r\n", 1)[0]
    assert HEAD_TIMEOUT - 0.3 <= took < HEAD_TIMEOUT + 2, took


def test_dribbled_head_is_cut_at_the_head_timeout(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, _, _ = edge
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.settimeout(0.2)
        closed = False
        for byte in b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
                if s.recv(4096) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed
    assert time.monotonic() - started < HEAD_TIMEOUT + 2


def test_idle_keep_alive_connection_is_closed_too(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, _, key = edge
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.settimeout(HEAD_TIMEOUT + 5)
        s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        while s.recv(65536):
            pass
        assert time.monotonic() - started < HEAD_TIMEOUT + 2


@pytest.mark.parametrize(("path", "anthropic"), [("/v1/chat/completions", False), ("/v1/messages", True)])
def test_stalled_body_gets_408_in_the_api_envelope(
    edge: tuple[Gateway, RawUpstream, str], path: str, anthropic: bool
) -> None:
    gw, raw, key = edge
    before = len(raw.received)
    got, took = exchange(
        gw,
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nx-api-key: {key}\r\n"
        'Content-Length: 100\r\n\r\n{"model":'.encode(),
        wait=BODY_TIMEOUT + 5,
    )
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got
    doc = orjson.loads(body)
    assert (
        (doc["error"]["type"] == "timeout_error")
        if anthropic
        else (doc["error"]["code"] == "request_timeout")
    )
    assert BODY_TIMEOUT - 0.1 <= took < BODY_TIMEOUT + 1.5, took
    assert len(raw.received) == before, raw.received[before:]


def test_a_large_body_that_keeps_coming_is_not_cut(edge: tuple[Gateway, RawUpstream, str]) -> None:
    """Slower than the body timeout in total, but never silent for that long: it is served."""
    gw, raw, key = edge
    padding = b" " * (200 * 1024)
    body = CHAT[:-1] + b"," + b'"pad":"' + padding + b'"}'
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.settimeout(10)
        s.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        step = len(body) // 5 + 1
        for i in range(0, len(body), step):
            s.sendall(body[i : i + step])
            time.sleep(BODY_TIMEOUT * 0.6)  # five pieces: 3 s in all, twice the timeout
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert raw.received[-1].body == body.replace(b'"chat"', b'"mock-model"', 1)  # the provider's name


def test_chunked_body_past_the_limit_is_refused_as_it_arrives(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, raw, key = edge
    before = len(raw.received)
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.settimeout(5)
        s.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        piece = b"x" * (MAX_BODY // 2 + 1000)
        s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) * 2)  # past the limit; the client never ends it
        got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 413"), got
    assert len(raw.received) == before


# -- item 10 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"chat","\\u006dodel":"pm-raw","messages":[]}',
        b'{"model":"pm-raw","model":"chat","messages":[]}',
        b'{"model":"chat","stream":false,"str\\u0065am":true,"messages":[]}',
    ],
)
def test_duplicate_members_are_refused(edge: tuple[Gateway, RawUpstream, str], body: bytes) -> None:
    gw, raw, key = edge
    before = len(raw.received)
    r = post(gw, key, "/v1/chat/completions", body)
    assert r.status_code == 400
    assert "more than once" in r.json()["error"]["message"]
    assert len(raw.received) == before, raw.received[before:]


def test_duplicate_members_are_refused_on_messages(edge: tuple[Gateway, RawUpstream, str]) -> None:
    gw, _, key = edge
    body = b'{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"x"}],"\\u006dodel":"x"}'
    r = post(gw, key, "/v1/messages", body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_upstream_status_out_of_range_is_502(env: Edge) -> None:
    r = post(env.gw, env.direct, "/v1/chat/completions", CHAT.replace(b'"chat"', b'"pm-odd"'))
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "server_error"
    assert len(env.odd.received) == 1


def test_connection_named_headers_are_dropped_both_ways(env: Edge) -> None:
    hop = {"connection": "keep-alive, X-Hop", "x-hop": "1", "x-kept": "2"}
    r = post(env.gw, env.direct, "/v1/chat/completions", CHAT.replace(b'"chat"', b'"pm-conn"'), headers=hop)
    assert r.status_code == 200
    assert r.headers.get("x-public") == "yes" and "x-internal" not in r.headers
    got = env.conn.received[-1]
    assert got.header("x-kept") == "2" and got.header("x-hop") is None


# -- what must keep holding: malformed requests get a clean 4xx (or a close), and no worker is lost -------
MALFORMED = {
    "te-and-cl": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n",
    "two-lengths": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
    b"Content-Length: 5\r\n\r\n",
    "bad-length": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4x\r\n\r\n",
    "bad-chunk": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "huge-header": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
    "bare-lf": b"GET /v1/models HTTP/1.1\nHost: x\n\n",
    "nul-in-header": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "no-http": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 64,
    "space-in-target": b"GET /v1/mod els HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_requests_get_a_clean_refusal(edge: tuple[Gateway, RawUpstream, str], name: str) -> None:
    gw, raw, _ = edge
    workers = gw.worker_pids()
    before = len(raw.received)
    got, _ = exchange(gw, MALFORMED[name], wait=HEAD_TIMEOUT + 3)
    status = got.split(b"\r\n", 1)[0]
    assert got == b"" or status.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), got[:200]
    assert b"HTTP/1.1 200" not in got  # nothing smuggled behind it was served
    assert len(raw.received) == before
    assert gw.worker_pids() == workers and all(os.path.exists(f"/proc/{p}") for p in workers)
