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
SOURCES = ["usage_tail.c", "buckets.c", "usage_ring.c"]


def cdef_from_header(text: str) -> str:
    """The declarations between the ``cffi:begin`` and ``cffi:end`` markers."""
    begin = text.index("/* cffi:begin */") + len("/* cffi:begin */")
    end = text.index("/* cffi:end */")
    return text[begin:end]


ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header(HEADER.read_text()))
ffibuilder.set_source(
    "gateway._gateway_native",
    '#include "gateway_native.h"',
    # Relative paths: setuptools resolves them from the project root, where setup.py runs.
    sources=[f"native/{name}" for name in SOURCES],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)
