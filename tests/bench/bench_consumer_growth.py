"""Growth: the cost of one MERGE batch of N changes into tables of S1 and S2 rows (ratio).

Each target table is written in key order (as a CDC table fills up: keys grow with time), with
deletion vectors on and the consumer's key property. The batch is the consumer's own apply path
(`merge.apply`) with a typical change mix: half updates of recently written keys, half inserts of
new keys; the key-range condition lets Delta skip every file outside the batch's key range.
For contrast the same batch is also merged without the key range (full scan of the target).

Run (full size, slow here):
  .walbridge/venv/bin/python tests/bench/bench_consumer_growth.py --sizes 1000000 10000000 --changes 100000
Smaller:
  .walbridge/venv/bin/python tests/bench/bench_consumer_growth.py --sizes 1000000 4000000 --changes 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer import merge
from spark_consumer.columns import COMMIT_LSN, OP, TOAST, TOTAL_ORDER, TS_MS
from spark_consumer.session import build_session

COLUMNS = ("id", "v", "note")


def target(spark: SparkSession, path: str, rows: int) -> None:
    (
        spark.range(rows)
        .select(
            F.col("id"),
            (F.col("id") % 1000).alias("v"),
            F.lit("initial row").alias("note"),
            F.lit(1).cast("long").alias(COMMIT_LSN),
            F.col("id").alias(TOTAL_ORDER),
            F.lit("c").alias(OP),
            F.lit(0).cast("long").alias(TS_MS),
        )
        # ~128k rows per file: a 1M table has 8 files, 10M has 80.
        .repartitionByRange(max(1, rows // 131_072), "id")
        .sortWithinPartitions("id")
        .write.format("delta")
        .save(path)
    )
    # The consumer records the key as a table property at creation; do the same.
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        f"('{merge.KEY_PROPERTY}' = 'id', 'delta.enableDeletionVectors' = 'true')"
    )


def changes(spark: SparkSession, rows: int, n: int) -> DataFrame:
    """n/2 updates of the most recent keys, n/2 inserts of new keys, one transaction."""
    half = n // 2
    return (
        spark.range(rows - half, rows + half)
        .select(
            F.col("id"),
            (F.col("id") % 7).alias("v"),
            F.lit("changed").alias("note"),
            F.lit(2).cast("long").alias(COMMIT_LSN),
            (F.col("id") - rows + half + 1).alias(TOTAL_ORDER),
            F.when(F.col("id") < rows, "u").otherwise("c").alias(OP),
            F.lit(0).cast("long").alias(TS_MS),
            F.array().cast("array<string>").alias(TOAST),
        )
        .persist()
    )


def one(spark: SparkSession, tmp: str, rows: int, n: int, use_range: bool) -> float:
    path = f"{tmp}/t{rows}_{int(use_range)}"
    target(spark, path, rows)
    src = changes(spark, rows, n)
    src.count()
    half = n // 2
    tc = merge.TableChanges(
        "bench",
        f"t{rows}",
        path,
        ("id",),
        COLUMNS,
        src,
        key_min=rows - half if use_range else None,
        key_max=rows + half - 1 if use_range else None,
    )
    t0 = time.perf_counter()
    merge.apply(spark, tc)
    took = time.perf_counter() - t0
    got = DeltaTable.forPath(spark, path).toDF().count()
    assert got == rows + half, f"{got} rows after merge, expected {rows + half}"
    src.unpersist()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs=2, default=[1_000_000, 10_000_000])
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--no-contrast", action="store_true", help="skip the full-scan MERGE")
    args = ap.parse_args()
    spark = build_session("bench-consumer-growth", shuffle_partitions=4)
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        one(spark, tmp, 100_000, 10_000, True)  # warm-up (JIT, Delta classes)
        small, large = args.sizes
        t_small = one(spark, tmp, small, args.changes, True)
        t_large = one(spark, tmp, large, args.changes, True)
        print(
            f"MERGE of {args.changes:,} changes with key range: {small:,} rows {t_small:.1f} s, "
            f"{large:,} rows {t_large:.1f} s; ratio {t_large / t_small:.2f}"
        )
        if not args.no_contrast:
            f_small = one(spark, tmp, small, args.changes, False)
            f_large = one(spark, tmp, large, args.changes, False)
            print(
                f"same without key range (full scan): {f_small:.1f} s, {f_large:.1f} s; "
                f"ratio {f_large / f_small:.2f}"
            )
    spark.stop()


if __name__ == "__main__":
    main()
