"""Admission against rate limits on a real shared-memory bucket table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.dataplane.limits import Limiter, estimate_tokens
from gateway.errors import RateLimited
from gateway.native import BucketTable, region_size
from gateway.shm.segment import Segment
from gateway.snapshot import KeyEntry, Limits, Principal


@pytest.fixture
def limiter() -> Iterator[Limiter]:
    seg = Segment.create(region_size(1024))
    table = BucketTable.create_layout(seg.buf, 1024)
    yield Limiter(table)
    table.close()
    seg.close()


def key_with(
    principal_limits: dict | None = None,
    key_limits: dict | None = None,  # type: ignore[type-arg]
    model_limits: dict | None = None,
    pid: str = "p1",
    kid: str = "k1",
) -> KeyEntry:  # type: ignore[type-arg]
    principal = Principal(
        pid,
        "alice",
        True,
        frozenset(),
        Limits.from_doc(f"p:{pid}", principal_limits),
        {m: lim for m, d in (model_limits or {}).items() if (lim := Limits.from_doc(f"pm:{pid}:{m}", d))}
        or None,
    )
    return KeyEntry(kid, principal, None, Limits.from_doc(f"k:{kid}", key_limits))


def test_unlimited_key_takes_no_ticket(limiter: Limiter) -> None:
    assert limiter.admit(key_with(), "chat", 100) is None


def test_requests_per_minute_admits_the_burst_then_refuses(limiter: Limiter) -> None:
    key = key_with({"rpm": 3})
    tickets = [limiter.admit(key, "chat", 1) for _ in range(3)]
    assert all(t is not None for t in tickets)
    with pytest.raises(RateLimited) as refused:
        limiter.admit(key, "chat", 1)
    assert refused.value.status == 429
    assert int(refused.value.headers["retry-after"]) >= 1
    assert dict(tickets[-1].headers)["x-ratelimit-remaining-requests"] == "0"  # type: ignore[union-attr]
    assert dict(tickets[0].headers)["x-ratelimit-limit-requests"] == "3"  # type: ignore[union-attr]


def test_each_answer_carries_the_headers_of_what_remains_then(limiter: Limiter) -> None:
    """The headers of a bucket are kept while what remains is the same, and made again when it changes."""
    key = key_with({"rpm": 3})
    remaining = []
    for _ in range(3):
        ticket = limiter.admit(key, "chat", 1)
        assert ticket is not None
        headers = dict(ticket.headers)
        remaining.append(headers["x-ratelimit-remaining-requests"])
        used = 3 - int(headers["x-ratelimit-remaining-requests"])
        assert headers["x-ratelimit-reset-requests"] == f"{used * 20:.3f}s"  # a request per 20 s comes back
    assert remaining == ["2", "1", "0"]


def test_headers_off_still_limits_and_says_when_to_retry(limiter: Limiter) -> None:
    quiet = Limiter(limiter.table, headers=False)
    key = key_with({"rpm": 2, "tpm": 1000})
    tickets = [quiet.admit(key, "chat", 10) for _ in range(2)]
    assert [t.headers for t in tickets if t is not None] == [[], []]
    with pytest.raises(RateLimited) as refused:
        quiet.admit(key, "chat", 10)
    assert int(refused.value.headers["retry-after"]) >= 1


def test_a_refused_request_takes_nothing_from_other_scopes(limiter: Limiter) -> None:
    key = key_with({"rpm": 10}, {"rpm": 1})
    limiter.admit(key, "chat", 1)
    for _ in range(5):
        with pytest.raises(RateLimited):
            limiter.admit(key, "chat", 1)
    other_key = key_with({"rpm": 10}, None, kid="k2")
    # The principal's bucket lost one request per admitted call only: 9 are left for its other keys.
    admitted = 0
    for _ in range(12):
        try:
            limiter.admit(other_key, "chat", 1)
            admitted += 1
        except RateLimited:
            break
    assert admitted == 9


def test_concurrency_is_held_until_finish(limiter: Limiter) -> None:
    key = key_with(None, {"concurrency": 2})
    a = limiter.admit(key, "chat", 1)
    b = limiter.admit(key, "chat", 1)
    with pytest.raises(RateLimited):
        limiter.admit(key, "chat", 1)
    assert a is not None and b is not None
    limiter.finish(a, None)
    c = limiter.admit(key, "chat", 1)
    assert c is not None


def test_model_limits_apply_only_to_that_model(limiter: Limiter) -> None:
    key = key_with(model_limits={"chat": {"rpm": 1}})
    limiter.admit(key, "chat", 1)
    with pytest.raises(RateLimited):
        limiter.admit(key, "chat", 1)
    assert limiter.admit(key, "other", 1) is None


def test_tokens_reserved_then_settled_to_real_usage(limiter: Limiter) -> None:
    key = key_with({"tpm": 1000})
    t = limiter.admit(key, "chat", 900)  # reserve 900 of 1000
    assert t is not None
    with pytest.raises(RateLimited):
        limiter.admit(key, "chat", 200)
    limiter.finish(t, 100)  # the request really used 100: 800 come back
    assert limiter.admit(key, "chat", 800) is not None


def test_debt_is_allowed_when_usage_exceeds_the_reservation(limiter: Limiter) -> None:
    key = key_with({"tpm": 1000})
    t = limiter.admit(key, "chat", 10)
    assert t is not None
    limiter.finish(t, 1500)  # more than the whole minute's budget
    with pytest.raises(RateLimited) as refused:
        limiter.admit(key, "chat", 1)
    assert int(refused.value.headers["retry-after"]) >= 30


def test_estimate_tokens() -> None:
    assert estimate_tokens(400, 50, 512) == (100, 150)
    assert estimate_tokens(400, None, 512) == (100, 612)
