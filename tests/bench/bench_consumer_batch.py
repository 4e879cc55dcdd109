"""Per-batch cost of the consumer's foreachBatch function, without Kafka (static batches).

Measures (local[2], mock:// registry, Delta under a temp dir):
  - small: several batches of 2 source transactions each (a few changes on two tables); the
    fixed cost per batch is what decides freshness;
  - large: one batch of N changes, reported as changes/s and as a ratio to a plain Delta append
    of the same decoded rows measured in the same run (the baseline). The batch is applied
    --rounds times (default 3), each time to a fresh lake and followed by the baseline, and the
    medians are reported: a long-running job's JVM has its generated code compiled and cached,
    and the first 1M-row batch of a young JVM mostly measures the JIT compiler. Workloads:
      --workload inserts (default): inserts over 2 three-column tables, transactions of 100;
      --workload mixed: the issue's 8-column table (the producer benchmark's `rows`: int8 key,
        text, numeric(12,2), timestamptz, jsonb, bool, text[], enum), transactions of 1000
        changes: 800 inserts of new keys, 100 updates of keys already in the lake (loaded by an
        earlier batch of --preload changes, applied in each round and not counted) and 100
        updates of keys inserted earlier in the same batch;
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
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.sql import DataFrame, SparkSession

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.session import build_session
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import (
    ColumnSpec,
    EventWriter,
    KafkaRecord,
    TableSpec,
    registry_client,
)
from tests.support.spark import KAFKA_SCHEMA, KafkaLog

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ACCOUNTS = TableSpec(
    "public",
    "accounts",
    (
        ColumnSpec("id", "long", "int8"),
        ColumnSpec("balance", DEC, "numeric(12,2)"),
        ColumnSpec("note", "string", "text"),
    ),
    ("id",),
)
SAVINGS = TableSpec("bank", "savings", ACCOUNTS.columns, ("id",))
# The producer benchmark's 8-column table, in the Avro forms of schemas/type_mapping.py.
TEXT_ARRAY = {
    "type": "record",
    "name": "text_array",
    "namespace": "io.walbridge.pg",
    "fields": [
        {"name": "dims", "type": {"type": "array", "items": "int"}},
        {"name": "lower_bounds", "type": {"type": "array", "items": "int"}},
        {"name": "elements", "type": {"type": "array", "items": ["null", "string"]}},
    ],
}
ROWS = TableSpec(
    "bench",
    "rows",
    (
        ColumnSpec("id", "long", "int8"),
        ColumnSpec("name", "string", "text"),
        ColumnSpec("price", [DEC, "string"], "numeric(12,2)"),
        ColumnSpec(
            "created",
            [{"type": "long", "logicalType": "timestamp-micros"}, "string"],
            "timestamptz",
        ),
        ColumnSpec("doc", "string", "jsonb"),
        ColumnSpec("active", "boolean", "bool"),
        ColumnSpec("tags", TEXT_ARRAY, "text[]"),
        ColumnSpec("mood", {"type": "string", "pg.enum.labels": ["sad", "ok", "happy"]}, "mood"),
    ),
    ("id",),
)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def wide_row(key: int, version: int = 0) -> dict[str, object]:
    return {
        "id": key,
        "name": f"name-{key}",
        "price": Decimal(f"{(key + version) % 100000}.25"),
        "created": EPOCH + timedelta(seconds=key),
        "doc": f'{{"g": {key}, "v": {version}}}',
        "active": key % 2 == 0,
        "tags": {"dims": [2], "lower_bounds": [1], "elements": ["a", str(key)]},
        "mood": ("sad", "ok", "happy")[key % 3],
    }


def mixed_transactions(
    writer: EventWriter, first_xid: int, count: int, first_key: int, lake_keys: int
) -> tuple[list[KafkaRecord], int]:
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


def producer_transactions(
    writer: EventWriter, first_xid: int, changes: int, first_key: int = 0
) -> list[KafkaRecord]:
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


def transactions(
    writer: EventWriter, first_xid: int, count: int, changes_per_tx: int, key_space: int
) -> list[KafkaRecord]:
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


@dataclass(frozen=True)
class Workload:
    records: list[KafkaRecord]
    changes: int
    transactions: int
    next_key: int = 0  # mixed: the first key not inserted yet


def workload(
    name: str, writer: EventWriter, first_xid: int, changes: int, lake_keys: int = 0
) -> Workload:
    """`changes` changes of one workload; mixed updates keys below `lake_keys` (the lake's)."""
    if name == "inserts":
        n_tx = max(1, changes // 100)
        return Workload(transactions(writer, first_xid, n_tx, 100, 10**9), n_tx * 100, n_tx)
    if name == "producer":
        return Workload(
            producer_transactions(writer, first_xid, changes, 10**8),
            changes // 2 * 2,
            2 * -(-(changes // 2) // 1000),
        )
    n_tx = max(1, changes // 1000)
    first_key = 10**8 if lake_keys else 0
    recs, next_key = mixed_transactions(writer, first_xid, n_tx, first_key, lake_keys)
    return Workload(recs, n_tx * 1000, n_tx, next_key)


def kafka_frame(spark: SparkSession, rows: list[tuple[object, ...]], where: str) -> DataFrame:
    """A cached Kafka-shaped frame read from parquet files: a frame made from a local list ships
    its rows inside the tasks, which runs the driver out of memory for a 1M-row batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = ["topic", "partition", "offset", "key", "value", "timestamp"]
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("timestamp", pa.timestamp("us")),
        ]
    )
    Path(where).mkdir(parents=True)
    half = (len(rows) + 1) // 2
    for i, part in enumerate((rows[:half], rows[half:])):  # two files: two partitions
        columns = list(zip(*part, strict=True)) if part else [() for _ in names]
        pq.write_table(
            pa.table(dict(zip(names, columns, strict=True)), schema=schema),
            f"{where}/part-{i}.parquet",
        )
    frame = spark.read.schema(KAFKA_SCHEMA).parquet(where).persist()
    frame.count()
    return frame


def baseline_append(
    big: DataFrame, specs: tuple[TableSpec, ...], client: SchemaRegistryClient, where: str
) -> None:
    """The baseline: decode the same rows the same way and append them to fresh Delta tables."""
    from pyspark.sql import functions as F

    from spark_consumer.columns import row_fields
    from spark_consumer.conversions import DEFAULT_CONVERSIONS
    from spark_consumer.decode import table_events, with_envelope_from_avro
    from spark_consumer.framing import schema_id_col

    schemas = WriterSchemas(client)
    for spec in specs:
        part = big.filter(F.col("topic") == spec.topic("bench")).withColumn("_first_seen", F.lit(0))
        first = part.select(schema_id_col("value").alias("v")).first()
        assert first is not None, f"no rows of {spec.topic('bench')}"
        vid = first["v"]
        events = table_events(
            with_envelope_from_avro(part, schemas.text(vid)),
            row_fields(schemas.parsed(vid)),
            DEFAULT_CONVERSIONS,
        )
        events.drop("_unchanged_toast").write.format("delta").mode("append").save(
            f"{where}/{spec.table}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small-batches", type=int, default=5)
    ap.add_argument("--large", type=int, default=50_000, help="changes in the large batch")
    ap.add_argument("--workload", choices=("inserts", "mixed", "producer"), default="inserts")
    ap.add_argument(
        "--preload",
        type=int,
        default=100_000,
        help="mixed: rows inserted by an earlier batch, updated by the large one",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="times the large batch is applied (each to a fresh lake) and appended",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=100_000,
        help="changes of an untimed batch (consumer and baseline) that warms the JVM",
    )
    args = ap.parse_args()

    spark = build_session("bench-consumer-batch")
    spark.sparkContext.setLogLevel("WARN")
    client = registry_client("mock://bench-batch")
    writer = EventWriter(client, "bench")
    log = KafkaLog()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ConsumerConfig(
            kafka_bootstrap="-",
            schema_registry_url="mock://bench-batch",
            topic_prefix="bench",
            lake_path=f"{tmp}/lake",
            checkpoint_path=f"{tmp}/cp",
            trigger=None,
            available_now=True,
        )
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
            print(
                f"small batches (2 tx, 6 changes): {', '.join(f'{s:.1f}' for s in small)} s; "
                f"median {sorted(small)[len(small) // 2]:.1f} s (first includes table creation)"
            )

        specs: tuple[TableSpec, ...] = (
            (ACCOUNTS, SAVINGS) if args.workload == "inserts" else (ROWS,)
        )
        if args.warmup:
            # A long-running job's JVM has compiled its hot paths; a cold one spends the first
            # seconds in the interpreter and JIT. Both sides get the same untimed warm-up.
            wcfg = replace(cfg, lake_path=f"{tmp}/warm-lake", checkpoint_path=f"{tmp}/warm-cp")
            warm = workload(args.workload, writer, 10**8, args.warmup)
            frame = kafka_frame(spark, log.rows(warm.records), f"{tmp}/warm-batch")
            t0 = time.perf_counter()
            BatchProcessor(spark, wcfg, WriterSchemas(client)).process(frame, 0)
            baseline_append(frame, specs, client, f"{tmp}/warm-append")
            print(
                f"  warm-up ({args.warmup} changes, consumer and baseline, untimed): "
                f"{time.perf_counter() - t0:.1f} s"
            )

        xid = 10**7
        pre = None
        lake_keys = 0
        if args.workload == "mixed" and args.preload:
            preload = workload("mixed", writer, xid, args.preload)
            xid += preload.transactions
            lake_keys = preload.next_key
            pre = kafka_frame(spark, log.rows(preload.records), f"{tmp}/preload-batch")
        large = workload(args.workload, writer, xid, args.large, lake_keys)
        changes, n_tx = large.changes, large.transactions
        big = kafka_frame(spark, log.rows(large.records), f"{tmp}/large-batch")
        ours: list[float] = []
        plain: list[float] = []
        for r in range(args.rounds):
            # Each round applies the same batch to a lake of its own, then appends it plainly:
            # the JVM reaches the steady state of a long-running job (compiled and cached code)
            # after a round or two, and both sides are measured at the same point of it.
            rcfg = replace(cfg, lake_path=f"{tmp}/lake-{r}", checkpoint_path=f"{tmp}/cp-{r}")
            proc = BatchProcessor(spark, rcfg, WriterSchemas(client))
            batch_id = 0
            if pre is not None:
                t0 = time.perf_counter()
                proc.process(pre, batch_id)
                print(
                    f"  round {r}: preload batch of {args.preload} changes in "
                    f"{time.perf_counter() - t0:.1f} s (not counted)"
                )
                batch_id += 1
            t0 = time.perf_counter()
            report = proc.process(big, batch_id)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            baseline_append(big, specs, client, f"{tmp}/append-{r}")
            plain.append(time.perf_counter() - t0)
            print(
                f"  round {r}: consumer {ours[-1]:.1f} s {report.steps}; plain decode+append "
                f"{plain[-1]:.1f} s; ratio {ours[-1] / plain[-1]:.2f}"
            )
        m_ours, m_plain = statistics.median(ours), statistics.median(plain)
        print(
            f"large batch ({args.workload}): {changes} changes in {n_tx} tx, median of "
            f"{args.rounds} round(s): consumer {m_ours:.1f} s ({changes / m_ours:,.0f} "
            f"changes/s); plain decode+append {m_plain:.1f} s ({changes / m_plain:,.0f} "
            f"changes/s); ratio consumer/append {m_ours / m_plain:.2f} (per round: "
            f"{', '.join(f'{a / b:.2f}' for a, b in zip(ours, plain, strict=True))})"
        )
    spark.stop()


if __name__ == "__main__":
    main()
