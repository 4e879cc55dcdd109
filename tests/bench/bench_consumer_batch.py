"""Per-batch cost of the consumer's foreachBatch function, without Kafka (static batches).

Measures (local[2], mock:// registry, Delta under a temp dir):
  - small: several batches of 2 source transactions each (a few changes on two tables); the
    fixed cost per batch is what decides freshness;
  - large: one batch of N changes, reported as changes/s and as a ratio to a plain Delta append
    of the same decoded rows measured in the same run (the baseline). Workloads:
      --workload inserts (default): inserts over 2 three-column tables, transactions of 100;
      --workload mixed: the issue's 8-column table (the producer benchmark's `rows`: int8 key,
        text, numeric(12,2), timestamptz, jsonb, bool, text[], enum), transactions of 1000
        changes: 800 inserts of new keys, 100 updates of keys already in the lake (loaded by an
        earlier batch of --preload inserts, timed apart) and 100 updates of keys inserted
        earlier in the same batch;
      --workload producer: the producer benchmark's 1M-change workload on the same table: half
        the changes insert new rows in transactions of 1000, then each of those rows is updated
        once, 1000 per transaction (all in the one large batch).

Run (apply throughput of 1M changes in one batch: --small-batches 0 --large 1000000):
  .walbridge/venv/bin/python tests/bench/bench_consumer_batch.py --small-batches 5 --large 200000
  .walbridge/venv/bin/python tests/bench/bench_consumer_batch.py --small-batches 0 \
      --large 1000000 --workload mixed --preload 200000
  .walbridge/venv/bin/python tests/bench/bench_consumer_batch.py --small-batches 0 \
      --large 1000000 --workload producer
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.sql import DataFrame, SparkSession

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.registry import WriterSchemas
from spark_consumer.session import build_session
from tests.support.event_writer import (
    ColumnSpec,
    EventWriter,
    KafkaRecord,
    TableSpec,
    registry_client,
)
from tests.support.spark import KAFKA_SCHEMA, KafkaLog

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ACCOUNTS = TableSpec("public", "accounts", (ColumnSpec("id", "long", "int8"),
                                             ColumnSpec("balance", DEC, "numeric(12,2)"),
                                             ColumnSpec("note", "string", "text")), ("id",))
SAVINGS = TableSpec("bank", "savings", ACCOUNTS.columns, ("id",))
# The producer benchmark's 8-column table, in the Avro forms of schemas/type_mapping.py.
TEXT_ARRAY = {"type": "record", "name": "text_array", "namespace": "io.walbridge.pg", "fields": [
    {"name": "dims", "type": {"type": "array", "items": "int"}},
    {"name": "lower_bounds", "type": {"type": "array", "items": "int"}},
    {"name": "elements", "type": {"type": "array", "items": ["null", "string"]}}]}
ROWS = TableSpec("bench", "rows", (
    ColumnSpec("id", "long", "int8"),
    ColumnSpec("name", "string", "text"),
    ColumnSpec("price", [DEC, "string"], "numeric(12,2)"),
    ColumnSpec("created", [{"type": "long", "logicalType": "timestamp-micros"}, "string"],
               "timestamptz"),
    ColumnSpec("doc", "string", "jsonb"),
    ColumnSpec("active", "boolean", "bool"),
    ColumnSpec("tags", TEXT_ARRAY, "text[]"),
    ColumnSpec("mood", {"type": "string", "pg.enum.labels": ["sad", "ok", "happy"]}, "mood"),
), ("id",))
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def wide_row(key: int, version: int = 0) -> dict[str, object]:
    return {"id": key, "name": f"name-{key}", "price": Decimal(f"{(key + version) % 100000}.25"),
            "created": EPOCH + timedelta(seconds=key), "doc": f'{{"g": {key}, "v": {version}}}',
            "active": key % 2 == 0,
            "tags": {"dims": [2], "lower_bounds": [1], "elements": ["a", str(key)]},
            "mood": ("sad", "ok", "happy")[key % 3]}


def mixed_transactions(writer: EventWriter, first_xid: int, count: int, first_key: int,
                       lake_keys: int) -> tuple[list[KafkaRecord], int]:
    """Transactions of 1000 changes: 800 inserts of new keys, 100 updates of lake keys
    (below `lake_keys`), 100 updates of keys inserted earlier in this batch (inserts instead
    when there are none). Returns the records and the next unused key."""
    rnd = random.Random(first_xid)
    out: list[KafkaRecord] = []
    key = first_key
    for i in range(count):
        xid = first_xid + i
        tx = writer.transaction(xid, xid * 10)
        for j in range(1000):
            if j % 10 == 3 and lake_keys:
                tx.update(ROWS, wide_row(rnd.randrange(lake_keys), xid))
            elif j % 10 == 7 and key > first_key:
                tx.update(ROWS, wide_row(rnd.randrange(first_key, key), xid))
            else:
                tx.insert(ROWS, wide_row(key))
                key += 1
        out += tx.records()
    return out, key


def producer_transactions(writer: EventWriter, first_xid: int, changes: int,
                          first_key: int = 0) -> list[KafkaRecord]:
    """The producer benchmark's workload (bench_producer.py): half the changes are inserts in
    transactions of 1000, then every inserted row is updated once, again 1000 per transaction
    (its UPDATE changes price and active)."""
    out: list[KafkaRecord] = []
    rows = changes // 2
    xid = first_xid
    for version in (0, 1):
        for start in range(first_key, first_key + rows, 1000):
            tx = writer.transaction(xid, xid * 10)
            for key in range(start, min(start + 1000, first_key + rows)):
                row = wide_row(key, version)
                if version:
                    row["active"] = not row["active"]
                    tx.update(ROWS, row)
                else:
                    tx.insert(ROWS, row)
            out += tx.records()
            xid += 1
    return out


def transactions(writer: EventWriter, first_xid: int, count: int, changes_per_tx: int,
                 key_space: int) -> list[KafkaRecord]:
    out: list[KafkaRecord] = []
    for i in range(count):
        xid = first_xid + i
        tx = writer.transaction(xid, xid * 10)
        for j in range(changes_per_tx):
            table = ACCOUNTS if j % 2 == 0 else SAVINGS
            key = (xid * changes_per_tx + j) % key_space
            tx.insert(table, {"id": key, "balance": Decimal(f"{key % 1000}.25"), "note": f"n{j}"})
        out += tx.records()
    return out


def kafka_frame(spark: SparkSession, rows: list[tuple[object, ...]], where: str) -> DataFrame:
    """A cached Kafka-shaped frame read from parquet files: a frame made from a local list ships
    its rows inside the tasks, which runs the driver out of memory for a 1M-row batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = ["topic", "partition", "offset", "key", "value", "timestamp"]
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()),
                        ("offset", pa.int64()), ("key", pa.binary()), ("value", pa.binary()),
                        ("timestamp", pa.timestamp("us"))])
    Path(where).mkdir(parents=True)
    half = (len(rows) + 1) // 2
    for i, part in enumerate((rows[:half], rows[half:])):  # two files: two partitions
        columns = list(zip(*part, strict=True)) if part else [() for _ in names]
        pq.write_table(pa.table(dict(zip(names, columns, strict=True)), schema=schema),
                       f"{where}/part-{i}.parquet")
    frame = spark.read.schema(KAFKA_SCHEMA).parquet(where).persist()
    frame.count()
    return frame


