"""Column expressions a batch builds the same way every time, built once per processor.

A Column is a handle on an unresolved expression in the JVM, bound to no DataFrame, so one
built for the first batch serves every later one. Building it is not free: every PySpark
Column function is two to four Py4J round trips (codegen_stable.py says why that matters on a
small machine), and a table's decode select alone is a few hundred of them. The cached forms
depend only on their key (a writer schema id, a key column), never on the batch's data; what
does change per batch (the LSN watermark) is built per batch beside them.

The cache grows with the writer schemas and tables the process has seen, as `WriterSchemas`
does; its entries are small JVM handles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class ColumnCache:
    """Build-once storage for expressions, shared by the MERGE threads."""

    def __init__(self) -> None:
        self._built: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The value cached under `key`, built by `build` the first time. Two threads may
        both build a missing entry; the first one stored is kept (they are equal)."""
        try:
            value: T = self._built[key]
            return value
        except KeyError:
            pass
        built = build()
        with self._lock:
            kept: T = self._built.setdefault(key, built)
        return kept
