"""Partitioned tables through the real pipeline: a parent named in the publication is one topic
and one lake table under the parent's name (publish_via_partition_root), whatever partition a row
lives in; rows that move between partitions stay one row; partitions attached and detached while
streaming; range and hash partitioning. `verify` compares the parents."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.producer_harness import sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e


def test_partitioned_parents_are_one_topic_and_one_lake_table(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    s = f"e2e_part_{uuid.uuid4().hex[:8]}"
    ranged, hashed = f"{s}.ranged", f"{s}.hashed"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {ranged} (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        *(
            f"CREATE TABLE {ranged}_{i} PARTITION OF {ranged} "
            f"FOR VALUES FROM ({(i - 1) * 100}) TO ({i * 100})"
            for i in range(1, 5)
        ),
        f"CREATE TABLE {hashed} (id int, region text, v text, PRIMARY KEY (id, region))"
        " PARTITION BY HASH (region)",
        *(
            f"CREATE TABLE {hashed}_{i} PARTITION OF {hashed} "
            f"FOR VALUES WITH (MODULUS 3, REMAINDER {i})"
            for i in range(3)
        ),
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [ranged, hashed], "e2epart"
        ) as p:
            # The harness creates the publication; the producer requires the root setting for
            # a publication of partitioned tables (test_replication_client covers the refusal).
            p.sql(
                f"ALTER PUBLICATION {p.source.publication} SET (publish_via_partition_root = true)"
            )
            p.start_producer()
            p.sql(
                f"INSERT INTO {ranged} SELECT g, 'v' || g FROM generate_series(0, 249) g",
                f"INSERT INTO {hashed} SELECT g, 'r' || (g % 7), 'h' || g"
                " FROM generate_series(1, 60) g",
            )
            p.sql(
                # Across range partitions: the key changes, so delete + create, one row after.
                f"UPDATE {ranged} SET id = id + 250, v = 'moved' WHERE id BETWEEN 10 AND 19",
                f"UPDATE {ranged} SET v = 'same partition' WHERE id = 5",
                # Across hash partitions (the partition key is part of the primary key).
                f"UPDATE {hashed} SET region = 'elsewhere' WHERE id <= 5",
                f"DELETE FROM {hashed} WHERE id BETWEEN 50 AND 55",
                # Detach the (empty) last partition, attach a new one for its range, write through it.
                f"ALTER TABLE {ranged} DETACH PARTITION {ranged}_4",
                f"CREATE TABLE {ranged}_4b (id int PRIMARY KEY, v text)",
                f"ALTER TABLE {ranged} ATTACH PARTITION {ranged}_4b FOR VALUES FROM (300) TO (400)",
                f"INSERT INTO {ranged} VALUES (300, 'attached'), (399, 'attached')",
                f"UPDATE {ranged} SET id = 350 WHERE id = 0",
            )
            p.wait_published()

            prefix = p.prefix
            topics = set(
                AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics
            )
            ours = {t for t in topics if t.startswith(f"{prefix}.{s}.")}
            assert ours == {f"{prefix}.{ranged}", f"{prefix}.{hashed}"}  # no leaf topics

            p.consume_available()
            p.assert_equal()
            rows = {r["id"]: r["v"] for r in p.table(ranged)}
            assert len(rows) == 250 + 2  # 0..249 (some moved), two attached rows
            assert all(rows[i] == "moved" for i in range(260, 270))
            assert not any(i in rows for i in (0, *range(10, 20)))
            assert rows[350] == "v0" and rows[300] == rows[399] == "attached"
            hashed_rows = {(r["id"], r["region"]) for r in p.table(hashed)}
            assert {(i, "elsewhere") for i in range(1, 6)} <= hashed_rows
            assert len(hashed_rows) == 60 - 6
            lake_tables = {d.name for d in (tmp_path / "lake" / s).iterdir()}
            assert lake_tables == {"ranged", "hashed"}
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")
