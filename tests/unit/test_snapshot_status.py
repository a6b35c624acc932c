"""What ``gateway status`` says of where the snapshot comes from, for every state a control worker or a
proxy host's control slot writes (a state it could not name once raised KeyError: the store-down one)."""

from __future__ import annotations

import pytest

from gateway.shm.snapshot_slot import (
    CONTROL_LOCAL,
    CONTROL_REACHABLE,
    CONTROL_STORE_DOWN,
    CONTROL_UNREACHABLE,
    SnapshotPublisher,
    SnapshotReader,
    region_bytes,
)
from gateway.supervisor.host import snapshot_status

STORE_DOWN = "local store unreachable (serving the last-known-good)"


@pytest.mark.parametrize(
    ("state", "seen", "source", "answered"),
    [
        (CONTROL_LOCAL, 0.0, "local store", None),
        (CONTROL_REACHABLE, 1700000000.0, "control plane answering", 1700000000.0),
        (CONTROL_UNREACHABLE, 1700000000.0, "control plane unreachable", 1700000000.0),
        (
            CONTROL_STORE_DOWN,
            1700000000.0,
            "local store unreachable (serving the last-known-good)",
            1700000000.0,
        ),
        (CONTROL_STORE_DOWN, 0.0, STORE_DOWN, None),
    ],
)
def test_every_control_state_is_named(state: int, seen: float, source: str, answered: float | None) -> None:
    buf = memoryview(bytearray(region_bytes(4096)))
    SnapshotPublisher(buf).set_control_state(state, seen)
    doc = snapshot_status(SnapshotReader(buf))
    assert doc["source"] == source
    assert doc["last_answered"] == answered
