"""`verify` by bucket checksums against the real pipeline: a keyed table of several column types
(text with the row text's own separators and NULLs, numeric with NaN, timestamptz, float8 with
-0 and NaN, arrays with NULL elements, bool, and a stored generated column, which the
publication does not publish and verify skips) and a table without a key holding duplicate rows
reach the lake through the producer and the consumer; `verify` says equal (so PostgreSQL's SQL
checksum and the executors' Python checksum agree row for row). Then the lake is changed behind
the pipeline's back (one column of one row, one row deleted, one row added, one more duplicate)
and `verify` names exactly those keys and that column, having read only the differing buckets."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import psycopg
import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from schemas.safe_names import lake_table_path
from spark_consumer import verify
from tests.e2e.harness import pipeline
from tests.support.producer_harness import sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e

ROWS = 3000


def test_verify_by_checksums_names_exactly_what_differs(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = f"e2e_verify_{uuid.uuid4().hex[:8]}"
    keyed, keyless = f"{s}.keyed", f"{s}.keyless"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {keyed} (id int PRIMARY KEY, note text, amount numeric(12,3), "
        "price numeric, at timestamptz, ratio float8, tags text[], nums int[], flag bool, "
        # char(n) pads with blanks, which a cast to text drops and the stream keeps.
        "code char(6), codes char(3)[], "
        "twice numeric GENERATED ALWAYS AS (amount * 2) STORED)",
        f"CREATE TABLE {keyless} (x int, y text)",
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [keyed, keyless], "e2everify"
        ) as p:
            p.start_producer()
            p.sql(
                f"INSERT INTO {keyed} SELECT g,"
                " CASE g % 7 WHEN 0 THEN NULL WHEN 1 THEN '' WHEN 2 THEN 'N' WHEN 3 THEN '3:a|b,c'"
                " ELSE 'note ' || g || E'\\n:é' END,"
                " (g * 1.5)::numeric(12,3),"
                " CASE WHEN g % 11 = 0 THEN 'NaN'::numeric ELSE g / 7.0 END,"
                " timestamptz '2026-01-01 00:00:00+02' + g * interval '1 minute 1.25 second',"
                " CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN '-0'::float8 WHEN 2 THEN 'NaN'"
                " ELSE g / 3.0 END,"
                " CASE WHEN g % 4 = 0 THEN NULL ELSE ARRAY['a:' || g, NULL, '', 'N'] END,"
                " CASE WHEN g % 6 = 0 THEN '{}'::int[] ELSE ARRAY[g, NULL, -g] END,"
                " CASE WHEN g % 3 = 0 THEN NULL ELSE g % 2 = 0 END,"
                " CASE WHEN g % 8 = 0 THEN NULL WHEN g % 8 = 1 THEN '' ELSE 'c' || g % 100 END,"
                " CASE WHEN g % 9 = 0 THEN NULL ELSE ARRAY['a', NULL, '', 'abc'] END"
                f" FROM generate_series(1, {ROWS}) g",
                # 100 distinct rows, each 10 times, some with NULLs.
                f"INSERT INTO {keyless} SELECT g % 100, CASE WHEN g % 9 = 0 THEN NULL"
                " ELSE 'y' || (g % 100) END FROM generate_series(1, 1000) g",
            )
            p.wait_published()
            p.consume_available()
            with caplog.at_level(logging.INFO, logger="walbridge.consumer"):
                p.assert_equal()
            assert f"verify {keyed}: {ROWS} rows in PostgreSQL, {ROWS} in the lake" in caplog.text

            keyed_path = lake_table_path(p.lake, s, "keyed")
            lake = DeltaTable.forPath(spark, keyed_path)
            lake.update("id = 11", {"note": F.lit("changed")})
            lake.delete("id = 20")
            added = spark.read.format("delta").load(keyed_path).where("id = 30")
            added.withColumn("id", F.lit(99999)).write.format("delta").mode("append").save(
                keyed_path
            )
            keyless_path = lake_table_path(p.lake, s, "keyless")
            spark.read.format("delta").load(keyless_path).where("x = 5 AND y = 'y5'").limit(
                1
            ).write.format("delta").mode("append").save(keyless_path)

            diffs = {d.table: d for d in p.verify()}
            k = diffs[keyed]
            assert k.missing == (("20",),), verify.report([k])
            assert k.extra == (("99999",),), verify.report([k])
            pg_note = "note 11\n:é"
            assert k.different == ((("11",), "note", pg_note, "changed"),), verify.report([k])
            assert k.notes == ()
            with psycopg.connect(pg_dsn) as conn:
                major = conn.info.server_version // 10000
            why = (
                f"publication {p.source.publication!r} has publish_generated_columns = none"
                if major >= 18
                else f"PostgreSQL {major} does not publish generated columns (18+ can)"
            )
            assert k.skipped == (f"twice (stored generated: {why})",)
            kl = diffs[keyless]
            assert kl.missing == () and kl.different == () and kl.notes == ()
            assert len(kl.extra) == 1
            ((row, copy),) = kl.extra
            with psycopg.connect(pg_dsn) as conn:
                row_count = conn.execute(
                    f"SELECT count(*) FROM {keyless} WHERE x = 5 AND y = 'y5'"
                ).fetchone()
            # The lake's one copy more than PostgreSQL has, numbered from 0.
            assert dict(row) == {"x": repr("5"), "y": repr("y5")}
            assert row_count is not None and copy == row_count[0] > 1
    finally:
        sql(pg_dsn, f"DROP SCHEMA IF EXISTS {s} CASCADE")
