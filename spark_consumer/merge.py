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
  it touches; `check_deletion_vectors` keeps an existing table from silently changing mode.
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
  last commit left, with the table handle it used (batch.py keeps both across batches).
- The collapsed source is cached here, before the MERGE; Delta's own copy of it (its
  `materializeSource`, to disk) is switched off in session.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, LongType, StringType, StructField, StructType
from pyspark.sql.window import Window

from spark_consumer import file_stats, lake_state, session_conf
from spark_consumer.cache_level import CACHE
from spark_consumer.column_cache import ColumnCache
from spark_consumer.columns import COMMIT_LSN, LAKE_META, OP, TOAST, TOTAL_ORDER, TS_MS
from spark_consumer.errors import ApplyError
from spark_consumer.key_change_toast import resolve_moved_toast
from spark_consumer.lake_state import DELETION_VECTORS, LakeTable

# Delta's session setting: whether a MERGE writes deletion vectors to a table that has them.
_MERGE_WRITES_DV = "spark.databricks.delta.merge.deletionVectors.persistent"
KEY_PROPERTY = "walbridge.key"  # table property: comma-separated key columns ('' = append-only)
# The producer's Avro field names (sanitized PostgreSQL names) and this module's derived names
# all match this, so they can stand inside the backticks of the SQL snippets MERGE needs.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Working columns; not Avro names, so no source column can have them.
_NEXT = "#next"
_FIRST_OP = "#first_op"


@dataclass(frozen=True)
class TableChanges:
    schema: str
    table: str
    path: str
    key: tuple[str, ...]
    columns: tuple[str, ...]  # source columns present in this batch, in order
    changes: DataFrame  # meta columns + source columns, already limited to applicable txs
    # From the batch's summary (so no extra Spark job asks for them):
    truncate: tuple[int, int] | None = None  # latest truncate among the changes
    toast_columns: frozenset[str] = frozenset()  # columns some change left unchanged (TOAST)
    key_min: int | str | None = None  # bounds of the first key column: lets MERGE prune files
    key_max: int | str | None = None
    only_distinct_inserts: bool = False  # every change a 'c', none twice (TableWork says so)
    unique_key: bool = False  # the key is a primary key or unique index at the source
    # The table's Delta version in the last progress row: None when no batch recorded it.
    recorded_version: int | None = None
    # The producer's snapshot of the table is not done: an update keeping an unchanged TOAST
    # value may name a row the snapshot has not delivered yet (its `r` event follows, later
    # in commit order, and replaces the row whole).
    snapshotting: bool = False
    # Lake column -> PostgreSQL column name where they differ: kept as the column's comment.
    pg_names: Mapping[str, str] = field(default_factory=dict)
    # Create the table with deletion vectors (ConsumerConfig.lake_deletion_vectors).
    deletion_vectors: bool = True
    # (after, up to): the commit_lsn range of the batch's applied transactions, the changes'
    # range; None: not known.
    commit_lsns: tuple[int, int] | None = None
    # The table as the batch found it (one read of its log, or the state this job's own last
    # commit left); None: read it here.
    lake: LakeTable | None = None
    # A handle on the table this job opened before (its schema unchanged since): opening one
    # reads the log again and analyses a query over the table.
    handle: DeltaTable | None = None
    # The processor's expressions built once (column_cache.py): a MERGE's clauses are a few
    # Py4J round trips per column, the same for every batch of a table.
    cache: ColumnCache = field(default_factory=ColumnCache)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def check_names(table: str, names: Iterable[str]) -> None:
    """Stop on a column name that could break out of a quoted SQL identifier or literal: only
    a hand-altered Delta table or a foreign writer schema can bring one."""
    for name in names:
        if not _PLAIN_NAME.fullmatch(name):
            raise ApplyError(
                f"table {table}: column name {name!r} is not a plain Avro name "
                "([A-Za-z_][A-Za-z0-9_]*); refusing to put it into a MERGE"
            )


@dataclass(frozen=True)
class Target:
    """The table to write to, after `ensure_table`: a handle and its schema."""

    table: DeltaTable
    schema: StructType

    @property
    def types(self) -> dict[str, DataType]:
        return {f.name: f.dataType for f in self.schema.fields}


