"""SIGTERM under load on kept-alive connections (issue 29, "Drain without cutting"): every request a client
sends on an open connection gets a whole answer, and those answered while the gateway drains carry
``Connection: close`` so that the client opens its next connection elsewhere. Only a connection attempt
after the listener stopped accepting fails. A real gateway with two proxy workers, the mock engine, a real
signal, and clients on raw sockets so that an answer cut before its status line is told apart from a
connection that could not be opened. Two kinds of clients: kept-alive ones that send their next request
on the same connection, and fresh ones that open a connection per request and write it a moment later
(as a busy event loop does), which hyper would close unread if granian stopped just then."""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from gateway.dataplane.closing import stop_accepting
from tests.fixtures.processes import Gateway, MockEngine, basic_config

pytestmark = pytest.mark.slow

KEPT_ALIVE, FRESH = 10, 6  # clients of each kind
PACE = 0.04  # seconds between one client's requests: at most ~400 req/s over all of them
FRESH_PAUSE = 0.05  # seconds a fresh client waits between opening its connection and writing its request


@dataclass
class Tally:
    """What the clients saw, by outcome; ``answers`` holds (request sent at, status, said close)."""

    answers: list[tuple[float, int, bool]] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)  # a request sent on an open connection, no whole answer
    refused: int = 0  # connection attempts that failed: the listener no longer took connections
    lock: threading.Lock = field(default_factory=threading.Lock)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """One whole HTTP/1.1 answer (Content-Length or chunked): its status and headers. Raises
    ``ConnectionError`` when the connection ends before the answer does."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError(f"EOF after {len(buf)} bytes of the head")
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        need = int(headers["content-length"])
        while len(rest) < need:
            got = sock.recv(65536)
            if not got:
                raise ConnectionError("EOF inside the body")
            rest += got
    elif headers.get("transfer-encoding") == "chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            got = sock.recv(65536)
            if not got:
                raise ConnectionError("EOF inside the chunked body")
            rest += got
    return status, headers


def client(port: int, request: bytes, tally: Tally, stop: threading.Event, fresh: bool) -> None:
    """One client: a request every ``PACE`` seconds, on its kept-alive connection, or on a new one each
    time when ``fresh``; a new connection too when the gateway said ``Connection: close``."""
    sock: socket.socket | None = None
    while not stop.is_set():
        if sock is None:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:  # refused, reset in the accept queue, no answer to the SYN: nothing was sent
                with tally.lock:
                    tally.refused += 1
                time.sleep(PACE)
                continue
            if fresh:
                time.sleep(FRESH_PAUSE)
        sent = time.monotonic()
        try:
            sock.sendall(request)
            status, headers = read_answer(sock)
        except OSError as exc:  # reset, EOF before the answer ended, broken pipe: the request was cut
            with tally.lock:
                tally.cut.append(f"{type(exc).__name__}: {exc}")
            sock.close()
            sock = None
            continue
        close = headers.get("connection", "").lower() == "close"
        with tally.lock:
            tally.answers.append((sent, status, close))
        if close or fresh:
            sock.close()
            sock = None
        time.sleep(PACE)
    if sock is not None:
        sock.close()


def test_sigterm_under_keepalive_load_cuts_no_request(tmp_path: Path, mock_engine: MockEngine) -> None:
    gw = Gateway(tmp_path, basic_config({"a": mock_engine.url}), workers=2, extra=("--grace-period", "20"))
    try:
        key = gw.create_key("alice")
        gw.wait_key_live(key)
        body = orjson.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 1}
        )
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        tally, stop = Tally(), threading.Event()
        threads = [
            threading.Thread(target=client, args=(gw.port, request, tally, stop, i >= KEPT_ALIVE))
            for i in range(KEPT_ALIVE + FRESH)
        ]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 30
            while len(tally.answers) < 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(tally.answers) >= 200, "the load did not get going"
            signalled = time.monotonic()
            gw.signal(signal.SIGTERM)
            assert gw.proc.wait(30) == 0
            stopped = time.monotonic()
            time.sleep(0.5)  # every client meets the closed listener at least once
        finally:
            stop.set()
            for t in threads:
                t.join(15)
        after = [a for a in tally.answers if a[0] >= signalled]
        print(
            f"answers {len(tally.answers)} ({len(after)} after SIGTERM, "
            f"{sum(a[2] for a in after)} with Connection: close), cut {len(tally.cut)}, "
            f"refused {tally.refused}, drain took {stopped - signalled:.2f}s"
        )
        assert tally.cut == [], f"{len(tally.cut)} requests cut: {tally.cut[:5]}"
        assert all(status == 200 for _, status, _ in tally.answers)
        assert tally.refused > 0  # the listener did stop: the clients got to the end of the drain
        # Answered during the drain: with Connection: close, all but those sent before the workers got
        # the signal (the supervisor passes it on at once; a second is a generous bound on a busy host).
        assert any(close for _, _, close in after)
        late = [a for a in after if a[0] > signalled + 1.0]
        assert all(close for _, _, close in late), "an answer during the drain kept the connection open"
    finally:
        gw.stop()


def test_a_listener_that_stops_accepting_still_hands_over_its_queue() -> None:
    """``stop_accepting`` on a real listener: a connection already queued is still accepted and carries
    bytes, a new one gets no answer to its SYN (its connect times out), and the listener stays open."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        assert stop_accepting(port)
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        listener.settimeout(5)
        conn, _ = listener.accept()
        with conn:
            queued.sendall(b"ping")
            assert conn.recv(4) == b"ping"
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    finally:
        queued.close()
        listener.close()
    assert not stop_accepting(port)  # no such listener any more
