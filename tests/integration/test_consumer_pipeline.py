"""The consumer against the real stack: events written per docs/event-format.md to Kafka and the
registry (tests/support/event_writer.py), read by the streaming query (available-now), applied
to Delta. One Spark session for the module; scenarios share a topic prefix per test."""

from __future__ import annotations

import json
import re
import shutil
import struct
import uuid
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from spark_consumer import batch, transaction_stats
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig, Decoder
from spark_consumer.errors import ConfigError
from spark_consumer.source import CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_MANAGER, start
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import (
    ColumnSpec,
    EventWriter,
    KafkaRecord,
    TableSpec,
    produce,
    registry_client,
)
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.integration

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}


def accounts(extra: tuple[ColumnSpec, ...] = ()) -> TableSpec:
    return TableSpec(
        "public",
        "accounts",
        (
            ColumnSpec("id", "long", "int8"),
            ColumnSpec("balance", DEC, "numeric(12,2)"),
            ColumnSpec("doc", "string", "text"),
            *extra,
        ),
        ("id",),
    )


AUDIT = TableSpec("bank", "audit", (ColumnSpec("msg", "string", "text"),), ())


class Harness:
    def __init__(
        self,
        spark: SparkSession,
        kafka: str,
        registry: str,
        tmp: Path,
        quarantine: bool = False,
        decoder: Decoder = Decoder.FROM_AVRO,
    ) -> None:
        self.spark = spark
        self.kafka = kafka
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.lake = str(tmp / "lake")
        self.writer = EventWriter(registry_client(registry), self.prefix)
        admin = AdminClient({"bootstrap.servers": kafka})
        # The transaction topic must have one partition; data topics get three.
        topics = [NewTopic(f"{self.prefix}.transaction", 1, 1)] + [
            NewTopic(t.topic(self.prefix), 3, 1) for t in (accounts(), AUDIT)
        ]
        for f in admin.create_topics(topics).values():
            f.result(30)
        self.config = ConsumerConfig(
            kafka_bootstrap=kafka,
            schema_registry_url=registry,
            topic_prefix=self.prefix,
            lake_path=self.lake,
            checkpoint_path=str(tmp / "checkpoint"),
            trigger=None,
            available_now=True,
            quarantine_path=str(tmp / "quarantine") if quarantine else None,
            decoder=decoder,
        )
        self.processor = BatchProcessor(spark, self.config, WriterSchemas.from_url(registry))

    def send(self, records: list[KafkaRecord], partition: int | None = None) -> None:
        parts = {r.topic: partition for r in records} if partition is not None else None
        produce(self.kafka, records, parts)

    def run(self) -> None:
        start(self.spark, self.config, self.processor).awaitTermination()

    def rows(self, schema: str, table: str) -> list[dict[str, object]]:
        df = self.spark.read.format("delta").load(f"{self.lake}/{schema}/{table}")
        return sorted((r.asDict() for r in df.collect()), key=repr)

    def progress(self) -> list[dict[str, Any]]:
        df = self.spark.read.format("delta").load(f"{self.lake}/_walbridge/progress")
        return [r.asDict() for r in df.orderBy("batch_id").collect()]


