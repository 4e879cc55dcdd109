"""Apply one table's changes of a batch to its Delta table with one guarded MERGE.

- Several changes to one key collapse to the last by (commit_lsn, total_order).
- c/r upsert, u update, d delete; a key change arrives as d(old key) + c(new key).
- t deletes every target row older than the truncate (by the dedup key), so a replay of the
  truncate cannot remove rows written after it.
- Columns in `unchanged_toast` keep the value of the latest earlier change in the batch that
  carried one, else the target's value; a key change's create takes them from the replaced
  row (key_change_toast.py); an update that would have to invent one is an error.
- Matched rows change only if the source's (commit_lsn, total_order) is greater: replay is a
  no-op. Tables without a key are append-only, deduplicated on (commit_lsn, total_order).
- The ON condition also bounds the first key column to the batch's key range (from the batch
  summary), so Delta prunes target files by their statistics; tables are created with deletion
  vectors, so an update marks rows instead of rewriting whole files. Both keep a MERGE's cost
  tied to the batch, not to the table's size. Without deletion vectors (the consumer's
  `lake_deletion_vectors` off, for readers that lack the feature) a MERGE rewrites every file
  it touches; `merge_target.check_deletion_vectors` keeps an existing table from silently
  changing mode.
- A table whose share of the batch is nothing but distinct inserts takes an insert-only MERGE
  (`_inserts_only_apply` explains why that gives exactly the same table): no collapse shuffle,
  no source materialisation, one pass. Still one commit per table per batch.
- When the table has had no commit since the last batch and every key of its share starts
  with an insert, the last changes are simply appended (`_append_applies` gives the argument):
  no join with the target at all. The same holds, whatever the ops, for a table that holds no
  row yet (`_empty_target_applies`): an initial load or a first snapshot chunk is appended. A
  table without a key that has had no commit since the last batch takes a plain append of its
  rows instead of the dedup MERGE (`_keyless_append_applies`).
- What a table's apply needs to know of it (exists, version, key, deletion-vector mode,
  schema) comes from one read of its log (lake_state.py), or from the state this job's own
  last commit left, with the table handle it used (merge_runner.py keeps both across batches).
- The collapsed source is cached here, before the MERGE; Delta's own copy of it (its
  `materializeSource`, to disk) is switched off in session.py.

This module chooses the form and runs it. Its parts live beside it: what a table's apply is
given (table_changes.py), the target table's creation, columns and mode (merge_target.py), the
last change per key (collapse.py) and the MERGE's conditions and assignments (merge_sql.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer import lake_state, merge_sql
from spark_consumer.cache_level import CACHE
from spark_consumer.collapse import FIRST_OP, collapse
from spark_consumer.columns import COMMIT_LSN, LAKE_META, OP, TOAST, TOTAL_ORDER
from spark_consumer.errors import ApplyError
from spark_consumer.key_change_toast import resolve_moved_toast
from spark_consumer.lake_state import DELETION_VECTORS as DELETION_VECTORS  # benchmarks use merge.*
from spark_consumer.lake_state import LakeTable
from spark_consumer.merge_target import KEY_PROPERTY as KEY_PROPERTY  # benchmarks use merge.*
from spark_consumer.merge_target import Target, ensure_table, lake_of
from spark_consumer.table_changes import TableChanges

# The producer's Avro field names (sanitized PostgreSQL names) and this module's derived names
# all match this, so they can stand inside the backticks of the SQL snippets MERGE needs.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_names(table: str, names: Iterable[str]) -> None:
    """Stop on a column name that could break out of a quoted SQL identifier or literal: only
    a hand-altered Delta table or a foreign writer schema can bring one."""
    for name in names:
        if not _PLAIN_NAME.fullmatch(name):
            raise ApplyError(
                f"table {table}: column name {name!r} is not a plain Avro name "
                "([A-Za-z_][A-Za-z0-9_]*); refusing to put it into a MERGE"
            )


def _target_columns(target: Target, tc: TableChanges) -> list[str]:
    cols = [f.name for f in target.schema.fields if f.name not in LAKE_META]
    check_names(tc.name, cols)
    return cols


def _toast_columns(tc: TableChanges) -> list[str]:
    unknown = tc.toast_columns - set(tc.columns)
    if unknown:
        raise ApplyError(
            f"table {tc.name}: unchanged_toast names unknown column(s) {sorted(unknown)}"
        )
    return [c for c in tc.columns if c in tc.toast_columns]


def inserts_only_applies(tc: TableChanges) -> bool:
    """Whether `_inserts_only_apply` gives exactly what the full MERGE gives.

    It does when every change of the table in this batch is an insert ('c'), no event came
    twice, nothing is unchanged-TOAST, and the key is unique at the source. The full MERGE could
    differ only on a key K the lake already holds with an older dedup key D than K's insert P
    (it would update; the insert-only form leaves the row). K existed at D and was inserted at
    P, so the source deleted it (a 'd', or a 't' truncate) at some X with D < X < P. The lake is
    at a transaction boundary L >= the batch's start W (W exactly, or later after a crash between
    two tables' commits or a replay) and still holds K's row from D, so X > L >= W; and
    X < P <= the batch's end. Every complete transaction in (W, end] is in the batch, so X
    would be one of its changes of this table: contradiction, as all of them are inserts. The
    argument needs no knowledge of L, so it holds for replays too; a matched key is simply
    skipped, which is also what the full MERGE does with an equal or newer row (replay).
    Distinct inserts of a unique key also mean at most one change per key: no collapse.

    A key made of every source column (REPLICA IDENTITY FULL without a primary key) is not
    unique at the source (identical rows may be inserted twice), so it keeps the full MERGE;
    snapshot reads ('r') may meet rows the lake holds, so they are not inserts here.
    """
    return (
        tc.only_distinct_inserts and tc.unique_key and tc.truncate is None and not tc.toast_columns
    )


def _inserts_only_apply(target: Target, tc: TableChanges, target_cols: list[str]) -> None:
    source = tc.changes.filter(merge_sql.op_is(tc, "c"))
    on = merge_sql.key_match(tc)
    key_range = merge_sql.key_range(tc)
    if key_range is not None:
        on = on & key_range
    # Insert-only: Delta runs this as an anti join against the (pruned) target and appends;
    # a key already there (a replay) is left as it is.
    (
        target.table.alias("t")
        .merge(source.alias("s"), on)
        .whenNotMatchedInsert(values=merge_sql.insert_values(tc, target_cols))
        .execute()
    )


def _append_applies(spark: SparkSession, tc: TableChanges) -> bool:
    """Whether the table may take a plain append of its last changes, provided that every key
    of its share starts with an insert ('c'); `apply_keyed` checks that on the collapsed rows.

    The table must be unchanged since the last batch: its Delta version is the one the last
    progress row recorded (or it does not exist yet). It then holds the source as of the
    batch's start W. A key K whose first change in the batch is an insert at P did not exist at
    the source just before P; nothing changed K between W and P (every complete transaction
    after W is in the batch, and P is K's first change), so K did not exist at W and the table
    does not hold it. With no target row to match, the full MERGE would insert K's last change
    unless it is a delete: exactly the append. A crashed run that already committed this batch
    moved the version on, so its replay takes the guarded MERGE. The key must be unique at the
    source (identical rows may repeat under a key of every column), with no truncate (it
    deletes target rows) and no unchanged TOAST (it reads them).

    Called before `ensure_table`, whose CREATE or ALTER commits add no rows but would move the
    version on.
    """
    if not tc.unique_key or tc.truncate is not None or tc.toast_columns:
        return False
    return _unchanged_since_last_batch(spark, tc)


def _unchanged_since_last_batch(spark: SparkSession, tc: TableChanges) -> bool:
    """Whether the table does not exist or is at the version the last progress row recorded:
    then it holds no change of this batch's transactions (all after the batch's start), since
    every commit to it is this job's and a batch's commits come before its progress row. A run
    that crashed after committing this batch moved the version on, so its replay answers no."""
    lake = lake_of(spark, tc)
    if not lake.exists:
        return True
    return tc.recorded_version is not None and lake.version == tc.recorded_version


def _keyless_append_applies(spark: SparkSession, tc: TableChanges) -> bool:
    """Whether a table without a key may take a plain append of its deduplicated rows instead
    of the MERGE that skips rows already there (by commit_lsn, total_order).

    Only rows of this batch's transactions could match, and the table holds none of them when
    it is unchanged since the last batch (`_unchanged_since_last_batch`); repeats within the
    batch are dropped before either form. So the MERGE would insert every row: the append.
    Not with a truncate, which deletes target rows first. Called before `ensure_table`, whose
    CREATE or ALTER commits add no rows but would move the version on."""
    return tc.truncate is None and _unchanged_since_last_batch(spark, tc)


def _append(target: Target, tc: TableChanges, rows: DataFrame, target_cols: list[str]) -> None:
    types = target.types
    # A column the writer no longer has (dropped at the source) gets NULL.
    missing = tuple((c, types[c]) for c in target_cols if c not in tc.columns)
    # A column whose type the source changed where Avro promotes (int -> long, float -> double;
    # docs/downstream.md) keeps the table's type: cast to it, as the MERGE's insert does (under
    # ANSI a value that does not fit stops the batch). A Delta append refuses any other type.
    # The changes' schema is the one ensure_table read (PySpark keeps it on the frame).
    source = {f.name: f.dataType for f in tc.changes.schema.fields}
    promoted = tuple(
        (c, types[c]) for c in target_cols if c in tc.columns and source[c] != types[c]
    )

    def value(c: str) -> Column:
        if c not in tc.columns:
            return F.lit(None).cast(types[c]).alias(c)
        if (c, types[c]) in promoted:
            return F.col(c).cast(types[c]).alias(c)
        return F.col(c)

    values = tc.cache.get(
        ("append", tuple(target_cols), missing, promoted),
        lambda: [*map(value, target_cols), *map(F.col, LAKE_META)],
    )
    rows.select(*values).write.format("delta").mode("append").save(tc.path)


def _empty_target_applies(spark: SparkSession, tc: TableChanges) -> bool:
    """Whether the table holds no row before this batch: it does not exist yet, or its version
    has no data file (read before `ensure_table`, whose commits add no rows).

    The full MERGE into a table without rows matches nothing: it inserts the last change of
    every key unless that is a delete, and a truncate finds nothing to remove. That is exactly
    an append of the collapsed rows that are not deletes, whatever the ops (snapshot reads
    included) and whether or not the key is unique: an initial load pays for no join with the
    target. A replay after a crash finds the rows its first run wrote, so it takes the MERGE.
    Not with unchanged TOAST columns: an update keeping a value needs a target row, and the
    MERGE's check names it."""
    lake = lake_of(spark, tc)
    return not tc.toast_columns and (not lake.exists or lake.files == 0)


