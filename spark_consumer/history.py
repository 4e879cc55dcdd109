"""SCD type 2 history of a source table (`history = true`, lake_options.py), at
`<lake>/_walbridge/history/<schema>/<table>`: the source columns plus `__valid_from_lsn`,
`__valid_to_lsn` (null while open), `__valid_from`, `__valid_to` (commit timestamps),
`__is_current` and `__op` (the op that opened the version: c, r or u).

Exact to the transaction, because the batch applies whole transactions in commit order:
- one version per key per source transaction that changed it (several changes to a row in one
  transaction are one version, its state at the commit);
- a change closes the open version at exactly its commit and opens the next; a change that
  touches only untracked columns (`track_columns` / `ignore_columns`) updates the open version
  in place instead;
- a delete closes the version; a key change (d old key + c new key) closes the old key's and
  opens the new key's; a truncate closes every open version at its commit;
- an unchanged TOAST value is carried from the key's previous version (or from the old key's,
  across a key change), never written as null or as the sentinel.

How: the versions valid at the batch's start (`__valid_from_lsn <= lo < __valid_to_lsn`, or
open) of the keys the batch touches, and the batch's events, form each key's timeline; a
truncate adds a delete of every key at its commit. Windows over the timeline carry TOAST
values, keep each transaction's last state, mark the states that open a version and group the
rest with the version they update; one MERGE on (key, `__valid_from_lsn`) writes the versions.
A replay reads the same versions valid at the batch's start (the batch only closes them later
and adds versions after it), so it computes and writes the same rows again: nothing changes.

Most batches need none of those versions' values: without untracked columns, TOAST columns,
truncates or snapshot reads, every change opens a version, and the versions valid at the start
only need closing at each key's first commit in the batch. Then the timeline is the batch's own
events, and the MERGE closes the open versions itself (one "closer" source row per key, matched
to the key's open version opened before that commit). That saves reading the open versions,
which for changes spread over the whole key range is most of the history's live part. A replay
finds the versions it closed no longer open and the ones it wrote by their `__valid_from_lsn`,
so it writes the same rows again, as the full form does.
"""

from __future__ import annotations

import logging
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark.sql.window import Window

from spark_consumer import file_stats, lake_state, merge_sql
from spark_consumer.cache_level import CACHE
from spark_consumer.columns import COMMIT_LSN, OP, TOAST, TOTAL_ORDER, TS_MS
from spark_consumer.errors import ApplyError
from spark_consumer.key_change_toast import resolve_moved_toast
from spark_consumer.lake_options import TableOptions
from spark_consumer.lake_state import DELETION_VECTORS
from spark_consumer.merge import check_names
from spark_consumer.merge_target import _sql_path
from spark_consumer.table_changes import TableChanges

FROM_LSN, TO_LSN = "__valid_from_lsn", "__valid_to_lsn"
FROM_TS, TO_TS = "__valid_from", "__valid_to"
CURRENT, HIST_OP = "__is_current", "__op"
HISTORY_META = (FROM_LSN, TO_LSN, FROM_TS, TO_TS, CURRENT, HIST_OP)

log = logging.getLogger("walbridge.consumer")

# Timeline working columns: not Avro names, so no source column can have them.
_LSN, _ORD, _OP, _TS, _PRIOR, _TOAST = "#lsn", "#ord", "#op", "#ts", "#prior", "#toast"
_KIND = "#kind"  # a MERGE source row: a version ("v"), or a closer of a key's open one ("c")


def _meta_fields() -> list[StructField]:
    return [
        StructField(FROM_LSN, LongType(), False),
        StructField(TO_LSN, LongType(), True),
        StructField(FROM_TS, TimestampType(), True),
        StructField(TO_TS, TimestampType(), True),
        StructField(CURRENT, BooleanType(), False),
        StructField(HIST_OP, StringType(), True),
    ]


