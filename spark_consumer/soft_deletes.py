"""Soft deletes (`deletes = "soft"`, lake_options.py): a deleted row stays in the current-state
table, flagged `__deleted = true`, with the delete's `_commit_lsn`, `_total_order`, `_op` ('d')
and `_ts_ms`; an insert of the same key later revives it (`__deleted = false`). A truncate
flags every row older than it (`_op` 't').

The same guarded MERGE as merge.py (a matched row changes only if the change is newer by the
dedup key, so a replay changes nothing), with the delete clause turned into an update. The row
a delete leaves keeps its values: the lake's, or, when the batch changed the key before deleting
it (a key inserted and deleted in one batch included), the last values the batch gave it, so
the result does not depend on how transactions fall into batches. A delete of a key neither the
lake nor the batch ever held a row of adds nothing. Always the full MERGE: merge.py's append
forms drop deletes.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_consumer import lake_state, merge, merge_sql
from spark_consumer.cache_level import CACHE
from spark_consumer.collapse import collapse
from spark_consumer.columns import COMMIT_LSN, LAKE_META, OP, TOAST, TOTAL_ORDER, TS_MS
from spark_consumer.key_change_toast import resolve_moved_toast
from spark_consumer.merge_target import _sql_path, ensure_table
from spark_consumer.table_changes import TableChanges

DELETED = "__deleted"
_HAS_PREV = "#has_prev"  # not an Avro name: no source column can have it


def _with_previous_values(changes: DataFrame, tc: TableChanges) -> DataFrame:
    """Deletes take the values of the latest earlier change of their key in the batch (the row
    as it was deleted), flagged `#has_prev`; other changes pass unchanged."""
    order = (
        Window.partitionBy(*tc.key)
        .orderBy(COMMIT_LSN, TOTAL_ORDER)
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    values = [c for c in tc.columns if c not in tc.key]
    prev = F.last(
        F.when(F.col(OP) != "d", F.struct(*[F.col(c) for c in values], F.col(TOAST))),
        ignorenulls=True,
    ).over(order)
    is_d = (F.col(OP) == "d") & prev.isNotNull()
    out = changes.withColumn("#prev", prev)
    exprs: dict[str, Column] = {
        c: F.when(is_d, F.col("#prev")[c]).otherwise(F.col(c)) for c in values
    }
    # The earlier change's unchanged-TOAST list goes with its values.
    exprs[TOAST] = F.when(is_d, F.col("#prev")[TOAST]).otherwise(F.col(TOAST))
    exprs[_HAS_PREV] = F.coalesce(is_d, F.lit(False))
    return out.withColumns(exprs).drop("#prev")


def _ensure_flag(spark: SparkSession, tc: TableChanges) -> merge.Target:
    target = ensure_table(spark, tc)
    if DELETED in target.schema.fieldNames():
        return target
    spark.sql(f"ALTER TABLE {_sql_path(tc.path)} ADD COLUMNS ({DELETED} boolean)")
    table = DeltaTable.forPath(spark, tc.path)
    return merge.Target(table, table.toDF().schema)


def apply(spark: SparkSession, tc: TableChanges) -> merge.Applied:
    merge.check_names(tc.name, (*tc.columns, *tc.key, *tc.toast_columns))
    target = _ensure_flag(spark, tc)
    target_cols = [
        f.name for f in target.schema.fields if f.name not in LAKE_META and f.name != DELETED
    ]
    merge.check_names(tc.name, target_cols)
    changes = tc.changes
    point = tc.truncate
    truncate_ts = None
    if point is not None:
        row = (
            changes.filter((F.col(OP) == "t") & (F.col(COMMIT_LSN) == point[0]))
            .filter(F.col(TOTAL_ORDER) == point[1])
            .select(TS_MS)
            .first()
        )
        truncate_ts = None if row is None else row[TS_MS]
        changes = changes.filter(merge_sql.after(point))
    changes = changes.filter(F.col(OP).isin("c", "r", "u", "d"))
    toast_cols = [c for c in tc.columns if c in tc.toast_columns]
    if toast_cols:
        lake = spark.read.format("delta").load(tc.path)
        changes = resolve_moved_toast(changes, lake, tc.key, toast_cols)
    changes = _with_previous_values(changes, tc)
    collapsed = collapse(
        changes, tc.key, (*tc.columns, _HAS_PREV), toast_cols, cache=tc.cache
    ).persist(CACHE)
    try:
        if toast_cols and not tc.snapshotting:  # an unchanged TOAST value is never invented
            merge._check_toast_targets(target.table, collapsed, tc, toast_cols)
        _merge(target, tc, collapsed, target_cols, toast_cols, truncate_ts)
    finally:
        collapsed.unpersist()
    return merge.Applied(lake_state.read(spark, tc.path), target.table)


def _merge(
    target: merge.Target,
    tc: TableChanges,
    source: DataFrame,
    target_cols: list[str],
    toast_cols: list[str],
    truncate_ts: int | None,
) -> None:
    clauses = merge_sql.merge_clauses(tc.key, tc.columns, target_cols, toast_cols)
    has_prev = F.col(f"s.`{_HAS_PREV}`")
    meta = {m: F.col(f"s.{m}") for m in LAKE_META}
    # A delete keeps the lake's values unless the batch gave the key later ones.
    deleted = {
        name: F.when(has_prev, value).otherwise(F.col(f"t.{name}"))
        for name, value in clauses.sets.items()
        if name.strip("`") not in LAKE_META
    }
    deleted_sets: dict[str, str | Column] = {**deleted, **meta, DELETED: F.lit(True)}
    live_sets: dict[str, str | Column] = {**clauses.sets, DELETED: F.lit(False)}
    inserts: dict[str, str | Column] = {**clauses.inserts, DELETED: F.col(f"s.{OP}") == "d"}
    newer = merge_sql._newer()
    on = merge_sql.key_match(tc)
    builder = (
        target.table.alias("t")
        .merge(source.alias("s"), on)
        .whenMatchedUpdate(F.expr(f"s.{OP} = 'd' AND {newer}"), deleted_sets)
        .whenMatchedUpdate(F.expr(f"s.{OP} <> 'd' AND {newer}"), live_sets)
        .whenNotMatchedInsert((F.col(f"s.{OP}") != "d") | has_prev, inserts)
    )
    if tc.truncate is not None:
        lsn, order = tc.truncate
        builder = builder.whenNotMatchedBySourceUpdate(
            F.expr(merge_sql.before_sql(tc.truncate) + f" AND NOT coalesce(t.{DELETED}, false)"),
            {
                DELETED: F.lit(True),
                COMMIT_LSN: F.lit(lsn).cast("long"),
                TOTAL_ORDER: F.lit(order).cast("long"),
                OP: F.lit("t"),
                TS_MS: F.lit(truncate_ts).cast("long"),
            },
        )
    builder.execute()
