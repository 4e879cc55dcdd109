"""Benchmark: the producer on every PostgreSQL major, in one run, as ratios.

Run (needs the local stack's Kafka and registry; ~15 minutes with the defaults):

    .walbridge/venv/bin/python tests/bench/bench_pg_versions.py [--majors 15,16,17,18]
        [--changes 200000] [--rows 500000] [--failover-runs 3]

For each major, a server of that major is started by `deploy/local/stack` in a state directory
of its own (the session stack's Kafka and registry serve every row), and three figures are
taken, each against a baseline measured on the same server in the same run:

- producer / pg_recvlogical: `bench_producer.py --changes N` (the same WAL decoded by both);
- snapshot / COPY: `bench_snapshot.py --rows N` (rows/s into Kafka, acknowledged);
- on 17+, the failover gap: a primary and a standby (`WALBRIDGE_PG_STANDBY=1`), the producer on
  the multi-host DSN, one small insert every 20 ms tagged with the serving node's port; once the
  standby holds the synced slot, `stack failover`, and the gap is the time from that command
  (the primary stops at once) to the arrival, at a Kafka reader polling the topic, of the first
  event written on the new primary. Target: under 30 s.

The 1-minute load average is printed before the run; the figures are meant for a quiet
machine (below 1.5): with a higher load the run refuses to start unless --allow-busy.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from confluent_kafka import Consumer  # noqa: E402
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer  # noqa: E402

from tests.support.pg_versions import failover_ready  # noqa: E402
from tests.support.producer_harness import ProducerProcess, Source, query, sql  # noqa: E402
from tests.support.scratch_stack import ScratchStack, free_block  # noqa: E402

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable


def stack_exports() -> dict[str, str]:
    out = subprocess.run(
        [str(ROOT / "deploy/local/stack"), "env"], check=True, text=True, capture_output=True
    ).stdout
    return dict(re.findall(r"^export (\w+)='([^']*)'$", out, re.MULTILINE))


def server(major: int, standby: bool = False) -> ScratchStack:
    """A server (or a primary and its standby) of that major, started fresh for a failover."""
    home = ROOT / ".walbridge" / ("pg-failover" if standby else "pg-matrix") / str(major)
    port = free_block(2)
    settings = {"WALBRIDGE_PG_VERSION": str(major), "WALBRIDGE_PG_PORT": str(port)}
    if standby:
        settings |= {"WALBRIDGE_PG_STANDBY": "1", "WALBRIDGE_PG_STANDBY_PORT": str(port + 1)}
    stack = ScratchStack(home, **settings)
    if standby:
        stack.run("down", "postgres", "postgres-2")
        shutil.rmtree(home / "postgres", ignore_errors=True)
        stack.up("postgres", "postgres-2")
    else:
        stack.up("postgres")
    return stack


def run_bench(script: str, args: list[str], env: dict[str, str], pattern: str) -> float:
    """Run a bench script; its figure, from the line matching ``pattern``."""
    done = subprocess.run(
        [PYTHON, str(BENCH / script), *args], env=env, text=True, capture_output=True, cwd=ROOT
    )
    sys.stdout.write("".join(f"    | {line}\n" for line in done.stdout.splitlines()))
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{done.stderr[-3000:]}")
    match = re.search(pattern, done.stdout)
    if match is None:
        raise RuntimeError(f"{script} printed no line matching {pattern!r}")
    return float(match.group(1))


def failover_gap(major: int, kafka: str, registry: str) -> float:
    pair = server(major, standby=True)
    try:
        env = pair.exports()
        dsn, standby_dsn = env["WALBRIDGE_PG_DSN"], env["WALBRIDGE_PG_STANDBY_DSN"]
        schema = f"bench_fo_{uuid.uuid4().hex[:8]}"
        table = f"{schema}.ticks"
        sql(
            dsn,
            f"CREATE SCHEMA {schema}",
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, node int NOT NULL)",
        )
        source = Source.create(dsn, [table], "benchfo")
        producer = ProducerProcess(source, kafka, registry, topic_partitions=1)
        producer.start()
        topic = f"{source.prefix}.{table}"
        stop = threading.Event()
        arrivals: list[tuple[float, int]] = []  # (arrival time, node port) of each event
        writer = threading.Thread(target=_ticks, args=(dsn, table, stop), daemon=True)
        reader = threading.Thread(
            target=_arrivals, args=(kafka, registry, topic, stop, arrivals), daemon=True
        )
        writer.start()
        reader.start()
        try:
            deadline = time.monotonic() + 180
            while not failover_ready(standby_dsn, source.slot):
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby never held the synced slot")
                time.sleep(0.5)
            old_port = int(query(dsn, "SELECT inet_server_port()")[0][0])
            began = time.monotonic()
            done = pair.run("failover")
            if done.returncode != 0:
                raise RuntimeError(f"stack failover failed:\n{done.stderr}")
            deadline = time.monotonic() + 300
            while not any(node != old_port and at >= began for at, node in arrivals):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no event from the new primary:\n{producer.log()}")
                time.sleep(0.05)
            first = min(at for at, node in arrivals if node != old_port and at >= began)
            return first - began
        finally:
            stop.set()
            writer.join(10)
            reader.join(10)
            producer.stop()
    finally:
        pair.run("down", "postgres", "postgres-2")


def _ticks(dsn: str, table: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
                while not stop.is_set():
                    conn.execute(f"INSERT INTO {table} (node) VALUES (inet_server_port())")
                    time.sleep(0.02)
        except psycopg.OperationalError:
            time.sleep(0.1)


def _arrivals(
    kafka: str, registry: str, topic: str, stop: threading.Event, out: list[tuple[float, int]]
) -> None:
    """Arrival time (at this reader) and the writing node of each event."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"bench-fo-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            message = consumer.poll(0.05)
            if message is None or message.error() or message.value() is None:
                continue
            arrived = time.monotonic()
            value = deserialize(message.value(), None)
            out.append((arrived, int(value["after"]["node"])))
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--majors", default="15,16,17,18")
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--failover-runs", type=int, default=3)
    parser.add_argument("--allow-busy", action="store_true")
    args = parser.parse_args()
    majors = [int(m) for m in args.majors.split(",")]
    load = os.getloadavg()[0]
    print(f"load average (1 min) before the run: {load:.2f} on {os.cpu_count()} CPUs")
    if load >= 1.5 and not args.allow_busy:
        sys.exit("the machine is busy (load >= 1.5): figures would not be comparable")
    exports = stack_exports()
    kafka, registry = exports["WALBRIDGE_KAFKA_BOOTSTRAP"], exports["WALBRIDGE_SCHEMA_REGISTRY_URL"]
    rows: list[tuple[int, float, float, str]] = []
    for major in majors:
        print(f"== PostgreSQL {major}")
        stack = server(major)
        try:
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")},
                "WALBRIDGE_PG_DSN": stack.exports()["WALBRIDGE_PG_DSN"],
                "WALBRIDGE_PG_TOOLS": exports["WALBRIDGE_PG_TOOLS"],
                "WALBRIDGE_KAFKA_BOOTSTRAP": kafka,
                "WALBRIDGE_SCHEMA_REGISTRY_URL": registry,
            }
            producer_ratio = run_bench(
                "bench_producer.py",
                ["--changes", str(args.changes), "--runs", "1", "--exactly-once", "on"],
                env,
                r"ratio producer / pg_recvlogical = ([0-9.]+)",
            )
            # The producer's default worker count (--snapshot-workers 0: the cores, capped).
            snapshot_ratio = run_bench(
                "bench_snapshot.py",
                ["--rows", str(args.rows), "--workers", "0"],
                env,
                r"ratio rows/s snapshot/COPY, 0 worker\(s\): ([0-9.]+)",
            )
        finally:
            stack.run("down", "postgres")
        gap = "n/a (no failover slots before 17)"
        if major >= 17 and args.failover_runs:
            gaps = [failover_gap(major, kafka, registry) for _ in range(args.failover_runs)]
            gap = f"median {statistics.median(gaps):.1f} s (runs: {', '.join(f'{g:.1f}' for g in gaps)})"
        rows.append((major, producer_ratio, snapshot_ratio, gap))
        print(
            f"   producer/pg_recvlogical {producer_ratio:.3f}, snapshot/COPY {snapshot_ratio:.2f}, failover gap {gap}"
        )
    print(f"\nload average (1 min) after the run: {os.getloadavg()[0]:.2f}")
    print(
        "| PostgreSQL | producer ÷ pg_recvlogical | snapshot ÷ COPY | failover gap (target < 30 s) |"
    )
    print("|---|---|---|---|")
    for major, producer_ratio, snapshot_ratio, gap in rows:
        print(f"| {major} | {producer_ratio:.3f} | {snapshot_ratio:.2f} | {gap} |")


if __name__ == "__main__":
    main()
