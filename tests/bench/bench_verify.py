"""verify at table scale: one table of N rows (bigint key, text, numeric, timestamptz) in
PostgreSQL and the same rows in a Delta table, compared by `verify.compare_table` (bucket
checksums on both sides, no drill: the sides are equal, which it asserts).

Reports verify's rows/s against a baseline in the same run (`SELECT count(*)` in PostgreSQL plus a
Spark count of the Delta table: the two scans verify can't avoid), and the driver's peak RSS
during verify ÷ its RSS just before, for the Python driver and for the JVM (in local mode the JVM
also runs the executors). Bounded memory means the ratios stay flat as N grows.

Run (stack up):
  .walbridge/venv/bin/python tests/bench/bench_verify.py --rows 10000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_producer import stack_env
from proc_usage import rss_kb

from schemas.safe_names import lake_table_path
from spark_consumer import verify
from spark_consumer.session import build_session

EPOCH_2026 = 1767225600  # 2026-01-01 00:00:00 UTC


class Peak:
    """Samples the RSS of some processes every 0.2 s in a thread; keeps each one's peak."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {k: rss_kb(p) for k, p in pids.items()}
        self.peak = dict(self.before)
        self._since: dict[str, int] = dict(self.before)  # peak since the last `since()`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for k, p in self.pids.items():
                now = rss_kb(p)
                self.peak[k] = max(self.peak[k], now)
                self._since[k] = max(self._since[k], now)

    def since(self, name: str) -> int:
        """The peak of `name` since the last call (or the start), in kB; starts a new window."""
        peak, self._since[name] = self._since[name], rss_kb(self.pids[name])
        return peak

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def fill_pg(db: psycopg.Connection, schema: str, rows: int) -> None:
    table = sql.Identifier(schema, "t")
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, v text, amount numeric(12,2), at timestamptz)"
        ).format(table)
    )
    step = 1_000_000
    for start in range(1, rows + 1, step):
        db.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, 'v' || g, ((g %% 100000) / 100.0)::numeric(12,2),"
                " to_timestamp(%s + g) FROM generate_series(%s, %s) g"
            ).format(table),
            (EPOCH_2026, start, min(start + step - 1, rows)),
        )
    db.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def fill_lake(spark: SparkSession, path: str, rows: int) -> None:
    (
        spark.range(1, rows + 1)
        .select(
            F.col("id"),
            F.concat(F.lit("v"), F.col("id").cast("string")).alias("v"),
            F.expr("CAST(CAST(id % 100000 AS DECIMAL(12,0)) / 100 AS DECIMAL(12,2))").alias(
                "amount"
            ),
            F.timestamp_seconds(F.col("id") + EPOCH_2026).alias("at"),
        )
        .repartitionByRange(max(1, rows // 500_000), "id")
        .write.format("delta")
        .save(path)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args()
    dsn = stack_env()["WALBRIDGE_PG_DSN"]
    schema = f"benchv_{uuid.uuid4().hex[:8]}"
    tmp = tempfile.mkdtemp(prefix="bench_verify_")
    spark = build_session("bench-verify")
    spark.sparkContext.setLogLevel("WARN")
    try:
        with psycopg.connect(dsn, autocommit=True) as db:
            t0 = time.perf_counter()
            fill_pg(db, schema, args.rows)
            print(f"PostgreSQL filled in {time.perf_counter() - t0:.1f}s", flush=True)
        path = lake_table_path(tmp, schema, "t")
        t0 = time.perf_counter()
        fill_lake(spark, path, args.rows)
        print(f"Delta table written in {time.perf_counter() - t0:.1f}s", flush=True)

        with psycopg.connect(dsn) as conn:
            for statement in verify.SESSION:
                conn.execute(statement)
            t0 = time.perf_counter()
            conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "t")))
            pg_count_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            lake_count = spark.read.format("delta").load(path).count()
            lake_count_s = time.perf_counter() - t0
            assert lake_count == args.rows
            jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]
            with Peak({"python": os.getpid(), "jvm": jvm}) as peak:
                t0 = time.perf_counter()
                diff = verify.compare_table(conn, spark, (schema, "t"), path)
                verify_s = time.perf_counter() - t0
        assert diff.equal, verify.report([diff])
        baseline_s = pg_count_s + lake_count_s
        load = os.getloadavg()
        print(f"rows: {args.rows}")
        print(
            f"verify: {verify_s:.1f}s, {args.rows / verify_s:.0f} rows/s; baseline (count(*) "
            f"{pg_count_s:.1f}s + Spark count {lake_count_s:.1f}s): {baseline_s:.1f}s, "
            f"{args.rows / baseline_s:.0f} rows/s; verify time / baseline {verify_s / baseline_s:.1f}"
        )
        for name in ("python", "jvm"):
            print(
                f"driver {name} RSS: {peak.before[name] / 1024:.0f} MB before, peak "
                f"{peak.peak[name] / 1024:.0f} MB during verify, ratio "
                f"{peak.peak[name] / peak.before[name]:.2f}"
            )
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
