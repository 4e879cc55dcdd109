"""The Delta table a MERGE writes to, and what is decided about it before any change is
applied: its creation at a table's first batch (the key it is created for, its deletion-vector
mode, the columns its statistics cover), the columns a newer writer schema adds, the key
recorded at creation, the check that an existing table is in the consumer's deletion-vector
mode, and which small tables rewrite the files a MERGE touches instead of marking rows
(`rewrites`, `rewriting`).

Apart from merge.py because none of it depends on the batch's changes beyond their columns:
the batch asks about a table (its stored key, its mode, its MERGE group) before any MERGE
runs, and merge.py calls `ensure_table` once the decision between its forms is taken.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import DataType, LongType, StringType, StructField, StructType

from spark_consumer import file_stats, lake_state, session_conf
from spark_consumer.columns import COMMIT_LSN, OP, TOTAL_ORDER, TS_MS
from spark_consumer.errors import ApplyError
from spark_consumer.lake_state import DELETION_VECTORS, LakeTable
from spark_consumer.table_changes import TableChanges

# Delta's session setting: whether a MERGE writes deletion vectors to a table that has them.
_MERGE_WRITES_DV = "spark.databricks.delta.merge.deletionVectors.persistent"
KEY_PROPERTY = "walbridge.key"  # table property: comma-separated key columns ('' = append-only)


@dataclass(frozen=True)
class Target:
    """The table to write to, after `ensure_table`: a handle and its schema."""

    table: DeltaTable
    schema: StructType

    @property
    def types(self) -> dict[str, DataType]:
        return {f.name: f.dataType for f in self.schema.fields}


def lake_of(spark: SparkSession, tc: TableChanges) -> LakeTable:
    """The table as the batch found it: `tc.lake`, or one read of its log."""
    return tc.lake if tc.lake is not None else lake_state.read(spark, tc.path)


def _sql_path(path: str) -> str:
    # Delta takes delta.`<p>` for a path only when <p> is absolute or has a scheme; a relative
    # lake path (--lake-path lake) would parse as a table name and fail the batch.
    if "://" not in path and not path.startswith("/"):
        path = os.path.abspath(path)
    return "delta.`" + path.replace("`", "``") + "`"


def ensure_table(spark: SparkSession, tc: TableChanges) -> Target:
    """Create the table, or add columns it lacks (schema evolution; dropped ones stay)."""
    lake = lake_of(spark, tc)
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
        for name, value in tc.properties.items():  # the table's layout options
            builder = builder.property(name, value)
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
