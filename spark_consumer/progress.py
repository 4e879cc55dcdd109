"""The progress table `<lake>/_walbridge/progress`: one row per applied batch.

A reader wanting every table at one source transaction boundary takes the row with the largest
`batch_id` and reads each table `VERSION AS OF table_versions['schema.table']`; all of them then
hold exactly the transactions committed at or before `commit_lsn`. (A table missing from the map
had no applied change yet: it does not exist at that point.) Reading a table's latest version
directly is also whole-transaction consistent for that table, but another table may be one
batch ahead or behind. `pending_version` is the
version of the pending table (incomplete transactions) that goes with this row, so a restart
resumes from the state of the last completed batch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from decimal import Decimal

from delta.tables import DeltaTable
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

PROGRESS_SCHEMA = StructType(
    [
        StructField("batch_id", LongType(), False),
        StructField("commit_lsn", LongType(), False),
        StructField("table_versions", MapType(StringType(), LongType()), False),
        StructField("kafka_offsets", StringType(), False),
        StructField("applied_at", TimestampType(), False),
        StructField("pending_version", LongType(), True),
        StructField("applied_transactions", LongType(), False),
        StructField("pending_transactions", LongType(), False),
        StructField("pending_oldest_age_s", DoubleType(), True),
        # Tables whose snapshot the producer had not finished at this batch: from the first
        # batch without a table here on, that table holds every row of the source.
        StructField("snapshotting", ArrayType(StringType()), True),
    ]
)

NO_LSN = -1  # watermark before anything was applied


@dataclass(frozen=True)
class Progress:
    batch_id: int = -1
    commit_lsn: int = NO_LSN
    table_versions: dict[str, int] = field(default_factory=dict)
    kafka_offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    pending_version: int | None = None
    snapshotting: frozenset[str] = frozenset()  # tables whose snapshot is not done


def latest(spark: SparkSession, path: str) -> Progress:
    if not DeltaTable.isDeltaTable(spark, path):
        return Progress()
    row = spark.read.format("delta").load(path).orderBy(F.desc("batch_id")).limit(1).first()
    if row is None:
        return Progress()
    return Progress(
        batch_id=row["batch_id"],
        commit_lsn=row["commit_lsn"],
        table_versions=dict(row["table_versions"]),
        kafka_offsets=json.loads(row["kafka_offsets"]),
        pending_version=row["pending_version"],
        # Absent from progress tables written before contract version 2.
        snapshotting=frozenset(row.asDict().get("snapshotting") or ()),
    )


def merge_offsets(
    before: dict[str, dict[str, int]], batch: list[tuple[str, int, int]]
) -> dict[str, dict[str, int]]:
    """Next offset to read per topic and partition, after this batch's (topic, partition, max)."""
    out = {t: dict(p) for t, p in before.items()}
    for topic, partition, max_offset in batch:
        parts = out.setdefault(topic, {})
        parts[str(partition)] = max(parts.get(str(partition), 0), max_offset + 1)
    return out


# Spark writes integer, double and timestamp literals into the Java source it generates, and
# caches compiled classes by that source; decimal and string literals reach the code by
# reference. Adding the one-row range's `id` (0) keeps the optimizer from folding the sum back
# into a literal of the result type.
_EXACT = DecimalType(38, 0)
_AGE = DecimalType(38, 6)


def _long(value: int | None) -> Column:
    if value is None:
        return F.lit(None).cast(LongType())
    return (F.col("id").cast(_EXACT) + F.lit(Decimal(value)).cast(_EXACT)).cast(LongType())


def _double(value: float | None) -> Column:
    if value is None:
        return F.lit(None).cast(DoubleType())
    age = Decimal(value).quantize(Decimal("0.000001"))
    return (F.col("id").cast(_AGE) + F.lit(age).cast(_AGE)).cast(DoubleType())


def append(
    spark: SparkSession,
    path: str,
    batch_id: int,
    progress: Progress,
    applied_transactions: int,
    pending_transactions: int,
    pending_oldest_age_s: float | None,
    snapshotting: list[str] | None = None,
    exists: bool = False,
) -> None:
    """`exists`: the caller read or wrote a row of this table, so it need not look (a look is a
    read of the table's log, every batch)."""
    if not exists and not DeltaTable.isDeltaTable(spark, path):
        # Created from the schema: the literal row below does not carry its nullability.
        DeltaTable.createIfNotExists(spark).location(path).addColumns(PROGRESS_SCHEMA).execute()
    # One row built in the JVM: createDataFrame from Python rows runs its task in a Python
    # worker, and starting one (when none is up) added about a second to a batch. Its values
    # are data of the row, not literals (`_long`): a row of literals compiled two new classes
    # every batch (see codegen_stable.py for what that costs).
    one = spark.range(1)
    versions = [
        c
        for name, version in sorted(progress.table_versions.items())
        for c in (F.lit(name), _long(version))
    ]
    values = {
        "batch_id": _long(batch_id),
        "commit_lsn": _long(progress.commit_lsn),
        "table_versions": F.create_map(*versions),
        "kafka_offsets": F.lit(json.dumps(progress.kafka_offsets, sort_keys=True)),
        "applied_at": F.timestamp_micros(_long(time.time_ns() // 1000)),
        "pending_version": _long(progress.pending_version),
        "applied_transactions": _long(applied_transactions),
        "pending_transactions": _long(pending_transactions),
        "pending_oldest_age_s": _double(pending_oldest_age_s),
        "snapshotting": F.array(*[F.lit(t) for t in (snapshotting or [])]),
    }
    row = one.select(
        *[values[f.name].cast(f.dataType).alias(f.name) for f in PROGRESS_SCHEMA.fields]
    )
    # No Delta transaction id (txnAppId) on this write: checking one reads the table's whole
    # state, which cost about 0.5 s per batch. A batch id already in this table is skipped
    # before anything is written (BatchProcessor.process), and this row is its last write.
    # mergeSchema: progress tables written before the snapshotting column get it added.
    row.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
