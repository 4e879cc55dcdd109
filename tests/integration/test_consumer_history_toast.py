"""A history table never invents an unchanged TOAST value (history.py `_carry_toast`):

- an update that leaves a TOAST value unchanged, for a key with no earlier version in the
  history (history turned on after the rows were written), stops the batch with an error
  naming the table, the key and the commit LSN;
- the same update followed in the batch by a snapshot read of the key (the watermark method
  reads a row again when a streamed change left its TOAST value unchanged) applies: its
  version holds null there, and the read opens the next version with the value.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.errors import ConsumerError
from spark_consumer.lake_options import LakeOptions, parse
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KafkaLog, spark  # noqa: F401

pytestmark = pytest.mark.integration

DOCS = TableSpec(
    "public",
    "docs",
    (
        ColumnSpec("id", "long", "int8"),
        ColumnSpec("v", "long", "int8"),
        ColumnSpec("body", "string", "text"),
    ),
    ("id",),
)
BODY = "b" * 5000
HISTORY = parse('[tables."public.docs"]\nhistory = true\n')


def _processor(
    spark: SparkSession, tmp: Path, client: SchemaRegistryClient, options: LakeOptions
) -> BatchProcessor:
    cfg = ConsumerConfig(
        kafka_bootstrap="-",
        schema_registry_url="mock://history-toast",
        topic_prefix="ht",
        lake_path=str(tmp / "lake"),
        checkpoint_path=str(tmp / "cp"),
        trigger=None,
        available_now=True,
        lake_tables_config=options,
    )
    return BatchProcessor(spark, cfg, WriterSchemas(client))


def test_an_unchanged_toast_value_with_no_earlier_version_stops_the_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    url = "mock://history-toast-stop"
    client = registry_client(url)
    w, log = EventWriter(client, "ht"), KafkaLog()
    # The current-state table has the row; its history is turned on afterwards.
    plain = _processor(spark, tmp_path, client, LakeOptions())
    plain.process(
        log.frame(
            spark, w.transaction(1, 100).insert(DOCS, {"id": 1, "v": 1, "body": BODY}).records()
        ),
        0,
    )
    update = w.transaction(2, 200).update(DOCS, {"id": 1, "v": 2, "body": None}, ["body"])
    with pytest.raises((ConsumerError, PySparkException)) as failed:
        _processor(spark, tmp_path, client, HISTORY).process(log.frame(spark, update.records()), 1)
    message = str(failed.value)
    assert "public.docs" in message and "unchanged TOAST" in message, message
    assert "'id': 1" in message and "200" in message, message


def test_a_snapshot_read_later_in_the_batch_gives_the_value(
    spark: SparkSession, tmp_path: Path
) -> None:
    url = "mock://history-toast-read"
    client = registry_client(url)
    w, log = EventWriter(client, "ht"), KafkaLog()
    proc = _processor(spark, tmp_path, client, HISTORY)
    records = [
        *w.transaction(1, 100).update(DOCS, {"id": 1, "v": 2, "body": None}, ["body"]).records(),
        *w.transaction(2, 200).read(DOCS, {"id": 1, "v": 2, "body": BODY}).records(),
    ]
    proc.process(log.frame(spark, records), 0)
    history = spark.read.format("delta").load(f"{tmp_path}/lake/_walbridge/history/public/docs")
    got = sorted(
        (r["__valid_from_lsn"], r["__valid_to_lsn"], r["__op"], r["v"], r["body"])
        for r in history.collect()
    )
    assert got == [(100, 200, "u", 2, None), (200, None, "r", 2, BODY)]
    current = spark.read.format("delta").load(f"{tmp_path}/lake/public/docs").collect()
    assert [(r["id"], r["v"], r["body"]) for r in current] == [(1, 2, BODY)]
