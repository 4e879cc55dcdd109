"""Decoder comparison: Spark from_avro (JVM) vs fastavro in mapInArrow, same rows, same run.

Run: .walbridge/venv/bin/python tests/bench/bench_consumer_decode.py [N]
Prints events/s for each decoder and the ratio; the baseline is a plain count of the same
cached Kafka-shaped rows (the cost of just scanning them).
"""

from __future__ import annotations

import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark import StorageLevel
from pyspark.sql import functions as F

from spark_consumer.columns import row_fields
from spark_consumer.conversions import DEFAULT_CONVERSIONS
from spark_consumer.decode import table_events, with_envelope_from_avro
from spark_consumer.decode_fastavro import with_envelope_fastavro
from spark_consumer.session import build_session
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import (
    ColumnSpec,
    EventWriter,
    TableSpec,
    registry_client,
)
from tests.support.spark import KafkaLog

TABLE = TableSpec(
    "public",
    "bench",
    (
        ColumnSpec("id", "long", "int8"),
        ColumnSpec("a", "int", "int4"),
        ColumnSpec("b", "string", "text"),
        ColumnSpec("c", "double", "float8"),
        ColumnSpec(
            "d",
            {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
            "numeric(12,2)",
        ),
        ColumnSpec("e", {"type": "long", "logicalType": "timestamp-micros"}, "timestamptz"),
        ColumnSpec("f", "boolean", "bool"),
        ColumnSpec("g", {"type": "string", "logicalType": "uuid"}, "uuid"),
    ),
    ("id",),
)


def main(n: int) -> None:
    import datetime as dt
    import uuid

    reg = registry_client("mock://bench")
    writer = EventWriter(reg, "bench")
    records = []
    per_tx = 100
    for t in range(n // per_tx):
        tx = writer.transaction(t + 1, (t + 1) * 1000)
        for i in range(per_tx):
            k = t * per_tx + i
            tx.insert(
                TABLE,
                {
                    "id": k,
                    "a": i,
                    "b": f"row {k}",
                    "c": k / 3,
                    "d": Decimal(k % 100000) / 100,
                    "e": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                    "f": k % 2 == 0,
                    "g": uuid.UUID(int=k),
                },
            )
        records += [r for r in tx.records() if r.topic.endswith(".bench")]
    spark = build_session("bench-decode")
    spark.sparkContext.setLogLevel("WARN")
    rows = KafkaLog().frame(spark, records).withColumn("_first_seen", F.lit(0).cast("long"))
    rows = rows.repartition(2).persist(StorageLevel.MEMORY_ONLY)
    rows.count()
    schemas = WriterSchemas(reg)
    vid = reg.get_latest_version("bench.public.bench-value").schema_id
    text = schemas.text(vid)
    fields = row_fields(schemas.parsed(vid))

    def timed(label: str, build: object) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            df = build()  # type: ignore[operator]
            df.agg(F.sum(F.hash(*df.columns))).collect()
            best = min(best, time.perf_counter() - t0)
        print(f"{label:<28} {len(records) / best:>12,.0f} events/s  ({best:.2f}s best of 3)")
        return best

    base = timed("scan only (baseline)", lambda: rows)
    spark_t = timed(
        "from_avro (JVM)",
        lambda: table_events(with_envelope_from_avro(rows, text), fields, DEFAULT_CONVERSIONS),
    )
    fast_t = timed(
        "fastavro in mapInArrow",
        lambda: table_events(with_envelope_fastavro(rows, text), fields, DEFAULT_CONVERSIONS),
    )
    print(
        f"events: {len(records)}; from_avro is {fast_t / spark_t:.2f}x the rate of fastavro; "
        f"baseline/from_avro time {base / spark_t:.2f}, baseline/fastavro {base / fast_t:.2f}"
    )
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
