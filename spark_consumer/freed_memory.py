"""Give the memory a batch freed back to the system before the next batch.

The driver's Python side handles each batch's summary as Arrow tables and Python objects, from
several threads (the MERGEs run side by side). The C library's allocator keeps what they free in
per-thread arenas for reuse, so a catch-up left the driver's RSS well above what it held live.
glibc's `malloc_trim` hands the free pages back; Dask's workers do the same for the same
reason. No library wraps it, and elsewhere (musl, macOS) there is nothing to call: a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _trim_function() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _trim_function()


def release() -> bool:
    """Return free heap pages to the system; whether there was anything to call."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
