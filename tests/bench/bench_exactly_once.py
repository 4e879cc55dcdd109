"""Benchmark: what exactly-once costs, against idempotent mode in the same run.

Run (needs the local stack; about 5 minutes for the default 1M changes):

    .walbridge/venv/bin/python tests/bench/bench_exactly_once.py [--changes N] [--tx-size N] [--rate 1000] [--seconds 20]

1. Throughput. bench_producer.py's workload (``--changes`` changes on its 8-column table, half
   inserts, half updates, in transactions of ``--tx-size`` rows) decoded twice from the same
   WAL: a pgoutput slot is created before the data and copied, one producer runs with
   ``--no-exactly-once`` (idempotent, today's baseline), one with Kafka transactions (the
   default), each timed from start until its slot's confirmed LSN reaches the end (with
   exactly-once that is: every event in a committed Kafka transaction). Ratio exactly-once /
   idempotent: target >= 0.9.
2. Visibility latency. Writers commit ``--rate`` transactions/s of 5 inserts for ``--seconds``;
   a consumer with ``isolation.level=read_committed`` reads the table's topic as it is written
   and takes, per event, the moment it received it minus the PostgreSQL commit time
   (``source.ts_ms``): commit -> visible to a read_committed reader. Both modes, one after the
   other; p50/p99 printed (target for exactly-once: p99 < 250 ms).
3. One big transaction (``--big-rows``, e.g. 5000000; 0 skips it): a single INSERT of that many
   rows while an exactly-once producer runs that exits right after its third Kafka commit (the
   fault-injection setting: the transaction is then part-way in Kafka, the slot unconfirmed);
   a second producer resumes it. Then: the records a read_committed reader finds in the topic
   must be exactly the rows, the END marker must count them, and the second producer's peak
   RSS is printed against its RSS when it was ready (memory bounded whatever the size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_producer import proc_stat, run_producer, stack_env, update
from bench_producer_latency import writer
from bench_replication import create_workload, drop_workload, generate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from producer.pgoutput import parse_lsn  # noqa: E402
from tests.support.producer_harness import ProducerProcess, Source, TopicReader  # noqa: E402
from tests.support.producer_harness import sql as run_sql  # noqa: E402

MODES = {"idempotent": "false", "exactly-once": "true"}


def throughput(env: dict[str, str], changes: int, tx_size: int, rounds: int) -> float:
    """Median ratio over ``rounds`` rounds, each both modes, in ABBA order (each on its own copy
    of the slot): a machine that gets busier or quieter during the run biases neither mode."""
    dsn = env["WALBRIDGE_PG_DSN"]
    tag = uuid.uuid4().hex[:8]
    schema, publication = f"bench_{tag}", f"bench_pub_{tag}"
    runs = [
        (mode, f"bench_{tag}_{r}_{i}")
        for r in range(rounds)
        for i, mode in enumerate(list(MODES) if r % 2 == 0 else list(MODES)[::-1])
    ]
    first = runs[0][1]
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_workload(db, schema, publication, first)
            began = time.perf_counter()
            inserts = changes // 2
            generate(db, schema, inserts, tx_size)
            update(db, schema, changes - inserts, tx_size)
            print(f"generated {changes:,} changes in {time.perf_counter() - began:.1f}s")
            row = db.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            end_lsn = parse_lsn(row[0])
            for _mode, slot in runs[1:]:
                db.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (first, slot))
            for n, (mode, slot) in enumerate(runs):
                seconds, steady, cpu, _main, rss = run_producer(
                    env | {"WALBRIDGE_EXACTLY_ONCE": MODES[mode]},
                    slot, publication, f"bench{tag}{n}", end_lsn, None,
                )  # fmt: skip
                rates[mode].append(changes / seconds)
                print(
                    f"{mode:13} {seconds:7.2f}s {changes / seconds:10,.0f} changes/s "
                    f"({changes / steady:,.0f} after start-up); CPU {cpu:.1f}s, "
                    f"peak RSS {rss / 1024:.0f} MB"
                )
        finally:
            drop_workload(db, schema, publication, (slot for _mode, slot in runs))
    ratios = sorted(e / i for e, i in zip(rates["exactly-once"], rates["idempotent"], strict=True))
    ratio = statistics.median(ratios)
    print(
        f"throughput ratio exactly-once / idempotent = {ratio:.3f} (median of "
        f"{', '.join(f'{r:.3f}' for r in ratios)}; target >= 0.9)"
    )
    return ratio


class VisibleReader:
    """read_committed consumer of one topic, live: per event, receipt time - commit time."""

    def __init__(self, env: dict[str, str], topic: str) -> None:
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"],
                "group.id": f"visible{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,  # the broker's wait for data must not be the figure
                "topic.metadata.refresh.interval.ms": 500,
            }
        )
        self.topic = topic
        self.deserialize = AvroDeserializer(
            SchemaRegistryClient({"url": env["WALBRIDGE_SCHEMA_REGISTRY_URL"]})
        )
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.topic not in self.consumer.list_topics(timeout=10).topics:
            time.sleep(0.2)
        parts = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
        context = SerializationContext(self.topic, MessageField.VALUE)
        while not self.stop.is_set():
            for m in self.consumer.consume(1000, 0.05):
                now_ms = time.time() * 1000
                if m.error() is not None:
                    continue
                value = self.deserialize(m.value(), context)
                self.latencies.append(now_ms - value["source"]["ts_ms"])

    def finish(self, expected: int, timeout: float = 120.0) -> list[float]:
        deadline = time.monotonic() + timeout
        while len(self.latencies) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop.set()
        self.thread.join(30)
        self.consumer.close()
        return sorted(self.latencies)


def visibility(env: dict[str, str], mode: str, rate: float, seconds: float) -> list[float]:
    dsn = env["WALBRIDGE_PG_DSN"]
    table = f"benche_{uuid.uuid4().hex[:8]}"
    run_sql(dsn, f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int)")
    source = Source.create(dsn, [table], "benche")
    producer = ProducerProcess(
        source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"],
        log_level="WARNING", exactly_once=MODES[mode],
    ).start()  # fmt: skip
    reader = VisibleReader(env, f"{source.prefix}.public.{table}")
    try:
        done: list[int] = []
        threads = [
            threading.Thread(target=writer, args=(dsn, table, rate / 2, 5, seconds, done))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        latencies = reader.finish(sum(done) * 5)
        assert producer.stop() == 0, producer.log()
    finally:
        if producer.proc is not None and producer.proc.poll() is None:
            producer.kill()
        source.drop()
        run_sql(dsn, f"DROP TABLE {table}")
    if len(latencies) != sum(done) * 5:
        sys.exit(f"{mode}: read {len(latencies)} events, expected {sum(done) * 5}")
    q = statistics.quantiles(latencies, n=100)
    print(
        f"{mode:13} {sum(done) / seconds:,.0f} tx/s: commit -> visible to read_committed "
        f"p50 {q[49]:.0f} ms, p99 {q[98]:.0f} ms, max {latencies[-1]:.0f} ms"
    )
    return latencies


def count_committed(bootstrap: str, topic: str) -> int:
    """Records a read_committed reader finds in ``topic`` (not decoded: counted)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    waiting, count = set(parts), 0
    while waiting:
        for m in consumer.consume(10_000, 1.0):
            if m.error() is None:
                count += 1
            elif m.error().code() == KafkaError._PARTITION_EOF:
                waiting.discard(m.partition())
    consumer.close()
    return count


