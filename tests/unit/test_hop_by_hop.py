"""Headers a Connection header names are hop-by-hop too (RFC 9110 7.6.1)."""

from __future__ import annotations

from gateway.dataplane.upstream import connection_named, without_hop_by_hop


def test_connection_named() -> None:
    assert connection_named(["keep-alive, X-Foo", " close ,x-bar,,"]) == {
        "keep-alive",
        "x-foo",
        "close",
        "x-bar",
    }
    assert connection_named([]) == frozenset()


def test_answer_headers_lose_what_connection_names() -> None:
    headers = [
        ("Content-Type", "application/json"),
        ("Connection", "close, X-Internal"),
        ("X-Internal", "secret"),
        ("x-internal", "again"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("X-Public", "yes"),
    ]
    assert without_hop_by_hop(headers) == [("Content-Type", "application/json"), ("X-Public", "yes")]


def test_the_common_answer_keeps_its_headers() -> None:
    headers = [("content-type", "text/event-stream"), ("connection", "keep-alive"), ("x-request-id", "1")]
    assert without_hop_by_hop(headers) == [("content-type", "text/event-stream"), ("x-request-id", "1")]
