"""A column the lake tables config leaves out never reaches any file of the lake, the pending
table's included: a transaction split over two batches waits there between them, with the
left-out values emptied (pending_redaction.py), and applies whole with the next batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.lake_options import parse
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KafkaLog, spark  # noqa: F401

pytestmark = pytest.mark.integration

SECRET = "078-05-1120-pending-secret"


def _people_like(table: str) -> TableSpec:
    return TableSpec(
        "public",
        table,
        (
            ColumnSpec("id", "long", "int8"),
            ColumnSpec("name", "string", "text"),
            ColumnSpec("ssn", "string", "text"),
        ),
        ("id",),
    )


PEOPLE = _people_like("people")
OTHER = _people_like("other")  # the same columns, no option: its values wait as they came


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(f) for f in root.rglob("*") if f.is_file() and needle in f.read_bytes())


def test_left_out_columns_wait_emptied_in_the_pending_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    client = registry_client("mock://pending-redaction")
    lake = tmp_path / "lake"
    cfg = ConsumerConfig(
        kafka_bootstrap="-",
        schema_registry_url="mock://pending-redaction",
        topic_prefix="pr",
        lake_path=str(lake),
        checkpoint_path=str(tmp_path / "cp"),
        trigger=None,
        available_now=True,
        lake_tables_config=parse('[tables."public.people"]\nexcept_columns = ["ssn"]\n'),
    )
    processor = BatchProcessor(spark, cfg, WriterSchemas(client))
    w, log = EventWriter(client, "pr"), KafkaLog()
    tx = (
        w.transaction(1, 100)
        .insert(OTHER, {"id": 1, "name": "Cy", "ssn": "not-left-out"})
        .insert(PEOPLE, {"id": 1, "name": "Ada", "ssn": SECRET})
        .insert(PEOPLE, {"id": 2, "name": "Bea", "ssn": SECRET})
    )
    begin, *events, end = tx.records()

    # Batch 0: the BEGIN, END and the first two events; the transaction waits.
    report = processor.process(log.frame(spark, [begin, *events[:2], end]), 0)
    assert (report.pending_transactions, report.pending_records) == (1, 4)
    waiting = spark.read.format("delta").load(cfg.pending_path)
    assert waiting.count() == 4
    # The pending table's files hold none of the secret; the other table's value waits whole
    # (so the look at the files finds what is there).
    assert _files_holding(lake, SECRET.encode()) == []
    assert _files_holding(lake / "_walbridge" / "pending", b"not-left-out") != []

    # Batch 1: the last event; the transaction applies, the left-out column nowhere.
    report = processor.process(log.frame(spark, events[2:]), 1)
    assert (report.commit_lsn, report.pending_records) == (100, 0)
    people = spark.read.format("delta").load(f"{lake}/public/people")
    assert "ssn" not in people.columns
    assert sorted((r["id"], r["name"]) for r in people.collect()) == [(1, "Ada"), (2, "Bea")]
    other = spark.read.format("delta").load(f"{lake}/public/other").collect()
    assert [(r["id"], r["name"], r["ssn"]) for r in other] == [(1, "Cy", "not-left-out")]
    assert _files_holding(lake, SECRET.encode()) == []
