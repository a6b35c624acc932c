"""The flow-control queueing discipline on its own (gateway.dataplane.flow): strict priority between
classes, weighted fair shares between tenants inside a class, no banked credit for an idle tenant,
sheddable requests shed first, and the bound."""

from __future__ import annotations

from collections import Counter

from gateway.dataplane.flow import CRITICAL, SHEDDABLE, STANDARD, FlowQueue, Waiter, priority_rank


def waiter(tenant: str, priority: int = STANDARD, weight: int = 1, item: str = "") -> Waiter[str]:
    return Waiter(priority, tenant, weight, item or tenant)


def drain(q: FlowQueue[str], n: int | None = None) -> list[str]:
    out = []
    while len(q) and (n is None or len(out) < n):
        head = q.head()
        assert head is not None
        q.dispatch(head)
        out.append(head.item)
    return out


def test_priority_names() -> None:
    assert [priority_rank(n) for n in ("critical", "standard", "sheddable")] == [
        CRITICAL,
        STANDARD,
        SHEDDABLE,
    ]
    assert priority_rank("urgent") is None and priority_rank(None) is None


def test_strict_priority_between_classes() -> None:
    q: FlowQueue[str] = FlowQueue()
    for i in range(3):
        q.push(waiter("a", SHEDDABLE, item=f"shed{i}"))
    for i in range(3):
        q.push(waiter("b", STANDARD, item=f"std{i}"))
    q.push(waiter("c", CRITICAL, item="crit"))
    assert q.depth == [1, 3, 3]
    order = drain(q)
    assert order == ["crit", "std0", "std1", "std2", "shed0", "shed1", "shed2"]
    assert q.depth == [0, 0, 0]


def test_weighted_share_two_to_one_over_many_dispatches() -> None:
    q: FlowQueue[str] = FlowQueue()
    # Both tenants keep the queue full: each dispatch is replaced by another of the same tenant.
    for _ in range(10):
        q.push(waiter("heavy", weight=2))
        q.push(waiter("light", weight=1))
    served: Counter[str] = Counter()
    for _ in range(3000):
        head = q.head()
        assert head is not None
        q.dispatch(head)
        served[head.tenant] += 1
        q.push(waiter(head.tenant, weight=head.weight))
    assert served["heavy"] == 2000 and served["light"] == 1000
    # And over any short window too: never more than a couple in a row of the heavier tenant.
    window = drain(q, 30)
    assert all(window[i : i + 4] != ["heavy"] * 4 for i in range(len(window) - 3))


def test_flooding_tenant_does_not_delay_the_other_past_its_share() -> None:
    q: FlowQueue[str] = FlowQueue()
    for i in range(50):
        q.push(waiter("flood", item=f"f{i}"))
    drain(q, 5)
    q.push(waiter("calm", item="c0"))
    # Equal weights: the newcomer goes within one dispatch, not after the 45 still waiting.
    assert drain(q, 2) == ["f5", "c0"]


def test_an_idle_tenant_banks_no_credit() -> None:
    q: FlowQueue[str] = FlowQueue()
    for i in range(20):
        q.push(waiter("busy", item=f"b{i}"))
    assert drain(q, 10) == [f"b{i}" for i in range(10)]
    # "idle" waited nothing while busy was served ten times: it does not get ten in a row now.
    for i in range(10):
        q.push(waiter("idle", item=f"i{i}"))
    first = drain(q, 6)
    assert Counter(x[0] for x in first) == {"b": 3, "i": 3}, first


def test_sheddable_is_shed_first_newest_first_and_only_for_a_higher_class() -> None:
    q: FlowQueue[str] = FlowQueue()
    capacity = 3

    def arrive(w: Waiter[str]) -> tuple[bool, str | None]:
        queued, shed = q.admit(w, room=len(q) < capacity)
        return queued, None if shed is None else shed.item

    assert arrive(waiter("a", SHEDDABLE, item="s1")) == (True, None)
    assert arrive(waiter("a", SHEDDABLE, item="s2")) == (True, None)
    assert arrive(waiter("b", STANDARD, item="n1")) == (True, None)
    # Full. A sheddable newcomer is refused, nothing shed.
    assert arrive(waiter("a", SHEDDABLE, item="s3")) == (False, None)
    # A standard newcomer sheds the newest sheddable waiter, then the next.
    assert arrive(waiter("b", STANDARD, item="n2")) == (True, "s2")
    assert arrive(waiter("c", CRITICAL, item="k1")) == (True, "s1")
    # No sheddable left: a standard or critical newcomer is refused, the bound holds.
    assert arrive(waiter("c", CRITICAL, item="k2")) == (False, None)
    assert len(q) == capacity and q.depth == [1, 2, 0]
    assert drain(q) == ["k1", "n1", "n2"]


def test_removed_waiters_are_gone() -> None:
    q: FlowQueue[str] = FlowQueue()
    a, b = waiter("a", item="a"), waiter("b", item="b")
    q.push(a)
    q.push(b)
    assert q.remove(a) and not q.remove(a)
    assert not a.queued and q.depth[STANDARD] == 1
    assert drain(q) == ["b"]
    assert q.head() is None
