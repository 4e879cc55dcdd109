"""A batch that reads Kafka records an earlier batch already read, while some of them wait in
the pending state (Spark's checkpoint replaced by an older one, say). Batches normally start
where the last one stopped, so the consumer does not de-duplicate them against the waiting
records; it must notice the overlap and de-duplicate then, or a waiting record would count
twice and be kept twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KAFKA_SCHEMA, KafkaLog, spark  # noqa: F401

pytestmark = pytest.mark.integration

ACC = TableSpec(
    "public",
    "accounts",
    (ColumnSpec("id", "long", "int8"), ColumnSpec("balance", "string", "text")),
    ("id",),
)


def test_records_read_twice_wait_once_and_apply_once(spark: SparkSession, tmp_path: Path) -> None:
    client = registry_client("mock://rereads")
    cfg = ConsumerConfig(
        kafka_bootstrap="-",
        schema_registry_url="mock://rereads",
        topic_prefix="rr",
        lake_path=str(tmp_path / "lake"),
        checkpoint_path=str(tmp_path / "cp"),
        trigger=None,
        available_now=True,
    )
    now = [1_000_000]
    processor = BatchProcessor(spark, cfg, WriterSchemas(client), clock_ms=lambda: now[0])
    w, log = EventWriter(client, "rr"), KafkaLog()
    t1 = w.transaction(1, 100).insert(ACC, {"id": 1, "balance": "1"})
    t2 = (
        w.transaction(2, 200)
        .insert(ACC, {"id": 2, "balance": "2"})
        .insert(ACC, {"id": 3, "balance": "3"})
        .insert(ACC, {"id": 4, "balance": "4"})
    )
    begin, *events, end = t2.records()
    # Batch 0: t1 whole; t2's BEGIN, END and two of its three events (they wait).
    first = log.rows([*t1.records(), begin, *events[:2], end])
    report = processor.process(spark.createDataFrame(first, KAFKA_SCHEMA), 0)
    assert (report.commit_lsn, report.pending_transactions, report.pending_records) == (100, 1, 4)

    # Batch 1, 4 s later, reads the same records again, with their offsets: t2 still waits,
    # once, and as first seen by batch 0.
    now[0] += 4_000
    report = processor.process(spark.createDataFrame(first, KAFKA_SCHEMA), 1)
    assert (report.commit_lsn, report.pending_transactions, report.pending_records) == (100, 1, 4)
    assert report.pending_oldest_age_s == 4.0
    assert spark.read.format("delta").load(cfg.pending_path).count() == 4

    # Batch 2: the third event; t2 applies with its three rows.
    report = processor.process(log.frame(spark, events[2:]), 2)
    assert (report.commit_lsn, report.pending_records) == (200, 0)
    lake = spark.read.format("delta").load(f"{cfg.lake_path}/public/accounts")
    assert sorted((r["id"], r["balance"]) for r in lake.collect()) == [
        (1, "1"),
        (2, "2"),
        (3, "3"),
        (4, "4"),
    ]
    assert lake.count() == 4
