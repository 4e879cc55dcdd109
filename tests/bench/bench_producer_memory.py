"""Benchmark: the producer's peak RSS while it publishes one very large transaction.

Run (needs the local stack; ~6-8 minutes for the default 5M rows on 2 cores):

    .walbridge/venv/bin/python tests/bench/bench_producer_memory.py [--rows N]

One transaction inserts ``--rows`` rows into the 8-column table of bench_replication.py. The
producer (``python -m producer run``, real Kafka and registry) must publish and confirm it
while its memory stays bounded: events are produced as they are decoded and librdkafka's
queue is capped (queue.buffering.max.messages / .kbytes), so peak RSS should not grow with
the transaction. Prints the peak RSS (VmHWM, target < 300 MB) next to the peak of a run of
``--baseline-rows`` rows (default 10k) measured in the same run, and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_producer import run_producer, stack_env
from bench_replication import create_workload, drop_workload, generate

from producer.pgoutput import parse_lsn


def one_run(env: dict[str, str], rows: int) -> tuple[float, float, int]:
    dsn = env["WALBRIDGE_PG_DSN"]
    tag = uuid.uuid4().hex[:8]
    schema, publication, slot = f"benchm_{tag}", f"benchm_pub_{tag}", f"benchm_{tag}"
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_workload(db, schema, publication, slot)
            began = time.perf_counter()
            generate(db, schema, rows, rows)  # a single transaction
            print(
                f"  generated one transaction of {rows:,} rows in {time.perf_counter() - began:.1f}s"
            )
            row = db.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            end_lsn = parse_lsn(row[0])
            seconds, _, cpu, _main_thread_cpu, rss = run_producer(
                env, slot, publication, f"benchm{tag}", end_lsn, None
            )
            return seconds, cpu, rss
        finally:
            drop_workload(db, schema, publication, [slot])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--baseline-rows", type=int, default=10_000)
    args = parser.parse_args()
    env = stack_env()
    results = {}
    for rows in (args.baseline_rows, args.rows):
        seconds, cpu, rss = one_run(env, rows)
        results[rows] = rss
        print(
            f"{rows:>10,} rows in one transaction: {seconds:7.1f}s ({rows / seconds:,.0f} rows/s),"
            f" CPU {cpu:.1f}s, peak RSS {rss / 1024:.0f} MB"
        )
    big, small = results[args.rows], results[args.baseline_rows]
    print(
        f"peak RSS {big / 1024:.0f} MB (target < 300 MB); ratio to the {args.baseline_rows:,}-row"
        f" run {big / small:.2f}"
    )


if __name__ == "__main__":
    main()
