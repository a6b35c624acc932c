"""``python -m perf.control_sim --hosts 500``: N simulated proxy hosts against one real control host.

Starts PostgreSQL from Debian's packages (as the tests do) and ``gateway serve --role control`` on it,
then N simulated proxy hosts in a process of their own (``perf.control_sim_hosts``: snapshot polls every
``--poll`` seconds, usage batches every ``--ship`` seconds, health reports every ``--report`` seconds, one
request at a time per host as a real control slot sends them, and a spool that keeps a refused batch and
sends it again after ``Retry-After``). Usage comes at ``--rate`` records a second per host (or
``--records`` a batch), all of one principal with a day and a month budget, so every batch also moves
the spend counters.

``--prefill-rows N`` first fills the usage table to N rows spread over ``--prefill-days`` day partitions
(``perf.control_fill``), as a fleet's table looks after that many days. ``--matrix`` runs the rows of the
fleet benchmark one after another against the same control host and table (prefilled once): 10 hosts x
1,000 records/s, 100 x 100, 100 x 500 (50,000/s), 100 x 1,000 (2x overload), 500 x 100; ``--rows``
names others (``HOSTSxRATE,...``).

``--warmup S`` runs the load S seconds before the ``--seconds`` measured (the store's pipeline fills
up first). For each run it prints the polls' latency (p50, p99, max) from request sent to answer read,
polls done against polls intended (a simulator that falls behind says so), the 304s, how late the
simulator's own timers fired (its event loop's delay, which every latency it measures includes), the
usage records made, accepted within the measured seconds (records/s) and in all (the hosts' spools
drained after the run), batches answered 503 ``ingest_busy``, the batches' latency from sent to answered
``200``, and the CPU seconds that the simulator (its own process tree), the control host, PostgreSQL and
the rest of the machine used over the measured seconds, with PostgreSQL's and the control host's per
accepted record (and the control host's CPU by thread). Then it checks the store: the run's records
stored (by their request ids' tag), distinct ids among them, and the difference from those accepted
(lost, if positive) and from the rows (stored twice). At the end: the table's rows against the prefill
and every record accepted, and the principal's spend counters against its records' sums; then it
removes PostgreSQL's and the control host's directories.
``--postgres-down S`` stops PostgreSQL for S seconds in the middle of a run and reports the polls sent
during the outage on their own line: they must be answered from memory. ``--pg-stat`` loads
``pg_stat_statements`` and prints where PostgreSQL's time went in each run.
I/O: subprocesses (PostgreSQL, the gateway, the simulator), loopback HTTP, temp directories, the
database, /proc (CPU accounting).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from perf import control_fill
from perf.control_sim_hosts import Params

if TYPE_CHECKING:
    from tests.fixtures.postgres import PostgresServer

MATRIX = "10x1000,100x100,100x500,100x1000,500x100"
# The principal the simulated records belong to: a day and a month budget that never run out, so that
# every batch moves its spend counters (``usage_spend``) as a budgeted fleet's does.
_PRINCIPAL = """
[[principals]]
name = "fleet"
roles = ["chatter"]
budgets = [{ period = "day", tokens = 1000000000000 }, { period = "month", tokens = 1000000000000 }]
"""


# -- CPU accounting ---------------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float]:
    """The parent pid and the CPU seconds (user and system) of process ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read()
    fields = text[text.rindex(b")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named root process and all its descendants alive now."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stats[int(name)] = _proc_stat(int(name))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[str, float] = {}
    for label, root in roots.items():
        todo, total = [root], 0.0
        while todo:
            pid = todo.pop()
            total += stats.get(pid, (0, 0.0))[1]
            todo += children.get(pid, [])
        totals[label] = total
    return totals


def thread_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``root`` and its descendants alive now, by its name and id (a
    process's main thread, where the control worker's event loop runs, by its pid; Python's threads, the
    store thread among them, are all named after the process, so told apart by their ids only)."""
    out: dict[str, float] = {}
    for pid in _tree(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    text = f.read()
            except OSError:
                continue
            name = text[text.index(b"(") + 1 : text.rindex(b")")].decode(errors="replace")
            fields = text[text.rindex(b")") + 2 :].split()
            label = f"{name} (main, pid {pid})" if tid == str(pid) else f"{name} #{tid}"
            out[label] = out.get(label, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                children.setdefault(_proc_stat(int(name))[0], []).append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    todo, out = [root], []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def machine_cpu() -> float:
    """CPU seconds all cores have spent busy since boot (not idle, not waiting on I/O)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _TICK


@dataclass
class CpuUse:
    seconds: float  # wall-clock seconds the accounting covers
    simulator: float
    control: float
    postgres: float
    machine: float
    threads: dict[str, float] = dataclasses.field(default_factory=dict)  # the control host's, by name

    @property
    def rest(self) -> float:
        # /proc/stat and the processes' own counters tick apart: a quiet machine's rest may come out a few
        # tenths of a second below zero.
        return max(0.0, self.machine - self.simulator - self.control - self.postgres)


@dataclass
class Outcome:
    hosts: int
    rate: float
    seconds: float
    fig: dict[str, Any]  # the simulator's Figures, as it sent them
    cpu: CpuUse
    load: tuple[float, float]
    down: tuple[float, float]  # when PostgreSQL was stopped and back (monotonic), or (inf, inf)
    rows: int = 0  # the run's records in the store
    distinct: int = 0

    def polls(self, during: bool) -> list[float]:
        low, high, measured = self.down[0], self.down[1], self.fig["measured"]
        return [
            lat for sent, lat, _ in self.fig["polls"] if sent >= measured and (low <= sent < high) == during
        ]

    def not_modified(self) -> float:
        """The share of the measured polls answered 304."""
        polls: list[int] = [hit for sent, _, hit in self.fig["polls"] if sent >= self.fig["measured"]]
        return sum(polls) / max(1, len(polls))


class Bench:
    """PostgreSQL and one control host, started once; runs of simulated hosts against them."""

    def __init__(self, args: argparse.Namespace) -> None:
        from tests.fixtures.postgres import PostgresServer, _bindir

        bindir = _bindir()
        if bindir is None:
            sys.exit("PostgreSQL is not installed (Debian's postgresql package)")
        self.args = args
        self.server: PostgresServer = PostgresServer(
            bindir, Path(tempfile.mkdtemp(prefix="gateway-control-sim-postgres-"))
        )
        if args.pg_stat:
            self.server.settings.append("shared_preload_libraries=pg_stat_statements")
        if args.synchronous_commit or args.postgres_down:
            # The tests' throwaway cluster acknowledges a commit before its WAL is written: a server killed
            # then (``--postgres-down`` stops it so: runuser kills it 2 s after SIGTERM) loses the last few
            # hundred milliseconds of commits, which a real one with synchronous_commit on keeps.
            self.server.settings.append("synchronous_commit=on")
        self.token = secrets.token_urlsafe(24)
        self.control: Any = None
        self.tmp: Path | None = None
        self.runs = 0

    def start(self) -> None:
        import httpx
        import psycopg

        from tests.fixtures.processes import Gateway, basic_config, free_port, wait_until

        self.server.start()
        self.url = self.server.url(self.server.create_database())
        if self.args.pg_stat:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
        env = {"GATEWAY_CLUSTER_TOKEN": self.token, "GATEWAY_HASH_KEY": secrets.token_hex(32)}
        self.port = free_port()
        extra = ["--role", "control", "--admin-port", str(self.port), "--database", self.url]
        if self.args.ingest_queue_max:
            extra += ["--ingest-queue-max", str(self.args.ingest_queue_max)]
        tmp = self.tmp = Path(tempfile.mkdtemp(prefix="gateway-control-sim-"))
        config = basic_config({"a": "http://127.0.0.1:9"}, extra=_PRINCIPAL)
        self.control = Gateway(tmp, config, workers=1, extra=tuple(extra), env=env, wait=False)
        base = f"http://127.0.0.1:{self.port}"
        auth = {"authorization": f"Bearer {self.token}"}
        wait_until(
            lambda: httpx.get(f"{base}/cluster/healthz", headers=auth).status_code == 200,
            timeout=30,
            what="control plane",
        )
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT id FROM principals WHERE name = 'fleet'").fetchone()
        assert row is not None
        self.principal = str(row[0])
        self.prefilled = 0
        if self.args.prefill_rows:
            took = control_fill.prefill(
                self.url, self.args.prefill_rows, self.args.prefill_days, self.principal
            )
            self.prefilled = self.args.prefill_rows
            print(f"prefilled {self.prefilled:,} rows over {self.args.prefill_days} days in {took:.0f} s")
        # One record first, which opens the principal's budget windows (one indexed sum of what the
        # prefill gave it, then never again): a live fleet's windows are open long before.
        began = time.monotonic()
        one = Params(
            self.port, self.token, 1, 0.0, 0.0, 1.0, 1.0, 0.0, 10.0, 30.0, 0.0, "warm", self.principal
        )
        from perf.control_sim_hosts import Simulation

        body = Simulation(one).usage_body(0, 0, 1)
        answer = httpx.post(f"{base}/cluster/usage", content=body, headers=auth, timeout=120)
        answer.raise_for_status()
        print(f"first batch (opens the budget windows) answered in {time.monotonic() - began:.2f} s")
        self.warm = 1

    def roots(self, simulator: int) -> dict[str, int]:  # PostgreSQL's pid changes when an outage restarts it
        assert self.server.proc is not None
        return {"control": self.control.proc.pid, "postgres": self.server.proc.pid, "simulator": simulator}

    def run(self, hosts: int, rate: float) -> Outcome:
        args = self.args
        self.runs += 1
        tag = f"r{self.runs:02d}-"
        if args.pg_stat:
            control_fill.reset_statements(self.url)
        params = Params(
            self.port, self.token, hosts, args.seconds, args.warmup, args.poll, args.ship, rate, args.report,
            args.timeout, args.drain, tag, self.principal,
        )  # fmt: skip
        since, load = time.time() - 5.0, os.getloadavg()[0]
        figures = Path(tempfile.mkstemp(prefix="gateway-control-sim-figures-")[1])
        env = {
            **os.environ,
            "CONTROL_SIM_HOSTS": orjson.dumps(dataclasses.asdict(params)).decode(),
            "CONTROL_SIM_FIGURES": str(figures),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "perf.control_sim_hosts"], stdout=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None
        down = [float("inf"), float("inf")]
        before: dict[str, float] = {}
        busy = started = 0.0
        threads: dict[str, float] = {}
        outage: threading.Thread | None = None
        cpu: CpuUse | None = None
        for line in proc.stdout:
            if line == b"start\n":
                before, busy, started = process_cpu(self.roots(proc.pid)), machine_cpu(), time.monotonic()
                threads = thread_cpu(self.control.proc.pid)
                if args.postgres_down:
                    outage = threading.Thread(target=self._outage, args=(down,))
                    outage.start()
            elif line == b"end\n":
                after, busy_after = process_cpu(self.roots(proc.pid)), machine_cpu()
                cpu = CpuUse(
                    time.monotonic() - started,
                    after["simulator"] - before["simulator"],
                    after["control"] - before["control"],
                    after["postgres"] - before["postgres"],
                    busy_after - busy,
                )
                threads_after = thread_cpu(self.control.proc.pid)
                cpu.threads = {k: v - threads.get(k, 0.0) for k, v in threads_after.items()}
        try:
            if proc.wait() != 0 or cpu is None:
                raise RuntimeError(f"the simulator failed (exit status {proc.returncode})")
            fig = orjson.loads(figures.read_bytes())
        finally:
            figures.unlink()
        if outage is not None:
            outage.join()
        out = Outcome(hosts, rate, args.seconds, fig, cpu, (load, os.getloadavg()[0]), (down[0], down[1]))
        out.rows, out.distinct = control_fill.stored(self.url, tag, since)
        report(out, args)
        if args.pg_stat:
            for total, calls, rows, query in control_fill.top_statements(self.url):
                print(f"  pg: {total:9.0f} ms {calls:7d} calls {rows:10.0f} rows  {query}")
        return out

    def _outage(self, down: list[float]) -> None:
        # From the start of the measured seconds: the outage falls in their middle.
        args = self.args
        time.sleep((args.seconds - args.postgres_down) / 2)
        down[0] = time.monotonic()  # polls sent while it stops count as sent during the outage
        self.server.stop()
        time.sleep(args.postgres_down)
        down[1] = time.monotonic()
        self.server.start()

    def check(self, outcomes: list[Outcome]) -> None:
        """The whole table against the prefill and every record accepted; the spend counters."""
        accepted = sum(int(o.fig["accepted"]) for o in outcomes)
        total = control_fill.count_all(self.url)
        print(
            f"usage table: {total:,} rows = prefill {self.prefilled:,} + first batch {self.warm} + "
            f"{total - self.prefilled - self.warm:,} stored by the runs, against {accepted:,} accepted: "
            f"{'equal' if total - self.prefilled - self.warm == accepted else 'DIFFERENT'}"
        )
        for period, kept, summed in control_fill.spend_check(self.url, self.principal):
            state = "equal" if kept == summed else "DIFFERENT"
            print(
                f"spend counter, {period}: {kept:,} tokens kept, {summed:,} summed from the records ({state})"
            )

    def stop(self) -> None:
        """Stop both and remove their directories (a 10M-row table takes gigabytes)."""
        try:
            if self.control is not None:
                self.control.stop()
            self.server.stop()
        finally:
            for path in (self.tmp, self.server.base):
                if path is not None:
                    shutil.rmtree(path, ignore_errors=True)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: list[float]) -> str:
    p50, p99, top = _pct(values, 0.5), _pct(values, 0.99), max(values, default=0.0)
    return f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {top * 1000:.1f} ms"


def report(o: Outcome, args: argparse.Namespace) -> None:
    fig, cpu = o.fig, o.cpu
    polls, during = o.polls(False), o.polls(True)
    done = len(fig["polls"])
    accepted, in_run = int(fig["accepted"]), int(fig["accepted_in_run"])
    print(
        f"\n{o.hosts} hosts x {o.rate:g} records/s ({o.hosts * o.rate:,.0f}/s offered), {args.warmup:.0f} s "
        f"of warm-up then {o.seconds:.0f} s measured, poll every {args.poll} s, a batch every {args.ship} s; "
        f"load average {o.load[0]:.2f} at start, {o.load[1]:.2f} at end"
    )
    print(
        f"polls done {done} of {fig['intended']} intended ({done / max(1, fig['intended']):.0%}), "
        f"{fig['sent']} sent, {fig['skipped']} skipped (due while the host waited for an earlier answer), "
        f"{fig['not_modified']} were 304; errors {fig['errors']}, timeouts {fig['timeouts']}; measured: "
        f"{len(polls) + len(during)} polls, {o.not_modified():.0%} were 304, "
        f"{'with PostgreSQL up ' if args.postgres_down else ''}{_ms(polls)}"
    )
    if args.postgres_down:
        print(
            f"polls sent while PostgreSQL was down ({args.postgres_down:.0f} s): {len(during)}, {_ms(during)}"
        )
    print(f"simulator's timers fired late by {_ms(fig['lag'])} (its own event loop's delay)")
    print(
        f"usage records made {fig['made']:,}, accepted in the measured seconds {in_run:,} "
        f"({in_run / o.seconds:,.0f}/s), in all {accepted:,}, still held {fig['left']:,}; "
        f"{fig['busy']} batches ({fig['busy_records']:,} records) answered 503 ingest_busy; "
        f"batches answered 200, measured: "
        f"{len(fig['batches'])}, {_ms(fig['batches'])}; reports answered {fig['reports']}"
    )
    print(
        f"store: {o.rows:,} rows of this run, {o.distinct:,} distinct request ids; accepted and not stored "
        f"{accepted - o.distinct:,}, stored twice {o.rows - o.distinct:,}"
    )
    per = 1e6 / max(1, in_run)
    print(
        f"CPU seconds over {cpu.seconds:.1f} s on {os.cpu_count()} cores: simulator {cpu.simulator:.1f} "
        f"({cpu.simulator / cpu.seconds:.0%} of a core), control host {cpu.control:.1f} "
        f"({cpu.control / cpu.seconds:.0%}, {cpu.control * per:.1f} µs per accepted record), PostgreSQL "
        f"{cpu.postgres:.1f} ({cpu.postgres / cpu.seconds:.0%}, {cpu.postgres * per:.1f} µs per record), "
        f"the rest of the machine {cpu.rest:.1f}"
        + (" (PostgreSQL's omits the processes the outage stopped)" if args.postgres_down else "")
    )
    top = sorted(cpu.threads.items(), key=lambda kv: -kv[1])[:6]
    print("control host's threads: " + ", ".join(f"{name} {sec:.1f} s" for name, sec in top))


def table(outcomes: list[Outcome]) -> None:
    """The runs as the Markdown table of perf/README.md."""
    print(
        "\n| hosts x rec/s | offered rec/s | accepted rec/s | batch p50 | batch p99 | 503 busy | poll p99 "
        "| 304 share | PostgreSQL µs/rec | control µs/rec | simulator CPU | load at start | rest | "
        "lost, twice |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for o in outcomes:
        fig, cpu = o.fig, o.cpu
        in_run = max(1, int(fig["accepted_in_run"]))
        polls = o.polls(False)
        print(
            f"| {o.hosts} x {o.rate:,.0f} | {o.hosts * o.rate:,.0f} | {in_run / o.seconds:,.0f} | "
            f"{_pct(fig['batches'], 0.5) * 1000:,.0f} ms | {_pct(fig['batches'], 0.99) * 1000:,.0f} ms | "
            f"{fig['busy']} | {_pct(polls, 0.99) * 1000:.0f} ms | {o.not_modified():.0%} | "
            f"{cpu.postgres * 1e6 / in_run:.1f} | {cpu.control * 1e6 / in_run:.1f} | "
            f"{cpu.simulator / cpu.seconds:.0%} | {o.load[0]:.2f} | {cpu.rest:.1f} | "
            f"{int(fig['accepted']) - o.distinct}, {o.rows - o.distinct} |"
        )


def _rows(text: str) -> list[tuple[int, float]]:
    out = []
    for item in text.split(","):
        hosts, rate = item.lower().split("x")
        out.append((int(hosts), float(rate)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.control_sim", description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds measured, after --warmup")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds of load before those measured")
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between snapshot polls per host")
    parser.add_argument("--ship", type=float, default=1.0, help="seconds between usage batches per host")
    parser.add_argument("--records", type=int, default=10, help="usage records per batch (0: none)")
    parser.add_argument("--rate", type=float, default=None, help="records a second per host (for --records)")
    parser.add_argument("--report", type=float, default=10.0, help="seconds between health reports per host")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a host waits for an answer")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds the hosts have after a run to "
                        "send what they still hold")  # fmt: skip
    parser.add_argument("--postgres-down", type=float, default=0.0, help="seconds of PostgreSQL outage")
    parser.add_argument("--prefill-rows", type=int, default=0, help="fill the usage table to N rows first")
    parser.add_argument("--prefill-days", type=int, default=7, help="days the prefilled rows spread over")
    parser.add_argument("--matrix", action="store_true", help=f"run the fleet rows ({MATRIX})")
    parser.add_argument("--rows", default=None, help="rows to run, HOSTSxRATE,... (implies --matrix)")
    parser.add_argument("--ingest-queue-max", type=int, default=0, help="the control host's (0: its default)")
    parser.add_argument(
        "--synchronous-commit",
        action="store_true",
        help="PostgreSQL's commits wait for their WAL (the tests' do not; --postgres-down implies it)",
    )
    parser.add_argument("--pg-stat", action="store_true", help="report pg_stat_statements for each run")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between the runs of a matrix")
    args = parser.parse_args()
    if args.rows or args.matrix:
        runs = _rows(args.rows or MATRIX)
    else:
        runs = [(args.hosts, args.rate if args.rate is not None else args.records / args.ship)]

    bench = Bench(args)
    outcomes: list[Outcome] = []
    try:
        bench.start()
        for i, (hosts, rate) in enumerate(runs):
            if i:
                time.sleep(args.pause)
            outcomes.append(bench.run(hosts, rate))
        bench.check(outcomes)
    finally:
        bench.stop()
    table(outcomes)


if __name__ == "__main__":
    main()
