"""Instructions a Python child process executes, as valgrind's callgrind counts them: the measure the
machine's load does not move, for comparing two commits exactly. I/O: runs valgrind.
"""

from __future__ import annotations

import re
import subprocess
import sys

__all__ = ["instructions"]


def instructions(module: str, *args: str) -> int:
    """Instructions callgrind counts in ``python -m module args...`` (valgrind:
    ``./scripts/system-deps.sh profile``)."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            module,
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind: {done.stderr[-500:]}")
    return int(found.group(1))