def baseline_append(big: DataFrame, specs: tuple[TableSpec, ...],
                    client: SchemaRegistryClient, where: str) -> None:
    """The baseline: decode the same rows the same way and append them to fresh Delta tables."""
    from pyspark.sql import functions as F

    from spark_consumer.conversions import DEFAULT_CONVERSIONS
    from spark_consumer.decode import table_events, with_envelope_from_avro
    from spark_consumer.envelope import row_fields
    from spark_consumer.framing import schema_id_col

    schemas = WriterSchemas(client)
    for spec in specs:
        part = big.filter(F.col("topic") == spec.topic("bench")).withColumn("_first_seen", F.lit(0))
        first = part.select(schema_id_col(F.col("value")).alias("v")).first()
        assert first is not None, f"no rows of {spec.topic('bench')}"
        vid = first["v"]
        events = table_events(with_envelope_from_avro(part, schemas.text(vid)),
                              row_fields(schemas.parsed(vid)), DEFAULT_CONVERSIONS)
        events.drop("_unchanged_toast").write.format("delta").mode("append").save(
            f"{where}/{spec.table}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small-batches", type=int, default=5)
    ap.add_argument("--large", type=int, default=50_000, help="changes in the large batch")
    ap.add_argument("--workload", choices=("inserts", "mixed", "producer"), default="inserts")
    ap.add_argument("--preload", type=int, default=100_000,
                    help="mixed: rows inserted by an earlier batch, updated by the large one")
    ap.add_argument("--warmup", type=int, default=100_000,
                    help="changes of an untimed batch (consumer and baseline) that warms the JVM")
    args = ap.parse_args()

    spark = build_session("bench-consumer-batch")
    spark.sparkContext.setLogLevel("WARN")
    client = registry_client("mock://bench-batch")
    writer = EventWriter(client, "bench")
    log = KafkaLog()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ConsumerConfig(kafka_bootstrap="-", schema_registry_url="mock://bench-batch",
                             topic_prefix="bench", lake_path=f"{tmp}/lake",
                             checkpoint_path=f"{tmp}/cp", trigger=None, available_now=True)
        proc = BatchProcessor(spark, cfg, WriterSchemas(client))
        xid = 1
        small: list[float] = []
        for b in range(args.small_batches):
            recs = transactions(writer, xid, 2, 3, 1000)
            xid += 2
            df = log.frame(spark, recs)
            t0 = time.perf_counter()
            report = proc.process(df, b)
            small.append(time.perf_counter() - t0)
            print(f"  batch {b}: {small[-1]:.1f} s {report.steps}")
        if small:
            print(f"small batches (2 tx, 6 changes): {', '.join(f'{s:.1f}' for s in small)} s; "
                  f"median {sorted(small)[len(small) // 2]:.1f} s (first includes table creation)")

        batch_id = args.small_batches
        specs: tuple[TableSpec, ...] = (ACCOUNTS, SAVINGS) if args.workload == "inserts" else (ROWS,)
        warm: list[KafkaRecord]
        if args.warmup:
            # A long-running job's JVM has compiled its hot paths; a cold one spends the first
            # seconds in the interpreter and JIT. Both sides get the same untimed warm-up.
            wcfg = replace(cfg, lake_path=f"{tmp}/warm-lake", checkpoint_path=f"{tmp}/warm-cp")
            if args.workload == "inserts":
                warm = transactions(writer, 10**8, max(1, args.warmup // 100), 100, 10**9)
            elif args.workload == "producer":
                warm = producer_transactions(writer, 10**8, args.warmup)
            else:
                warm, _ = mixed_transactions(writer, 10**8, max(1, args.warmup // 1000), 0, 0)
            frame = kafka_frame(spark, log.rows(warm), f"{tmp}/warm-batch")
            t0 = time.perf_counter()
            BatchProcessor(spark, wcfg, WriterSchemas(client)).process(frame, 0)
            baseline_append(frame, specs, client, f"{tmp}/warm-append")
            print(f"  warm-up ({args.warmup} changes, consumer and baseline, untimed): "
                  f"{time.perf_counter() - t0:.1f} s")
        if args.workload == "inserts":
            n_tx = max(1, args.large // 100)
            recs = transactions(writer, xid, n_tx, 100, 10**9)
            changes = n_tx * 100
        elif args.workload == "producer":
            recs = producer_transactions(writer, xid, args.large, 10**8)
            changes = args.large // 2 * 2
            n_tx = 2 * -(-(args.large // 2) // 1000)
        else:
            lake_keys = 0
            if args.preload:
                pre, lake_keys = mixed_transactions(writer, xid, max(1, args.preload // 1000),
                                                    0, 0)
                xid += max(1, args.preload // 1000)
                frame = kafka_frame(spark, log.rows(pre), f"{tmp}/preload-batch")
                t0 = time.perf_counter()
                proc.process(frame, batch_id)
                print(f"  preload batch: {args.preload} changes in "
                      f"{time.perf_counter() - t0:.1f} s")
                batch_id += 1
            n_tx = max(1, args.large // 1000)
            recs, _ = mixed_transactions(writer, xid, n_tx, 10**8, lake_keys)
            changes = n_tx * 1000
        big = kafka_frame(spark, log.rows(recs), f"{tmp}/large-batch")
        t0 = time.perf_counter()
        report = proc.process(big, batch_id)
        merge_s = time.perf_counter() - t0
        print(f"  large batch steps: {report.steps}")
        t0 = time.perf_counter()
        baseline_append(big, specs, client, f"{tmp}/append")
        append_s = time.perf_counter() - t0
        print(f"large batch ({args.workload}): {changes} changes in {n_tx} tx: consumer {merge_s:.1f} s "
              f"({changes / merge_s:,.0f} changes/s); plain decode+append {append_s:.1f} s "
              f"({changes / append_s:,.0f} changes/s); ratio consumer/append "
              f"{merge_s / append_s:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
