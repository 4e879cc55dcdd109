"""One aggregation per batch: decoded events and markers -> one row per (transaction, table)
and per transaction's markers, plus the records that failed to decode; and the plan from it.

Everything the batch needs to know before it writes (completeness, truncates, unchanged-TOAST
columns, key bounds for file pruning, undecodable records) comes out of this single Spark job,
so a small batch does not pay for a dozen separate aggregations (a large one adds one small
job for its tables' work, see below). A small batch brings the rows
to the driver and plans there (`reassembly.plan`). A large one (a catch-up batch holds tens of
thousands of transactions) keeps them in Spark: Spark decides each transaction's completeness,
one row per transaction comes back for the cut in commit order (`reassembly.cut`), then one
row per table for the MERGEs. The driver's memory then follows the transactions, not the
tables they touch; its rows are a fifth of what the summary was on TPC-B-shaped work.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegerType, LongType, ShortType, StringType

from spark_consumer import codegen_stable, reassembly, session_conf
from spark_consumer.cache_level import CACHE
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
from spark_consumer.reassembly import (
    DATA_SCHEMA,
    EXPECTED_SCHEMA,
    MARKER_SCHEMA,
    TX_SCHEMA,
    WORK_SCHEMA,
    Plan,
    Summary,
    TxSummary,
)
from spark_consumer.union import union_all

# A batch's summary has about one group per record on short transactions, and its collect_set
# makes it an object hash aggregate, which gives up on hashing after 128 groups per task and
# sorts instead: both the hashing and the sort were paid. A sort aggregate sorts at once. 1M
# summary rows alone: 2.9 s against 2.4 s. A 1M-transaction catch-up (bench_consumer_catchup.py,
# one run each) spent 49 s in decode+summary while the setting went to the consumer's session,
# which the streaming query's frames do not use, and 41 s once it reached theirs (that run
# also stopped coalescing a union of few tables, see `collect`). Only for the summary's jobs
# (`summary_settings`): where groups are few and large (Delta's deletion-vector bitmaps per
# file) the hash map is the faster.
_OBJECT_HASH_AGGREGATE = "spark.sql.execution.useObjectHashAggregateExec"
_ADAPTIVE = "spark.sql.adaptive.enabled"
# A summary over more tables than this reads its union in one task per core (`collect`).
_COALESCE_ABOVE_PARTS = 16

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


@contextmanager
def summary_settings(spark: SparkSession) -> Iterator[None]:
    """Around the summary's jobs (`collect`, `SparkStats.plan`): sort aggregates, and no
    adaptive execution. `spark` must be the session of the batch's frames: in a streaming
    query that is the query's own copy of the consumer's session (settings made on the
    consumer's session do not reach it). Session settings: the batch runs no other job on it
    meanwhile.

    A streaming query's session already runs without adaptive execution; a batch handed
    frames of another session (the benchmarks, tests) would materialize every table's cache in
    a Spark job of its own before the summary's, about 100 jobs for 100 tables."""
    with (
        session_conf.changed(spark, _OBJECT_HASH_AGGREGATE, "false"),
        session_conf.changed(spark, _ADAPTIVE, "false"),
    ):
        yield


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


def _group_columns() -> list[Column]:
    # The transaction first: the key a large batch's rows are spread by (`collect`), and the
    # one the per-transaction aggregation over the groups (`stats_of`) groups by.
    return [F.col(c) for c in ("tx", "kind", "bad", "coll", "topic")]


def _aggregates() -> list[Column]:
    end = F.col("status") == "END"
    first = F.min(F.struct("part", "off"))
    return [
        F.max("lsn").alias("lsn"),
        # size(collect_set) rather than count_distinct: one aggregate, no Expand stage.
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


@dataclass(frozen=True)
class DriverStats:
    """A small batch's summary, brought to the driver and planned there."""

    summary: Summary
    bad: list[BadRecord]
    frames: tuple[DataFrame, ...] = ()  # none kept in Spark

    def plan(self, watermark: int) -> Plan:
        return reassembly.plan(self.summary, watermark)

    def describe(self, pending: tuple[TxSummary, ...]) -> tuple[TxSummary, ...]:
        return pending  # `plan` described them


@dataclass(frozen=True)
class SparkStats:
    """A large batch's summary, kept in Spark (`groups`, cached: one of `frames`, which the
    batch drops when it ends), and one row per transaction on the driver (`TX_SCHEMA`)."""

    groups: DataFrame
    transactions: pa.Table
    bad: list[BadRecord]
    message_collection: str
    now_ms: int
    cache: ColumnCache

    @property
    def frames(self) -> tuple[DataFrame, ...]:
        return (self.groups,)

    def plan(self, watermark: int) -> Plan:
        cut = reassembly.cut(self.transactions, watermark)
        if not cut.applied_transactions:
            return cut.plan((), cut.oldest)
        applied = (
            self.groups.filter(
                self.cache.get("summary-usable-data", _usable_data)
                & codegen_stable.greater("lsn", watermark)
                & codegen_stable.at_most("lsn", cut.watermark_after)
            )
            .groupBy("coll")
            .agg(*self.cache.get("summary-work", _work_aggregates))
            .toArrow()
        )
        return cut.plan(reassembly.table_works(_typed(applied, WORK_SCHEMA)), cut.oldest)

    def describe(self, pending: tuple[TxSummary, ...]) -> tuple[TxSummary, ...]:
        """What the ended ones among `pending` miss (for error messages: one more job)."""
        names = [t.tx_id for t in pending if t.has_end]
        if not names:
            return pending
        rows = self.groups.filter(F.col("tx").isin(names)).toArrow()
        summary, _bad = summarize(rows, self.message_collection, self.now_ms)
        return reassembly.describe(pending, summary)


def collect(
    tables: Sequence[tuple[DataFrame, str | None]],
    markers: DataFrame,
    watermark: int,
    message_collection: str,
    now_ms: int,
    cache: ColumnCache,
    *,
    in_spark: bool = False,
) -> DriverStats | SparkStats:
    """Run the batch's one aggregation. `tables`: (decoded events, first key column or None).
    Records read by this batch have no first-seen time yet (batch.py): they were seen `now_ms`.
    `cache`: the processor's, for the expressions every batch builds alike. `in_spark`: plan
    the batch in Spark (a large batch), else on the driver."""
    parts = [_data_rows(df, key, watermark, cache) for df, key in tables] + [
        _marker_rows(markers, watermark, cache)
    ]
    rows = union_all(parts)
    if len(parts) > _COALESCE_ABOVE_PARTS:
        # The union has a partition for each of every table's, and each task reading one
        # deserializes the whole union's lineage: tables x tables work in a batch touching
        # hundreds of tables. One partition per core reads them in a few tasks. Not for a few
        # tables: there each partition keeps a task of its own, spread over the cores.
        rows = rows.coalesce(markers.sparkSession.sparkContext.defaultParallelism)
    if in_spark:
        # Spread by transaction before aggregating: both aggregations (per transaction and
        # table, then per transaction) then find their groups together, one exchange and one
        # sort instead of a partial aggregation, two exchanges and more sorts. A summary of
        # 150k TPC-B transactions (1.05M records, synthetic, warm JVM): 2.97-3.08 s against
        # 3.30-3.42 s. A small batch's groups go to the driver after the first aggregation.
        rows = rows.repartition(F.col("tx"))
    groups = rows.groupBy(*cache.get("summary-groups", _group_columns)).agg(
        *cache.get("summary-aggregates", _aggregates)
    )
    return stats_of(groups, message_collection, now_ms, cache, in_spark=in_spark)


def stats_of(
    groups: DataFrame,
    message_collection: str,
    now_ms: int,
    cache: ColumnCache,
    *,
    in_spark: bool = False,
) -> DriverStats | SparkStats:
    """The batch's summary from its aggregation (`_group_columns` + `_aggregates`, not run
    yet), planned on the driver or in Spark."""
    if not in_spark:
        # As Arrow, and planned as Arrow: as pickled Rows, then as Python objects, a
        # catch-up batch's rows cost the driver seconds and hundreds of MB.
        summary, bad = summarize(groups.toArrow(), message_collection, now_ms)
        return DriverStats(summary, bad)
    groups = groups.persist(CACHE)
    per_tx = cache.get(("summary-per-tx", message_collection), lambda: _per_tx(message_collection))
    try:
        rows = (
            groups.filter(F.col("bad").isNull())
            .groupBy("tx")
            .agg(*per_tx[0])
            .select(*per_tx[1])
            .unionByName(
                groups.filter(F.col("bad").isNotNull()).select(*_BAD), allowMissingColumns=True
            )
            .toArrow()
        )
    except BaseException:
        groups.unpersist()  # the batch drops the frames it is handed; this one it never got
        raise
    txs = rows.filter(pc.is_null(rows["bad"]))
    txs = _filled(txs.select(TX_SCHEMA.names), "seen", now_ms)
    return SparkStats(groups, _typed(txs, TX_SCHEMA), _bad(rows), message_collection, now_ms, cache)


# Where an unusable group's error message points (see `_aggregates`).
_BAD = ["bad", "topic", "first_part", "first_off", "records"]


def _usable_data() -> Column:
    return F.col("bad").isNull() & (F.col("kind") == "d")


def _per_tx(message_collection: str) -> tuple[list[Column], list[Column]]:
    """The aggregates per transaction over its usable groups, and the `TX_SCHEMA` columns
    from them. Complete: an END, and its table collections' counts (the messages' left out)
    equal, as sorted (table, count) lists without zeros, the tables' counts of distinct events
    (`reassembly._differs` on the driver: a table absent from one side counts 0)."""
    data = F.col("kind") == "d"
    counted = F.when(
        data & (F.col("events") != 0),
        F.struct(F.col("coll").alias("c"), F.col("events").cast("long").alias("n")),
    )
    aggregates = [
        F.max("lsn").alias("lsn"),
        F.min("seen").alias("seen"),
        F.sum("records").alias("records"),
        F.max("has_end").alias("has_end"),
        F.max("ts").alias("ts"),
        F.max("dcs").alias("dcs"),  # only an END's group has them
        F.array_sort(F.collect_list(counted)).alias("counted"),
    ]
    named = F.transform(
        F.coalesce(
            F.col("dcs"), F.array().cast("array<struct<data_collection:string,event_count:long>>")
        ),
        lambda x: F.struct(x["data_collection"].alias("c"), x["event_count"].alias("n")),
    )
    expected = F.array_sort(
        F.filter(named, lambda x: (x["c"] != F.lit(message_collection)) & (x["n"] != 0))
    )
    ended = F.coalesce(F.col("has_end"), F.lit(False))
    columns = [
        F.col("tx"),
        F.col("lsn"),
        F.col("seen"),
        F.col("records"),
        ended.alias("has_end"),
        (ended & (F.col("counted") == expected)).alias("complete"),
        F.col("ts"),
    ]
    return aggregates, columns


def _work_aggregates() -> list[Column]:
    """Per table, in `WORK_SCHEMA`, from the applied transactions' groups (the driver's
    `reassembly._table_work` computes the same from `DATA_SCHEMA` rows)."""
    only_inserts = F.coalesce(~F.col("not_insert"), F.lit(False))
    truncate = F.max(F.when(F.col("t_ord").isNotNull(), F.struct("lsn", "t_ord")))
    toast = F.array_distinct(F.flatten(F.collect_list("toast")))
    return [
        F.min("topic").alias("topic"),
        F.sum("events").alias("events"),
        F.min(F.col("truncates") == F.col("records")).alias("all_t"),
        F.min(only_inserts & (F.col("events") == F.col("records"))).alias("distinct_c"),
        F.max(F.col("events") != F.col("records")).alias("dups"),
        F.max("k_null").alias("k_null"),
        F.min(F.col("kl_min").isNotNull()).alias("long"),
        F.min(F.col("ks_min").isNotNull()).alias("str"),
        F.min("kl_min").alias("kl_min"),
        F.max("kl_max").alias("kl_max"),
        F.min("ks_min").alias("ks_min"),
        F.max("ks_max").alias("ks_max"),
        truncate["lsn"].alias("t_lsn"),
        truncate["t_ord"].alias("t_ord"),
        F.when(F.size(toast) > 0, toast).alias("toast"),
    ]


def _bad(agg: pa.Table) -> list[BadRecord]:
    """The unusable groups (`_BAD` columns), first record first."""
    return sorted(
        (
            BadRecord(r["topic"], r["first_part"], r["first_off"], r["bad"], r["records"])
            for r in agg.filter(pc.is_valid(agg["bad"])).select(_BAD).to_pylist()
        ),
        key=lambda b: (b.topic, b.partition, b.offset),
    )


def _rows(agg: pa.Table, kind: str, columns: list[str]) -> pa.Table:
    """The usable groups of one kind, only the columns asked for: each filter copies what it
    keeps, and a catch-up batch's aggregation is ~70 MB."""
    usable = pc.and_(pc.is_null(agg["bad"]), pc.equal(agg["kind"], kind))
    return agg.select(columns).filter(usable)


def _filled(rows: pa.Table, name: str, value: object) -> pa.Table:
    """`rows` with the nulls of column `name` replaced by `value`."""
    return rows.set_column(rows.schema.get_field_index(name), name, pc.fill_null(rows[name], value))


def _typed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays(
        [rows[f.name].cast(f.type) for f in schema], schema=schema
    )  # Spark's counts are int32 where the planner takes int64


def summarize(
    agg: pa.Table, message_collection: str, now_ms: int
) -> tuple[Summary, list[BadRecord]]:
    """The aggregation's rows (`_group_columns` + `_aggregates`) in the planner's layout, and
    the groups that cannot be used. Pure: no Spark."""
    bad = _bad(agg)
    d = _rows(agg, "d", [n for n in DATA_SCHEMA.names if n != "only_inserts"] + ["not_insert"])
    d = _filled(d, "seen", now_ms)
    d = d.append_column("only_inserts", pc.invert(pc.fill_null(d["not_insert"], True)))
    data = _typed(d, DATA_SCHEMA)
    m = _filled(_rows(agg, "m", [*MARKER_SCHEMA.names, "dcs"]), "seen", now_ms)
    m = _filled(m, "has_end", False)
    marker_rows = _typed(m, MARKER_SCHEMA)
    # The END's data_collections, one row per table collection (not the messages' one).
    # A null list may span values in its buffers; `_rows` filtering gives it none today.
    ended = m.filter(pc.is_valid(m["dcs"]))
    dcs = ended["dcs"].combine_chunks()
    owner = pc.list_parent_indices(dcs)
    named = pc.list_flatten(dcs)
    expected = pa.Table.from_arrays(
        [
            pc.take(ended["tx"].combine_chunks().cast(pa.string()), owner),
            pc.take(ended["lsn"].combine_chunks().cast(pa.int64()), owner),
            pc.struct_field(named, "data_collection").cast(pa.string()),
            pc.struct_field(named, "event_count").cast(pa.int64()),
        ],
        schema=EXPECTED_SCHEMA,
    )
    expected = expected.filter(pc.not_equal(expected["coll"], message_collection))
    return Summary(data, marker_rows, expected), bad