def _target_columns(target: Target, tc: TableChanges) -> list[str]:
    cols = [f.name for f in target.schema.fields if f.name not in LAKE_META]
    check_names(tc.name, cols)
    return cols


def _lake(spark: SparkSession, tc: TableChanges) -> LakeTable:
    return tc.lake if tc.lake is not None else lake_state.read(spark, tc.path)


def _sql_path(path: str) -> str:
    # Delta takes delta.`<p>` for a path only when <p> is absolute or has a scheme; a relative
    # lake path (--lake-path lake) would parse as a table name and fail the batch.
    if "://" not in path and not path.startswith("/"):
        path = os.path.abspath(path)
    return "delta.`" + path.replace("`", "``") + "`"


def _order(prefix: str = "") -> Column:
    return F.struct(F.col(prefix + COMMIT_LSN), F.col(prefix + TOTAL_ORDER))


def _newer(s: str = "s.", t: str = "t.") -> str:
    return (
        f"({s}{COMMIT_LSN} > {t}{COMMIT_LSN} OR ({s}{COMMIT_LSN} = {t}{COMMIT_LSN}"
        f" AND {s}{TOTAL_ORDER} > {t}{TOTAL_ORDER}))"
    )


def ensure_table(spark: SparkSession, tc: TableChanges) -> Target:
    """Create the table, or add columns it lacks (schema evolution; dropped ones stay)."""
    lake = _lake(spark, tc)
    src_types: dict[str, DataType] = {
        f.name: f.dataType for f in tc.changes.schema.fields if f.name in tc.columns
    }
    meta = [
        StructField(COMMIT_LSN, LongType(), False),
        StructField(TOTAL_ORDER, LongType(), False),
        StructField(OP, StringType(), True),
        StructField(TS_MS, LongType(), True),
    ]
    comments = {c: pg_name_comment(n) for c, n in tc.pg_names.items() if c in src_types}
    if not lake.exists:
        schema = StructType(
            [
                StructField(
                    c, src_types[c], True, {"comment": comments[c]} if c in comments else {}
                )
                for c in tc.columns
            ]
            + meta
        )
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(tc.path)
            .addColumns(schema)
            .property(KEY_PROPERTY, ",".join(tc.key))
            # MERGE marks replaced rows in deletion vectors instead of rewriting whole files;
            # "false" keeps the table at Delta's legacy protocol (unless a column's type needs
            # a table feature, as timestamp_ntz does): see README "Reading the lake".
            .property(DELETION_VECTORS, "true" if tc.deletion_vectors else "false")
        )
        # A wide table keeps statistics for the column its MERGEs prune files by.
        stats = file_stats.stats_columns(schema, tc.key[0] if tc.key else COMMIT_LSN)
        if stats is not None:
            builder = builder.property(file_stats.STATS_COLUMNS_PROPERTY, stats)
        return Target(builder.execute(), schema)
    existing = set(lake.columns)
    new = [c for c in tc.columns if c not in existing]
    if not new:
        table = tc.handle if tc.handle is not None else DeltaTable.forPath(spark, tc.path)
        return Target(table, lake.schema)
    # The comment is a literal of pg_name_comment's alphabet: no quote, no backslash.
    cols = ", ".join(
        f"`{c}` {src_types[c].simpleString()}"
        + (f" COMMENT '{comments[c]}'" if c in comments else "")
        for c in new
    )
    spark.sql(f"ALTER TABLE {_sql_path(tc.path)} ADD COLUMNS ({cols})")
    table = DeltaTable.forPath(spark, tc.path)
    return Target(table, table.toDF().schema)


def pg_name_comment(name: str) -> str:
    """A lake column's comment naming its PostgreSQL column, when the names differ (`sp ace`
    for `sp_ace`; CONTRACT.md, "Names"): `PostgreSQL column <name>`, with `%`, `'`, `\\` and
    control characters percent-encoded (`urllib.parse.unquote` gives the name back), so the
    text is also a safe SQL literal for ALTER TABLE ... ADD COLUMNS ... COMMENT."""
    escaped = "".join(
        f"%{ord(ch):02X}" if ch in "%'\\" or ord(ch) < 0x20 or ord(ch) == 0x7F else ch
        for ch in name
    )
    return f"PostgreSQL column {escaped}"


