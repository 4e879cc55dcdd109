"""PostgreSQL 18's published generated columns reach the lake: a publication with
``publish_generated_columns = stored`` carries a table's stored generated column through the
initial snapshot and the stream into its Delta table (never the virtual one), a column list on a
second table is honoured, and `verify` compares exactly the published columns of each, naming
the ones it skipped and why. Skips on servers before 18, naming the version."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.producer_harness import query, sql
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e]


def test_published_stored_generated_columns_reach_the_lake_and_verify_compares_them(
    spark: SparkSession, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_dsn) as conn:
        major = conn.info.server_version // 10000
    if major < 18:
        pytest.skip(f"PostgreSQL {major} does not publish generated columns (18+ does)")
    s = f"e2e_gencols_{uuid.uuid4().hex[:8]}"
    full, listed = f"{s}.full", f"{s}.listed"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {full} (id int PRIMARY KEY, a int NOT NULL,"
        " s text GENERATED ALWAYS AS ('s' || (a * 2)) STORED, b text,"
        " v int GENERATED ALWAYS AS (a * 3) VIRTUAL)",
        f"INSERT INTO {full} (id, a, b) SELECT g, g, 'b' || g FROM generate_series(1, 3000) g",
        f"CREATE TABLE {listed} (id int PRIMARY KEY, a int NOT NULL,"
        " s bigint GENERATED ALWAYS AS (a::bigint * 1000) STORED, b text)",
        f"INSERT INTO {listed} (id, a, b) SELECT g, g, 'b' || g FROM generate_series(1, 500) g",
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [full, listed], "e2egencols"
        ) as p:
            pub = p.source.publication
            p.sql(
                f"ALTER PUBLICATION {pub} SET TABLE {full}, {listed} (id, s)",
                f"ALTER PUBLICATION {pub} SET (publish_generated_columns = stored)",
            )
            p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
            p.producer.env["WALBRIDGE_SNAPSHOT_CHUNK_ROWS"] = "1000"
            p.start_producer()
            p.wait_snapshots_read(240)
            p.sql(
                f"INSERT INTO {full} (id, a, b) SELECT g, g, 'n' || g"
                " FROM generate_series(3001, 3100) g",
                f"UPDATE {full} SET a = a + 100000 WHERE id % 7 = 0",
                f"DELETE FROM {full} WHERE id % 11 = 0",
                f"UPDATE {listed} SET a = a + 5, b = 'changed' WHERE id <= 50",
                f"INSERT INTO {listed} (id, a, b) VALUES (1000, 7, 'new')",
            )
            p.wait_published()
            for table in (full, listed):
                p.wait_snapshot_recorded(table)
            p.consume_available()

            diffs = {d.table: d for d in p.verify()}
            assert all(d.equal for d in diffs.values()), [d for d in diffs.values()]
            assert diffs[full].skipped == ("v (virtual generated: never published)",)
            assert diffs[listed].skipped == (
                f"a (not in the column list of publication {pub!r})",
                f"b (not in the column list of publication {pub!r})",
            )
            # The lake holds the stored generated column, with PostgreSQL's values, and no
            # virtual one: verify being equal is not the only witness.
            lake = {r["id"]: r for r in p.table(full) if not r.get("_deleted")}
            assert "v" not in next(iter(lake.values()))
            assert {i: r["s"] for i, r in lake.items()} == dict(
                query(pg_dsn, f"SELECT id, s FROM {full}")
            )
            lake_listed = {r["id"]: r for r in p.table(listed) if not r.get("_deleted")}
            row = lake_listed[1]
            assert "a" not in row and "b" not in row
            assert {i: r["s"] for i, r in lake_listed.items()} == dict(
                query(pg_dsn, f"SELECT id, s FROM {listed}")
            )
    finally:
        sql(pg_dsn, f"DROP SCHEMA IF EXISTS {s} CASCADE")
