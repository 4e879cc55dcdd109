"""The progress table on real Delta: rows read back, and statistics only where readers use them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_consumer import progress
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.integration


def test_progress_rows_read_back_with_statistics_of_the_columns_readers_select_by(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "progress")
    for batch_id in (0, 1):
        row = progress.Progress(
            batch_id=batch_id,
            commit_lsn=100 + batch_id,
            table_versions={"public.a": batch_id},
            kafka_offsets={"t": {"0": 10 * batch_id}},
        )
        progress.append(spark, path, batch_id, row, 3, 0, None, ["public.b"], batch_id > 0)

    latest = progress.latest(spark, path)
    assert (latest.batch_id, latest.commit_lsn, latest.table_versions) == (1, 101, {"public.a": 1})
    assert latest.snapshotting == frozenset({"public.b"})

    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    assert {r["key"]: r["value"] for r in props}[progress.STATS_PROPERTY] == "batch_id,commit_lsn"
    adds = [
        json.loads(line)["add"]
        for f in sorted((tmp_path / "progress" / "_delta_log").glob("*.json"))
        for line in f.read_text().splitlines()
        if '"add"' in line
    ]
    assert len(adds) == 2  # one data file per batch
    for add in adds:
        stats = json.loads(add["stats"])
        assert set(stats["minValues"]) == {"batch_id", "commit_lsn"}
