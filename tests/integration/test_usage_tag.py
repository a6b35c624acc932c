"""A routing rule's usage tag end to end: the requests it decides carry its tag into their stored usage
records, the others none, and ``gateway usage --by tag`` groups them."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson

from gateway.config import Settings
from gateway.controlplane.store import open_store
from gateway.usage_record import UsageRecord
from tests.fixtures.processes import Gateway, MockEngine, wait_until

CONFIG = """
[[backends]]
name = "a"
url = "{url}"
connect_timeout = 1.0
first_byte_timeout = 10.0

[[provider_models]]
name = "pm-a"
backends = [{{ backend = "a", model = "mock-model" }}]

[[models]]
name = "chat"
chain = ["pm-a"]

[[models.rules]]
name = "red team"
when = {{ headers = {{ x-team = "red" }} }}
route = ["pm-a"]
tag = "red-team"

[[roles]]
name = "chatter"
permissions = ["model/chat"]

[[principals]]
name = "alice"
roles = ["chatter"]
"""


def records(gw: Gateway) -> list[UsageRecord]:
    with open_store(Settings(data_dir=gw.data_dir)) as store:
        return store.usage.records(limit=100)


def test_a_rule_tag_reaches_the_usage_records_and_groups_them(
    tmp_path: Path, mock_engine: MockEngine
) -> None:
    gw = Gateway(tmp_path, CONFIG.format(url=mock_engine.url))
    try:
        key = gw.create_key("alice")
        auth = {"authorization": f"Bearer {key}"}

        def chat(team: str | None) -> httpx.Response:
            return httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 3},
                headers={**auth, **({"x-team": team} if team else {})},
                timeout=30,
            )

        gw.wait_key_live(key)  # in every worker, not only the one that answered first
        assert [chat(team).status_code for team in ("red", None, "red")] == [200, 200, 200]
        wait_until(lambda: len(records(gw)) >= 3, timeout=20, what="3 usage records")
        by_order = sorted(records(gw), key=lambda r: r.ts)
        assert [r.tag for r in by_order] == ["red-team", None, "red-team"]

        out = gw.cli("usage", "--by", "tag", "--json").stdout
        groups = {g["group"]: g["requests"] for g in orjson.loads(out)["groups"]}
        assert groups == {"red-team": 2, "-": 1}
        table = gw.cli("usage", "--by", "tag").stdout
        assert table.splitlines()[0].split()[0] == "TAG"
        assert any(line.split()[:2] == ["red-team", "2"] for line in table.splitlines())
    finally:
        gw.stop()