def apply_keyed(spark: SparkSession, tc: TableChanges) -> Target:
    may_append = _append_applies(spark, tc)
    empty = _empty_target_applies(spark, tc)
    target = ensure_table(spark, tc)
    target_cols = _target_columns(target, tc)
    if inserts_only_applies(tc):
        if may_append:  # distinct inserts: every key starts with its only change
            _append(target, tc, tc.changes.filter(merge_sql.op_is(tc, "c")), target_cols)
        else:
            _inserts_only_apply(target, tc, target_cols)
        return target
    changes = tc.changes
    point = tc.truncate
    if point is not None:
        changes = changes.filter(merge_sql.after(point))
    changes = changes.filter(tc.cache.get("row-op", lambda: F.col(OP).isin("c", "r", "u", "d")))
    toast_cols = _toast_columns(tc)
    if empty and not toast_cols:
        last = collapse(changes, tc.key, tc.columns, [], cache=tc.cache)  # read once: not cached
        _append(target, tc, last.filter(F.col(OP) != "d"), target_cols)
        return target
    if toast_cols:
        # Before the MERGE deletes the old keys: a key change's create takes its unchanged
        # TOAST values from the row it replaces. A read of its own: the source must not share
        # the MERGE target's attributes (Delta does not copy the source, see session.py).
        lake = spark.read.format("delta").load(tc.path)
        changes = resolve_moved_toast(changes, lake, tc.key, toast_cols)
    # Cached: it is read by the checks below and twice by the MERGE (matches, then writes).
    collapsed = collapse(
        changes, tc.key, tc.columns, toast_cols, first_op=may_append, cache=tc.cache
    )
    collapsed = collapsed.persist(CACHE)
    try:
        if may_append and not collapsed.filter(F.col(FIRST_OP) != "c").limit(1).collect():
            _append(target, tc, collapsed.filter(F.col(OP) != "d"), target_cols)
            return target
        source = collapsed.drop(FIRST_OP) if may_append else collapsed
        if toast_cols and not tc.snapshotting:
            _check_toast_targets(target.table, source, tc, toast_cols)
        _merge(target.table, tc, source, target_cols, toast_cols)
        return target
    finally:
        collapsed.unpersist()  # the persisted frame itself: a derived one would not match