def _ensure(spark: SparkSession, path: str, tc: TableChanges) -> tuple[StructType, bool]:
    """Create the history table, or add the source columns it lacks; its schema, and whether
    it holds no row (just created, or no data file in its version)."""
    types = {f.name: f.dataType for f in tc.changes.schema.fields if f.name in tc.columns}
    lake = lake_state.read(spark, path)
    if not lake.exists:
        schema = StructType([StructField(c, types[c], True) for c in tc.columns] + _meta_fields())
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(path)
            .addColumns(schema)
            # Open and closed versions never share a file: a batch's MERGE (and the full
            # form's read) finds the open ones in a partition as large as the source table,
            # and skips the closed ones' files by their `__valid_to_lsn` statistics. Unsplit,
            # every file soon held some open version, and every batch joined against the
            # whole history, a cost growing with it.
            .partitionedBy(CURRENT)
            .property("walbridge.key", ",".join(tc.key))
            # As the current-state table (merge_target.py): closing a version marks its row
            # in a deletion vector instead of rewriting its whole file. Changes spread over
            # the key range touch every file of the open versions, so without them each
            # batch rewrote the whole open partition, a table as large as the source's.
            .property(DELETION_VECTORS, "true" if tc.deletion_vectors else "false")
        )
        # A wide table keeps statistics for the columns the batches prune files by.
        stats = file_stats.stats_columns(schema, tc.key[0], FROM_LSN, TO_LSN)
        if stats is not None:
            builder = builder.property(file_stats.STATS_COLUMNS_PROPERTY, stats)
        builder.execute()
        return schema, True
    empty = lake.files == 0
    new = [c for c in tc.columns if c not in lake.columns]
    if not new:
        return lake.schema, empty
    cols = ", ".join(f"`{c}` {types[c].simpleString()}" for c in new)
    spark.sql(f"ALTER TABLE {_sql_path(path)} ADD COLUMNS ({cols})")
    return lake_state.read(spark, path).schema, empty


def _still_open(lo: int, t: str = "") -> Column:
    """Versions not closed before the batch's first commit: every version the batch can touch
    (those valid at its start, and on a replay those it wrote). Closed versions are most of a
    long history; Delta skips their files by the column's statistics, so a batch's cost follows
    its own changes, not the history's length."""
    return F.col(f"{t}{TO_LSN}").isNull() | (F.col(f"{t}{TO_LSN}") > lo)


def _prior(
    spark: SparkSession,
    path: str,
    tc: TableChanges,
    lo: int,
    types: dict[str, DataType],
    whole: bool,
) -> DataFrame:
    """The versions valid at the batch's start, as timeline rows (of the batch's key range
    unless `whole`: a truncate closes every open version)."""
    columns = tc.columns
    hist = spark.read.format("delta").load(path)
    valid = (F.col(FROM_LSN) <= lo) & _still_open(lo)
    if not whole and (bounds := merge_sql.key_range(tc, "")) is not None:
        valid = valid & bounds
    return hist.filter(valid).select(
        *[
            (F.col(c) if c in hist.columns else F.lit(None)).cast(types[c]).alias(c)
            for c in columns
        ],
        F.col(FROM_LSN).alias(_LSN),
        F.lit(-1).cast("long").alias(_ORD),
        F.col(HIST_OP).alias(_OP),
        F.col(FROM_TS).alias(_TS),
        F.lit(True).alias(_PRIOR),
        F.array().cast("array<string>").alias(_TOAST),
    )


def _events(changes: DataFrame, columns: tuple[str, ...]) -> DataFrame:
    return changes.filter(F.col(OP).isin("c", "r", "u", "d")).select(
        *columns,
        F.col(COMMIT_LSN).alias(_LSN),
        F.col(TOTAL_ORDER).alias(_ORD),
        F.col(OP).alias(_OP),
        F.timestamp_millis(F.col(TS_MS)).alias(_TS),
        F.lit(False).alias(_PRIOR),
        F.col(TOAST).alias(_TOAST),
    )


def _truncate_deletes(
    spark: SparkSession, keys: DataFrame, points: list[tuple[int, int, int | None]]
) -> DataFrame:
    """A delete of every key at each truncate's commit (a delete of an absent key is nothing)."""
    # Built in the JVM: a frame of Python rows would start a Python worker for its task.
    at = spark.range(1).select(
        F.inline(
            F.array(
                *[
                    F.struct(
                        F.lit(lsn).cast("long").alias(_LSN),
                        F.lit(order).cast("long").alias(_ORD),
                        F.lit(ts).cast("long").alias("ts"),
                    )
                    for lsn, order, ts in points
                ]
            )
        )
    )
    return keys.crossJoin(F.broadcast(at)).select(
        *keys.columns,
        F.col(_LSN),
        F.col(_ORD),
        F.lit("d").alias(_OP),
        F.timestamp_millis(F.col("ts")).alias(_TS),
        F.lit(False).alias(_PRIOR),
        F.array().cast("array<string>").alias(_TOAST),
    )


