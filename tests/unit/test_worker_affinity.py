"""Which proxy workers ``pin_to_core`` pins; checked without pinning the test process itself."""

from __future__ import annotations

import os

import pytest

from gateway.config import Settings
from gateway.dataplane.worker import pin_to_core

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")


@pytest.mark.parametrize("mode", ["off", "bogus"])
def test_off_and_unknown_modes_pin_nothing(mode: str) -> None:
    """An unknown mode (a mistyped GATEWAY_CPU_AFFINITY) falls back to the default, off, not to auto:
    with as many workers as cores, auto would pin."""
    cores = os.sched_getaffinity(0)
    try:
        assert pin_to_core(Settings(cpu_affinity=mode, workers=len(cores)), 0) is None
        assert os.sched_getaffinity(0) == cores
    finally:
        os.sched_setaffinity(0, cores)


def test_auto_pins_nothing_when_workers_and_cores_differ() -> None:
    cores = os.sched_getaffinity(0)
    try:
        assert pin_to_core(Settings(cpu_affinity="auto", workers=len(cores) + 1), 0) is None
        assert os.sched_getaffinity(0) == cores
    finally:
        os.sched_setaffinity(0, cores)
