"""One aggregation per batch: decoded events and markers -> the small per-transaction records
that `reassembly.decide` plans from, plus the records that failed to decode.

Everything the batch needs to know before it writes (completeness, truncates, unchanged-TOAST
columns, key bounds for file pruning, undecodable records) comes out of this single Spark job,
so a small batch does not pay for a dozen separate aggregations.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegerType, LongType, ShortType, StringType

from spark_consumer import codegen_stable
from spark_consumer.column_cache import ColumnCache
from spark_consumer.columns import (
    COMMIT_LSN,
    FIRST_SEEN,
    OFFSET,
    OK,
    OP,
    PARTITION,
    SCHEMA,
    TABLE,
    TOAST,
    TOPIC,
    TOTAL_ORDER,
    TX_ID,
)
from spark_consumer.reassembly import MarkerStats, TableStats

# Summary rows converted to Python objects at a time (transaction_stats.collect).
_SLICE_ROWS = 16_384
# Shared: each frozenset() call makes a new 216-byte object, more than a TableStats itself.
_NO_COLUMNS: frozenset[str] = frozenset()
NOT_DECODED = "Avro body does not decode with its writer schema"
NO_TRANSACTION = "data event without transaction block or commit_lsn"


@dataclass(frozen=True)
class BadRecord:
    """The first record (lowest partition, offset) of a group that cannot be used."""

    topic: str
    partition: int
    offset: int
    reason: str
    count: int


def bad_reason() -> Column:
    """Why a decoded data event cannot be applied, or null when it can."""
    return F.when(~F.col(OK), F.lit(NOT_DECODED)).when(
        F.col(TX_ID).isNull() | F.col(COMMIT_LSN).isNull(), F.lit(NO_TRANSACTION)
    )


def usable() -> Column:
    return F.col(OK) & F.col(TX_ID).isNotNull() & F.col(COMMIT_LSN).isNotNull()


def _key_bounds(key_type: DataType | None, key: str | None) -> tuple[Column, Column]:
    """The first key column as a long or a string, for min/max (file pruning); else null."""
    none = F.lit(None)
    if key is None or key_type is None:
        return none.cast("long"), none.cast("string")
    if isinstance(key_type, LongType | IntegerType | ShortType):
        return F.col(key).cast("long"), none.cast("string")
    if isinstance(key_type, StringType):
        return none.cast("long"), F.col(key)
    return none.cast("long"), none.cast("string")


def _data_columns(key_type: DataType | None, key: str | None) -> list[Column]:
    """The summary rows' columns, from one table's decoded events."""
    k_long, k_str = _key_bounds(key_type, key)
    return [
        F.lit("d").alias("kind"),
        bad_reason().alias("bad"),
        F.col(TX_ID).alias("tx"),
        F.concat_ws(".", SCHEMA, TABLE).alias("coll"),
        F.col(TOPIC).alias("topic"),
        F.col(PARTITION).alias("part"),
        F.col(OFFSET).alias("off"),
        F.col(COMMIT_LSN).alias("lsn"),
        F.col(TOTAL_ORDER).alias("ord"),
        F.col(OP).alias("op"),
        F.col(FIRST_SEEN).alias("seen"),
        F.col(TOAST).alias("toast"),
        k_long.alias("k_long"),
        k_str.alias("k_str"),
        F.lit(None).cast("string").alias("status"),
        F.lit(None).cast("array<struct<data_collection:string,event_count:long>>").alias("dcs"),
        F.lit(None).cast("long").alias("ts"),
    ]


def _data_rows(events: DataFrame, key: str | None, watermark: int, cache: ColumnCache) -> DataFrame:
    key_type = next((f.dataType for f in events.schema.fields if f.name == key), None)
    columns = cache.get(("summary-data", key, key_type), lambda: _data_columns(key_type, key))
    unusable = cache.get("summary-bad", lambda: bad_reason().isNotNull())
    later = codegen_stable.greater(COMMIT_LSN, watermark)
    return events.filter(unusable | later).select(*columns)


def _marker_columns() -> list[Column]:
    return [
        F.lit("m").alias("kind"),
        F.when(~F.col(OK), F.lit(NOT_DECODED)).alias("bad"),
        F.col(TX_ID).alias("tx"),
        F.lit(None).cast("string").alias("coll"),
        F.col(TOPIC).alias("topic"),
        F.col(PARTITION).alias("part"),
        F.col(OFFSET).alias("off"),
        F.col(COMMIT_LSN).alias("lsn"),
        F.lit(None).cast("long").alias("ord"),
        F.lit(None).cast("string").alias("op"),
        F.col(FIRST_SEEN).alias("seen"),
        F.lit(None).cast("array<string>").alias("toast"),
        F.lit(None).cast("long").alias("k_long"),
        F.lit(None).cast("string").alias("k_str"),
        F.col("_status").alias("status"),
        F.col("_data_collections").alias("dcs"),
        F.col("_ts_ms").alias("ts"),
    ]


def _marker_rows(markers: DataFrame, watermark: int, cache: ColumnCache) -> DataFrame:
    columns = cache.get("summary-markers", _marker_columns)
    not_ok = cache.get("summary-not-ok", lambda: ~F.col(OK))
    later = codegen_stable.greater(COMMIT_LSN, watermark)
    return markers.filter(not_ok | later).select(*columns)


def _nonempty(array: Column) -> Column:
    return F.when(F.size(array) > 0, array)


# Strings repeated across the summary's rows: converted through a dictionary, one Python
# object per distinct value (a table's name, or a transaction's id on its few rows).
_REPEATED = ("kind", "tx", "coll", "topic")


def _columns(part: pa.RecordBatch) -> dict[str, list[Any]]:
    """A slice of the summary as Python lists, one per column. Column by column: pyarrow's
    row-wise conversion (and PySpark's Rows before it) cost about 20 µs per summary row."""
    out: dict[str, list[Any]] = {}
    for name in part.schema.names:
        column = part.column(name)
        if name in _REPEATED:
            encoded = pc.dictionary_encode(column)
            values = [sys.intern(v) for v in encoded.dictionary.to_pylist()]
            out[name] = [None if j is None else values[j] for j in _pylist(encoded.indices)]
        else:
            out[name] = _pylist(column)
    return out


def _pylist(column: pa.Array) -> list[Any]:
    """`column.to_pylist()`, faster for what most of the summary is: all-null columns, and
    integers and booleans (through numpy: pyarrow makes a scalar per value, ~0.6 µs each)."""
    n = len(column)
    if column.null_count == n:
        return [None] * n
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_boolean(kind)):
        return column.to_pylist()
    filler = False if pa.types.is_boolean(kind) else 0
    values: list[Any] = pc.fill_null(column, filler).to_numpy(zero_copy_only=False).tolist()
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False).tolist()
        values = [v if ok else None for v, ok in zip(values, valid, strict=True)]
    return values


