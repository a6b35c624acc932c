"""``python -m perf.fleet_bench``: what one proxy host's health report costs the control plane's fleet
(``Fleet.record``, which answers with the host's rate-limit shares), with N proxy hosts reporting.

The hosts report one after another on a clock that runs ten seconds a round (the proxies' report
interval), each with its traffic of the last window and, as a real proxy host does, the grant it holds.
Two mixes of scopes:

- ``shared``: every host sees the same 5 scopes (a principal and its keys used through every host, as
  ``perf.control_sim`` reports);
- ``own``: 2 scopes every host sees and 3 of its own (keys pinned to hosts), so the fleet knows 3N + 2.

``--rounds`` rounds settle the fleet (every host holds a grant), then ``--timed`` reports are timed one by
one: CPU µs per report (``time.process_time`` over the batch, the figure to trust on a shared machine)
and the wall time's p50 and p99. With ``--leave``, one host then stops reporting and eight more rounds
run: the fleet forgets it after a TTL, and while its default lingers and the bound shrinks to that of one
host fewer, every scope held at the bound is squeezed and named in every answer for a few rounds; the
worst round's CPU µs per report and the scopes its answers named are printed. No I/O but stdout.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from gateway.controlplane.fleet.reports import Fleet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scopes_of(mix: str, index: int) -> list[str]:
    if mix == "shared":
        return ["p:all", "k:all-1", "k:all-2", "k:all-3", "t:all"]
    return ["p:all", "k:all", f"p:{index}", f"k:{index}-1", f"k:{index}-2"]


def report(host: int, mix: str, rng: random.Random, held: dict[str, Any]) -> dict[str, Any]:
    traffic = {scope: rng.randint(5, 100) for scope in scopes_of(mix, host)}
    return {"host": f"h{host}", "role": "proxy", "traffic": traffic, "held": held}


def run(hosts: int, mix: str, rounds: int, timed: int, seed: int, leave: bool = False) -> dict[str, float]:
    rng = random.Random(seed)
    clock = Clock()
    fleet = Fleet(clock)
    held: dict[int, dict[str, Any]] = {h: {} for h in range(hosts)}
    step = 10.0 / hosts

    def one(host: int) -> None:
        clock.now += step
        answer = fleet.record(report(host, mix, rng, held[host]))
        held[host] = {
            "shares": answer["shares"],
            "default_share": answer["default_share"],
            "hosts": answer["hosts"],
        }

    for _ in range(rounds):
        for host in range(hosts):
            one(host)
    walls: list[float] = []
    named = 0
    cpu_start = time.process_time()
    for i in range(timed):
        host = i % hosts
        started = time.perf_counter()
        one(host)
        walls.append(time.perf_counter() - started)
        named += len(held[host]["shares"])
    cpu = time.process_time() - cpu_start
    walls.sort()
    got = {
        "cpu_us": cpu / timed * 1e6,
        "p50_us": statistics.median(walls) * 1e6,
        "p99_us": walls[min(len(walls) - 1, int(0.99 * len(walls)))] * 1e6,
        "named": named / timed,
        "leave_cpu_us": 0.0,
        "leave_named": 0.0,
    }
    for _ in range(8 if leave else 0):  # host 0 is silent from now on
        cpu_start = time.process_time()
        named = 0
        for host in range(1, hosts):
            one(host)
            named += len(held[host]["shares"])
        per_report = (time.process_time() - cpu_start) / (hosts - 1) * 1e6
        if per_report > got["leave_cpu_us"]:
            got["leave_cpu_us"], got["leave_named"] = per_report, named / (hosts - 1)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--hosts", default="100,500,1000,2000", help="comma-separated host counts")
    parser.add_argument("--mix", default="shared,own", help="comma-separated: shared, own")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of reports before the timed ones")
    parser.add_argument("--timed", type=int, default=1000, help="reports timed (at most one round)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--leave", action="store_true", help="then one host stops reporting: 8 rounds more")
    args = parser.parse_args()
    more = " a host left: worst round, CPU µs / report | scopes named then |" if args.leave else ""
    print(f"| mix | hosts | CPU µs / report | wall p50 | wall p99 | scopes named in an answer |{more}")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.leave else ""))
    for mix in args.mix.split(","):
        for hosts in (int(h) for h in args.hosts.split(",")):
            got = run(hosts, mix, args.rounds, min(args.timed, hosts), args.seed, args.leave)
            after = f" {got['leave_cpu_us']:,.0f} | {got['leave_named']:.1f} |" if args.leave else ""
            print(
                f"| {mix} | {hosts} | {got['cpu_us']:,.0f} | {got['p50_us']:,.0f} µs | "
                f"{got['p99_us']:,.0f} µs | {got['named']:.1f} |{after}",
                flush=True,
            )


if __name__ == "__main__":
    main()
