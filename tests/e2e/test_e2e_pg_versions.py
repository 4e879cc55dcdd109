"""The version matrix: the whole pipeline on PostgreSQL 15, 16, 17 and 18.

On each major: existing rows reach the lake through the initial snapshot while writes go on
(a keyed table with TOASTed values, a table without a key), then streamed changes of the
shapes users have (small transactions, one of 5,000 rows, updates that leave a TOAST value
unchanged, deletes). A read_committed reader finds every event once and END counts exact
(exactly-once is the producer's default), and `verify` finds the lake equal to PostgreSQL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.exactly_once import check_exactly_once
from tests.support.pg_versions import MAJORS, pg_dsn_of, server_major  # noqa: F401
from tests.support.producer_harness import sql
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e]

_TOASTED = "(SELECT string_agg(md5(g::text || '-' || k::text), '') FROM generate_series(1, 120) k)"


def _write_small_transactions(dsn: str, items: str, log: str, stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            with conn.transaction():
                conn.execute(f"UPDATE {items} SET qty = qty + 1 WHERE id = %s", (i * 7 % 3000,))
                conn.execute(f"DELETE FROM {items} WHERE id = %s", (i * 13 % 3000 + 1,))
                conn.execute(
                    f"INSERT INTO {items} (id, qty, note, tags) VALUES (%s, 1, 'new', '{{a,b}}')",
                    (100_000 + i,),
                )
                conn.execute(f"INSERT INTO {log} VALUES (%s, 'during')", (i,))
            time.sleep(0.02)


@pytest.mark.parametrize("major", MAJORS)
def test_the_whole_pipeline_on_each_postgresql_major(
    major: int,
    pg_dsn_of: Callable[[int], str],
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    dsn = pg_dsn_of(major)
    assert server_major(dsn) == major
    s = f"e2e_pg{major}_{uuid.uuid4().hex[:8]}"
    items, log = f"{s}.items", f"{s}.log"
    sql(
        dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {items} (id int PRIMARY KEY, qty int NOT NULL, note text, tags text[],"
        " at timestamptz NOT NULL DEFAULT now())",
        f"INSERT INTO {items} (id, qty, note, tags) SELECT g, 0,"
        f" CASE WHEN g % 40 = 0 THEN {_TOASTED} ELSE 'n' || g END, ARRAY['t' || g % 7]"
        " FROM generate_series(1, 3000) g",
        f"CREATE TABLE {log} (k int, v text)",
        f"INSERT INTO {log} SELECT g % 50, 'v' || g FROM generate_series(1, 500) g",
    )
    stop = threading.Event()
    try:
        with pipeline(
            spark, dsn, kafka_bootstrap, registry_url, tmp_path, [items, log], f"e2epg{major}"
        ) as p:
            p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
            p.producer.env["WALBRIDGE_SNAPSHOT_CHUNK_ROWS"] = "1000"
            writer = threading.Thread(
                target=_write_small_transactions, args=(dsn, items, log, stop), daemon=True
            )
            writer.start()
            p.start_producer()
            p.wait_snapshots_read(180)
            stop.set()
            writer.join(30)
            p.sql(
                # One transaction of 5,000 changes, updates that leave the TOAST value out of
                # the stream (unchanged), deletes, and appends to the table without a key.
                f"INSERT INTO {items} (id, qty, note) SELECT g, 2, 'bulk' "
                "FROM generate_series(200000, 204999) g",
                f"UPDATE {items} SET qty = qty + 10 WHERE id % 40 = 0",
                f"DELETE FROM {items} WHERE id BETWEEN 2000 AND 2100",
                f"INSERT INTO {log} SELECT g, 'after' FROM generate_series(1, 100) g",
            )
            p.wait_published()
            for table in (items, log):
                p.wait_snapshot_recorded(table)
            transactions = check_exactly_once(p, [f"{p.prefix}.{items}", f"{p.prefix}.{log}"])
            assert transactions > 10  # the snapshot's chunks, the writer's, the four above
            p.consume_available()
            p.assert_equal()
            assert p.progress()[-1]["snapshotting"] == []
            assert p.producer.stop() == 0, p.producer.log()
    finally:
        stop.set()
        sql(dsn, f"DROP SCHEMA IF EXISTS {s} CASCADE")
