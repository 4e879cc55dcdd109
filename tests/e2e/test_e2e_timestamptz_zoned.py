"""--timestamptz-format zoned-string through the real pipeline: the producer writes Debezium's
ZonedTimestamp strings, the consumer lands them as timestamps (PostgreSQL's text of the values a
timestamp cannot hold in `__text`), and `verify` finds the lake equal to PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.producer_harness import TopicReader, sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e


def test_zoned_timestamps_land_typed_and_equal(
    spark: SparkSession, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    s = f"e2e_zoned_{uuid.uuid4().hex[:8]}"
    table = f"{s}.events"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {table} (id int PRIMARY KEY, at timestamptz, ats timestamptz[])",
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [table], "e2ezoned"
        ) as p:
            p.producer.env["WALBRIDGE_TIMESTAMPTZ_FORMAT"] = "zoned-string"
            p.start_producer()
            p.sql(
                f"""INSERT INTO {table} VALUES
                (1, '2040-08-22 10:00:00.123456+02', ARRAY['2024-01-02 03:04:05+00'::timestamptz,
                     NULL, 'infinity']),
                (2, 'infinity', NULL), (3, '0044-03-15 12:00:00+00 BC', '{{}}'),
                (4, '10000-01-01 00:00:00+00', NULL), (5, NULL, NULL),
                (6, '2000-01-01 00:00:00.5+00', ARRAY['1999-12-31 23:59:59.999999+00'::timestamptz])""",
                f"UPDATE {table} SET at = at + INTERVAL '1 day' WHERE id = 6",
            )
            p.wait_published()
            events = TopicReader(kafka_bootstrap, registry_url).read(
                [f"{p.prefix}.{table}"], expect=7
            )
            first = next(e.value for e in events if e.value["after"]["id"] == 1)
            assert first["after"]["at"] == "2040-08-22T08:00:00.123456Z"
            assert first["after"]["ats"] == ["2024-01-02T03:04:05Z", None, "infinity"]
            p.consume_available()
            p.assert_equal()
            rows = {r["id"]: r for r in p.table(table)}
            assert rows[1]["at"] is not None and rows[1]["at__text"] is None
            assert rows[2]["at"] is None and rows[2]["at__text"] == "infinity"
            assert rows[4]["at"] is None and rows[4]["at__text"] == "10000-01-01 00:00:00+00"
            assert rows[5]["at"] is None and rows[5]["at__text"] is None
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")
