"""The C extension under valgrind's callgrind: instructions per call of every ``gw_*`` entry point the
request path and the control worker use, on the inputs of ``perf.micro_native`` and
``perf.micro_accounting``; what crossing into it through cffi costs; and where a parse spends them.

    .venv/bin/python -m perf.native_profile [-n 4000] [--keep DIR] [CASE ...]

Each case runs in its own ``valgrind --tool=callgrind`` child (this module with ``--case``) that counts
instructions only inside cffi's wrappers ``_cffi_f_gw_*`` (``--toggle-collect``), so the interpreter
around them costs nothing in the figures. From the call arcs in callgrind's output, per entry point
``gw_X``: how often its wrapper called it, the instructions spent in our C below the wrapper, and those of
the crossing itself (the wrapper's own work and its argument conversions). Instruction counts do not
depend on the machine's load, so unlike timings they compare across runs on this noisy machine; they say
nothing of cache misses. Needs valgrind (``make profile-native`` installs Debian's package if missing).
I/O: runs valgrind children; writes callgrind files to a temporary directory (``--keep`` keeps them);
prints Markdown to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gateway.native import TailBuffer, UsageRing, model_span_c, parse_usage_c, ring_region_size
from gateway.shm.regions import RING_SLOT_BYTES
from gateway.usage_record import encode_record
from perf.control_bench import records
from perf.micro_accounting import ANSWER, request_loop
from perf.micro_native import stream_tail
from perf.scenarios import LARGE_BODY, SMALL_BODY

# Each case is a factory of ``run(n)``, made in the valgrind child only.


def _repeat(fn: Callable[[bytes], object], data: bytes) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            fn(data)

    return run


def _tail_buffer() -> Callable[[int], None]:
    tail = stream_tail()
    chunks = [tail[i : i + 200] for i in range(0, len(tail), 200)]
    buf = TailBuffer(pure=False)

    def run(n: int) -> None:
        for _ in range(n):
            for chunk in chunks:
                buf.append(chunk)
            buf.usage()

    return run


def _ring(batch: int = 1024) -> Callable[[int], None]:
    ring = UsageRing.create_layout(
        bytearray(ring_region_size(1, batch, RING_SLOT_BYTES)), 1, batch, RING_SLOT_BYTES
    )
    encoded = [encode_record(r) for r in records(batch, 0)]

    def run(n: int) -> None:
        for _ in range(max(1, n // batch)):
            for data in encoded:
                ring.push(0, data)
            ring.advance(0, len(ring.read(0, batch)))

    return run


@dataclass(frozen=True)
class Case:
    label: str
    run: Callable[[], Callable[[int], None]]
    size: int = 0  # bytes per call of a parse: instructions per byte, and where they go


# Entry points that make or measure regions: called while a case sets up, not per iteration.
SETUP = frozenset(
    {"gw_bt_init", "gw_bt_capacity", "gw_bt_region_size", "gw_ring_init", "gw_ring_region_size"}
    | {"gw_ring_geometry", "gw_ring_counters"}
)


CASES: dict[str, Case] = {
    "request": Case(
        "one request's accounting, everything on (perf.micro_accounting's loop)",
        lambda: request_loop(limits=True, budget=True, usage=True),
    ),
    "usage-answer": Case(
        "parse_usage of the bench's whole answer", lambda: _repeat(parse_usage_c, ANSWER), len(ANSWER)
    ),
    "usage-stream": Case(
        "parse_usage of a 4 KiB stream tail", lambda: _repeat(parse_usage_c, stream_tail()), 4096
    ),
    "usage-none": Case(
        "parse_usage of a 4 KiB stream tail without usage",
        lambda: _repeat(parse_usage_c, stream_tail().replace(b'"usage"', b'"usagE"')),
        4096,
    ),
    "tail": Case("TailBuffer: a 4 KiB stream in 200-byte appends, then usage", _tail_buffer),
    "model-bench": Case(
        "the model's span in the small scenarios' body",
        lambda: _repeat(model_span_c, SMALL_BODY),
        len(SMALL_BODY),
    ),
    "model-100k": Case(
        "the model's span in the large-body scenario's body (a 100 KB prompt)",
        lambda: _repeat(model_span_c, LARGE_BODY),
        len(LARGE_BODY),
    ),
    "ring": Case("usage ring: push, then read and advance a batch (control worker)", _ring),
}


@dataclass
class Profile:
    """What one callgrind file says: per entry point ``gw_X``, how often its cffi wrapper
    ``_cffi_f_gw_X`` called it, the instructions spent in our C below the wrapper (every call the wrapper
    made into a ``gw_*`` function, inclusive), and those of the crossing itself (the wrapper's own and
    its argument conversions); and every function's self instructions."""

    calls: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    crossing: Counter[str] = field(default_factory=Counter)
    self_cost: Counter[str] = field(default_factory=Counter)

    @classmethod
    def read(cls, path: Path) -> Profile:
        """Reads a file written with ``--compress-strings=no --compress-pos=no``: ``fn=`` opens a
        function; ``cfn=`` and ``calls=`` announce a call whose inclusive cost is the next cost line; other
        cost lines are the current function's own. An entry point that ends in a tail call
        (``gw_tail_usage`` jumps into ``gw_usage_parse``) may show up as a second callee of the wrapper."""
        prof = cls()
        fn = callee = ""
        pending_calls = 0
        for line in path.read_text().splitlines():
            if line.startswith("fn="):
                fn = line[3:]
            elif line.startswith("cfn="):
                callee = line[4:]
            elif line.startswith("calls="):
                pending_calls = int(line[6:].split()[0])
            elif line[:1].isdigit():
                cost = int(line.split()[1])
                entry = fn[len(_WRAPPER) :] if fn.startswith(_WRAPPER) else ""
                if pending_calls:
                    if entry:
                        if callee.startswith("gw_"):
                            prof.inclusive[entry] += cost
                        else:
                            prof.crossing[entry] += cost
                        if callee == entry:
                            prof.calls[entry] += pending_calls
                    pending_calls = 0
                else:
                    prof.self_cost[fn] += cost
                    if entry:
                        prof.crossing[entry] += cost
        return prof


