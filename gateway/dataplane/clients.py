"""The per-client-address abuse limiter: concurrent requests and request rate per address, exact across
the workers of a host, and which address a request comes from.

The address is the socket's peer (RSGI ``scope.client``) unless that peer is in ``--trusted-proxies``:
then it is the right-most address of ``X-Forwarded-For`` that is not itself a trusted proxy, which is the
one hop the trusted chain vouches for (addresses further left are whatever the client wrote). Every line of
the header counts, joined in order into one list as RFC 9110 (5.3) combines a repeated field: a client's
own line ahead of its balancer's must not hide the balancer's. A hop there that is no address ends the
walk: it is the client's "address", which no ``allow_ips`` holds, and nothing further left is believed.
``Forwarded`` (RFC 7239) is not read: a balancer that sets only ``X-Forwarded-For`` passes a client's
``Forwarded`` on untouched, so believing it would let clients pick their address. IPv6
addresses are grouped by /64, since one host usually holds a whole /64. granian offers no PROXY-protocol
listener and no accept hook, so nothing here sees a connection before its first request head: idle
connections are bounded by the head timeout and the per-worker connection cap (see worker.py), not by
this module.

Each address maps to one of ``slots`` bucket pairs in the shared token-bucket table (a gauge for requests
in flight, a GCRA bucket for the rate), chosen by a CRC of the address. Slots in that table are claimed for
good, so hashing into a fixed number of them keeps a flood of distinct (IPv6) addresses from filling the
table that every key's limits live in; the price is that two addresses may share a slot (with the default
8,192 slots, an abuser lands on a given client's slot with probability 1/8,192). Admission is one C call
(``BucketTable.admit``) and the end another, with the gauge noted in the worker's ``Holdings`` so that a
worker killed with ``kill -9`` does not keep its places. I/O: none (shared memory only).
"""

from __future__ import annotations

import ipaddress
import math
import zlib

from gateway.dataplane.rsgi import Scope
from gateway.errors import RateLimited
from gateway.native import (
    ADMITTED,
    LIMIT_CONCURRENCY,
    LIMIT_REQUESTS,
    AdmissionPlan,
    AtomicWords,
    BucketTable,
)
from gateway.shm.bucket_keys import bucket_key
from gateway.shm.holdings import Holdings

__all__ = ["ClientLimiter", "ClientTicket", "TrustedProxies", "peer_address"]

# Addresses remembered per worker (address -> slot, peer -> trusted?) before the caches start over.
_CACHE = 65536
# Characters of a garbled X-Forwarded-For element kept as the client's "address" (in 403s and 429s).
_GARBLED = 64
# The key space of the per-address buckets in the shared table: "c:<slot>".
_SCOPE = "c:"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def peer_address(client: str) -> str:
    """The address part of RSGI's ``scope.client``: ``"1.2.3.4:5678"`` or, for IPv6, ``"[::1]:5678"``."""
    if client.startswith("["):
        return client[1 : client.find("]")]
    host, sep, port = client.rpartition(":")
    return host if sep and port.isdigit() else client


class TrustedProxies:
    """The networks whose ``X-Forwarded-For`` is believed. Empty: never (the peer is the client)."""

    __slots__ = ("_addresses", "_known", "networks")

    def __init__(self, cidrs: tuple[str, ...] | list[str]) -> None:
        self.networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(c.strip(), strict=False) for c in cidrs
        )
        self._known: dict[str, bool] = {}
        self._addresses: dict[str, str] = {}  # X-Forwarded-For element -> its address, "" for none

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: str) -> bool:
        known = self._known.get(address)
        if known is None:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                known = False
            else:
                known = any(ip in net for net in self.networks)
            if len(self._known) >= _CACHE:
                self._known.clear()
            self._known[address] = known
        return known

    def client_of(self, peer: str, forwarded_for: list[str]) -> str:
        """The client's address: the peer's, or, from a trusted peer, the right-most untrusted hop of the
        ``X-Forwarded-For`` lines (``Headers.get_all``), all of them, in order."""
        if not forwarded_for or not self.networks or not self.trusts(peer):
            return peer
        nearest = peer
        hops = forwarded_for[0] if len(forwarded_for) == 1 else ",".join(forwarded_for)
        for hop in reversed(hops.split(",")):
            hop = hop.strip(" \t")
            if not hop:
                continue  # an empty list element is no hop (RFC 9110 5.6.1)
            address = self.address_of(hop)
            if not address:
                # Written by the nearest proxy we trust, or by one it trusts: it names no address, so the
                # client has none that an allow_ips could hold, and what lies further left is the client's.
                return hop[:_GARBLED]
            if not self.trusts(address):
                return address
            nearest = address
        return nearest  # every hop a trusted proxy: the farthest one is the nearest we know of the client

    def address_of(self, hop: str) -> str:
        """The address one ``X-Forwarded-For`` element names, as ``ipaddress`` writes it: ``1.2.3.4``,
        ``2001:db8::1`` or ``[2001:db8::1]``, with a port or without (``1.2.3.4:443``, ``[::1]:443``, as
        some balancers write them); "" for anything else."""
        address = self._addresses.get(hop)
        if address is None:
            address = _parse_hop(hop)
            if len(self._addresses) >= _CACHE:
                self._addresses.clear()
            self._addresses[hop] = address
        return address


