"""Benchmark: the consumer's apply throughput on the local Spark cluster, one worker vs two.

Run (needs `deploy/local/stack up` and `deploy/local/stack up spark`; a few minutes):

    .walbridge/venv/bin/python tests/bench/bench_consumer_cluster.py [--changes N] [--rounds N] [--s3]

Workload: ``--changes`` row changes on a 3-column table (half inserts, half updates of the same
rows, 1000 rows per transaction), published once by the real producer. Then, per round, the
consumer (``python -m spark_consumer run --available-now``, no batch cap, a fresh lake and
checkpoint each time) applies the whole backlog on the cluster with worker 2 stopped (1 worker,
1 core) and with both workers (2 cores). The baseline is the one-worker run of the same round.

The rate counts the seconds the consumer's batches report (reading, decoding, MERGE and the
progress commit), not the driver's JVM start. It prints both rates, their ratio (2 workers over
1), and per-core rates. On this 2-core machine the driver, Kafka and PostgreSQL share the cores
with the executors, so the ratio understates what a cluster with dedicated cores gives.
``--s3`` puts the lake and checkpoint on the stack's S3 store (`deploy/local/stack up s3`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.producer_harness import ProducerProcess, Source, sql  # noqa: E402

STACK = ROOT / "deploy" / "local" / "stack"
BATCH = re.compile(r"batch \d+: applied (\d+) transaction\(s\).*?; ([0-9.]+)s")


def stack_env() -> dict[str, str]:
    out = subprocess.run([str(STACK), "env"], check=True, text=True, capture_output=True).stdout
    return dict(re.findall(r"^export (\w+)='([^']*)'$", out, re.MULTILINE))


def publish(env: dict[str, str], changes: int) -> Source:
    dsn = env["WALBRIDGE_PG_DSN"]
    table = f"bench_cluster_{uuid.uuid4().hex[:8]}"
    sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, pad text)")
    source = Source.create(dsn, [table], "bcluster")
    producer = ProducerProcess(
        source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"]
    ).start()
    rows = changes // 2
    for lo in range(1, rows + 1, 1000):
        hi = min(lo + 999, rows)
        sql(dsn, f"INSERT INTO {table} SELECT g, 0, 'p' || g FROM generate_series({lo}, {hi}) g")
    for lo in range(1, rows + 1, 1000):
        sql(dsn, f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN {lo} AND {min(lo + 999, rows)}")
    source.wait_confirmed(source.current_lsn(), timeout=900)
    assert producer.stop() == 0, producer.log()
    return source


def apply_once(env: dict[str, str], source: Source, lake_root: str, label: str) -> float:
    """Seconds of batch work to apply the whole backlog into a fresh lake."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")} | {
        "WALBRIDGE_KAFKA_BOOTSTRAP": env["WALBRIDGE_KAFKA_BOOTSTRAP"],
        "WALBRIDGE_SCHEMA_REGISTRY_URL": env["WALBRIDGE_SCHEMA_REGISTRY_URL"],
        "WALBRIDGE_SPARK_MASTER": env["WALBRIDGE_SPARK_MASTER"],
        "WALBRIDGE_TOPIC_PREFIX": source.prefix,
        "WALBRIDGE_LAKE_PATH": f"{lake_root}/{label}/lake",
        "WALBRIDGE_CHECKPOINT_PATH": f"{lake_root}/{label}/checkpoint",
        "WALBRIDGE_MAX_OFFSETS_PER_TRIGGER": "0",
        "WALBRIDGE_SPARK_DRIVER_MEMORY": "1g",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    run_env |= {k: v for k, v in env.items() if k.startswith("AWS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "spark_consumer", "run", "--available-now", "--metrics-port", "0"],
        cwd=ROOT, env=run_env, text=True, capture_output=True, timeout=3600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"consumer failed ({label}):\n{output[-4000:]}")
    batches = [float(m.group(2)) for m in BATCH.finditer(output) if int(m.group(1)) > 0]
    if not batches:
        raise SystemExit(f"no applied batch in the consumer's log ({label}):\n{output[-4000:]}")
    return sum(batches)


def workers(count: int) -> None:
    action = "up" if count == 2 else "down"
    subprocess.run([str(STACK), action, "spark-worker-2"], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--s3", action="store_true")
    args = parser.parse_args()
    env = stack_env()
    if "WALBRIDGE_SPARK_MASTER" not in env:
        raise SystemExit("start the cluster first: deploy/local/stack up spark")
    if args.s3 and "WALBRIDGE_S3_BUCKET" not in env:
        raise SystemExit("start the store first: deploy/local/stack up s3")
    source = publish(env, args.changes)
    times: dict[int, list[float]] = {1: [], 2: []}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
            root = f"s3a://{env['WALBRIDGE_S3_BUCKET']}/{source.prefix}" if args.s3 else tmp
            for r in range(args.rounds):
                for count in (1, 2):
                    workers(count)
                    seconds = apply_once(env, source, root, f"r{r}w{count}")
                    times[count].append(seconds)
                    print(
                        f"round {r + 1}, {count} worker(s): {seconds:.1f} s of batches, "
                        f"{args.changes / seconds:,.0f} changes/s",
                        flush=True,
                    )
    finally:
        workers(2)
        source.drop()
    one, two = statistics.median(times[1]), statistics.median(times[2])
    rate1, rate2 = args.changes / one, args.changes / two
    print(f"1 worker (1 core):  {rate1:,.0f} changes/s (median of {args.rounds})")
    print(f"2 workers (2 cores): {rate2:,.0f} changes/s, {rate2 / 2:,.0f} per core")
    print(f"ratio 2 workers / 1 worker: {rate2 / rate1:.2f}")


if __name__ == "__main__":
    main()
