"""Benchmark: commit -> Kafka latency at a steady rate of small transactions.

Run (needs the local stack; about a minute):

    .walbridge/venv/bin/python tests/bench/bench_producer_latency.py [--rate 1000] [--rows 5] [--seconds 20]

Writers commit ``--rate`` transactions/s of ``--rows`` inserts each for ``--seconds``, while the
producer (``python -m producer run``) publishes them. The table's topic is created up front with
``message.timestamp.type=LogAppendTime``, so each record's Kafka timestamp is the moment the
broker appended it (just before it acknowledges). Latency per event = that timestamp minus the
PostgreSQL commit time carried in ``source.ts_ms``; p50/p99/max are printed (target p99 < 100 ms)
with the transaction rate actually reached (the writers share the 2 cores too).
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
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_producer import stack_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.integration.test_producer_harness import ProducerProcess, Source, sql  # noqa: E402


def writer(dsn: str, table: str, rate: float, rows: int, seconds: float, done: list[int]) -> None:
    statement = f"INSERT INTO {table} (v) SELECT g FROM generate_series(1, {rows}) g"
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.perf_counter()
        sent = 0
        while (now := time.perf_counter() - began) < seconds:
            due = int(now * rate) + 1
            while sent < due:
                conn.execute(statement)  # type: ignore[arg-type]
                sent += 1
            time.sleep(max(0.0, sent / rate - (time.perf_counter() - began)))
        done.append(sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="transactions per second")
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--writers", type=int, default=2)
    args = parser.parse_args()
    env = stack_env()
    dsn = env["WALBRIDGE_PG_DSN"]
    table = f"benchl_{uuid.uuid4().hex[:8]}"
    sql(
        dsn, f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int, at timestamptz DEFAULT now())"
    )
    source = Source.create(dsn, [table], "benchl")
    topic = f"{source.prefix}.public.{table}"
    admin = AdminClient({"bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"]})
    new = NewTopic(topic, 3, -1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([new])[topic].result()
    producer = ProducerProcess(
        source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"],
        log_level="WARNING",
    ).start()  # fmt: skip
    try:
        done: list[int] = []
        threads = [
            threading.Thread(
                target=writer,
                args=(dsn, table, args.rate / args.writers, args.rows, args.seconds, done),
            )
            for _ in range(args.writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        source.wait_confirmed(source.current_lsn(), timeout=300)
        assert producer.stop() == 0, producer.log()
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
    deadline = time.monotonic() + 300
    while len(latencies) < expected and time.monotonic() < deadline:
        for m in consumer.consume(5000, 1.0):
            if m.error() is not None:
                continue
            value = deserialize(m.value(), SerializationContext(topic, MessageField.VALUE))
            _kind, appended_ms = m.timestamp()
            latencies.append(appended_ms - value["source"]["ts_ms"])
    consumer.close()
    sql(dsn, f"DROP TABLE {table}")
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


if __name__ == "__main__":
    main()