def _merge(
    table: DeltaTable,
    tc: TableChanges,
    source: DataFrame,
    target_cols: list[str],
    toast_cols: list[str],
) -> None:
    point = tc.truncate
    # A truncate must see every target row (not-matched-by-source), so no range then.
    on = merge_sql.key_match(tc)
    key_range = None if point is not None else merge_sql.key_range(tc)
    if key_range is not None:
        on = on & key_range
    clauses = tc.cache.get(
        ("merge", tc.key, tc.columns, tuple(target_cols), tuple(toast_cols)),
        partial(merge_sql.merge_clauses, tc.key, tc.columns, target_cols, toast_cols),
    )
    merge = (
        table.alias("t")
        .merge(source.alias("s"), on)
        .whenMatchedDelete(clauses.delete_when)
        .whenMatchedUpdate(clauses.update_when, clauses.sets)
        .whenNotMatchedInsert(clauses.insert_when, clauses.inserts)
    )
    if point is not None:
        merge = merge.whenNotMatchedBySourceDelete(merge_sql.before_sql(point))
    merge.execute()


def _check_toast_targets(
    table: DeltaTable, source: DataFrame, tc: TableChanges, toast_cols: list[str]
) -> None:
    """An update keeping an unchanged TOAST value needs the target row; never invent one."""
    needs = F.lit(False)
    for c in toast_cols:
        needs = needs | (F.array_contains(TOAST, c) & ~F.col(f"_has_{c}"))
    orphan = (
        source.filter(needs & (F.col(OP) != "d"))
        .join(table.toDF().select(*tc.key), list(tc.key), "left_anti")
        .select(*tc.key, COMMIT_LSN)
        .limit(3)
        .collect()
    )
    if orphan:
        raise ApplyError(
            f"table {tc.name}: update with unchanged TOAST value(s) for key(s) not in the lake: "
            + "; ".join(f"{r.asDict()} at commit_lsn {r[COMMIT_LSN]}" for r in orphan)
        )