def _parse_hop(hop: str) -> str:
    if hop.startswith("["):
        end = hop.find("]")
        port = hop[end + 1 :] if end > 0 else ":"
        host = hop[1:end]
    elif hop.count(":") == 1:  # IPv4 with a port (a bare IPv6 address has two colons or more)
        host, port = hop.split(":")
        port = ":" + port
    else:
        host, port = hop, ""
    if port and not (port[0] == ":" and port[1:].isascii() and port[1:].isdigit()):
        return ""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return ""


class ClientTicket:
    """What an admitted request holds of its address's limits."""

    __slots__ = ("note", "plan")

    def __init__(self, plan: AdmissionPlan, note: int) -> None:
        self.plan = plan
        self.note = note


class ClientLimiter:
    """``max_requests`` concurrent requests and ``rate`` requests per second (bursts of ``burst``) per
    client address; 0 turns either off."""

    def __init__(
        self,
        table: BucketTable,
        holdings: Holdings | None,
        *,
        max_requests: int,
        rate: float,
        burst: int,
        slots: int,
        trusted: TrustedProxies,
    ) -> None:
        self.table = table
        self.holdings = holdings
        self.notes: AtomicWords | None = holdings.words if holdings is not None else None
        self.max_requests = max_requests
        self.rate = rate
        self.burst = burst if burst > 0 else max(1, math.ceil(2 * rate))
        self.slots = max(1, slots)
        self.trusted = trusted
        self._by_address: dict[str, AdmissionPlan] = {}  # the plan of each address seen (bounded)
        self._plans: dict[int, AdmissionPlan] = {}

    @property
    def active(self) -> bool:
        return self.max_requests > 0 or self.rate > 0

    def address(self, scope: Scope) -> str:
        """The request's client address, as the limits count it."""
        peer = peer_address(scope.client)
        if self.trusted:
            return self.trusted.client_of(peer, scope.headers.get_all("x-forwarded-for"))
        return peer

    def slot(self, address: str) -> int:
        grouped = address
        if ":" in address:  # IPv6: one /64 is one client
            try:
                grouped = str(ipaddress.IPv6Network(f"{address}/64", strict=False).network_address)
            except ValueError:
                pass
        return zlib.crc32(grouped.encode()) % self.slots

    def plan(self, slot: int) -> AdmissionPlan:
        plan = self._plans.get(slot)
        if plan is None:
            rows: list[tuple[int, int, int, float]] = []
            scope = f"{_SCOPE}{slot}"
            if self.rate > 0:
                rows.append((LIMIT_REQUESTS, bucket_key(scope, "rate"), self.burst, self.rate))
            if self.max_requests > 0:
                rows.append((LIMIT_CONCURRENCY, bucket_key(scope, "inflight"), self.max_requests, 0.0))
            plan = self._plans[slot] = AdmissionPlan(rows)
        return plan

    def admit(self, scope: Scope) -> ClientTicket:
        """Take a place and a request from the caller's address, or raise RateLimited (429, Retry-After)."""
        if self.trusted:
            address = self.address(scope)
        else:
            # The peer's "host:port" up to its last colon ("[::1]" for IPv6) names its plan: one slice and
            # one dict lookup per request; the address is worked out only when it is new.
            client = scope.client
            address = client[: client.rfind(":")]
        plan = self._by_address.get(address)
        if plan is None:
            plan = self._plan_of(address)
        holdings = self.holdings
        note = (holdings.free.pop() if holdings.free else holdings.take()) if holdings is not None else -1
        rc, out = self.table.admit(plan, 0, self.notes, note)
        if rc != ADMITTED:
            if holdings is not None:
                holdings.give(note)
            raise self._refused(plan, out[0], out[1], address)
        return ClientTicket(plan, note)

    def _plan_of(self, address: str) -> AdmissionPlan:
        plan = self.plan(self.slot(peer_address(address + ":0")))
        if len(self._by_address) >= _CACHE:
            self._by_address.clear()
        self._by_address[address] = plan
        return plan

    def _refused(self, plan: AdmissionPlan, index: int, wait: int, address: str) -> RateLimited:
        gauge = plan.limits[index].kind == LIMIT_CONCURRENCY
        seconds = 1 if gauge or wait < 0 else max(1, math.ceil(wait / 1e9))
        what = (
            f"{self.max_requests} concurrent requests"
            if gauge
            else f"{self.rate:g} requests per second (bursts of {self.burst})"
        )
        return RateLimited(
            f"Too many requests from your address {address.strip('[]')}: at most {what}. "
            f"Retry after {seconds}s.",
            headers={"retry-after": str(seconds)},
        )

    def finish(self, ticket: ClientTicket) -> None:
        """Give the request's place back (its rate stays taken)."""
        note = ticket.note
        self.table.finish(ticket.plan, 0, -1, self.notes, note)
        if note >= 0 and self.holdings is not None:
            self.holdings.free.append(note)
        ticket.note = -1
