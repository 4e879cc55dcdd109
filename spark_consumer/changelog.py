"""The raw changelog table of a source table (`changelog = true`, lake_options.py): every applied
event as one row, append-only, at `<lake>/_walbridge/changelog/<schema>/<table>`.

Columns: `op`, `before`, `after` (the event's rows, in the lake's column forms, narrowed to the
table's kept columns), `commit_lsn`, `tx_id`, `total_order` (the order within the transaction),
`ts_ms` (the source timestamp) and `unchanged_toast`. Deduplicated on the event's dedup key
(`commit_lsn`, `total_order`): a replay, or a redelivered event, never adds a row twice.

The dedup is an anti join against the rows the table already holds of the batch's commit range
(its files are pruned by their `commit_lsn` statistics), then an append: this job is the
table's only writer, so nothing comes between the two. An append, not a MERGE, because a
writer schema that adds a column adds a field to `before`/`after`, which an append merges into
the table's schema (`mergeSchema`) without a session setting shared by every table's thread.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from spark_consumer import file_stats, lake_state
from spark_consumer.columns import BEFORE, COMMIT_LSN, OP, TOAST, TOTAL_ORDER, TS_MS, TX_ID
from spark_consumer.lake_options import TableOptions

DEDUP_KEY = ("commit_lsn", "total_order")
# The columns whose file statistics anything reads: the dedup's anti join prunes by commit_lsn,
# and readers ask for what changed after a commit_lsn or in a time range. Delta's default keeps
# statistics for the first 32 leaf columns, which here are mostly the fields of both images:
# computed for every row written, and read by no query.
STATS_COLUMNS = "commit_lsn,total_order,ts_ms"
AFTER_OPS = ("c", "r", "u")  # the events whose flat columns are their `after` row


def _images(frame: DataFrame, opts: TableOptions) -> tuple[Column, Column]:
    """The event's `before` and `after` rows, with only the columns the lake may keep.

    `before` is the decoded `_before` image (decode.py). `after` is built here from the flat
    columns, which hold a c/r/u event's `after` row as they are (a d event's flat columns are
    its `before` row, a t event's are empty): one struct per event at write time, instead of
    one more in every cached event of the batch. The row's columns, in their order, are the
    `_before` image's fields, which decode.py selects from the same writer schemas."""
    struct = frame.schema[BEFORE].dataType
    assert isinstance(struct, StructType)
    kept = opts.kept(struct.fieldNames())
    before = F.when(F.col(BEFORE).isNotNull(), F.struct(*[F.col(BEFORE)[c].alias(c) for c in kept]))
    after = F.when(F.col(OP).isin(*AFTER_OPS), F.struct(*[F.col(c) for c in kept]))
    return before.alias("before"), after.alias("after")


def rows(changes: DataFrame, opts: TableOptions, deduplicate: bool = True) -> DataFrame:
    """The changelog rows of a table's applied events (`changes`, decoded with the `before`
    image); with `deduplicate`, one per dedup key (the batch's plan says when no event came
    twice: then the shuffle of every event with both its images is saved)."""
    out = changes.select(
        F.col(OP).alias("op"),
        *_images(changes, opts),
        F.col(COMMIT_LSN).alias("commit_lsn"),
        F.col(TX_ID).alias("tx_id"),
        F.col(TOTAL_ORDER).alias("total_order"),
        F.col(TS_MS).alias("ts_ms"),
        F.col(TOAST).alias("unchanged_toast"),
    )
    return out.dropDuplicates(list(DEDUP_KEY)) if deduplicate else out


def write(
    spark: SparkSession,
    path: str,
    changes: DataFrame,
    opts: TableOptions,
    commit_lsns: tuple[int, int],
    recorded_version: int | None,
    deduplicate: bool = True,
) -> int:
    """Append the events the table does not hold yet; the table's Delta version afterwards.

    `recorded_version`: the table's version in the last progress row. When the table is still
    there, it holds no event of this batch (every commit to it is this job's, and a batch's
    commits come before its progress row), so the anti join is skipped."""
    new = rows(changes, opts, deduplicate)
    lake = lake_state.read(spark, path)
    if not lake.exists:
        _create(spark, path, new.schema)
    elif lake.version != recorded_version:
        lo, hi = commit_lsns
        held = (
            spark.read.format("delta")
            .load(path)
            .filter((F.col("commit_lsn") > lo) & (F.col("commit_lsn") <= hi))
            .select(*DEDUP_KEY)
        )
        new = new.join(held, list(DEDUP_KEY), "left_anti")
    (new.write.format("delta").mode("append").option("mergeSchema", "true").save(path))
    return lake_state.read(spark, path).version


def _create(spark: SparkSession, path: str, schema: StructType) -> None:
    """The table, empty, with its statistics columns (an append cannot set table properties).
    Every column nullable, nested ones too, as the append that created it before made them."""
    nullable = _nullable(schema)
    assert isinstance(nullable, StructType)
    (
        DeltaTable.createIfNotExists(spark)
        .location(path)
        .addColumns(nullable)
        .property(file_stats.STATS_COLUMNS_PROPERTY, STATS_COLUMNS)
        .execute()
    )


def _nullable(data_type: DataType) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in data_type])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(data_type.keyType, _nullable(data_type.valueType), True)
    return data_type
