"""Flow control at saturation through a running gateway (one proxy worker) in front of a slow mock engine
whose backends let one request in at a time: a flooding tenant does not keep a quieter one from its fair
share, sheddable requests are shed (429 with Retry-After) before any standard one is refused and never go
ahead of a standard one, a backend's reserved places are kept from sheddable requests, and /metrics counts
it all per priority."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import Gateway, MockEngine, free_port, wait_until

HOLD = 12.0  # seconds the request holding the only place runs: the queue is set up meanwhile


def config(url: str) -> str:
    backends = ""
    for name, size, gate in (("wide", 64, 1), ("tight", 5, 1), ("reserve", 8, 2)):
        reserve = "reserved_places = 1\n" if name == "reserve" else ""
        backends += (
            f'[[backends]]\nname = "{name}"\nurl = "{url}"\nfirst_byte_timeout = 30.0\n{reserve}'
            f"max_concurrency = {gate}\nqueue_size = {size}\nqueue_timeout = 60\n\n"
            f'[[provider_models]]\nname = "pm-{name}"\nbackends = [{{ backend = "{name}", model = "m" }}]\n\n'
            f'[[models]]\nname = "{name}"\nchain = ["pm-{name}"]\n\n'
        )
    return backends + (
        '[[roles]]\nname = "user"\npermissions = ["model/*"]\n\n'
        '[[principals]]\nname = "flood"\nroles = ["user"]\n\n'
        '[[principals]]\nname = "calm"\nroles = ["user"]\nweight = 2\n\n'
        '[[principals]]\nname = "batch"\nroles = ["user"]\npriority = "sheddable"\n'
    )


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for s in family.samples:
            if s.name.startswith("gateway_flow_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


class Env:
    def __init__(self, tmp: Path, engine: MockEngine) -> None:
        self.admin = f"http://127.0.0.1:{free_port()}"
        port = self.admin.rsplit(":", 1)[1]
        self.gw = Gateway(tmp, config(engine.url), workers=1, extra=("--admin-port", port))
        self.keys = {p: self.gw.create_key(p) for p in ("flood", "calm", "batch")}
        for key in self.keys.values():
            self.gw.wait_key_live(key)
        self.engine = engine

    def post(self, who: str, model: str, tag: str, delay: float = 0.1) -> httpx.Response:
        return httpx.post(
            self.gw.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.keys[who]}", "x-mock-delay": str(delay)},
            json={"model": model, "messages": [{"role": "user", "content": tag}], "max_tokens": 2},
            timeout=90,
        )

    def served(self) -> list[str]:
        """The tags of the requests the engine was asked to serve, in the order they reached it."""
        return [
            json.loads(r["body"])["messages"][0]["content"]
            for r in self.engine.requests()
            if r["path"] == "/v1/chat/completions"
        ]

    def metric(self, name: str, **labels: str) -> float:
        key = f"{name}{{{','.join(f'{k}={v}' for k, v in sorted(labels.items()))}}}"
        return scrape(self.admin).get(key, 0.0)

    def until(self, check: Callable[[], bool], what: str) -> None:
        wait_until(check, timeout=HOLD, interval=0.1, what=what)


def test_flow_control_fair_share_shedding_and_metrics(tmp_path: Path) -> None:
    engine = MockEngine(tmp_path)
    env = Env(tmp_path, engine)
    try:
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            # -- Fair share: "flood" fills the queue first; "calm" (weight 2) comes later. ------------------
            engine.reset()
            hold = pool.submit(env.post, "flood", "wide", "hold", HOLD)
            env.until(lambda: env.served() == ["hold"], "the hold request in")
            floods = [pool.submit(env.post, "flood", "wide", f"f{i}") for i in range(19)]
            env.until(lambda: env.metric("gateway_flow_queue_depth", priority="standard") == 19, "19 queued")
            calms = [pool.submit(env.post, "calm", "wide", f"c{i}") for i in range(6)]
            env.until(lambda: env.metric("gateway_flow_queue_depth", priority="standard") == 25, "25 queued")
            assert not hold.done(), "the queue took longer to fill than the hold request runs"
            answers = [f.result() for f in [hold, *floods, *calms]]
            assert [r.status_code for r in answers] == [200] * 26
            order = env.served()[1:]
            # Weighted fair queueing: calm's six go within the first nine dispatched (two of calm's per
            # one of flood's), not after flood's nineteen that were queued before them.
            last_calm = max(order.index(f"c{i}") for i in range(6))
            assert last_calm <= 8, order
            assert sum(1 for tag in order[: last_calm + 1] if tag.startswith("f")) <= 3, order

            # -- Shedding: queue of five on "tight"; sheddable requests go first, and never go ahead. -------
            engine.reset()
            hold = pool.submit(env.post, "calm", "tight", "hold", HOLD)
            env.until(lambda: env.served() == ["hold"], "the hold request in")

            def queue(who: str, tag: str, priority: str, depth: int) -> concurrent.futures.Future[Any]:
                """One more request waiting, once the queue shows it (one after the other: "newest" and
                the order inside a tenant are then known)."""
                future = pool.submit(env.post, who, "tight", tag)
                env.until(lambda: env.metric("gateway_flow_queue_depth", priority=priority) == depth, tag)
                return future

            sheds = [queue("batch", f"s{i}", "sheddable", i + 1) for i in range(3)]
            stds = [queue("flood", f"n{i}", "standard", i + 1) for i in range(2)]
            # Full: each standard newcomer takes the place of the newest sheddable waiter.
            stds.append(pool.submit(env.post, "flood", "tight", "n2"))
            shed_last = sheds[2].result()
            stds.append(pool.submit(env.post, "flood", "tight", "n3"))
            shed_middle = sheds[1].result()
            # A sheddable newcomer sheds nobody: refused at once.
            late = env.post("batch", "tight", "s3")
            assert not hold.done(), "the queue took longer to fill than the hold request runs"
            for refused, why in ((shed_last, "shed"), (shed_middle, "shed"), (late, "queue is full")):
                assert refused.status_code == 429, refused.text
                assert refused.headers["retry-after"] == "60"
                error = refused.json()["error"]
                assert error["code"] == "backend_saturated" and why in error["message"], error
            # One sheddable still waits (s0); every standard one goes first.
            assert [f.result().status_code for f in [hold, *stds]] == [200] * 5
            assert sheds[0].result().status_code == 200
            assert env.served() == ["hold", "n0", "n1", "n2", "n3", "s0"]
            # The Anthropic envelope for the same refusal on /v1/messages.
            hold = pool.submit(env.post, "calm", "tight", "hold", 3.0)
            env.until(lambda: env.served()[-1] == "hold", "the hold request in")
            fill = [pool.submit(env.post, "flood", "tight", f"x{i}") for i in range(5)]
            env.until(lambda: env.metric("gateway_flow_queue_depth", priority="standard") == 5, "queue full")
            anthropic = httpx.post(
                env.gw.url + "/v1/messages",
                headers={"x-api-key": env.keys["flood"], "anthropic-version": "2023-06-01"},
                json={"model": "tight", "messages": [{"role": "user", "content": "m"}], "max_tokens": 2},
                timeout=30,
            )
            assert anthropic.status_code == 429 and anthropic.headers["retry-after"] == "60"
            body: dict[str, Any] = anthropic.json()
            assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
            assert [f.result().status_code for f in [hold, *fill]] == [200] * 6

        # -- Metrics, per priority. ------------------------------------------------------------------------
        def counted() -> bool:
            m = scrape(env.admin)
            return (
                m.get("gateway_flow_dispatched_total{priority=standard}") == 19 + 6 + 4 + 5
                and m.get("gateway_flow_dispatched_total{priority=sheddable}") == 1
            )

        env.until(counted, "dispatch counters")
        m = scrape(env.admin)
        assert m["gateway_flow_refused_total{priority=sheddable,reason=shed}"] == 2
        assert m["gateway_flow_refused_total{priority=sheddable,reason=queue_full}"] == 1
        assert m["gateway_flow_refused_total{priority=standard,reason=queue_full}"] == 1
        assert m["gateway_flow_wait_seconds_count{priority=standard}"] == 34
        assert m["gateway_flow_wait_seconds_bucket{le=+Inf,priority=standard}"] == 34
        assert m["gateway_flow_queue_depth{priority=standard}"] == 0
        assert "gateway_flow_queue_depth{priority=critical}" in m
    finally:
        env.gw.stop()
        engine.stop()


def test_reserved_places_are_kept_for_standard_requests(tmp_path: Path) -> None:
    """Backend "reserve" lets two in, one of them kept from sheddable requests: with one sheddable request
    in flight a second waits, and a standard request that comes after it is served at once, beside it."""
    engine = MockEngine(tmp_path)
    env = Env(tmp_path, engine)
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            hold = pool.submit(env.post, "batch", "reserve", "hold", 6.0)
            env.until(lambda: env.served() == ["hold"], "the hold request in")
            waiting = pool.submit(env.post, "batch", "reserve", "s0")
            env.until(lambda: env.metric("gateway_flow_queue_depth", priority="sheddable") == 1, "s0 waits")
            quick = env.post("calm", "reserve", "c0")
            assert quick.status_code == 200, quick.text
            assert env.served() == ["hold", "c0"] and not waiting.done() and not hold.done()
            assert hold.result().status_code == 200 and waiting.result().status_code == 200
            assert env.served() == ["hold", "c0", "s0"]
    finally:
        env.gw.stop()
        engine.stop()
