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

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_consumer.codegen_stable import double_value_sql, long_value_sql, sql_name

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

# Delta collects min/max statistics only for the columns readers select rows by: a reader takes
# the row of a batch or of a commit LSN. Statistics of all ten columns (a map, an array, a JSON
# string among them) took about 60 ms of every batch's write, for nothing a reader uses.
STATS_PROPERTY = "delta.dataSkippingStatsColumns"
STATS_COLUMNS = "batch_id,commit_lsn"


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


def unread(
    read: dict[str, dict[str, int]], batch: list[tuple[str, int, int]]
) -> list[tuple[str, int, int, int]]:
    """The partitions where a batch's (topic, partition, max offset) reaches past what the
    lake has read (`read`: next offset per topic and partition, as `merge_offsets` keeps it):
    (topic, partition, max offset, next offset read), first topic and partition first."""
    out = []
    for topic, partition, max_offset in sorted(batch):
        next_read = read.get(topic, {}).get(str(partition), 0)
        if max_offset >= next_read:
            out.append((topic, partition, max_offset, next_read))
    return out


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
        (
            DeltaTable.createIfNotExists(spark)
            .location(path)
            .addColumns(PROGRESS_SCHEMA)
            .property(STATS_PROPERTY, STATS_COLUMNS)
            .execute()
        )

    # One row built in the JVM: createDataFrame from Python rows runs its task in a Python
    # worker, and starting one (when none is up) added about a second to a batch. Its numbers
    # are data of the row, not literals: a row of literals compiled two new classes every
    # batch (codegen_stable.py says what that costs). They are SQL, one parse each: built from
    # Column functions, this row took about 250 Py4J round trips, a tenth of a small batch's.
    # Text (table names, offsets) goes in as literal values, never into the SQL.
    versions = [
        c
        for name, version in sorted(progress.table_versions.items())
        for c in (F.lit(name), F.expr(long_value_sql(version, "id")))
    ]
    now_us = long_value_sql(time.time_ns() // 1000, "id")
    numbers = {
        "batch_id": long_value_sql(batch_id, "id"),
        "commit_lsn": long_value_sql(progress.commit_lsn, "id"),
        "applied_at": f"timestamp_micros({now_us})",
        "pending_version": long_value_sql(progress.pending_version, "id"),
        "applied_transactions": long_value_sql(applied_transactions, "id"),
        "pending_transactions": long_value_sql(pending_transactions, "id"),
        "pending_oldest_age_s": double_value_sql(pending_oldest_age_s, "id"),
    }
    others = {
        "table_versions": F.create_map(*versions),
        "kafka_offsets": F.lit(json.dumps(progress.kafka_offsets, sort_keys=True)),
        "snapshotting": F.array(*[F.lit(t) for t in (snapshotting or [])]),
    }
    row = spark.range(0, 1, 1, numPartitions=1).select(  # one task, not one per core
        *[
            F.expr(f"{numbers[f.name]} AS {sql_name(f.name)}")
            if f.name in numbers
            else others[f.name].cast(f.dataType).alias(f.name)
            for f in PROGRESS_SCHEMA.fields
        ]
    )
    # No Delta transaction id (txnAppId) on this write: checking one reads the table's whole
    # state, which cost about 0.5 s per batch. A batch id already in this table is skipped
    # before anything is written (BatchProcessor.process), and this row is its last write.
    # mergeSchema: progress tables written before the snapshotting column get it added.
    row.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