def check_deletion_vectors(table: str, lake: LakeTable, wanted: bool) -> None:
    """Stop when an existing table was created in the other deletion-vector mode.

    Turning them on would move the table to a protocol that readers chosen for the other mode
    cannot open; turning them off leaves the vectors already written (and the protocol's
    feature) in place. Both are the operator's step to take, with Delta's own commands.
    """
    if not lake.exists:
        return
    has = lake.deletion_vectors
    if has == wanted:
        return
    path = lake.path
    sql_path = _sql_path(path)
    if wanted:
        how = (
            f"ALTER TABLE {sql_path} SET TBLPROPERTIES ('{DELETION_VECTORS}' = 'true') "
            "(its readers then need the deletionVectors table feature)"
        )
    else:
        how = f"ALTER TABLE {sql_path} DROP FEATURE deletionVectors (see Delta's docs)"
    raise ApplyError(
        f"table {table}: the lake table at {path} has {DELETION_VECTORS}={str(has).lower()} "
        f"but the consumer runs with lake_deletion_vectors={str(wanted).lower()} "
        f"(WALBRIDGE_LAKE_DELETION_VECTORS); set it back, or convert the table: {how}"
    )


def rewrites(lake: LakeTable, below_bytes: int) -> bool:
    """Whether the table's MERGE rewrites the files it touches instead of writing deletion
    vectors (`ConsumerConfig.lake_rewrite_below_bytes`): a table that has them, but small."""
    return lake.exists and lake.deletion_vectors and lake.size < below_bytes


def rewriting(spark: SparkSession) -> AbstractContextManager[None]:
    """MERGEs run inside rewrite the files they touch, with or without deletion vectors. It is
    a session setting (Delta has no per-MERGE one), so no MERGE that should write deletion
    vectors may run meanwhile; the table and its protocol keep the feature either way."""
    return session_conf.changed(spark, _MERGE_WRITES_DV, "false")


def stored_key(lake: LakeTable) -> tuple[str, ...] | None:
    """The key recorded at creation, or None when the table does not exist yet."""
    if not lake.exists:
        return None
    value = lake.properties.get(KEY_PROPERTY, "")
    return tuple(c for c in value.split(",") if c)


def _after(point: tuple[int, int]) -> Column:
    lsn, order = point
    return (F.col(COMMIT_LSN) > lsn) | ((F.col(COMMIT_LSN) == lsn) & (F.col(TOTAL_ORDER) > order))


def _before_sql(point: tuple[int, int], t: str = "t.") -> str:
    lsn, order = point
    return f"({t}{COMMIT_LSN} < {lsn} OR ({t}{COMMIT_LSN} = {lsn} AND {t}{TOTAL_ORDER} < {order}))"


def _toast_columns(tc: TableChanges) -> list[str]:
    unknown = tc.toast_columns - set(tc.columns)
    if unknown:
        raise ApplyError(
            f"table {tc.name}: unchanged_toast names unknown column(s) {sorted(unknown)}"
        )
    return [c for c in tc.columns if c in tc.toast_columns]


def _key_range(tc: TableChanges) -> Column | None:
    """A target-only predicate on the first key column, so Delta skips files by their min/max
    statistics instead of scanning the whole table (keys of a batch are usually clustered:
    new rows and recently changed ones)."""
    if tc.key_min is None or tc.key_max is None:
        return None
    k = F.col(f"t.`{tc.key[0]}`")
    return (k >= F.lit(tc.key_min)) & (k <= F.lit(tc.key_max))


