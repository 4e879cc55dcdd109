"""Freshness: source commit -> visible in the lake (through the progress table), p50 and p99,
at a steady rate of changes/s through the whole real pipeline (PostgreSQL, the producer as a
subprocess, Kafka, the consumer streaming in this process).

Workload: transactions of --per-tx inserts (default 5, the TPC-B shape) at the given rate. A transaction is visible when the first
progress row with commit_lsn >= its commit_lsn is written (`applied_at`); its commit time is the
event's `_ts_ms` (source commit time). Needs the local stack (deploy/local/stack up).

Also reported, to show where a batch's seconds go: the median of each step of the consumer's
batch function (BatchReport.steps) and of Spark's own trigger phases around it
(StreamingQueryProgress.durationMs: latestOffset, walCommit, addBatch = the batch function,
commitOffsets, triggerExecution = the whole trigger).

The first --warmup seconds of load (default 180) are applied and left out: a young JVM's first
batches are slow and would make a one-off start-up cost look like steady-state freshness. Its
JIT compiler threads used 0.8 of a core at first under this load, 0.2-0.3 after four minutes;
the median batch went from 4-5 s in the first minute to 2.5 s.

The figures are also written as JSON (every transaction's delay included), with a plot of the
freshness distribution (PNG) beside it, under --results-dir (tests/bench/bench_output.py says
where by default).

Run:
  eval "$(deploy/local/stack env)"
  .walbridge/venv/bin/python tests/bench/bench_consumer_freshness.py --rate 1000 --seconds 60
(--trigger defaults to the consumer's own default, DEFAULT_TRIGGER.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg
from pyspark.sql import functions as F

from spark_consumer.config import DEFAULT_TRIGGER
from spark_consumer.session import build_session
from spark_consumer.source import start
from tests.bench.bench_output import results_dir, run_base, write_json
from tests.bench.plots import distribution_plot
from tests.e2e.harness import pipeline
from tests.support.producer_harness import sql


def load(dsn: str, table: str, rate: float, seconds: float, per_tx: int = 10) -> int:
    """Steady transactions of `per_tx` inserts; returns how many transactions committed."""
    interval = per_tx / rate
    n = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {table} (v) SELECT g FROM generate_series(1, %s) g", (per_tx,)
                )
            n += 1
            lag = t0 + n * interval - time.monotonic()
            if lag > 0:
                time.sleep(lag)
    return n


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=1000.0, help="changes/s")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--trigger", default=DEFAULT_TRIGGER)
    ap.add_argument("--per-tx", type=int, default=5, help="inserts per source transaction")
    ap.add_argument(
        "--warmup",
        type=float,
        default=180.0,
        help="seconds of the same load, applied and left out of the figures, before the timed"
        " load: freshness is a steady-state figure, and a young JVM's first batches are not",
    )
    ap.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help=f"where the JSON result and the plot go (default: {results_dir()})",
    )
    args = ap.parse_args()
    dsn = os.environ["WALBRIDGE_PG_DSN"]
    s = f"bench_fresh_{uuid.uuid4().hex[:8]}"
    table = f"{s}.events"
    sql(
        dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int, at timestamptz DEFAULT now())",
    )
    spark = build_session("bench-consumer-freshness")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            pipeline(
                spark,
                dsn,
                os.environ["WALBRIDGE_KAFKA_BOOTSTRAP"],
                os.environ["WALBRIDGE_SCHEMA_REGISTRY_URL"],
                Path(tmp),
                [table],
                "benchfresh",
            ) as p,
        ):
            p.start_producer()
            proc = p.processor(trigger=args.trigger, available_now=False)
            query = start(spark, proc.config, proc)

            def applied() -> int:
                return sum(sum(r.changes_by_table.values()) for r in proc.reports)

            def run_load(seconds: float, expected_before: int) -> int:
                """Runs the load, then waits until the lake has it all; returns the total."""
                committed = load(dsn, table, args.rate, seconds, args.per_tx)
                p.wait_published()
                expected = expected_before + committed * args.per_tx
                deadline = time.monotonic() + 600
                while applied() < expected and query.exception() is None:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the lake did not catch up: {applied()}/{expected}")
                    time.sleep(0.5)
                return expected

            warm = run_load(args.warmup, 0) if args.warmup > 0 else 0
            first_report = len(proc.reports)
            progress_seen = {prog.batchId for prog in query.recentProgress}
            measured_from = time.time()
            run_load(args.seconds, warm)
            trigger_phases: dict[str, list[float]] = {}
            for prog in query.recentProgress:
                if prog.numInputRows and prog.batchId not in progress_seen:
                    for k, v in json.loads(prog.json)["durationMs"].items():
                        trigger_phases.setdefault(k, []).append(v / 1000)
            query.stop()
            progress = (
                spark.read.format("delta")
                .load(f"{p.lake}/_walbridge/progress")
                .select("commit_lsn", F.col("applied_at").cast("double").alias("at"))
                .orderBy("commit_lsn")
                .collect()
            )
            schema, name = table.split(".")
            txs = (
                spark.read.format("delta")
                .load(f"{p.lake}/{schema}/{name}")
                .where(F.col("_ts_ms") >= int(measured_from * 1000))
                .groupBy("_commit_lsn")
                .agg(F.max("_ts_ms").alias("ts"))
                .collect()
            )
            marks = [(r["commit_lsn"], r["at"]) for r in progress]
            delays = []
            for t in txs:
                visible = next(at for lsn, at in marks if lsn >= t["_commit_lsn"])
                delays.append(visible - t["ts"] / 1000)
            reports = proc.reports[first_report:]
            seconds = [r.seconds for r in reports if not r.skipped]
            print(
                f"{len(txs)} transactions ({len(txs) * args.per_tx} changes) at {args.rate:.0f} "
                f"changes/s, trigger {args.trigger!r}: freshness p50 {pct(delays, 50):.1f} s,"
                f" p99 {pct(delays, 99):.1f} s, max {max(delays):.1f} s; {len(seconds)} "
                f"batches, median batch {pct(seconds, 50):.1f} s (after {args.warmup:.0f} s"
                " of warm-up load)"
            )
            steps: dict[str, list[float]] = {}
            for r in reports:
                if not r.skipped and r.applied_transactions:
                    for k, v in r.steps.items():
                        steps.setdefault(k, []).append(v)
            print(
                "batch function, median s per step: "
                + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in steps.items())
            )
            print(
                "Spark trigger phases (batches with input), median s: "
                + ", ".join(
                    f"{k} {statistics.median(v):.2f}" for k, v in sorted(trigger_phases.items())
                )
            )
            base = run_base("bench_consumer_freshness", args.results_dir)
            percentiles = {"p50": pct(delays, 50), "p99": pct(delays, 99)}
            result = {
                "rate": args.rate,
                "seconds": args.seconds,
                "trigger": args.trigger,
                "per_tx": args.per_tx,
                "warmup_s": args.warmup,
                "transactions": len(txs),
                "freshness_s": {**percentiles, "max": max(delays)},
                "median_batch_s": pct(seconds, 50),
                "batch_step_median_s": {k: statistics.median(v) for k, v in steps.items()},
                "trigger_phase_median_s": {
                    k: statistics.median(v) for k, v in sorted(trigger_phases.items())
                },
                "delays_s": sorted(delays),
            }
            plot = distribution_plot(
                base.with_suffix(".png"),
                delays,
                title=(
                    f"Freshness: source commit to visible in the lake, {len(txs)} transactions at "
                    f"{args.rate:.0f} changes/s"
                ),
                xlabel="seconds",
                marks=percentiles,
            )
            print(f"results: {write_json(base, result)}, {plot}")
    finally:
        sql(dsn, f"DROP SCHEMA {s} CASCADE")
        spark.stop()


if __name__ == "__main__":
    main()
