"""A keyless table's dedup MERGE reads only the batch's commit_lsn range of the table
(spark_consumer.merge.apply_append_only), on Spark and Delta."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from spark_consumer import merge
from tests.support.spark import spark  # noqa: F401

CHANGES = "v long, _commit_lsn long, _total_order long, _op string, _ts_ms long"


def _apply(spark: SparkSession, path: str, lsns: tuple[int, int], after: int) -> None:
    rows = [(lsn, lsn, 1, "c", 0) for lsn in lsns]
    changes = spark.createDataFrame(rows, CHANGES).coalesce(1)
    merge.apply(
        spark,
        merge.TableChanges("s", "log", path, (), ("v",), changes, commit_lsns=(after, max(lsns))),
    )


def test_older_files_are_not_read_and_a_replay_adds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "log")
    _apply(spark, path, (10, 11), after=0)
    first_files = set(Path(path).glob("*.parquet"))
    assert first_files
    _apply(spark, path, (20, 21), after=11)
    # The first batch's data file goes missing: a MERGE that read the whole table fails on it,
    # one bounded by the batch's commit_lsn range skips it by its statistics.
    for f in first_files:
        f.unlink()
    _apply(spark, path, (30, 31), after=21)
    _apply(spark, path, (30, 31), after=21)  # a replay of the same batch
    got = spark.read.format("delta").load(path).where("_commit_lsn > 11").orderBy("v")
    assert [r.v for r in got.collect()] == [20, 21, 30, 31]