def big_transaction(env: dict[str, str], rows: int) -> None:
    dsn, bootstrap = env["WALBRIDGE_PG_DSN"], env["WALBRIDGE_KAFKA_BOOTSTRAP"]
    registry = env["WALBRIDGE_SCHEMA_REGISTRY_URL"]
    table = f"bencheb_{uuid.uuid4().hex[:8]}"
    run_sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, v int, pad text)")
    source = Source.create(dsn, [table], "bencheb")
    faulty = ProducerProcess(
        source, bootstrap, registry, log_level="WARNING", fault_exit_after_kafka_commits=3
    ).start()
    try:
        began = time.perf_counter()
        run_sql(
            dsn,
            f"INSERT INTO {table} SELECT g, g, repeat('x', 40) FROM generate_series(1, {rows}) g",
        )
        print(f"big transaction: {rows:,} rows inserted in {time.perf_counter() - began:.0f}s")
        assert faulty.proc is not None
        if faulty.proc.wait(1800) != 137:
            sys.exit(f"the faulty producer exited with {faulty.proc.returncode}")
        producer = ProducerProcess(source, bootstrap, registry, log_level="WARNING").start()
        assert producer.proc is not None
        _cpu, _main, ready_rss = proc_stat(producer.proc.pid)
        began = time.perf_counter()
        source.wait_confirmed(source.current_lsn(), timeout=3600)
        seconds = time.perf_counter() - began
        _cpu, _main, peak_rss = proc_stat(producer.proc.pid)
        assert producer.stop() == 0, producer.log()
        topic = f"{source.prefix}.public.{table}"
        found = count_committed(bootstrap, topic)
        reader = TopicReader(bootstrap, registry)
        ends = [
            r.value["event_count"]
            for r in reader.read_to_end([f"{source.prefix}.transaction"])
            if r.value["status"] == "END"
        ]
    finally:
        source.drop()
        run_sql(dsn, f"DROP TABLE {table}")
    print(
        f"big transaction: resumed and finished in {seconds:.0f}s; read_committed finds "
        f"{found:,} records for {rows:,} rows (exactly once: {found == rows}), END counts {ends}; "
        f"peak RSS {peak_rss / 1024:.0f} MB vs {ready_rss / 1024:.0f} MB when ready "
        f"({peak_rss / ready_rss:.2f}x)"
    )
    if found != rows or ends != [rows]:
        sys.exit("big transaction: NOT exactly once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--tx-size", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1000.0, help="transactions per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--big-rows", type=int, default=0)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    env = stack_env()
    if not args.skip_throughput:
        throughput(env, args.changes, args.tx_size, args.rounds)
    if not args.skip_latency:
        p99 = {}
        for mode in MODES:
            latencies = visibility(env, mode, args.rate, args.seconds)
            p99[mode] = statistics.quantiles(latencies, n=100)[98]
        print(
            f"p99 exactly-once {p99['exactly-once']:.0f} ms (target < 250 ms); "
            f"ratio to idempotent {p99['exactly-once'] / max(p99['idempotent'], 1.0):.2f}"
        )
    if args.big_rows:
        big_transaction(env, args.big_rows)


if __name__ == "__main__":
    main()
