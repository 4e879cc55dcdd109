"""A database that already holds rows reaches the lake: the initial snapshot of a keyed table
with TOASTed values, a table without a key, an empty table and a partitioned table (under its
parent's name), with writes going on while the chunks are read. `verify` compares every table,
and the progress table says from which batch on no snapshot was under way."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline, wait_for
from tests.support.producer_harness import sql
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.secure_stack]

_TOASTED = "(SELECT string_agg(md5(g::text || '-' || k::text), '') FROM generate_series(1, 120) k)"


def test_existing_rows_of_every_table_shape_reach_the_lake(
    spark: SparkSession, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    s = f"e2e_snap_{uuid.uuid4().hex[:8]}"
    keyed, keyless, empty, parted = f"{s}.keyed", f"{s}.keyless", f"{s}.empty", f"{s}.parted"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {keyed} (id int PRIMARY KEY, v int NOT NULL, pad text)",
        f"INSERT INTO {keyed} SELECT g, 0, CASE WHEN g % 50 = 0 THEN {_TOASTED} ELSE 'p' || g "
        "END FROM generate_series(1, 30000) g",
        f"CREATE TABLE {keyless} (x int, y text)",
        f"INSERT INTO {keyless} SELECT g % 100, 'y' || g FROM generate_series(1, 2000) g",
        f"CREATE TABLE {empty} (id int PRIMARY KEY)",
        f"CREATE TABLE {parted} (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        f"CREATE TABLE {parted}_1 PARTITION OF {parted} FOR VALUES FROM (0) TO (5000)",
        f"CREATE TABLE {parted}_2 PARTITION OF {parted} FOR VALUES FROM (5000) TO (100000)",
        f"INSERT INTO {parted} SELECT g, 'v' || g FROM generate_series(1, 8000) g",
    )
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                with conn.transaction():
                    conn.execute(f"UPDATE {keyed} SET v = v + 1 WHERE id = %s", (i * 7 % 30000,))
                    conn.execute(f"DELETE FROM {keyed} WHERE id = %s", (i * 13 % 30000,))
                    conn.execute(f"INSERT INTO {keyed} VALUES (%s, 1, 'new')", (100000 + i,))
                    conn.execute(f"INSERT INTO {keyless} VALUES (%s, 'during')", (i,))
                    conn.execute(f"UPDATE {parted} SET id = id + 10000 WHERE id = %s", (i,))
                time.sleep(0.01)

    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path,
            [keyed, keyless, empty, parted], "e2esnap",
        ) as p:  # fmt: skip
            p.sql(
                f"ALTER PUBLICATION {p.source.publication} SET (publish_via_partition_root = true)"
            )
            p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
            p.producer.env["WALBRIDGE_SNAPSHOT_CHUNK_ROWS"] = "3000"
            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            p.start_producer()
            p.wait_snapshots_read(240)
            stop.set()
            writer.join(30)
            p.wait_published()
            for table in (keyed, keyless, empty, parted):
                p.wait_snapshot_recorded(table)
            p.consume_available()
            p.assert_equal()
            # Every snapshot is done and acknowledged: the last batch names none.
            assert p.progress()[-1]["snapshotting"] == []
    finally:
        stop.set()
        sql(pg_dsn, f"DROP SCHEMA IF EXISTS {s} CASCADE")


def test_the_progress_table_names_a_table_while_its_snapshot_runs(
    spark: SparkSession, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    """Not timing-dependent: the snapshot's reads wait for a lock the test holds, so the
    batch that reads its resume record runs while it is certainly unfinished."""
    s = f"e2e_snapping_{uuid.uuid4().hex[:8]}"
    held, other = f"{s}.held", f"{s}.other"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {held} (id int PRIMARY KEY, v text)",
        f"INSERT INTO {held} SELECT g, 'v' || g FROM generate_series(1, 5000) g",
        f"CREATE TABLE {other} (id int PRIMARY KEY)",
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [held, other], "e2esnapping"
        ) as p:
            p.start_producer()  # --snapshot never: the signal asks for the snapshot
            with psycopg.connect(pg_dsn) as lock:  # a transaction open until the block ends
                lock.execute(f"LOCK TABLE {held} IN ACCESS EXCLUSIVE MODE")
                asked = subprocess.run(
                    [sys.executable, "-m", "producer", "snapshot", held],
                    env={**os.environ, "WALBRIDGE_PG_DSN": pg_dsn},
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert asked.returncode == 0, asked.stderr
                wait_for(
                    "the producer to take the signal",
                    lambda: "snapshotting" in p.producer.http("/readyz")[1],
                    every=0.2,
                )
                p.sql(f"INSERT INTO {other} VALUES (1)")
                p.wait_published()  # the signal's transaction, its resume record, the insert
                p.consume_available()
                assert p.progress()[-1]["snapshotting"] == [held]
                assert [r["id"] for r in p.table(other)] == [1]
            wait_for(
                "the snapshot to end",
                lambda: "snapshotting" not in p.producer.http("/readyz")[1],
                every=0.5,
            )
            p.wait_published()
            # /readyz and the slot move on before the table's last resume record commits.
            p.wait_snapshot_recorded(held)
            p.consume_available()
            assert p.progress()[-1]["snapshotting"] == []
            p.assert_equal()
    finally:
        sql(pg_dsn, f"DROP SCHEMA IF EXISTS {s} CASCADE")
