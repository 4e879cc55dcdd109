"""A wide table's MERGE still prunes files by statistics when its pruning column comes after
Delta's first 32 (spark_consumer.file_stats), on Spark and Delta: the key of a keyed table, and
commit_lsn, which follows every source column, of a table without a key."""

from __future__ import annotations

from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_consumer import file_stats, merge
from tests.support.spark import spark  # noqa: F401

WIDE = tuple(f"c{i}" for i in range(40))
META = (
    "_commit_lsn long, _total_order long, _op string, _ts_ms long, _unchanged_toast array<string>"
)


def _keyed(spark: SparkSession, path: str, keys: tuple[int, ...], lsn: int) -> None:
    rows = [
        (*[f"v{k}"] * len(WIDE), k, lsn, i, "c" if lsn < 30 else "u", 0, [])
        for i, k in enumerate(keys)
    ]
    schema = ", ".join(f"{c} string" for c in WIDE) + ", k long, " + META
    changes = spark.createDataFrame(rows, schema).coalesce(1)
    merge.apply(
        spark,
        merge.TableChanges(
            "s", "wide", path, ("k",), (*WIDE, "k"), changes, key_min=min(keys), key_max=max(keys)
        ),
    )


def _keyless(spark: SparkSession, path: str, lsns: tuple[int, int], after: int) -> None:
    rows = [(*[f"v{lsn}"] * len(WIDE), lsn, 1, "c", 0, []) for lsn in lsns]
    schema = ", ".join(f"{c} string" for c in WIDE) + ", " + META
    changes = spark.createDataFrame(rows, schema).coalesce(1)
    merge.apply(
        spark,
        merge.TableChanges("s", "log", path, (), WIDE, changes, commit_lsns=(after, max(lsns))),
    )


def _property(spark: SparkSession, path: str) -> str | None:
    detail = DeltaTable.forPath(spark, path).detail().collect()[0]
    return detail["properties"].get(file_stats.STATS_COLUMNS_PROPERTY)


def test_a_key_after_the_first_32_columns_still_prunes(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "wide")
    _keyed(spark, path, (1, 2), lsn=10)
    assert (_property(spark, path) or "").split(",")[0] == "k"
    first_files = set(Path(path).glob("*.parquet"))
    _keyed(spark, path, (100, 101), lsn=20)
    # The first batch's file goes missing: a MERGE that read the whole table fails on it, one
    # that pruned by the key's statistics skips it.
    for f in first_files:
        f.unlink()
    _keyed(spark, path, (100,), lsn=30)
    got = spark.read.format("delta").load(path).where("k >= 100").orderBy("k")
    assert [(r.k, r._op) for r in got.collect()] == [(100, "u"), (101, "c")]


def test_a_table_without_a_key_and_40_columns_still_prunes_by_commit_lsn(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "log")
    _keyless(spark, path, (10, 11), after=0)
    assert (_property(spark, path) or "").split(",")[0] == "_commit_lsn"
    first_files = set(Path(path).glob("*.parquet"))
    _keyless(spark, path, (20, 21), after=11)
    for f in first_files:
        f.unlink()
    _keyless(spark, path, (30, 31), after=21)
    got = spark.read.format("delta").load(path).where("_commit_lsn > 11").orderBy("_commit_lsn")
    assert [r._commit_lsn for r in got.collect()] == [20, 21, 30, 31]
