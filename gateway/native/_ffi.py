"""The C extension ``gateway._gateway_native`` loaded once, the flags that say which implementation is in
use, the package's exceptions, and the C return codes turned into them. I/O: none (reads one environment
variable at import)."""

from __future__ import annotations

import mmap
import os
from typing import Any, Final, Literal, NoReturn, TypeAlias

__all__ = [
    "HAVE_NATIVE",
    "IMPLEMENTATION",
    "PURE_PYTHON",
    "BucketTableFull",
    "Bytes",
    "NativeError",
    "NativeUnavailable",
    "RegionError",
    "WritableBuffer",
    "ffi",
    "lib",
    "raise_for",
    "require_native",
]

PURE_PYTHON: Final = os.environ.get("GATEWAY_PURE_PYTHON", "") not in ("", "0")

try:
    from gateway._gateway_native import ffi, lib
except ImportError as _exc:
    if not PURE_PYTHON:
        raise ImportError(
            "gateway._gateway_native is not built: run `make native` "
            "(or set GATEWAY_PURE_PYTHON=1 to use the pure-Python usage parser)"
        ) from _exc
    ffi = lib = None

IMPLEMENTATION: Final[Literal["c", "python"]] = "python" if PURE_PYTHON else "c"
HAVE_NATIVE: Final = lib is not None

Bytes: TypeAlias = bytes | bytearray | memoryview
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap


class NativeError(Exception):
    """An error reported by the C extension."""


class NativeUnavailable(NativeError):
    """The extension is not built (only possible with ``GATEWAY_PURE_PYTHON=1``)."""


class RegionError(NativeError):
    """The shared region is misaligned, too small, not initialised, or already closed."""


class BucketTableFull(NativeError):
    """No free slot is left for a new key: the table's capacity is too small for the keys in use."""


def require_native() -> Any:
    """The extension's ``lib``; ``NativeUnavailable`` when it is not built."""
    if lib is None:
        raise NativeUnavailable("gateway._gateway_native is not built; run `make native`")
    return lib


def raise_for(rc: int) -> NoReturn:
    """Raise what a C call's negative return code means."""
    if rc == lib.GW_EINVAL:
        raise ValueError("argument out of range (rate must be finite and > 0, counts >= 0, key != 0)")
    if rc == lib.GW_EFULL:
        raise BucketTableFull("bucket table is full")
    if rc == lib.GW_EREGION:
        raise RegionError("region is not an initialised bucket table of this size (or was closed)")
    raise NativeError(f"unexpected return code {rc}")
