"""Shares of a rate limit across the proxy hosts of a cluster. Pure; no I/O.

Every host enforces each limit exactly, locally, on its share of it: limit * share. Once per report
window the control plane sets each host's share of a scope to that host's fraction of the scope's traffic
in the last window, but never below 1/hosts, so that a host that was idle still admits its floor rather
than refusing everything while the scope is far under its limit.

The bound: with fractions f_h summing to 1 and a floor of 1/H, the shares sum to
1 + Σ_{f_h < 1/H} (1/H - f_h) ≤ 1 + (H - 1)/H, reached with all traffic on one host and the others idle.
So a scope is admitted at most limit * (2H - 1)/H per window across the cluster — under twice its limit,
and exactly its limit when traffic is spread evenly (every f_h ≥ 1/H). A scope with no traffic anywhere
gets 1/H on every host.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["compute_shares", "overshoot_bound"]


def compute_shares(
    traffic: Mapping[str, Mapping[str, float]], hosts: list[str]
) -> dict[str, dict[str, float]]:
    """``traffic[host][scope]`` = the scope's traffic on that host in the last window; returns
    ``shares[host][scope]`` for every scope any host saw. Scopes a host has no entry for get 1/H there."""
    if not hosts:
        return {}
    floor = 1.0 / len(hosts)
    scopes = {scope for host in hosts for scope in traffic.get(host, {})}
    shares: dict[str, dict[str, float]] = {host: {} for host in hosts}
    for scope in scopes:
        total = sum(traffic.get(host, {}).get(scope, 0.0) for host in hosts)
        for host in hosts:
            fraction = traffic.get(host, {}).get(scope, 0.0) / total if total > 0 else floor
            shares[host][scope] = max(floor, fraction)
    return shares


def overshoot_bound(hosts: int) -> float:
    """The most a scope's shares can sum to across ``hosts`` hosts: (2H - 1)/H."""
    return (2 * hosts - 1) / hosts if hosts > 0 else 1.0