_WRAPPER = "_cffi_f_"


def run_case(name: str, n: int, out: Path) -> Profile:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    argv = [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--compress-strings=no",
        "--compress-pos=no",
        "--collect-atstart=no",
        f"--toggle-collect={_WRAPPER}gw_*",  # wrappers never nest; gw_* calls do
        sys.executable,
        "-m",
        "perf.native_profile",
        "--case",
        name,
        "-n",
        str(n),
    ]
    env = {**os.environ, "PYTHONMALLOC": "malloc"}  # valgrind sees every allocation, not pymalloc's arenas
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"case {name} failed under valgrind:\n{done.stderr[-2000:]}")
    return Profile.read(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=4000, help="iterations per case")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    parser.add_argument("cases", nargs="*", help=f"cases to run (default all: {', '.join(CASES)})")
    args = parser.parse_args()
    if args.case:
        CASES[args.case].run()(args.n)
        return
    names = args.cases or list(CASES)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}: one of {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="native-profile-") as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for name in names:
            print(f"- `{name}`: {CASES[name].label}")
        print()
        print(
            "| case | C function | calls per iteration | instructions per call | per byte "
            "| per iteration | cffi crossing per call |"
        )
        print("|---|---|---:|---:|---:|---:|---:|")
        parses: dict[str, Profile] = {}
        for name in names:
            case = CASES[name]
            prof = run_case(name, args.n, where / f"{name}.callgrind")
            if case.size:
                parses[name] = prof
            for fn in sorted(prof.calls, key=lambda f: -prof.inclusive[f]):
                if fn in SETUP:
                    continue
                calls = prof.calls[fn]
                per_call = prof.inclusive[fn] / calls
                per_byte = f"{per_call / case.size:.2f}" if case.size else ""
                print(
                    f"| {name} | `{fn}` | {calls / args.n:.3g} | {per_call:,.0f} | {per_byte} "
                    f"| {prof.inclusive[fn] / args.n:,.0f} | {prof.crossing[fn] / calls:,.0f} |"
                )
        print()
        print("Where a parse's instructions go (self cost, share of the case's total):")
        print()
        for name, prof in parses.items():
            total = sum(prof.self_cost.values()) or 1
            top = ", ".join(
                f"`{fn.split('.')[0]}` {cost / total:.0%}" for fn, cost in prof.self_cost.most_common(5)
            )
            print(f"- {name}: {top}")


if __name__ == "__main__":
    main()