@pytest.fixture()
def harness(
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> Iterator[Harness]:
    yield Harness(spark, kafka_bootstrap, registry_url, tmp_path)


@pytest.mark.parametrize("in_spark", [False, True], ids=["planned-on-driver", "planned-in-spark"])
def test_whole_transactions_in_commit_order(
    harness: Harness, in_spark: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches this small are planned on the driver; a catch-up batch in Spark.
    monkeypatch.setattr(batch, "_SPARK_PLANNING_RECORDS", -1 if in_spark else 10**9)
    acc, w = accounts(), harness.writer
    t1 = (
        w.transaction(501, 1000)
        .insert(acc, {"id": 1, "balance": Decimal("10.00"), "doc": "A" * 5000})
        .insert(acc, {"id": 2, "balance": Decimal("5.00"), "doc": "b"})
        .insert(AUDIT, {"msg": "opened"})
    )
    t2 = (
        w.transaction(502, 2000)
        .update(acc, {"id": 1, "balance": Decimal("7.00"), "doc": None}, unchanged_toast=["doc"])
        .update(acc, {"id": 2, "balance": Decimal("8.00"), "doc": "b"})
    )
    t3 = (
        w.transaction(503, 3000)
        .delete(acc, {"id": 2})
        .insert(acc, {"id": 20, "balance": Decimal("8.00"), "doc": "b"})
    )  # key change 2 -> 20
    r2 = t2.records()
    # Batch 1: t1 whole, t2's END but one of its two events missing, t3 whole.
    harness.send(t1.records() + r2[:2] + [r2[-1]] + t3.records())
    harness.run()
    assert harness.rows("public", "accounts") == [
        {
            "id": 1,
            "balance": Decimal("10.00"),
            "doc": "A" * 5000,
            "_commit_lsn": 1000,
            "_total_order": 1,
            "_op": "c",
            "_ts_ms": 1_700_000_000_000,
        },
        {
            "id": 2,
            "balance": Decimal("5.00"),
            "doc": "b",
            "_commit_lsn": 1000,
            "_total_order": 2,
            "_op": "c",
            "_ts_ms": 1_700_000_000_000,
        },
    ]
    first = harness.progress()[-1]
    assert first["commit_lsn"] == 1000 and first["pending_transactions"] == 2
    # A local checkpoint and lake: the query's offsets and commits went through the FileSystem
    # API, not FileContext (source.py); the runs below restart from them.
    assert harness.spark.conf.get(CHECKPOINT_FILE_MANAGER) == FILE_SYSTEM_MANAGER
    assert (Path(harness.config.checkpoint_path) / "commits" / "0").is_file()
    assert [r["msg"] for r in harness.rows("bank", "audit")] == ["opened"]

    # Batch 2: the missing event arrives (on another partition): t2 and t3 apply.
    harness.send([r2[2]], partition=2)
    harness.run()
    got = {
        r["id"]: (r["balance"], r["doc"], r["_commit_lsn"])
        for r in harness.rows("public", "accounts")
    }
    assert got == {1: (Decimal("7.00"), "A" * 5000, 2000), 20: (Decimal("8.00"), "b", 3000)}
    last = harness.progress()[-1]
    assert last["commit_lsn"] == 3000 and last["pending_transactions"] == 0
    versions = last["table_versions"]
    assert set(versions) == {"public.accounts", "bank.audit"}

    # A reader at the earlier progress row sees the earlier state of every table.
    old = (
        harness.spark.read.format("delta")
        .option("versionAsOf", first["table_versions"]["public.accounts"])
        .load(f"{harness.lake}/public/accounts")
    )
    assert sorted(r["id"] for r in old.collect()) == [1, 2]

    # Replay: the producer re-sends t2 and t3 after a crash; nothing changes.
    harness.send(t2.records() + t3.records())
    harness.run()
    assert {
        r["id"]: (r["balance"], r["doc"], r["_commit_lsn"])
        for r in harness.rows("public", "accounts")
    } == got


def test_truncate_and_schema_evolution(harness: Harness) -> None:
    w = harness.writer
    v1 = accounts()
    v2 = accounts((ColumnSpec("note", "string", "text"),))
    t1 = w.transaction(1, 100).insert(v1, {"id": 1, "balance": Decimal("1.00"), "doc": "x"})
    t2 = (
        w.transaction(2, 200)
        .truncate(v1)
        .insert(v2, {"id": 2, "balance": Decimal("2.00"), "doc": "y", "note": "new col"})
    )
    harness.send(t1.records() + t2.records())
    harness.run()
    rows = harness.rows("public", "accounts")
    assert [(r["id"], r["note"]) for r in rows] == [(2, "new col")]


def test_poison_record_stops_naming_coordinates(harness: Harness) -> None:
    harness.send(
        [KafkaRecord(accounts().topic(harness.prefix), None, b"not avro at all")], partition=1
    )
    with pytest.raises(
        StreamingQueryException,
        match=rf"topic '{harness.prefix}.public.accounts', partition 1, offset 0",
    ):
        harness.run()


def test_poison_record_quarantined(
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    h = Harness(spark, kafka_bootstrap, registry_url, tmp_path, quarantine=True)
    t1 = h.writer.transaction(1, 100).insert(AUDIT, {"msg": "kept"})
    h.send([KafkaRecord(AUDIT.topic(h.prefix), None, b"\x00\x00\x0f\xff\xffjunk"), *t1.records()])
    h.run()
    assert [r["msg"] for r in h.rows("bank", "audit")] == ["kept"]
    q = spark.read.format("delta").load(str(tmp_path / "quarantine")).collect()
    assert [(r["topic"], r["value"], r["reason"]) for r in q] == [
        (AUDIT.topic(h.prefix), b"\x00\x00\x0f\xff\xffjunk", "unknown value schema id 1048575")
    ]


def test_a_new_checkpoint_for_a_lake_with_progress_is_refused(harness: Harness) -> None:
    """Spark would number batches from 0 again, and the consumer skips the batch numbers its
    progress table has: the new records of those batches would never reach the lake."""
    acc, w = accounts(), harness.writer
    t1 = w.transaction(601, 1000).insert(acc, {"id": 1, "balance": Decimal("1.00"), "doc": "a"})
    harness.send(t1.records())
    harness.run()
    assert harness.progress()[-1]["commit_lsn"] == 1000
    shutil.rmtree(harness.config.checkpoint_path)
    t2 = w.transaction(602, 2000).insert(acc, {"id": 2, "balance": Decimal("2.00"), "doc": "b"})
    harness.send(t2.records())
    with pytest.raises(ConfigError, match="has no Kafka offsets") as refused:
        harness.run()
    assert harness.config.checkpoint_path in str(refused.value)
    assert [r["id"] for r in harness.rows("public", "accounts")] == [1]  # nothing half-applied


def test_an_older_checkpoint_for_a_lake_is_refused(harness: Harness) -> None:
    """A checkpoint restored from a copy taken before the lake's last batch: Spark numbers its
    next batch as one the progress table has, so the consumer would skip it as a replay, with
    the records the lake never read."""
    acc, w = accounts(), harness.writer
    t1 = w.transaction(611, 1000).insert(acc, {"id": 1, "balance": Decimal("1.00"), "doc": "a"})
    harness.send(t1.records())
    harness.run()
    copy = f"{harness.config.checkpoint_path}.copy"
    shutil.copytree(harness.config.checkpoint_path, copy)
    t2 = w.transaction(612, 2000).insert(acc, {"id": 2, "balance": Decimal("2.00"), "doc": "b"})
    harness.send(t2.records())
    harness.run()
    assert [r["batch_id"] for r in harness.progress()] == [0, 1]
    shutil.rmtree(harness.config.checkpoint_path)
    shutil.copytree(copy, harness.config.checkpoint_path)
    t3 = w.transaction(613, 3000).insert(acc, {"id": 3, "balance": Decimal("3.00"), "doc": "c"})
    harness.send(t3.records())
    with pytest.raises(
        StreamingQueryException, match=r"batch 1 is one the lake .* never read"
    ) as refused:
        harness.run()
    message = str(refused.value)
    assert f"checkpoint at {harness.config.checkpoint_path} is older" in message
    topics = f"{re.escape(harness.prefix)}\\.(public\\.accounts|transaction)"
    assert re.search(rf"{topics}\[\d\] offsets \d+\.\.\d+, where the lake had read", message)
    assert [r["id"] for r in harness.rows("public", "accounts")] == [1, 2]


def test_a_batch_replayed_after_a_crash_is_skipped(harness: Harness) -> None:
    """Spark re-runs a batch whose commit it did not log (a crash after the progress row was
    written) with the offsets it logged: every record was read, so the batch is skipped."""
    acc, w = accounts(), harness.writer
    t1 = w.transaction(615, 1000).insert(acc, {"id": 1, "balance": Decimal("1.00"), "doc": "a"})
    harness.send(t1.records())
    harness.run()
    commits = Path(harness.config.checkpoint_path, "commits")
    for name in ("0", ".0.crc"):
        (commits / name).unlink(missing_ok=True)
    harness.run()  # batch 0 again: skipped, no error
    assert [r["batch_id"] for r in harness.progress()] == [0]
    assert harness.processor.reports[-1].skipped
    assert [r["id"] for r in harness.rows("public", "accounts")] == [1]


def _log_actions(table: str) -> list[dict[str, Any]]:
    """Every action of the table's Delta log, oldest commit first (the JSON as written)."""
    commits = sorted(Path(table, "_delta_log").glob("*.json"))
    return [json.loads(line) for c in commits for line in c.read_text().splitlines()]


def test_small_tables_merge_by_rewriting_files(harness: Harness) -> None:
    """Below `lake_rewrite_below_bytes` a table with deletion vectors is MERGEd by rewriting the
    file it touches; at 0 (the default) the same MERGE writes a deletion vector. Both lakes end
    equal."""
    acc, w = accounts(), harness.writer
    harness.config = replace(harness.config, lake_rewrite_below_bytes=8 * 2**20)
    harness.processor = BatchProcessor(harness.spark, harness.config, harness.processor.schemas)
    # Enough rows that every file keeps some after the delete: a file losing all its rows is
    # removed, not given a deletion vector.
    rows = [{"id": i, "balance": Decimal(f"{i}.00"), "doc": f"d{i}"} for i in range(1, 61)]
    t1 = w.transaction(621, 1000)
    for r in rows:
        t1.insert(acc, r)
    t2 = (
        w.transaction(622, 2000)
        .update(acc, {"id": 2, "balance": Decimal("20.00"), "doc": "x"})
        .delete(acc, {"id": 4})
    )
    always_dv = replace(
        harness.config,
        lake_path=f"{harness.lake}_dv",
        checkpoint_path=f"{harness.config.checkpoint_path}_dv",
        lake_rewrite_below_bytes=0,
    )
    other = BatchProcessor(harness.spark, always_dv, harness.processor.schemas)
    for t in (t1, t2):
        harness.send(t.records())
        harness.run()
        start(harness.spark, always_dv, other).awaitTermination()
    lakes = {False: harness.lake, True: always_dv.lake_path}
    for dv, lake in lakes.items():
        table = f"{lake}/public/accounts"
        actions = _log_actions(table)
        meta = next(a["metaData"] for a in actions if "metaData" in a)
        assert meta["configuration"]["delta.enableDeletionVectors"] == "true"
        with_dv = [a for a in actions if a.get("add", {}).get("deletionVector")]
        assert bool(with_dv) is dv, (dv, with_dv)
        got = harness.spark.read.format("delta").load(table).orderBy("id").collect()
        want = [(r["id"], r["doc"]) for r in rows if r["id"] != 4]
        assert [(r["id"], r["doc"]) for r in got] == [(i, "x" if i == 2 else d) for i, d in want]


def test_transaction_topic_with_several_partitions_is_refused(
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(f"{prefix}.transaction", 3, 1)]).values():
        f.result(30)
    config = ConsumerConfig(
        kafka_bootstrap=kafka_bootstrap,
        schema_registry_url=registry_url,
        topic_prefix=prefix,
        lake_path=str(tmp_path / "lake"),
        checkpoint_path=str(tmp_path / "cp"),
        trigger=None,
        available_now=True,
    )
    processor = BatchProcessor(spark, config, WriterSchemas.from_url(registry_url))
    with pytest.raises(ConfigError, match=rf"topic '{prefix}.transaction' has 3 partitions"):
        start(spark, config, processor)


def test_last_change_of_a_key_wins_within_one_batch(harness: Harness) -> None:
    """Several changes to one key in one batch (no unchanged TOAST: the window collapse), each
    transaction also delivered twice in the same batch, as after a producer restart."""
    acc, w = accounts(), harness.writer
    t1 = (
        w.transaction(601, 6000)
        .insert(acc, {"id": 5, "balance": Decimal("1.00"), "doc": "x"})
        .insert(acc, {"id": 6, "balance": Decimal("4.00"), "doc": "gone"})
    )
    t2 = (
        w.transaction(602, 7000)
        .update(acc, {"id": 5, "balance": Decimal("2.00"), "doc": "y"})
        .delete(acc, {"id": 6})
    )
    t3 = (
        w.transaction(603, 8000)
        .update(acc, {"id": 5, "balance": Decimal("3.00"), "doc": "z"})
        .insert(acc, {"id": 6, "balance": Decimal("9.00"), "doc": "again"})
        .insert(acc, {"id": 7, "balance": Decimal("1.00"), "doc": "new"})
    )
    t4 = w.transaction(604, 9000).delete(acc, {"id": 7})
    records = t1.records() + t2.records() + t3.records() + t4.records()
    harness.send(records + records)
    harness.run()
    got = {
        r["id"]: (r["balance"], r["doc"], r["_commit_lsn"], r["_op"])
        for r in harness.rows("public", "accounts")
    }
    assert got == {5: (Decimal("3.00"), "z", 8000, "u"), 6: (Decimal("9.00"), "again", 8000, "c")}
    assert harness.progress()[-1]["commit_lsn"] == 9000


def malformed_variants(good: KafkaRecord) -> list[tuple[KafkaRecord, str]]:
    """Broken copies of a real data record, each with the reason the consumer must give."""
    v = good.value
    return [
        (KafkaRecord(good.topic, good.key, b"\x01" + v[1:]), "value is not Confluent-framed Avro"),
        (
            KafkaRecord(good.topic, good.key, b"\x00" + struct.pack(">I", 0xFFFFF) + v[5:]),
            "unknown value schema id 1048575",
        ),
        (
            KafkaRecord(good.topic, good.key, v[: 5 + (len(v) - 5) // 2]),
            transaction_stats.NOT_DECODED,
        ),
        (
            KafkaRecord(good.topic, good.key, v[:5]),
            transaction_stats.NOT_DECODED,
        ),  # header, no body
        (KafkaRecord(good.topic, good.key, v[:-1]), transaction_stats.NOT_DECODED),  # last byte cut
        (KafkaRecord(good.topic, good.key, v[:3]), "value is not Confluent-framed Avro"),
        (KafkaRecord(good.topic, b"\x07nope", v), "key is not Confluent-framed Avro"),
    ]


@pytest.mark.parametrize("decoder", list(Decoder))
def test_malformed_records_are_quarantined_with_their_reason(
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    decoder: Decoder,
) -> None:
    """Wrong magic byte, unknown schema id, truncated Avro, a bad key: each is quarantined with
    its topic, partition, offset and reason; the good transaction around them is applied."""
    h = Harness(spark, kafka_bootstrap, registry_url, tmp_path, quarantine=True, decoder=decoder)
    acc = accounts()
    t1 = h.writer.transaction(1, 100).insert(acc, {"id": 1, "balance": Decimal("1.00"), "doc": "a"})
    records = t1.records()
    good = next(r for r in records if r.topic == acc.topic(h.prefix))
    bad = malformed_variants(good)
    h.send(records, partition=0)
    h.send([r for r, _ in bad], partition=2)
    h.run()
    assert [(r["id"], r["doc"]) for r in h.rows("public", "accounts")] == [(1, "a")]
    q = spark.read.format("delta").load(str(tmp_path / "quarantine")).collect()
    got = sorted((r["topic"], r["partition"], r["offset"], r["reason"]) for r in q)
    assert got == [(good.topic, 2, offset, why) for offset, (_, why) in enumerate(bad)], got


@pytest.mark.parametrize(
    "decoder, what",
    [(Decoder.FROM_AVRO, "event"), (Decoder.FASTAVRO, "event"), (Decoder.FROM_AVRO, "marker")],
)
def test_truncated_avro_stops_naming_topic_partition_offset(
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    decoder: Decoder,
    what: str,
) -> None:
    """A truncated event or marker stops the job naming it (a truncated marker used to be
    passed over: Spark's from_avro gives a struct of nulls for it, read as a marker of no
    transaction)."""
    h = Harness(spark, kafka_bootstrap, registry_url, tmp_path, decoder=decoder)
    acc = accounts()
    t1 = h.writer.transaction(1, 100).insert(acc, {"id": 1, "balance": Decimal("1.00"), "doc": "a"})
    records = t1.records()
    topic = acc.topic(h.prefix) if what == "event" else f"{h.prefix}.transaction"
    good = next(r for r in records if r.topic == topic)
    h.send(records, partition=0)
    truncated = KafkaRecord(good.topic, good.key, good.value[:-3])
    h.send([truncated], partition=1 if what == "event" else 0)
    offset = 0 if what == "event" else len([r for r in records if r.topic == topic])
    with pytest.raises(
        StreamingQueryException,
        match=rf"{re.escape(transaction_stats.NOT_DECODED)}.*topic '{re.escape(good.topic)}', "
        rf"partition {1 if what == 'event' else 0}, offset {offset}",
    ):
        h.run()
    assert not Path(h.lake, "public", "accounts").exists()  # nothing applied around it
