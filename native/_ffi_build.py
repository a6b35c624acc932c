"""cffi build script for ``gateway._gateway_native`` (API mode), referenced from setup.py's cffi_modules.

The C lives in real files next to this one; the cdef is the marked part of ``gateway_native.h``, so the
declarations exist once. Reads those files at build time; writes nothing itself (setuptools and cffi
write the generated C and the shared object).
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "gateway_native.h"
SOURCES = [
    "usage_tail.c",
    "buckets.c",
    "usage_ring.c",
    "json_member.c",
    "prefix_index.c",
    "sse_usage.c",
    "http1_chunks.c",
]


def cdef_from_header(text: str) -> str:
    """The declarations between the ``cffi:begin`` and ``cffi:end`` markers."""
    begin = text.index("/* cffi:begin */") + len("/* cffi:begin */")
    end = text.index("/* cffi:end */")
    return text[begin:end]


ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header(HEADER.read_text()))
# cffi wraps every call in Py_BEGIN/END_ALLOW_THREADS. Our functions never block and take well under a
# microsecond, so releasing the GIL buys nothing, while in a granian worker (whose runtime threads queue
# for the GIL) each release lets another thread in and costs the event loop a hand-over: measured at about
# a quarter of the gateway's throughput with limits and usage on. The wrappers are emitted after this
# preamble, so redefining the two macros here keeps the GIL held around our calls only.
PREAMBLE = """
#include "gateway_native.h"
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
"""

ffibuilder.set_source(
    "gateway._gateway_native",
    PREAMBLE,
    # Relative paths: setuptools resolves them from the project root, where setup.py runs.
    sources=[f"native/{name}" for name in SOURCES],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)