def _carry_toast(timeline: DataFrame, key: tuple[str, ...], toast_cols: list[str]) -> DataFrame:
    """Each unchanged TOAST value from the key's latest earlier state that carried one.

    `#missing`: a state whose value has no such earlier state, and no snapshot read of the key
    follows it in the batch. During a snapshot that is expected: a row updated before its
    chunk was read has no version yet, and the snapshot reads it later (the watermark method
    drops a chunk's row that a streamed change touched, and reads it again by key when that
    change left a TOAST value unchanged: docs/snapshots.md). The state then holds null there,
    as the current-state table's row does, until the read opens the next version."""
    by_key = Window.partitionBy(*key).orderBy(_LSN, _ORD)
    upto = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    read_later = F.max((F.col(_OP) == "r").cast("int")).over(
        by_key.rowsBetween(1, Window.unboundedFollowing)
    )
    exprs: dict[str, Column] = {}
    missing = F.lit(False)
    for c in toast_cols:
        carried = (F.col(_OP) != "d") & ~F.array_contains(F.col(_TOAST), c)
        found = F.last(F.when(carried, F.struct(F.col(c).alias("v"))), ignorenulls=True).over(upto)
        exprs[c] = found["v"]
        missing = missing | ((F.col(_OP) != "d") & found.isNull())
    no_read_later = F.coalesce(read_later, F.lit(0)) == 0
    return timeline.withColumns({**exprs, "#missing": missing & no_read_later})


def _versions(states: DataFrame, tc: TableChanges, opts: TableOptions) -> DataFrame:
    """Each key's versions from its transaction-level states (one per key and commit)."""
    key = tc.key
    values = [c for c in tc.columns if c not in key]
    tracked = [c for c in values if opts.tracked(c)]
    order = Window.partitionBy(*key).orderBy(_LSN)
    prev = F.lag(F.struct(F.col(_OP).alias("op"), *[F.col(c) for c in values])).over(order)
    same_tracked = reduce(
        lambda a, b: a & b, [prev[c].eqNullSafe(F.col(c)) for c in tracked], F.lit(True)
    )
    same_all = reduce(
        lambda a, b: a & b, [prev[c].eqNullSafe(F.col(c)) for c in values], F.lit(True)
    )
    # Whether the state opens a version: always after nothing or a delete; with untracked
    # columns, only when a tracked one changed; a snapshot read of an unchanged row, never.
    if opts.tracks_subset:
        changed = ~same_tracked
    else:
        changed = F.when(F.col(_OP) == "r", ~same_all).otherwise(F.lit(True))
    opener = F.col(_PRIOR) | prev.isNull() | (prev["op"] == "d") | changed
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    marked = states.withColumn(
        "#opener", F.when(F.col(_OP) == "d", F.lit(False)).otherwise(opener)
    ).withColumns(
        {
            "#group": F.sum(F.col("#opener").cast("long")).over(upto),
            "#next": F.lead(F.struct(F.col(_LSN).alias("lsn"), F.col(_TS).alias("ts"))).over(order),
        }
    )
    first = F.min_by(
        F.struct(F.col(_LSN).alias("lsn"), F.col(_TS).alias("ts"), F.col(_OP).alias("op")),
        F.col(_LSN),
    )
    grouped = (
        marked.filter(F.col(_OP) != "d")
        .groupBy(*key, "#group")
        .agg(
            first.alias("#first"),
            F.max_by(F.struct(*[F.col(c) for c in values]), F.col(_LSN)).alias("#last"),
            F.max_by(F.col("#next"), F.col(_LSN)).alias("#end"),
        )
    )
    return grouped.select(
        *key,
        *[F.col("#last")[c].alias(c) for c in values],
        F.col("#first.lsn").alias(FROM_LSN),
        F.col("#end.lsn").alias(TO_LSN),
        F.col("#first.ts").alias(FROM_TS),
        F.col("#end.ts").alias(TO_TS),
        F.col("#end").isNull().alias(CURRENT),
        F.col("#first.op").alias(HIST_OP),
    )


