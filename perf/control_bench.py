"""``python -m perf.control_bench``: the control plane's own figures.

- snapshot build time, document size and a proxy worker's decode time for 1k, 10k and 100k keys;
- usage ingestion into the store, records per second and CPU µs per record, for SQLite and PostgreSQL (a
  throwaway cluster from Debian's packages, as the tests start it; skipped when PostgreSQL is not
  installed), and the control worker's whole drain (ring, decode, store, metrics) in CPU µs per record on
  each;
- time from a config write (``gateway keys create``) to every proxy worker of a running gateway
  accepting the new key.

I/O: temp directories, subprocesses (PostgreSQL, the gateway, the mock engine), loopback HTTP.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from gateway.config import Settings
from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.snapshot_build import build_snapshot_doc
from gateway.controlplane.store import Store, open_store
from gateway.controlplane.usage.sink import UsageSink
from gateway.native import BucketTable, UsageRing, region_size, ring_region_size
from gateway.shm.regions import RING_SLOT_BYTES
from gateway.snapshot import Snapshot
from gateway.usage_record import RouteStep, UsageRecord, encode_record

CONFIG = {
    "backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
    "provider_models": [{"name": "m", "backends": ["a"]}],
    "models": [{"name": "chat", "chain": ["m"]}],
    "roles": [{"name": "user", "permissions": ["model/chat"]}],
    "principals": [{"name": f"p{i}", "roles": ["user"]} for i in range(100)],
}


def fill_keys(store: Store, n: int) -> None:
    """n keys spread over the principals, inserted in one transaction (the CLI would take minutes)."""
    principals = [p.id for p in store.principals()]
    now = time.time()
    with store._driver.transaction(write=True) as tx:  # a benchmark's shortcut around the CLI
        tx.executemany(
            "INSERT INTO api_keys (id, name, principal_id, key_hash, created_at, expires_at, revoked_at, "
            "managed_by) VALUES (?, NULL, ?, ?, ?, NULL, NULL, 'cli')",
            [(f"k{i:08d}", principals[i % len(principals)], f"{i:064x}", now) for i in range(n)],
        )
        tx.execute("UPDATE config_revision SET revision = revision + 1 WHERE id = 1")


def snapshot_figures(sizes: list[int]) -> list[str]:
    rows = ["| keys | build ms | document KiB | decode ms (per proxy worker) |", "|---:|---:|---:|---:|"]
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp, open_store(Settings(data_dir=Path(tmp))) as store:
            store.apply_config(parse_config(CONFIG, "bench"), actor="test")
            fill_keys(store, n)
            started = time.perf_counter()
            blob = orjson.dumps(build_snapshot_doc(store))
            built = time.perf_counter() - started
            started = time.perf_counter()
            snap = Snapshot.decode(blob, 1)
            decoded = time.perf_counter() - started
            assert len(snap.keys) == n
            rows.append(f"| {n:,} | {built * 1000:.0f} | {len(blob) / 1024:,.0f} | {decoded * 1000:.0f} |")
    return rows


def records(n: int, offset: int) -> list[UsageRecord]:
    return [
        UsageRecord(
            f"bench{offset + i:016x}",
            time.time(),
            "p1",
            "k1",
            "chat",
            "a",
            200,
            12,
            16,
            0,
            28,
            "reported",
            1234,
            0.8,
            0.7,
            None,
        )
        for i in range(n)
    ]


# The principal of the running bench's gateway (perf.targets' ``ACCOUNTED``): a day's budget, so that each
# record it spends is added to its spend counters and checked against the budget's base.
BUDGETED = {
    **CONFIG,
    "principals": [
        {"name": "bench", "roles": ["user"], "budget": {"period": "day", "tokens": 10**12, "cost": 1e9}}
    ],
}


def bench_records(n: int, offset: int, principal: str, key: str, counter: int) -> list[UsageRecord]:
    """Records as the running bench's gateway writes them: the principal's budget counter named, and a
    route trace of the one attempt (``--route-trace`` is on by default)."""
    shape = (
        time.time(), principal, key, "chat", "a", 200, 22, 16, 0, 38, "reported", 12900, 0.81, 0.62,
        [counter], None, 1, None, None, None, [RouteStep.start("a", "m", 200)], None, None,
    )  # fmt: skip
    return [UsageRecord(f"a1b2c3d4e5f60718{offset + i:08x}", *shape) for i in range(n)]


def ingestion(store: Store, total: int = 40_960, batch: int = 2048) -> tuple[float, float]:
    """Records per second through ``UsageStore.insert``, and this process's CPU µs per record (on
    PostgreSQL the server's own work is not in it: that is the control worker's share)."""
    made = [records(batch, offset) for offset in range(0, total, batch)]
    started, cpu = time.perf_counter(), time.process_time()
    for chunk in made:
        store.usage.insert(chunk)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - started
    assert store.usage.count() == total
    return total / wall, cpu / total * 1e6


def drain_us(settings: Settings, total: int = 40_960, batch: int = 2048, *, budgeted: bool = False) -> float:
    """CPU µs per record of ``UsageSink.drain``: records pushed into a ring as proxy workers push them,
    then read, decoded, written to the store and counted in the metrics, in batches of ``batch``.
    ``budgeted``: the running bench's records (``bench_records``), whose principal has a budget, in
    batches as two workers fill their rings between drains at about 17,000 requests a second."""
    rings, slots = (2 if budgeted else 1), 1 << (2 * batch - 1).bit_length()
    ring = UsageRing.create_layout(
        bytearray(ring_region_size(rings, slots, RING_SLOT_BYTES)), rings, slots, RING_SLOT_BYTES
    )
    table = BucketTable.create_layout(bytearray(region_size(1024)), 1024)
    spent = 0.0
    with open_store(settings) as store:
        sink = UsageSink(store, ring, table, "bench", recent=1000)
        if budgeted:
            store.apply_config(parse_config(BUDGETED, "bench"), actor="test")
            doc = build_snapshot_doc(store)
            sink.set_budgets(doc["principals"], doc.get("keys"))
            made = bench_records(total, 0, next(iter(doc["principals"])), "k1", sink.bases[0].key)
        else:
            made = records(total, 0)
        encoded = [encode_record(r) for r in made]
        for start in range(0, total, batch):
            for i, data in enumerate(encoded[start : start + batch]):
                ring.push(i % rings, data)
            began = time.process_time()
            while sink.drain():
                pass
            spent += time.process_time() - began
        assert store.usage.count() == total
    return spent / total * 1e6


def ingestion_figures() -> list[str]:
    rows = [
        "| store | records/s (batches of 2048) | CPU µs per record (this process) |",
        "|---|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp, open_store(Settings(data_dir=Path(tmp))) as store:
        rate, cpu = ingestion(store)
        rows.append(f"| SQLite (WAL, synchronous=NORMAL) | {rate:,.0f} | {cpu:.2f} |")
    with tempfile.TemporaryDirectory() as tmp:
        cpu = drain_us(Settings(data_dir=Path(tmp)))
    rows.append(f"| control worker's drain, SQLite: ring, decode, store, metrics | | {cpu:.2f} |")
    with tempfile.TemporaryDirectory() as tmp:
        cpu = drain_us(Settings(data_dir=Path(tmp)), batch=850, budgeted=True)
    rows.append(f"| the same, the bench gateway's records (a budget, a route trace), SQLite | | {cpu:.2f} |")
    try:
        from tests.fixtures.postgres import PostgresServer, _bindir
    except ImportError:
        return rows
    bindir = _bindir()
    if bindir is None:
        rows.append("| PostgreSQL | not installed | |")
        return rows
    base = Path(tempfile.mkdtemp(prefix="gateway-bench-postgres-"))
    server = PostgresServer(bindir, base)
    server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(data_dir=Path(tmp), database=server.url(server.create_database()))
            with open_store(settings) as store:
                rate, cpu = ingestion(store)
            name = f"PostgreSQL {bindir.parent.name} (fsync off, as the tests run it)"
            rows.append(f"| {name} | {rate:,.0f} | {cpu:.2f} |")
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(data_dir=Path(tmp), database=server.url(server.create_database()))
            cpu = drain_us(settings)
        rows.append(f"| control worker's drain, PostgreSQL (the server's CPU not counted) | | {cpu:.2f} |")
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(data_dir=Path(tmp), database=server.url(server.create_database()))
            cpu = drain_us(settings, batch=850, budgeted=True)
        rows.append(f"| the same, the bench gateway's records, PostgreSQL | | {cpu:.2f} |")
    finally:
        server.stop()
    return rows


def propagation_figures(rounds: int = 5) -> list[str]:
    from tests.fixtures.processes import Gateway, MockEngine, basic_config

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        engine = MockEngine(tmp)
        gw = Gateway(tmp, basic_config({"a": engine.url}), workers=2)
        try:
            delays = []
            for _ in range(rounds):
                key = gw.create_key("alice")
                written = time.perf_counter()

                def everywhere(key: str = key) -> bool:
                    # Fresh connections, so SO_REUSEPORT reaches both workers.
                    return all(
                        httpx.get(
                            gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"}
                        ).status_code
                        == 200
                        for _ in range(16)
                    )

                while not everywhere():
                    time.sleep(0.01)
                delays.append(time.perf_counter() - written)
        finally:
            gw.stop()
            engine.stop()
    return [
        "| from `gateway keys create` returning to every proxy worker accepting the key | ms |",
        "|---|---:|",
        f"| median of {rounds} | {statistics.median(delays) * 1000:.0f} |",
        f"| worst | {max(delays) * 1000:.0f} |",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.control_bench", description=__doc__.split("\n")[0])
    p.add_argument("--keys", default="1000,10000,100000", help="key counts for the snapshot figures")
    p.add_argument("--parts", default="snapshot,usage,propagation", help="which figures, comma-separated")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    out: list[str] = []
    if "snapshot" in parts:
        out += ["## Snapshot", "", *snapshot_figures([int(k) for k in args.keys.split(",")]), ""]
    if "usage" in parts:
        out += ["## Usage ingestion", "", *ingestion_figures(), ""]
    if "propagation" in parts:
        out += ["## Config write to serving", "", *propagation_figures(), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
