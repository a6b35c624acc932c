"""The client address a request is counted under, and the per-address limits on a real bucket table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gateway.dataplane.clients import ClientLimiter, TrustedProxies, peer_address
from gateway.errors import RateLimited
from gateway.native import AtomicWords, BucketTable, region_size
from gateway.shm.holdings import Holdings
from gateway.shm.segment import Segment
from tests.fixtures.rsgi import FakeHeaders, FakeScope


@dataclass
class Scope:
    client: str
    headers: dict[str, str] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("client", "address"),
    [
        ("1.2.3.4:5678", "1.2.3.4"),
        ("[::1]:39176", "::1"),
        ("[2001:db8::7]:80", "2001:db8::7"),
        ("odd", "odd"),
    ],
)
def test_peer_address(client: str, address: str) -> None:
    assert peer_address(client) == address


TRUSTED = TrustedProxies(["10.0.0.0/8", "::1/128"])


@pytest.mark.parametrize(
    ("peer", "xff", "client"),
    [
        ("10.1.1.1", ["198.51.100.7"], "198.51.100.7"),  # a trusted balancer names the client
        (
            "10.1.1.1",
            ["6.6.6.6, 198.51.100.7"],
            "198.51.100.7",
        ),  # what the client wrote itself is not believed
        ("10.1.1.1", ["198.51.100.7, 10.2.2.2"], "198.51.100.7"),  # a chain of trusted proxies is walked
        ("10.1.1.1", ["10.3.3.3, 10.2.2.2"], "10.3.3.3"),  # all trusted: the farthest known
        ("10.1.1.1", [], "10.1.1.1"),  # no header: the peer
        ("192.0.2.1", ["198.51.100.7"], "192.0.2.1"),  # an untrusted peer's header is ignored
        ("::1", ["[2001:db8::1]"], "2001:db8::1"),
        # Repeated lines are one list, in order (RFC 9110 5.3): the client's own line first, the balancer's
        # last. Reading only the first line made 10.1.2.3 (the client's choice) the address.
        ("10.1.1.1", ["10.1.2.3", "198.51.100.7"], "198.51.100.7"),
        ("10.1.1.1", ["6.6.6.6, 10.1.2.3", "198.51.100.7, 10.2.2.2"], "198.51.100.7"),
        ("10.1.1.1", ["198.51.100.7", "10.2.2.2"], "198.51.100.7"),  # a trusted hop on a line of its own
        ("10.1.1.1", ["10.3.3.3", "10.2.2.2"], "10.3.3.3"),
        # Empty list elements are nothing (RFC 9110 5.6.1), wherever they are.
        ("10.1.1.1", [" , 198.51.100.7 ,, "], "198.51.100.7"),
        ("10.1.1.1", ["198.51.100.7", ""], "198.51.100.7"),
        ("10.1.1.1", [",", ","], "10.1.1.1"),
        # Ports, as some balancers write them, and addresses in their canonical spelling.
        ("10.1.1.1", ["198.51.100.7:4711"], "198.51.100.7"),
        ("10.1.1.1", ["[2001:DB8::1]:443"], "2001:db8::1"),
        ("10.1.1.1", ["2001:DB8::1"], "2001:db8::1"),
        ("10.1.1.1", ["198.51.100.7, 10.2.2.2:80"], "198.51.100.7"),
        # A hop that is no address stops the walk: it is the client's "address" (which no allow_ips
        # holds), never the trusted peer's and never a hop further left.
        ("10.1.1.1", ["not-an-address"], "not-an-address"),
        ("10.1.1.1", ["198.51.100.7, unknown"], "unknown"),
        ("10.1.1.1", ["10.9.9.9", "garbage"], "garbage"),
        ("10.1.1.1", ["10.9.9.9, _hidden, 10.2.2.2"], "_hidden"),
        ("10.1.1.1", ["198.51.100.7:port"], "198.51.100.7:port"),
        ("10.1.1.1", ["[2001:db8::1"], "[2001:db8::1"),
        ("10.1.1.1", ["[2001:db8::1]x"], "[2001:db8::1]x"),
        ("10.1.1.1", ["[]"], "[]"),
        ("10.1.1.1", ["10.9.9.9", "1.2.3.4:\u00b2"], "1.2.3.4:\u00b2"),  # a digit, but not an ASCII one
        ("10.1.1.1", ["x" * 100], "x" * 64),  # kept short: it is echoed in 403s and keys a limiter slot
        # What a client writes further left of a garbled hop is not reached.
        ("10.1.1.1", ["10.5.5.5", "unknown"], "unknown"),
        # Forwarded (RFC 7239) is not read: only X-Forwarded-For is handed in, so nothing here is it.
    ],
)
def test_forwarded_for_only_from_trusted_peers(peer: str, xff: list[str], client: str) -> None:
    assert TRUSTED.client_of(peer, xff) == client
    assert TrustedProxies([]).client_of(peer, xff) == peer


def test_the_limiter_reads_every_forwarded_for_line(table: BucketTable) -> None:
    limiter = make(table, max_requests=1, trusted=TrustedProxies(["127.0.0.0/8"]))

    def scope(*lines: str) -> FakeScope:
        return FakeScope(
            "POST", "/", FakeHeaders([("x-forwarded-for", v) for v in lines]), client="127.0.0.1:9"
        )

    held = limiter.admit(scope("198.51.100.7"))
    # The same client, with a line of its own choosing ahead of its balancer's: still 198.51.100.7.
    with pytest.raises(RateLimited) as info:
        limiter.admit(scope("10.1.2.3", "198.51.100.7"))
    assert "198.51.100.7" in info.value.message
    limiter.finish(held)


@pytest.fixture
def table() -> Iterator[BucketTable]:
    seg = Segment.create(region_size(1024))
    table = BucketTable.create_layout(seg.buf, 1024)
    yield table
    table.close()
    seg.close()


def make(table: BucketTable, **kw: object) -> ClientLimiter:
    args: dict[str, object] = {
        "max_requests": 0,
        "rate": 0.0,
        "burst": 0,
        "slots": 64,
        "trusted": TrustedProxies([]),
    }
    args.update(kw)
    return ClientLimiter(table, None, **args)  # type: ignore[arg-type]


def test_concurrency_per_address(table: BucketTable) -> None:
    limiter = make(table, max_requests=2)
    a, b = Scope("192.0.2.1:1000"), Scope("192.0.2.1:1001")
    held = [limiter.admit(a), limiter.admit(b)]
    with pytest.raises(RateLimited) as info:
        limiter.admit(Scope("192.0.2.1:1002"))
    assert info.value.headers["retry-after"] == "1" and "192.0.2.1" in info.value.message
    limiter.finish(held.pop())
    held.append(limiter.admit(a))  # a place came back
    for t in held:
        limiter.finish(t)


def test_rate_per_address_says_when_to_retry(table: BucketTable) -> None:
    limiter = make(table, rate=0.5, burst=2)
    scope = Scope("192.0.2.2:1")
    for t in (limiter.admit(scope), limiter.admit(scope)):
        limiter.finish(t)
    with pytest.raises(RateLimited) as info:
        limiter.admit(scope)
    assert info.value.headers["retry-after"] == "2"


def test_ipv6_addresses_of_one_64_share_their_limits(table: BucketTable) -> None:
    limiter = make(table, max_requests=1, slots=8192)
    assert limiter.slot("2001:db8:1:2::1") == limiter.slot("2001:db8:1:2:ffff::9")
    t = limiter.admit(Scope("[2001:db8:1:2::1]:5"))
    with pytest.raises(RateLimited):
        limiter.admit(Scope("[2001:db8:1:2::abcd]:6"))
    limiter.finish(t)


def test_gauges_are_noted_so_a_killed_worker_gives_them_back(table: BucketTable) -> None:
    seg = Segment.create(8 * 1024)
    words = AtomicWords(seg.buf)
    limiter = ClientLimiter(
        table, Holdings(words, 0, 1024), max_requests=1, rate=0, burst=0, slots=64, trusted=TrustedProxies([])
    )
    limiter.admit(Scope("192.0.2.3:1"))  # never finished: the worker "died"
    with pytest.raises(RateLimited):
        limiter.admit(Scope("192.0.2.3:2"))
    assert Holdings(words, 0, 1024).recover(table) == 1  # what the replacement worker does at start
    limiter.admit(Scope("192.0.2.3:3"))
    words.close()
    seg.close()


def test_a_flood_of_addresses_claims_at_most_slots_buckets(table: BucketTable) -> None:
    limiter = make(table, max_requests=5, slots=16)
    for i in range(2000):
        limiter.finish(limiter.admit(Scope(f"[2001:db8:{i:x}::1]:1")))
    assert len({limiter.slot(f"2001:db8:{i:x}::1") for i in range(2000)}) <= 16