def write(spark: SparkSession, path: str, tc: TableChanges, opts: TableOptions) -> int:
    """Write the batch's share of the table's history; the history table's Delta version."""
    if not tc.key:
        raise ApplyError(
            f"table {tc.name}: history = true needs a key (a primary key or replica identity "
            "index); the table has none"
        )
    if tc.commit_lsns is None:
        raise ApplyError(f"table {tc.name}: no commit range for its history")
    check_names(tc.name, (*tc.columns, *tc.key))
    lo = tc.commit_lsns[0]
    schema, empty = _ensure(spark, path, tc)
    types = {f.name: f.dataType for f in tc.changes.schema.fields if f.name in tc.columns}
    changes = tc.changes
    toast_cols = [c for c in tc.columns if c in tc.toast_columns]
    events = _events(changes, tc.columns)
    points: list[tuple[int, int, int | None]] = []
    if tc.truncate is not None:
        points = [
            (r[COMMIT_LSN], r[TOTAL_ORDER], r[TS_MS])
            for r in changes.filter(F.col(OP) == "t")
            .select(COMMIT_LSN, TOTAL_ORDER, TS_MS)
            .collect()
        ]
    if not points and _short_form_fits(tc, opts, toast_cols):
        # The MERGE reads its source twice (session.py: no materialized source): cached, and
        # computed whole by the look for snapshot reads, which would need the full form.
        source = _short_form_source(events, tc).persist(CACHE)
        try:
            if not source.filter(F.col(HIST_OP) == "r").limit(1).collect():
                log.debug("history of %s: short form", tc.name)
                if empty:
                    log.debug("history of %s: appended", tc.name)
                    _append(path, source.filter(F.col(_KIND) == "v"), tc, schema)
                else:
                    _merge(spark, path, source, tc, schema, lo, whole=False, closers=True)
                return lake_state.read(spark, path).version
        finally:
            source.unpersist()
    log.debug("history of %s: full form", tc.name)
    prior_all = _prior(spark, path, tc, lo, types, whole=bool(points))
    batch_keys = events.select(*tc.key).distinct()
    if points:  # a truncate closes every open version, touched by the batch or not
        prior = prior_all
        keys = batch_keys.unionByName(prior_all.select(*tc.key)).distinct()
    else:
        prior = prior_all.join(batch_keys, list(tc.key), "left_semi")
    if toast_cols:
        # A key change's create takes its unchanged TOAST values from the old key's version.
        lake_like = prior.select(*tc.key, *toast_cols)
        changes = resolve_moved_toast(changes, lake_like, tc.key, toast_cols)
        events = _events(changes, tc.columns)
    timeline = prior.unionByName(events)
    if points:
        # The deletes carry no row: their columns are null.
        deletes = _truncate_deletes(spark, keys, points)
        timeline = timeline.unionByName(deletes, allowMissingColumns=True)
    if toast_cols:
        timeline = _carry_toast(timeline, tc.key, toast_cols).persist(CACHE)
        # While the table's snapshot is unfinished, the read may come in a later batch.
        lost = (
            []
            if tc.snapshotting
            else timeline.filter(F.col("#missing")).select(*tc.key, _LSN).limit(3).collect()
        )
        if lost:
            timeline.unpersist()
            raise ApplyError(
                f"table {tc.name}: unchanged TOAST value(s) with no earlier version in the "
                "history (was history turned on after the rows were written?): "
                + "; ".join(f"{r.asDict()}" for r in lost)
            )
        timeline = timeline.drop("#missing")
    versions = _versions(_last_in_tx(timeline, tc.key), tc, opts).persist(CACHE)
    try:
        if empty:
            log.debug("history of %s: appended", tc.name)
            _append(path, versions, tc, schema)
        else:
            _merge(spark, path, versions, tc, schema, lo, whole=bool(points))
    finally:
        versions.unpersist()
        if toast_cols:
            timeline.unpersist()
    return lake_state.read(spark, path).version


def _short_form_fits(tc: TableChanges, opts: TableOptions, toast_cols: list[str]) -> bool:
    """Whether every change of the batch may open a version with no earlier version's values:
    no untracked columns, no TOAST column, no snapshot in progress (whether a snapshot read
    changed its row needs the open version; the caller also looks for reads in the changes).
    A truncate is the caller's to rule out."""
    return not (opts.tracks_subset or toast_cols or tc.snapshotting)


def _last_in_tx(timeline: DataFrame, key: tuple[str, ...]) -> DataFrame:
    """The state of each key at each commit: its transaction's last change."""
    last = Window.partitionBy(*key, _LSN).orderBy(F.desc(_ORD))
    return (
        timeline.withColumn("#rank", F.row_number().over(last))
        .filter(F.col("#rank") == 1)
        .drop("#rank")
    )


