"""Durable state for records of incomplete transactions: the Delta table
`<lake>/_walbridge/pending` holds the raw Kafka records (not yet applied), overwritten by each
batch; the progress row names the version that belongs to it, so a batch that failed half way
is re-run from the state of the last good batch. A progress row without a pending version means
nothing waited: the common case costs neither a write nor a read of this table."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_consumer.delta_conflicts import retry_on_conflict
from spark_consumer.delta_version import table_version

RAW_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("_first_seen", LongType(), False),  # epoch ms when first read by the consumer
    ]
)


def load(spark: SparkSession, path: str, version: int | None) -> DataFrame:
    if version is None or not DeltaTable.isDeltaTable(spark, path):
        # An empty RDD has no partitions: no task, no Python worker.
        return spark.createDataFrame(spark.sparkContext.emptyRDD(), RAW_SCHEMA)
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def save(spark: SparkSession, path: str, rows: DataFrame, *, append: bool = False) -> int:
    """Overwrite with the records still waiting, or with `append` add records to the state
    of the version read (which must be the latest); returns the new table version."""
    mode = "append" if append else "overwrite"
    # An overwrite reads the table: a concurrent OPTIMIZE of it makes it conflict, and the
    # same overwrite again is the same state.
    retry_on_conflict(
        lambda: rows.select(*RAW_SCHEMA.fieldNames()).write.format("delta").mode(mode).save(path),
        f"pending table {path}",
    )
    return table_version(spark, path)