def apply_append_only(spark: SparkSession, tc: TableChanges) -> Target:
    """Tables without a key: every change is a row; (commit_lsn, total_order) dedups replays."""
    may_append = _keyless_append_applies(spark, tc)
    target = ensure_table(spark, tc)
    table = target.table
    target_cols = _target_columns(target, tc)
    changes = tc.changes
    point = tc.truncate
    if point is not None:
        table.delete(merge_sql.before_sql(point, t=""))
        changes = changes.filter(merge_sql.after(point))
    rows = changes.filter(tc.cache.get("not-truncate", lambda: F.col(OP) != "t")).dropDuplicates(
        [COMMIT_LSN, TOTAL_ORDER]
    )
    if may_append:
        _append(target, tc, rows, target_cols)
        return target
    inserts = merge_sql.insert_values(tc, target_cols)
    on = f"t.{COMMIT_LSN} = s.{COMMIT_LSN} AND t.{TOTAL_ORDER} = s.{TOTAL_ORDER}"
    if tc.commit_lsns is not None:
        # Only rows of the same transactions can match (a replay's): a bound on the target
        # lets Delta skip, by their commit_lsn statistics, every file older batches wrote.
        # Without it the dedup join read the whole table in every batch, so a keyless log
        # table (pgbench's history), which grows with every batch, made each batch's cost
        # grow with all the history before it.
        after, up_to = tc.commit_lsns
        on += f" AND t.{COMMIT_LSN} > {int(after)} AND t.{COMMIT_LSN} <= {int(up_to)}"
    table.alias("t").merge(rows.alias("s"), on).whenNotMatchedInsert(values=inserts).execute()
    return target


@dataclass(frozen=True)
class Applied:
    lake: LakeTable  # the table after this batch's commit
    handle: DeltaTable  # for the next batch (`TableChanges.handle`)

    @property
    def version(self) -> int:
        return self.lake.version


def apply(spark: SparkSession, tc: TableChanges) -> Applied:
    """Apply; the table's state afterwards (its Delta version, for the progress row)."""
    check_names(tc.name, (*tc.columns, *tc.key, *tc.toast_columns))
    target = apply_keyed(spark, tc) if tc.key else apply_append_only(spark, tc)
    return Applied(lake_state.read(spark, tc.path), target.table)