def collapse(
    changes: DataFrame,
    key: tuple[str, ...],
    columns: tuple[str, ...],
    toast_cols: list[str],
    first_op: bool = False,
    *,
    cache: ColumnCache,
) -> DataFrame:
    """Last change per key; unchanged TOAST columns resolved from earlier changes in the batch.

    For each TOAST column X: `_has_X` tells whether some change of this key carried X (the
    latest such value is used); otherwise the MERGE keeps the target's value. `first_op` (not
    with TOAST columns) adds the op of each key's first change as `#first_op`.
    """
    last_cols = [c for c in (*columns, *LAKE_META, TOAST) if c not in key]
    if not toast_cols:
        return _last_per_key(changes, key, last_cols, first_op, cache=cache)
    if first_op:
        raise ValueError("collapse: first_op is only computed without TOAST columns")
    aggs = [F.max_by(F.struct(*[F.col(c) for c in last_cols]), _order()).alias("_last")]
    for c in toast_cols:
        carried = (F.col(OP) != "d") & ~F.array_contains(F.col(TOAST), c)
        order_if = F.when(carried, _order())
        # max_by ignores rows whose ordering value is null, i.e. changes that did not carry X.
        aggs.append(F.max_by(F.struct(F.col(c).alias("v")), order_if).alias(f"_v_{c}"))
        aggs.append(F.max(carried.cast("int")).alias(f"_has_{c}"))
    grouped = changes.groupBy(*key).agg(*aggs)
    exprs: list[Column] = []
    for c in (*key, *last_cols):
        if c in toast_cols:
            exprs.append(
                F.when(F.col(f"_has_{c}") == 1, F.col(f"_v_{c}")["v"])
                .otherwise(F.col("_last")[c])
                .alias(c)
            )
            exprs.append((F.col(f"_has_{c}") == 1).alias(f"_has_{c}"))
        elif c in key:
            exprs.append(F.col(c))
        else:
            exprs.append(F.col("_last")[c].alias(c))
    return grouped.select(*exprs)


def _last_per_key(
    changes: DataFrame,
    key: tuple[str, ...],
    last_cols: list[str],
    first_op: bool = False,
    *,
    cache: ColumnCache,
) -> DataFrame:
    """The change no other change of its key follows in (commit_lsn, total_order) order.

    A window runs as one shuffle and one sort by key. The max_by aggregate that the TOAST case
    needs is a sort aggregate over wide rows: a local sort and a partial aggregate before its
    shuffle, then a second sort. Delta's materializeSource time per 1M changes, interleaved
    runs on one machine: 2.1-3.2 s with the window, 2.8-4.8 s with the aggregate.

    `lead` rather than `row_number() = 1`: Spark turns a rank filter into a partial group limit
    before the shuffle, which brings the first sort back. Redelivered copies of one event share
    (commit_lsn, total_order) and carry the same change, so keeping the one that sorts last is
    exact. The first change's op comes from the same window, so it costs no other sort.
    """
    nxt, first, last = cache.get(("last-per-key", key), partial(_window_columns, key))
    out = changes.select(*key, *last_cols).withColumn(_NEXT, nxt)
    if first_op:
        out = out.withColumn(_FIRST_OP, first)
    return out.filter(last).drop(_NEXT)


def _window_columns(key: tuple[str, ...]) -> tuple[Column, Column, Column]:
    """`_last_per_key`'s columns: the next change's flag, the first change's op, and whether a
    change is its key's last."""
    order = Window.partitionBy(*key).orderBy(COMMIT_LSN, TOTAL_ORDER)
    return F.lead(F.lit(True)).over(order), F.first(OP).over(order), F.col(_NEXT).isNull()


def _insert_values(tc: TableChanges, target_cols: list[str]) -> dict[str, str | Column]:
    return tc.cache.get(
        ("insert-values", tc.columns, tuple(target_cols)),
        lambda: _expressions(_insert_sql(tc.columns, target_cols)),
    )


def _insert_sql(columns: tuple[str, ...], target_cols: list[str]) -> dict[str, str]:
    # A column the writer no longer has (dropped at the source) gets NULL.
    values = {f"`{c}`": (f"s.`{c}`" if c in columns else "NULL") for c in target_cols}
    values.update({m: f"s.{m}" for m in LAKE_META})
    return values


def _expressions(sql: Mapping[str, str]) -> dict[str, str | Column]:
    """A MERGE clause's assignments as parsed Columns: Delta's builder parses each string
    again on every call (three Py4J round trips each), a Column it passes on as it is."""
    return {name: F.expr(value) for name, value in sql.items()}


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


def _key_match(tc: TableChanges) -> Column:
    return tc.cache.get(
        ("key-match", tc.key), lambda: F.expr(" AND ".join(f"t.`{k}` = s.`{k}`" for k in tc.key))
    )


def _op_is(tc: TableChanges, op: str) -> Column:
    return tc.cache.get(("op-is", op), lambda: F.col(OP) == op)


