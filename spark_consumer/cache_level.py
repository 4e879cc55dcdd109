"""The storage level of every frame a batch caches (raw rows, decoded tables, markers, the
summary's groups, collapsed MERGE sources)."""

from __future__ import annotations

from pyspark import StorageLevel

# Spark's columnar batches kept as JVM objects, spilling to disk under memory pressure.
# PySpark's MEMORY_AND_DISK is the *serialized* level: every later scan of the cache
# deserializes it again. On a warm JVM, a 1M-insert batch took 17.6 s (27 s of JVM CPU) with it
# and 14.5 s (22 s) with this one.
CACHE = StorageLevel.MEMORY_AND_DISK_DESER
