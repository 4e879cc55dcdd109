"""Delta checkpoints are written by the consumer's background thread, never inside a commit
(spark_consumer/checkpoints.py), and the table reads the same through them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_consumer import checkpoints
from spark_consumer.checkpoints import Checkpointer
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.integration


def _append(spark: SparkSession, path: str, versions: range) -> None:
    for v in versions:
        spark.range(v, v + 1).write.format("delta").mode("append").save(path)


def _checkpoints(log: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint*.parquet"))


def test_checkpoints_are_written_beside_the_commits(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    log = tmp_path / "t" / "_delta_log"
    _append(spark, path, range(12))  # versions 0..11
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    assert {r["key"]: r["value"] for r in props}["delta.checkpointInterval"] == str(
        checkpoints.IN_COMMIT_INTERVAL
    )
    assert _checkpoints(log) == [], "version 10 was checkpointed inside its commit"

    writer = Checkpointer(spark)
    try:
        writer.request([path])
        writer.drain()
        assert _checkpoints(log) == [11]
        assert json.loads((log / "_last_checkpoint").read_text())["version"] == 11

        _append(spark, path, range(12, 17))  # version 16: 5 past the checkpoint
        writer.request([path, path])
        writer.drain()
        assert _checkpoints(log) == [11]

        _append(spark, path, range(17, 22))  # version 21: 10 past it
        writer.request([path])
        writer.drain()
        assert _checkpoints(log) == [11, 21]
        assert writer.written == 2
    finally:
        writer.close()

    # A new reader starts from the checkpoint and sees every row.
    spark.catalog.clearCache()
    rows = spark.read.format("delta").load(path).collect()
    assert sorted(r["id"] for r in rows) == list(range(22))


def test_a_path_without_a_table_is_left_alone(spark: SparkSession, tmp_path: Path) -> None:
    writer = Checkpointer(spark)
    try:
        writer.request([str(tmp_path / "nothing-here")])
        writer.drain()
        assert writer.written == 0
        assert not (tmp_path / "nothing-here").exists()
    finally:
        writer.close()