def _short_form_source(events: DataFrame, tc: TableChanges) -> DataFrame:
    """The short form's MERGE source: every transaction's last change of a key opens a version
    (a delete opens none) that the key's next one closes, and each key's first such change
    closes the version open before the batch (a closer). One window over the key's changes in
    commit order gives all of it: the full form's grouping would make each group one state."""
    key = tc.key
    values = [c for c in tc.columns if c not in key]
    in_order = Window.partitionBy(*key).orderBy(_LSN, _ORD)
    last_in_tx = F.lead(_LSN).over(in_order)
    states = events.withColumn("#later", last_in_tx).filter(
        F.col("#later").isNull() | (F.col("#later") != F.col(_LSN))
    )
    by_commit = Window.partitionBy(*key).orderBy(_LSN)
    states = states.withColumns(
        {
            "#next": F.lead(F.struct(F.col(_LSN).alias("lsn"), F.col(_TS).alias("ts"))).over(
                by_commit
            ),
            "#first": F.lag(_LSN).over(by_commit).isNull(),
        }
    )
    versions = states.filter(F.col(_OP) != "d").select(
        *key,
        *values,
        F.col(_LSN).alias(FROM_LSN),
        F.col("#next.lsn").alias(TO_LSN),
        F.col(_TS).alias(FROM_TS),
        F.col("#next.ts").alias(TO_TS),
        F.col("#next").isNull().alias(CURRENT),
        F.col(_OP).alias(HIST_OP),
        F.lit("v").alias(_KIND),
    )
    closers = states.filter(F.col("#first")).select(
        *key,
        F.col(_LSN).alias(FROM_LSN),
        F.col(_TS).alias(FROM_TS),
        F.lit("c").alias(_KIND),
    )
    return versions.unionByName(closers, allowMissingColumns=True)


def _append(path: str, versions: DataFrame, tc: TableChanges, schema: StructType) -> None:
    """Write the versions into a history table that holds no row: what the MERGE would do (it
    can match nothing, so it inserts every version and no closer finds a version to close),
    without its join and its second pass over the source. One commit, as the MERGE's. A replay
    finds the rows this wrote, so it takes the MERGE, which writes the same rows again."""
    types = {f.name: f.dataType for f in schema.fields}
    sent = set(tc.columns) | set(HISTORY_META)
    # A column the source no longer sends is NULL in a new version, as in the MERGE's insert.
    rows = versions.select(
        *[
            (F.col(c) if c in sent else F.lit(None)).cast(types[c]).alias(c)
            for c in schema.fieldNames()
        ]
    )
    rows.write.format("delta").mode("append").save(path)


def _merge(
    spark: SparkSession,
    path: str,
    versions: DataFrame,
    tc: TableChanges,
    schema: StructType,
    lo: int,
    whole: bool,
    closers: bool = False,
) -> None:
    """MERGE the versions on (key, `__valid_from_lsn`). With `closers`, the source also holds
    the closers of `_short_form_source`, each matched to its key's version still open and
    opened before the closer's commit (none on a replay, which closed it already): that version
    is closed there. A target version matches at most one source row: a closer's is opened
    before the batch's first commit of the key, a version's at or after it."""
    target_cols = [f.name for f in schema.fields if f.name not in HISTORY_META]
    check_names(tc.name, target_cols)
    keys = F.expr(" AND ".join(f"t.`{k}` = s.`{k}`" for k in tc.key))
    same_version = F.col(f"t.{FROM_LSN}") == F.col(f"s.{FROM_LSN}")
    is_closer = F.col(f"s.`{_KIND}`") == "c"
    if closers:
        closes = F.col(f"t.{TO_LSN}").isNull() & (F.col(f"t.{FROM_LSN}") < F.col(f"s.{FROM_LSN}"))
        on = keys & F.when(is_closer, closes).otherwise(same_version)
    else:
        on = keys & same_version
    # Target-only predicates, so Delta prunes the files no matched version can be in: those
    # of closed versions, and (without a truncate) of keys outside the batch's range.
    on = on & _still_open(lo, "t.")
    if not whole and (bounds := merge_sql.key_range(tc)) is not None:
        on = on & bounds
    values: dict[str, str | Column] = {
        f"`{c}`": F.col(f"s.`{c}`") for c in target_cols if c in tc.columns
    }
    meta: dict[str, str | Column] = {m: F.col(f"s.{m}") for m in HISTORY_META}
    # A column the source no longer sends keeps its value in a version it changes, and is
    # NULL in a new one.
    inserts: dict[str, str | Column] = {
        **{f"`{c}`": F.lit(None) for c in target_cols if c not in tc.columns},
        **values,
        **meta,
    }
    sets = {k: v for k, v in values.items() if k.strip("`") not in tc.key}
    merge = DeltaTable.forPath(spark, path).alias("t").merge(versions.alias("s"), on)
    if closers:
        close: dict[str, str | Column] = {
            TO_LSN: F.col(f"s.{FROM_LSN}"),
            TO_TS: F.col(f"s.{FROM_TS}"),
            CURRENT: F.lit(False),
        }
        merge = (
            merge.whenMatchedUpdate(condition=is_closer, set=close)
            .whenMatchedUpdate(set={**sets, **meta})
            .whenNotMatchedInsert(condition=~is_closer, values=inserts)
        )
    else:
        merge = merge.whenMatchedUpdate(set={**sets, **meta}).whenNotMatchedInsert(values=inserts)
    merge.execute()
