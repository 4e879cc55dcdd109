"""What writing the lake without deletion vectors costs (`--lake-deletion-vectors false`).

Two copies of one target table (S rows in key order, ~128k rows per file, the consumer's key
property), one with deletion vectors (the default) and one without, take the same batches
through the consumer's own apply path (`merge.apply`), alternating so both see the same JVM:

- `recent`: half updates of the most recently written keys, half inserts of new keys (the
  usual CDC shape: the key range keeps the MERGE to the newest files);
- `scattered`: updates of keys spread evenly over the whole table, so every file holds some.

With deletion vectors a MERGE writes the new rows and marks the old ones; without them it
rewrites each file that holds an updated row. After the batches, a full scan of each copy shows
what the readers pay for the vectors. Ratios are "without / with" (> 1: without is slower).

Run (figures in docs/benchmarks.md):
  .walbridge/venv/bin/python tests/bench/bench_consumer_deletion_vectors.py --rows 1000000 --changes 50000 --batches 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer import merge
from spark_consumer.columns import COMMIT_LSN, OP, TOAST, TOTAL_ORDER, TS_MS
from spark_consumer.session import build_session

COLUMNS = ("id", "v", "note")


def target(
    spark: SparkSession, path: str, rows: int, deletion_vectors: bool, rows_per_file: int
) -> None:
    (
        spark.range(rows)
        .select(
            F.col("id"),
            (F.col("id") % 1000).alias("v"),
            F.lit("initial row, with some text to give the files a realistic width").alias("note"),
            F.lit(1).cast("long").alias(COMMIT_LSN),
            F.col("id").alias(TOTAL_ORDER),
            F.lit("c").alias(OP),
            F.lit(0).cast("long").alias(TS_MS),
        )
        .repartitionByRange(max(1, rows // rows_per_file), "id")
        .sortWithinPartitions("id")
        .write.format("delta")
        .save(path)
    )
    mode = "true" if deletion_vectors else "false"
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        f"('{merge.KEY_PROPERTY}' = 'id', '{merge.DELETION_VECTORS}' = '{mode}')"
    )


def changes(spark: SparkSession, workload: str, rows: int, n: int, batch: int) -> DataFrame:
    """One transaction of n changes at commit_lsn batch + 2 (each batch newer than the last)."""
    if workload == "recent":
        # Updates of the newest n/2 keys, inserts of n/2 new keys after the previous batches'.
        top = rows + batch * (n // 2)
        ids = spark.range(top - n // 2, top + n // 2)
        op = F.when(F.col("id") < top, "u").otherwise("c")
    else:
        # n updates spread evenly over all rows: every file of the table holds some.
        step = max(1, rows // n)
        ids = spark.range(batch % step, rows, step).limit(n)
        op = F.lit("u")
    return ids.select(
        F.col("id"),
        ((F.col("id") + batch) % 7).alias("v"),
        F.lit(f"changed in batch {batch}").alias("note"),
        F.lit(batch + 2).cast("long").alias(COMMIT_LSN),
        F.monotonically_increasing_id().alias(TOTAL_ORDER),
        op.alias(OP),
        F.lit(0).cast("long").alias(TS_MS),
        F.array().cast("array<string>").alias(TOAST),
    ).persist()


def apply_batch(
    spark: SparkSession,
    path: str,
    src: DataFrame,
    deletion_vectors: bool,
    key_range: tuple[int, int],
) -> float:
    tc = merge.TableChanges(
        "bench",
        Path(path).name,
        path,
        ("id",),
        COLUMNS,
        src,
        key_min=key_range[0],
        key_max=key_range[1],
        deletion_vectors=deletion_vectors,
    )
    t0 = time.perf_counter()
    merge.apply(spark, tc)
    return time.perf_counter() - t0


def scan(spark: SparkSession, path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    row = spark.read.format("delta").load(path).agg(F.count("*"), F.sum("v")).first()
    assert row is not None
    return time.perf_counter() - t0, int(row[0])


def size_mb(path: str) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 1e6


def workload_run(
    spark: SparkSession, tmp: str, workload: str, rows: int, n: int, batches: int, per_file: int
) -> None:
    paths = {dv: f"{tmp}/{workload}_{'dv' if dv else 'plain'}" for dv in (True, False)}
    for dv, path in paths.items():
        target(spark, path, rows, dv, per_file)
    took: dict[bool, list[float]] = {True: [], False: []}
    for b in range(batches):
        src = changes(spark, workload, rows, n, b)
        lo_hi = src.agg(F.min("id"), F.max("id")).first()
        assert lo_hi is not None
        # Alternate which mode goes first, so neither always meets a warmer JVM.
        for dv in (True, False) if b % 2 == 0 else (False, True):
            took[dv].append(apply_batch(spark, paths[dv], src, dv, (lo_hi[0], lo_hi[1])))
        src.unpersist()
    # Each copy scanned once untimed (its files' metadata and the scan's code warm), then timed.
    for dv in (True, False):
        scan(spark, paths[dv])
    reads = {dv: scan(spark, paths[dv]) for dv in (True, False)}
    assert reads[True][1] == reads[False][1], f"row counts differ: {reads}"
    with_dv, without = sum(took[True]), sum(took[False])
    print(
        f"{workload:>9}: {batches} MERGE batches of {n:,} changes into {rows:,} rows: "
        f"with deletion vectors {with_dv:.1f} s (median batch {statistics.median(took[True]):.1f} s), "
        f"without {without:.1f} s (median {statistics.median(took[False]):.1f} s); "
        f"ratio {without / with_dv:.2f}"
    )
    print(
        f"{'':>9}  then a full scan: {reads[True][0]:.2f} s with, {reads[False][0]:.2f} s without "
        f"(ratio {reads[False][0] / reads[True][0]:.2f}); written in all (nothing vacuumed) "
        f"{size_mb(paths[True]):.1f} MB with, {size_mb(paths[False]):.1f} MB without "
        f"(ratio {size_mb(paths[False]) / size_mb(paths[True]):.2f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--changes", type=int, default=50_000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["recent", "scattered"])
    ap.add_argument(
        "--rows-per-file", type=int, default=131_072, help="the target's rows per file at start"
    )
    args = ap.parse_args()
    spark = build_session(
        "bench-consumer-deletion-vectors",
        shuffle_partitions=2,
        extra_conf={"spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up (JIT, Delta classes), untimed, both modes.
        for dv in (True, False):
            path = f"{tmp}/warm_{dv}"
            target(spark, path, 100_000, dv, 50_000)
            src = changes(spark, "scattered", 100_000, 5_000, 0)
            apply_batch(spark, path, src, dv, (0, 100_000))
            src.unpersist()
        for workload in args.workloads:
            workload_run(
                spark, tmp, workload, args.rows, args.changes, args.batches, args.rows_per_file
            )
    spark.stop()


if __name__ == "__main__":
    main()