def _group_columns() -> list[Column]:
    return [F.col(c) for c in ("kind", "bad", "tx", "coll", "topic")]


def _aggregates() -> list[Column]:
    end = F.col("status") == "END"
    first = F.min(F.struct("part", "off"))
    return [
        F.max("lsn").alias("lsn"),
        # size(collect_set) rather than count_distinct: one hash aggregate, no Expand stage.
        F.size(F.collect_set("ord")).alias("events"),
        F.count(F.lit(1)).alias("records"),
        F.min("seen").alias("seen"),
        F.max(F.when(F.col("op") == "t", F.col("ord"))).alias("t_ord"),
        F.count(F.when(F.col("op") == "t", 1)).alias("truncates"),
        # Most events leave no TOAST value unchanged: collect only the non-empty lists,
        # and null where none is (cheaper to bring back than an empty list).
        _nonempty(
            F.array_distinct(F.flatten(F.collect_set(F.when(F.size("toast") > 0, F.col("toast")))))
        ).alias("toast"),
        F.min("k_long").alias("kl_min"),
        F.max("k_long").alias("kl_max"),
        F.min("k_str").alias("ks_min"),
        F.max("k_str").alias("ks_max"),
        # A null in the bounds column means some event had no usable key value.
        F.max(F.col("k_long").isNull() & F.col("k_str").isNull()).alias("k_null"),
        # Any event but an insert: the insert-only MERGE is then out of the question.
        F.max(F.col("op") != "c").alias("not_insert"),
        F.max(end).alias("has_end"),
        F.max(F.when(end, F.col("dcs"))).alias("dcs"),
        F.max("ts").alias("ts"),
        # Where the error message points: only for records that can't be used.
        F.when(F.col("bad").isNotNull(), first["part"]).alias("first_part"),
        F.when(F.col("bad").isNotNull(), first["off"]).alias("first_off"),
    ]


