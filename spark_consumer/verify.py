"""`verify`: compare each published PostgreSQL table with its Delta table, key by key and column
by column. PostgreSQL is read through psycopg (its loaders give Python values), the lake
through Spark; both sides become {key: {column: value}} and are diffed in pure Python."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql import SparkSession

from spark_consumer.config import VerifyConfig
from spark_consumer.errors import ConfigError

Row = dict[str, Any]


@dataclass(frozen=True)
class TableDiff:
    table: str
    missing: tuple[Any, ...]  # keys in PostgreSQL, not in the lake
    extra: tuple[Any, ...]    # keys in the lake, not in PostgreSQL
    different: tuple[tuple[Any, str, Any, Any], ...]  # (key, column, pg value, lake value)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)


def published_tables(conn: psycopg.Connection[Any], publication: str) -> list[str]:
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
        "ORDER BY 1, 2", (publication,)).fetchall()
    return [f"{s}.{t}" for s, t in rows]


def key_columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """Replica identity columns: the index named by REPLICA IDENTITY, else the primary key."""
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s::regclass
          AND (i.indisreplident OR (i.indisprimary AND NOT EXISTS (
               SELECT 1 FROM pg_index j WHERE j.indrelid = i.indrelid AND j.indisreplident)))
        ORDER BY array_position(i.indkey, a.attnum)
        """, (table,)).fetchall()
    return [r[0] for r in rows]


def _norm(value: Any) -> Any:
    # Delta decimals come back with the column's scale; compare numerically.
    if isinstance(value, Decimal):
        return value.normalize()
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def diff(table: str, pg: Mapping[Any, Row], lake: Mapping[Any, Row], limit: int = 20) -> TableDiff:
    missing = tuple(sorted((k for k in pg if k not in lake), key=repr)[:limit])
    extra = tuple(sorted((k for k in lake if k not in pg), key=repr)[:limit])
    different: list[tuple[Any, str, Any, Any]] = []
    for k in sorted(pg.keys() & lake.keys(), key=repr):
        for col, pv in pg[k].items():
            lv = lake[k].get(col)
            if _norm(pv) != _norm(lv):
                different.append((k, col, pv, lv))
        if len(different) >= limit:
            break
    return TableDiff(table, missing, extra, tuple(different))


def read_pg(conn: psycopg.Connection[Any], table: str, key: list[str]) -> dict[Any, Row]:
    schema, name = table.split(".", 1)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema),
                                                         sql.Identifier(name)))
        cols = [d.name for d in cur.description or ()]
        rows = [dict(zip(cols, r, strict=True)) for r in cur]
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


def read_lake(spark: SparkSession, path: str, columns: list[str],
              key: list[str]) -> dict[Any, Row] | None:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    df = spark.read.format("delta").load(path)
    present = [c for c in columns if c in df.columns]
    rows = [
        {c: r[c] if c in present else None for c in columns}
        for r in df.select(*present).toLocalIterator()
    ]
    return _by_key(rows, key)


def run(config: VerifyConfig, spark: SparkSession) -> list[TableDiff]:
    out = []
    with psycopg.connect(config.pg_dsn) as conn:
        tables = published_tables(conn, config.publication)
        if config.tables:
            unknown = set(config.tables) - set(tables)
            if unknown:
                raise ConfigError(f"WALBRIDGE_TABLES {sorted(unknown)} are not in publication "
                                  f"{config.publication!r}")
            tables = [t for t in tables if t in config.tables]
        for table in tables:
            key = key_columns(conn, table)
            pg_rows = read_pg(conn, table, key)
            columns = list(next(iter(pg_rows.values())).keys()) if pg_rows else []
            if not columns:
                with conn.cursor() as cur:
                    cur.execute(sql.SQL("SELECT * FROM {}.{} LIMIT 0").format(
                        *map(sql.Identifier, table.split(".", 1))))
                    columns = [d.name for d in cur.description or ()]
            schema, name = table.split(".", 1)
            lake = read_lake(spark, f"{config.lake_path}/{schema}/{name}", columns, key)
            if lake is None:
                lake = {}
            out.append(diff(table, pg_rows, lake))
    return out


def report(diffs: list[TableDiff]) -> str:
    lines = []
    for d in diffs:
        if d.equal:
            lines.append(f"{d.table}: equal")
            continue
        lines.append(f"{d.table}: {len(d.missing)} missing, {len(d.extra)} extra, "
                     f"{len(d.different)} different (first 20 of each)")
        lines += [f"  missing {k}" for k in d.missing]
        lines += [f"  extra   {k}" for k in d.extra]
        lines += [f"  differs {k} {c}: pg={pv!r} lake={lv!r}" for k, c, pv, lv in d.different]
    return "\n".join(lines)

