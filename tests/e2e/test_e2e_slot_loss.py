"""A slot lost while the producer was down, end to end (issue 39): with --on-slot-loss
resnapshot the producer replaces the slot and snapshots the table again, and the lake converges
on the source, deletes made in the lost window included; verify finds them equal."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.producer_harness import sql, unique
from tests.support.slot_loss import invalidate, slot_row
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e]


def test_resnapshot_after_a_lost_slot_converges_the_lake(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    name = unique("e2eslot")
    table = f"public.{name}"
    sql(
        pg_dsn,
        f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL, pad text)",
        f"INSERT INTO {name} SELECT g, 0, 'p' || g FROM generate_series(1, 200) g",
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [table], "e2eslot"
        ) as p:
            p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
            p.start_producer()
            p.sql(f"UPDATE {name} SET v = 1 WHERE id <= 50")
            p.wait_published()
            p.wait_snapshot_recorded(table)
            assert p.producer.stop() == 0, p.producer.log()
            p.consume_available()
            p.assert_equal()

            # While the producer is down: changes its slot will never deliver, then the slot
            # is invalidated.
            p.sql(
                f"DELETE FROM {name} WHERE id BETWEEN 100 AND 120",
                f"UPDATE {name} SET v = 9 WHERE id = 1",
                f"INSERT INTO {name} SELECT g, 3, 'n' FROM generate_series(300, 310) g",
            )
            invalidate(p.source.dsn, p.source.slot)

            p.producer.env["WALBRIDGE_ON_SLOT_LOSS"] = "resnapshot"
            p.start_producer()
            new = slot_row(p.source.dsn, p.source.slot)
            assert new is not None and new["wal_status"] != "lost"
            p.sql(f"DELETE FROM {name} WHERE id = 2")  # streamed during the snapshot
            p.wait_published()
            p.wait_snapshot_recorded(table)
            p.consume_available()
            p.assert_equal()  # rows 100-120 are gone from the lake too
            last = max(p.progress(), key=lambda row: row["batch_id"])
            assert table not in (last["snapshotting"] or [])
            assert p.producer.stop() == 0, p.producer.log()
            assert "is lost: wal_status lost" in p.producer.log()
    finally:
        sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")