def collect(
    tables: Sequence[tuple[DataFrame, str | None]],
    markers: DataFrame,
    watermark: int,
    message_collection: str,
    now_ms: int,
    cache: ColumnCache,
) -> tuple[list[TableStats], list[MarkerStats], list[BadRecord]]:
    """Run the batch's one aggregation. `tables`: (decoded events, first key column or None).
    Records read by this batch have no first-seen time yet (batch.py): they were seen `now_ms`.
    `cache`: the processor's, for the expressions every batch builds alike."""
    parts = [_data_rows(df, key, watermark, cache) for df, key in tables] + [
        _marker_rows(markers, watermark, cache)
    ]
    rows = reduce(DataFrame.unionByName, parts)
    agg = (
        rows.groupBy(*cache.get("summary-groups", _group_columns))
        .agg(*cache.get("summary-aggregates", _aggregates))
        # As Arrow, converted a slice at a time: a catch-up batch brings back ~185k of these
        # rows, and as pickled Rows (built one by one, each field looked up by name) they took
        # about 10 s of the driver's Python per batch and raised its RSS by ~500 MB.
        .toArrow()
    )
    data: list[TableStats] = []
    marks: list[MarkerStats] = []
    bad = [
        BadRecord(r["topic"], r["first_part"], r["first_off"], r["bad"], r["records"])
        for r in agg.filter(pc.is_valid(agg["bad"])).to_pylist()
    ]
    usable_rows = agg.filter(pc.is_null(agg["bad"]))
    for part in usable_rows.to_batches(max_chunksize=_SLICE_ROWS):
        col = _columns(part)
        for i in range(part.num_rows):
            seen = col["seen"][i]
            if seen is None:
                seen = now_ms
            if col["kind"][i] == "d":
                if col["k_null"][i]:
                    low = high = None
                elif col["kl_min"][i] is not None:
                    low, high = col["kl_min"][i], col["kl_max"][i]
                else:
                    low, high = col["ks_min"][i], col["ks_max"][i]
                toast = col["toast"][i]
                data.append(
                    TableStats(
                        tx_id=col["tx"][i],
                        collection=col["coll"][i],
                        topic=col["topic"][i],
                        commit_lsn=col["lsn"][i],
                        events=col["events"][i],
                        records=col["records"][i],
                        first_seen_ms=seen,
                        truncate_order=col["t_ord"][i],
                        truncates=col["truncates"][i],
                        toast_columns=frozenset(toast) if toast else _NO_COLUMNS,
                        key_min=low,
                        key_max=high,
                        only_inserts=not col["not_insert"][i],
                    )
                )
            else:
                expected = {
                    sys.intern(d["data_collection"]): d["event_count"]
                    for d in (col["dcs"][i] or ())
                    if d["data_collection"] != message_collection
                }
                marks.append(
                    MarkerStats(
                        col["tx"][i],
                        col["lsn"][i],
                        bool(col["has_end"][i]),
                        expected,
                        col["records"][i],
                        seen,
                        col["ts"][i],
                    )
                )
    bad.sort(key=lambda b: (b.topic, b.partition, b.offset))
    return data, marks, bad
