"""`verify`: compare each published PostgreSQL table with its Delta table, key by key and column
by column. Both sides become {key: {column: comparable value}} and are diffed in pure Python:
PostgreSQL's canonical text of each value against the lake value rendered to that text
(`verify_forms`), so edge values (NaN, infinity, BC dates, 24:00, interval months) compare
exactly rather than through a loader's approximation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql import SparkSession

from schemas.safe_names import lake_table_path
from schemas.table_list import format_table
from schemas.type_mapping import field_names
from spark_consumer import verify_forms as forms
from spark_consumer.config import VerifyConfig
from spark_consumer.errors import ConfigError
from spark_consumer.verify_forms import ColumnInfo

Row = dict[str, Any]


@dataclass(frozen=True)
class TableDiff:
    table: str
    missing: tuple[Any, ...]  # keys in PostgreSQL, not in the lake
    extra: tuple[Any, ...]  # keys in the lake, not in PostgreSQL
    different: tuple[tuple[Any, str, Any, Any], ...]  # (key, column, pg value, lake value)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)


Table = tuple[str, str]  # (schema, table), PostgreSQL's names as they are


def published_tables(conn: psycopg.Connection[Any], publication: str) -> list[Table]:
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (publication,),
    ).fetchall()
    return [(s, t) for s, t in rows]


def _oid(conn: psycopg.Connection[Any], table: Table) -> int:
    """The table's oid from its two names as parameters (a `'s.t'::regclass` text would be
    parsed as SQL: names with quotes, dots or capitals break it)."""
    row = conn.execute(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        table,
    ).fetchone()
    if row is None:
        raise ConfigError(f"table {format_table(*table)} does not exist")
    return int(row[0])


def key_columns(conn: psycopg.Connection[Any], table: Table) -> list[str]:
    """Replica identity columns: the index named by REPLICA IDENTITY, else the primary key."""
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s
          AND (i.indisreplident OR (i.indisprimary AND NOT EXISTS (
               SELECT 1 FROM pg_index j WHERE j.indrelid = i.indrelid AND j.indisreplident)))
        ORDER BY array_position(i.indkey, a.attnum)
        """,
        (_oid(conn, table),),
    ).fetchall()
    return [r[0] for r in rows]


COLUMNS_SQL = """
WITH RECURSIVE cols AS (
    SELECT a.attnum, a.attname, a.atttypid AS typid FROM pg_attribute a
    WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
), base(attnum, typid, depth) AS (
    SELECT attnum, typid, 0 FROM cols
    UNION ALL
    SELECT b.attnum, t.typbasetype, b.depth + 1 FROM base b JOIN pg_type t ON t.oid = b.typid
    WHERE t.typtype = 'd'
)
SELECT c.attname, t.typname, e.typname AS element
FROM cols c
JOIN LATERAL (SELECT typid FROM base WHERE base.attnum = c.attnum
              ORDER BY depth DESC LIMIT 1) b ON true
JOIN pg_type t ON t.oid = b.typid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
ORDER BY c.attnum
"""


def columns(conn: psycopg.Connection[Any], table: Table) -> list[ColumnInfo]:
    rows = conn.execute(COLUMNS_SQL, (_oid(conn, table),)).fetchall()
    lake_names = field_names(tuple(r[0] for r in rows))
    out = []
    for (name, base, element), lake in zip(rows, lake_names, strict=True):
        # An array's element may itself be a domain; its base name is good enough here.
        out.append(ColumnInfo(name, lake, base, element))
    return out


def diff(table: str, pg: Mapping[Any, Row], lake: Mapping[Any, Row], limit: int = 20) -> TableDiff:
    missing = tuple(sorted((k for k in pg if k not in lake), key=repr)[:limit])
    extra = tuple(sorted((k for k in lake if k not in pg), key=repr)[:limit])
    different: list[tuple[Any, str, Any, Any]] = []
    for k in sorted(pg.keys() & lake.keys(), key=repr):
        for col, pv in pg[k].items():
            lv = lake[k].get(col)
            if pv != lv:
                different.append((k, col, pv, lv))
        if len(different) >= limit:
            break
    return TableDiff(table, missing, extra, tuple(different))


def read_pg(
    conn: psycopg.Connection[Any], table: Table, cols: list[ColumnInfo], key: list[str]
) -> dict[Any, Row]:
    schema, name = table
    exprs = sql.SQL(", ").join(forms.pg_expression(c) for c in cols)
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT {} FROM {}.{}").format(
                exprs, sql.Identifier(schema), sql.Identifier(name)
            )
        )
        rows = [{c.name: forms.pg_value(c, v) for c, v in zip(cols, r, strict=True)} for r in cur]
    return _by_key(rows, key)


def _by_key(rows: list[Row], key: list[str]) -> dict[Any, Row]:
    if key:
        return {tuple(r[k] for k in key): r for r in rows}
    # Without a key, compare as multisets: the whole row is the key, counted.
    out: dict[Any, Row] = {}
    for r in rows:
        base = tuple(sorted((k, repr(v)) for k, v in r.items()))
        n = 0
        while (base, n) in out:
            n += 1
        out[(base, n)] = r
    return out


def read_lake(
    spark: SparkSession, path: str, cols: list[ColumnInfo], key: list[str]
) -> dict[Any, Row] | None:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    df = spark.read.format("delta").load(path)
    rows = [{c.name: forms.lake_text(c, r.asDict()) for c in cols} for r in df.toLocalIterator()]
    return _by_key(rows, key)


# Canonical text forms on the PostgreSQL side (see verify_forms).
SESSION = (
    "SET DateStyle = 'ISO, MDY'",
    "SET TimeZone = 'UTC'",
    "SET IntervalStyle = 'postgres'",
    "SET extra_float_digits = 1",
)


def run(config: VerifyConfig, spark: SparkSession) -> list[TableDiff]:
    out = []
    with psycopg.connect(config.pg_dsn) as conn:
        tables = published_tables(conn, config.publication)
        if config.tables:
            unknown = sorted(set(config.tables) - set(tables))
            if unknown:
                raise ConfigError(
                    f"WALBRIDGE_TABLES {', '.join(format_table(*t) for t in unknown)} are not "
                    f"in publication {config.publication!r}"
                )
            tables = [t for t in tables if t in config.tables]
        for statement in SESSION:
            conn.execute(statement)
        for table in tables:
            key = key_columns(conn, table)
            cols = columns(conn, table)
            pg_rows = read_pg(conn, table, cols, key)
            lake = read_lake(spark, lake_table_path(config.lake_path, *table), cols, key)
            out.append(diff(format_table(*table), pg_rows, lake or {}))
    return out


def report(diffs: list[TableDiff]) -> str:
    lines = []
    for d in diffs:
        if d.equal:
            lines.append(f"{d.table}: equal")
            continue
        lines.append(
            f"{d.table}: {len(d.missing)} missing, {len(d.extra)} extra, "
            f"{len(d.different)} different (first 20 of each)"
        )
        lines += [f"  missing {k}" for k in d.missing]
        lines += [f"  extra   {k}" for k in d.extra]
        lines += [f"  differs {k} {c}: pg={pv!r} lake={lv!r}" for k, c, pv, lv in d.different]
    return "\n".join(lines)