def _inserts_only_apply(target: Target, tc: TableChanges, target_cols: list[str]) -> None:
    source = tc.changes.filter(_op_is(tc, "c"))
    on = _key_match(tc)
    key_range = _key_range(tc)
    if key_range is not None:
        on = on & key_range
    # Insert-only: Delta runs this as an anti join against the (pruned) target and appends;
    # a key already there (a replay) is left as it is.
    (
        target.table.alias("t")
        .merge(source.alias("s"), on)
        .whenNotMatchedInsert(values=_insert_values(tc, target_cols))
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
    lake = _lake(spark, tc)
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
    lake = _lake(spark, tc)
    return not tc.toast_columns and (not lake.exists or lake.files == 0)


def apply_keyed(spark: SparkSession, tc: TableChanges) -> Target:
    may_append = _append_applies(spark, tc)
    empty = _empty_target_applies(spark, tc)
    target = ensure_table(spark, tc)
    target_cols = _target_columns(target, tc)
    if inserts_only_applies(tc):
        if may_append:  # distinct inserts: every key starts with its only change
            _append(target, tc, tc.changes.filter(_op_is(tc, "c")), target_cols)
        else:
            _inserts_only_apply(target, tc, target_cols)
        return target
    changes = tc.changes
    point = tc.truncate
    if point is not None:
        changes = changes.filter(_after(point))
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
        if may_append and not collapsed.filter(F.col(_FIRST_OP) != "c").limit(1).collect():
            _append(target, tc, collapsed.filter(F.col(OP) != "d"), target_cols)
            return target
        source = collapsed.drop(_FIRST_OP) if may_append else collapsed
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
    on = _key_match(tc)
    key_range = None if point is not None else _key_range(tc)
    if key_range is not None:
        on = on & key_range
    clauses = tc.cache.get(
        ("merge", tc.key, tc.columns, tuple(target_cols), tuple(toast_cols)),
        partial(_merge_clauses, tc.key, tc.columns, target_cols, toast_cols),
    )
    merge = (
        table.alias("t")
        .merge(source.alias("s"), on)
        .whenMatchedDelete(clauses.delete_when)
        .whenMatchedUpdate(clauses.update_when, clauses.sets)
        .whenNotMatchedInsert(clauses.insert_when, clauses.inserts)
    )
    if point is not None:
        merge = merge.whenNotMatchedBySourceDelete(_before_sql(point))
    merge.execute()


@dataclass(frozen=True)
class _MergeClauses:
    """The guarded MERGE's conditions and assignments for one table schema."""

    delete_when: Column
    update_when: Column
    insert_when: Column
    sets: dict[str, str | Column]
    inserts: dict[str, str | Column]


def _merge_clauses(
    key: tuple[str, ...], columns: tuple[str, ...], target_cols: list[str], toast_cols: list[str]
) -> _MergeClauses:
    newer = _newer()

    def value(c: str, matched: bool) -> str:
        if c not in columns:
            return "NULL"  # a column the writer no longer has: dropped at the source
        if c in toast_cols:
            keep = f"t.`{c}`" if matched else "NULL"
            return f"CASE WHEN array_contains(s.{TOAST}, '{c}') AND NOT s.`_has_{c}` THEN {keep} ELSE s.`{c}` END"
        return f"s.`{c}`"

    sets = {f"`{c}`": value(c, True) for c in target_cols if c not in key}
    sets.update({m: f"s.{m}" for m in LAKE_META})
    inserts = {f"`{c}`": value(c, False) for c in target_cols}
    inserts.update({m: f"s.{m}" for m in LAKE_META})
    return _MergeClauses(
        delete_when=F.expr(f"s.{OP} = 'd' AND {newer}"),
        update_when=F.expr(f"s.{OP} <> 'd' AND {newer}"),
        insert_when=F.expr(f"s.{OP} <> 'd'"),
        sets=_expressions(sets),
        inserts=_expressions(inserts),
    )


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
        table.delete(_before_sql(point, t=""))
        changes = changes.filter(_after(point))
    rows = changes.filter(tc.cache.get("not-truncate", lambda: F.col(OP) != "t")).dropDuplicates(
        [COMMIT_LSN, TOTAL_ORDER]
    )
    if may_append:
        _append(target, tc, rows, target_cols)
        return target
    inserts = _insert_values(tc, target_cols)
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
