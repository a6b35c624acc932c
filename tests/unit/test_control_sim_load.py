"""The fleet benchmark's offered load (perf.control_sim_hosts): a host at R records a second, a batch every S
seconds, makes R x S x k records by its k-th batch, whatever the fraction, and the records it sends are
the wire format a proxy host sends, each with its own request id."""

from __future__ import annotations

import orjson

from gateway.usage_record import UsageRecord, encode_record, record_from_values
from perf.control_sim_hosts import Params, Simulation, records_due


def test_batches_sum_to_the_rate_over_the_run() -> None:
    for rate, ship in ((500.0, 1.0), (0.3, 1.0), (100.0, 0.25), (7.0, 0.1), (1000.0, 2.0)):
        made = [records_due(rate, ship, k) - records_due(rate, ship, k - 1) for k in range(1, 1001)]
        assert all(n >= 0 for n in made)
        assert sum(made) == int(rate * ship * 1000 + 1e-6)
        # No batch holds more than one record beyond its share: the load is even, not bunched.
        assert max(made) - min(made) <= 1


def test_a_batch_is_what_a_proxy_host_sends() -> None:
    sim = Simulation(Params(1, "t", 1, 1.0, 0.0, 0.25, 1.0, 10.0, 10.0, 5.0, 1.0, "r07-", "p-fleet"))
    records = [record_from_values(v) for v in orjson.loads(sim.usage_body(3, 9, 300))]
    assert len({r.request_id for r in records}) == 300
    assert all(r.request_id.startswith("r07-0003000009") for r in records)
    first = records[0]
    assert first.principal_id == "p-fleet" and first.total_tokens == 28
    # The same record, encoded by the proxies' encoder (its end time is the batch's own).
    alone = orjson.loads(sim.usage_body(3, 9, 1))[0]
    assert orjson.loads(encode_record(UsageRecord(*first)._replace(ts=alone[2]))) == alone
