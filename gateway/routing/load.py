"""What routing knows of the backends' load and health at the moment a request is decided.

``Load`` is the interface the rules and pool policies read: requests in flight per backend (shared across a
host's workers), the engine's own figures from its ``/metrics`` (scraped in the background by the host's
control slot), the gate's current ceiling, whether a backend may be tried at all (active probes and
passive health), and the host's index of which backend was sent which prompt blocks. The data plane
implements it over shared memory (``gateway.dataplane.backend_load``); the dry run and the tests use
``StaticLoad``. ``EngineState`` is one backend's line of the engine document the scraper publishes
(``gateway.controlplane.fleet.engines``). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.native import PrefixIndex

__all__ = ["EngineState", "Load", "StaticLoad", "engine_states"]


@dataclass(frozen=True, slots=True)
class EngineState:
    """One backend as its host's scraper last saw it. ``kind`` is ``"vllm"``, ``"sglang"`` or None when
    the backend publishes no engine metrics (then ``waiting``/``running``/``kv_cache`` are None)."""

    kind: str | None = None
    waiting: int | None = None
    running: int | None = None
    host_in_flight: int | None = None  # this host's requests on the backend when ``running`` was read
    kv_cache: float | None = None
    ceiling: int | None = None  # the gate's current ceiling; None when the backend has no gate
    healthy: bool = True  # False once active probes failed; passive health is the worker's own
    epoch: int = 0  # changes when the scraper sees the engine restart (its prefix cache is then empty)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def engine_states(doc: dict[str, Any] | None) -> dict[str, EngineState]:
    """The scraper's document (``{"backends": {name: {...}}}``) as ``EngineState`` per backend; anything
    unreadable in a line is taken as unknown rather than failing the whole document."""
    out: dict[str, EngineState] = {}
    for name, line in ((doc or {}).get("backends") or {}).items():
        if not isinstance(line, dict):
            continue
        kv = line.get("kv_cache")
        out[str(name)] = EngineState(
            kind=line.get("kind") if isinstance(line.get("kind"), str) else None,
            waiting=_int(line.get("waiting")),
            running=_int(line.get("running")),
            host_in_flight=_int(line.get("host_in_flight")),
            kv_cache=float(kv) if isinstance(kv, (int, float)) and not isinstance(kv, bool) else None,
            ceiling=_int(line.get("ceiling")),
            healthy=line.get("healthy") is not False,
            epoch=_int(line.get("epoch")) or 0,
        )
    return out


class Load(Protocol):
    def in_flight(self, backend: str) -> int: ...

    def engine(self, backend: str) -> EngineState | None: ...

    def available(self, backend: str) -> bool: ...

    def prefix_index(self) -> PrefixIndex | None:
        """Which backend was sent which prompt blocks (host-wide), for ``cache_aware``; None: not kept."""
        ...

    def note_prefix(self, backend: str, prompt_bytes: int, matched_bytes: int) -> None:
        """Count what ``cache_aware`` sent ``backend``: a prompt's bytes, and those the index said it held."""
        ...

    @property
    def degraded(self) -> bool:
        """True when some backend is not ``available``: only then do targets need filtering."""
        ...


@dataclass(slots=True)
class StaticLoad:
    """A fixed picture of load: for the dry run (filled from the host's last figures) and for tests."""

    flights: dict[str, int] = field(default_factory=dict)
    engines: dict[str, EngineState] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    index: PrefixIndex | None = None
    prefixes: dict[str, list[int]] = field(default_factory=dict)  # backend -> [prompt, matched] bytes

    def in_flight(self, backend: str) -> int:
        return self.flights.get(backend, 0)

    def engine(self, backend: str) -> EngineState | None:
        return self.engines.get(backend)

    def prefix_index(self) -> PrefixIndex | None:
        return self.index

    def note_prefix(self, backend: str, prompt_bytes: int, matched_bytes: int) -> None:
        seen = self.prefixes.setdefault(backend, [0, 0])
        seen[0] += prompt_bytes
        seen[1] += matched_bytes

    def available(self, backend: str) -> bool:
        if backend in self.down:
            return False
        state = self.engines.get(backend)
        return state is None or state.healthy

    @property
    def degraded(self) -> bool:
        return bool(self.down) or any(not s.healthy for s in self.engines.values())
