"""Benchmark: commit -> Kafka latency at a steady rate of small transactions.

Run (needs the local stack; about a minute):

    .walbridge/venv/bin/python tests/bench/bench_producer_latency.py [--rate 1000] [--rows 5] [--seconds 20]

Writers commit ``--rate`` transactions/s of ``--rows`` inserts each for ``--seconds``, while the
producer (``python -m producer run``) publishes them. The table's topic is created up front with
``message.timestamp.type=LogAppendTime``, so each record's Kafka timestamp is the moment the
broker appended it (just before it acknowledges). Latency per event = that timestamp minus the
PostgreSQL commit time carried in ``source.ts_ms``; p50/p99/max are printed (target p99 < 100 ms)
with the transaction rate actually reached (the writers share the 2 cores too). Writers commit
with synchronous_commit=on (``--async-commit`` keeps the stack's off: then the WAL writer's
200 ms flush delay, not the producer, sets the latency).

With ``--snapshot-rows N`` the same run measures the latency while an incremental snapshot
runs: a second table of N rows (bench_replication's 8 columns) is in the publication, and
``--rounds`` times, one phase of ``--seconds`` runs with no snapshot, then the snapshot is asked
for (``walbridge-producer snapshot public.<table>``) and, once its first chunk is published, a
phase of the same length runs beside it. Each event belongs to the phase its commit fell in;
p99 with ÷ p99 without is printed per round and over all rounds (target < 2), with the snapshot's
rows/s during the phase (what the chunk budget trades for that latency). A phase the snapshot
did not cover to its end is reported (use more rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_producer import stack_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from producer.pgoutput import Commit, Decoder  # noqa: E402
from producer.replication import ReplicationClient, ReplicationConfig  # noqa: E402
from producer.transactions import pg_ts_to_ms  # noqa: E402
from tests.support.producer_harness import ProducerProcess, Source, metric, sql  # noqa: E402

SYNC_COMMIT = True


def writer(dsn: str, table: str, rate: float, rows: int, seconds: float, done: list[int]) -> None:
    statement = f"INSERT INTO {table} (v) SELECT g FROM generate_series(1, {rows}) g"
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The local stack runs with synchronous_commit=off: WAL reaches the walsender only when
        # the WAL writer flushes (wal_writer_delay, 200 ms), which would dominate the figure.
        conn.execute(f"SET synchronous_commit = {'on' if SYNC_COMMIT else 'off'}")
        began = time.perf_counter()
        sent = 0
        while (now := time.perf_counter() - began) < seconds:
            due = int(now * rate) + 1
            while sent < due:
                conn.execute(statement)
                sent += 1
            time.sleep(max(0.0, sent / rate - (time.perf_counter() - began)))
        done.append(sent)


class WalsenderBaseline:
    """Commit -> arrival of its Commit message at a bare replication client (no Kafka), on a
    second slot of the same publication: what PostgreSQL itself adds, measured in the same run."""

    def __init__(self, dsn: str, publication: str) -> None:
        self.slot = f"benchl_base_{uuid.uuid4().hex[:8]}"
        self.dsn = dsn
        self.publication = publication
        self.latencies: list[float] = []
        self.stop = threading.Event()
        sql(dsn, f"SELECT pg_create_logical_replication_slot('{self.slot}', 'pgoutput')")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        config = ReplicationConfig(
            slot=self.slot, publication=self.publication, create_slot=False,
            create_publication=False,
        )  # fmt: skip
        decode = Decoder().decode
        with ReplicationClient(self.dsn, config) as client:
            for item in client.stream(idle_after=0.2):
                if item is None:
                    if self.stop.is_set():
                        return
                    continue
                message = decode(item[0])
                if type(message) is Commit:
                    now_ms = time.time() * 1000
                    self.latencies.append(now_ms - pg_ts_to_ms(message.commit_ts))
                    client.confirm(message.end_lsn)

    def finish(self) -> list[float]:
        self.stop.set()
        self.thread.join(60)
        sql(self.dsn, f"SELECT pg_drop_replication_slot('{self.slot}')")
        return sorted(self.latencies)


def run_writers(dsn: str, table: str, rate: float, rows: int, seconds: float, n: int) -> int:
    done: list[int] = []
    threads = [
        threading.Thread(target=writer, args=(dsn, table, rate / n, rows, seconds, done))
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def snapshotting(producer: ProducerProcess) -> bool:
    return "snapshotting" in producer.http("/readyz")[1]


Phase = tuple[str, float, float, bool, float]


def snapshot_phases(
    args: argparse.Namespace, dsn: str, table: str, big: str, producer: ProducerProcess
) -> tuple[int, list[Phase]]:
    """(transactions, [(phase, first commit ms, last commit ms, snapshot ran throughout,
    snapshot rows published meanwhile)])."""
    phases: list[Phase] = []
    sent = 0
    for _ in range(args.rounds):
        deadline = time.monotonic() + 600
        while snapshotting(producer):  # the previous round's snapshot ends first
            assert time.monotonic() < deadline, producer.log()
            time.sleep(0.5)
        began = time.time() * 1000
        sent += run_writers(dsn, table, args.rate, args.rows, args.seconds, args.writers)
        phases.append(("without", began, time.time() * 1000, True, 0.0))
        before = metric(producer, "walbridge_snapshot_rows_total")
        subprocess.run(
            [sys.executable, "-m", "producer", "snapshot", f"public.{big}"],
            env={**os.environ, "WALBRIDGE_PG_DSN": dsn}, check=True, capture_output=True,
        )  # fmt: skip
        while metric(producer, "walbridge_snapshot_rows_total") <= before:
            assert time.monotonic() < deadline, producer.log()
            time.sleep(0.05)
        began = time.time() * 1000
        rows_before = metric(producer, "walbridge_snapshot_rows_total")
        sent += run_writers(dsn, table, args.rate, args.rows, args.seconds, args.writers)
        rows = metric(producer, "walbridge_snapshot_rows_total") - rows_before
        phases.append(("with", began, time.time() * 1000, snapshotting(producer), rows))
    return sent, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="transactions per second")
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument(
        "--async-commit", action="store_true", help="keep the server's synchronous_commit=off"
    )
    parser.add_argument(
        "--snapshot-rows", type=int, default=0, help="measure beside snapshots of this many rows"
    )
    parser.add_argument("--rounds", type=int, default=2, help="without/with rounds")
    parser.add_argument(
        "--chunk-budget-ms", type=int, default=None, help="the producer's snapshot_chunk_budget_ms"
    )
    args = parser.parse_args()
    global SYNC_COMMIT
    SYNC_COMMIT = not args.async_commit
    env = stack_env()
    dsn = env["WALBRIDGE_PG_DSN"]
    table = f"benchl_{uuid.uuid4().hex[:8]}"
    sql(
        dsn, f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int, at timestamptz DEFAULT now())"
    )
    big = f"benchl_big_{uuid.uuid4().hex[:8]}"
    tables = [table]
    if args.snapshot_rows:
        sql(
            dsn,
            f"CREATE TYPE {big}_mood AS ENUM ('sad', 'ok', 'happy')",
            f"CREATE TABLE {big} (id int8 PRIMARY KEY, name text, price numeric(12,2),"
            f" created timestamptz, doc jsonb, active bool, tags text[], mood {big}_mood)",
            f"INSERT INTO {big} SELECT g, 'name-' || g, (g % 100000) / 100.0, now(),"
            " jsonb_build_object('g', g, 'tag', 'bench'), g % 2 = 0, ARRAY['a', g::text],"
            f" (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::{big}_mood"
            f" FROM generate_series(1, {args.snapshot_rows}) g",
            f"VACUUM ANALYZE {big}",
        )
        tables.append(big)
    source = Source.create(dsn, tables, "benchl")
    topic = f"{source.prefix}.public.{table}"
    admin = AdminClient({"bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"]})
    new = NewTopic(topic, 3, -1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([new])[topic].result()
    baseline = WalsenderBaseline(dsn, source.publication)
    producer = ProducerProcess(
        source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"],
        log_level="WARNING", snapshot="never",
        **({} if args.chunk_budget_ms is None else {"snapshot_chunk_budget_ms": args.chunk_budget_ms}),
    ).start()  # fmt: skip
    phases: list[Phase] = []
    try:
        if args.snapshot_rows:
            sent, phases = snapshot_phases(args, dsn, table, big, producer)
            done = [sent]
        else:
            done = [run_writers(dsn, table, args.rate, args.rows, args.seconds, args.writers)]
        if args.snapshot_rows:
            deadline = time.monotonic() + 900
            while snapshotting(producer):  # (a stop inside a chunk's transaction aborts it)
                assert time.monotonic() < deadline, producer.log()
                time.sleep(0.5)
        source.wait_confirmed(source.current_lsn(), timeout=300)
        assert producer.stop() == 0, producer.log()
        base = baseline.finish()
    finally:
        if producer.proc is not None and producer.proc.poll() is None:
            producer.kill()
        source.drop()
    expected = sum(done) * args.rows
    consumer = Consumer(
        {
            "bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"],
            "group.id": f"lat{uuid.uuid4().hex}",
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    deserialize = AvroDeserializer(
        SchemaRegistryClient({"url": env["WALBRIDGE_SCHEMA_REGISTRY_URL"]})
    )
    latencies: list[float] = []
    by_phase: list[list[float]] = [[] for _ in phases]
    deadline = time.monotonic() + 300
    while len(latencies) < expected and time.monotonic() < deadline:
        for m in consumer.consume(5000, 1.0):
            if m.error() is not None:
                continue
            value = deserialize(m.value(), SerializationContext(topic, MessageField.VALUE))
            _kind, appended_ms = m.timestamp()
            committed = value["source"]["ts_ms"]
            latencies.append(appended_ms - committed)
            for i, (_, began, ended, _, _) in enumerate(phases):
                if began - 1 <= committed <= ended + 1:
                    by_phase[i].append(appended_ms - committed)
    consumer.close()
    sql(dsn, f"DROP TABLE {table}")
    if args.snapshot_rows:
        sql(dsn, f"DROP TABLE {big}", f"DROP TYPE {big}_mood")
    if len(latencies) != expected:
        sys.exit(f"read {len(latencies)} events, expected {expected}")
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    print(
        f"{sum(done):,} transactions of {args.rows} rows in {args.seconds:.0f}s "
        f"({sum(done) / args.seconds:,.0f} tx/s, target {args.rate:,.0f}); {expected:,} events"
    )
    print(
        f"commit -> Kafka append latency: p50 {q[49]:.0f} ms, p99 {q[98]:.0f} ms, "
        f"max {latencies[-1]:.0f} ms (target p99 < 100 ms)"
    )
    b = statistics.quantiles(base, n=100)
    print(
        f"baseline, commit -> bare replication client (no Kafka), {len(base):,} commits: "
        f"p50 {b[49]:.0f} ms, p99 {b[98]:.0f} ms, max {base[-1]:.0f} ms; "
        f"p99 ratio producer / baseline {q[98] / max(b[98], 1.0):.2f}"
    )
    if phases:
        report_phases(phases, by_phase)


def report_phases(phases: list[Phase], by_phase: list[list[float]]) -> None:
    p99s: dict[str, list[float]] = {"without": [], "with": []}
    for (kind, began, ended, covered, rows), values in zip(phases, by_phase, strict=True):
        p = statistics.quantiles(sorted(values), n=100)
        p99s[kind].append(p[98])
        note = "" if covered else " (the snapshot ended before this phase did: use more rows)"
        rate = f"; snapshot {rows / ((ended - began) / 1000):,.0f} rows/s" if kind == "with" else ""
        print(
            f"  {kind:>7} snapshot: {len(values):,} events, p50 {p[49]:.0f} ms, "
            f"p99 {p[98]:.0f} ms{rate}{note}"
        )
    for i, (without, with_) in enumerate(zip(p99s["without"], p99s["with"], strict=True)):
        print(f"round {i + 1}: p99 with ÷ without a snapshot {with_ / max(without, 1.0):.2f}")
    everything = {kind: sorted(v for (k, *_), vs in zip(phases, by_phase, strict=True)
                               if k == kind for v in vs) for kind in p99s}  # fmt: skip
    q_with = statistics.quantiles(everything["with"], n=100)[98]
    q_without = statistics.quantiles(everything["without"], n=100)[98]
    print(
        f"all rounds: p99 {q_with:.0f} ms with a snapshot, {q_without:.0f} ms without; "
        f"ratio {q_with / max(q_without, 1.0):.2f} (target < 2)"
    )


if __name__ == "__main__":
    main()
