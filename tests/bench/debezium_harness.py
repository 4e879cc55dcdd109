"""Debezium Server as a process beside walbridge (bench_debezium.py), and the Kafka and
PostgreSQL helpers its runs share: topic counts and reads decoded with the registry, slots and a
publication made for a run and dropped after it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.support.producer_harness import free_port  # noqa: E402

DEBEZIUM = ROOT / "deploy" / "local" / "debezium-server"


# --- Debezium Server as a process ------------------------------------------------------------


class DebeziumProcess:
    """Debezium Server's PostgreSQL connector on an existing slot and publication, publishing
    Confluent-framed Avro (key and value) to Kafka with subjects in the same registry."""

    def __init__(
        self, env: dict[str, str], slot: str, publication: str, prefix: str, tables: list[str]
    ) -> None:
        self.dir = Path(f"/tmp/debezium-{prefix}")
        self.dir.mkdir(parents=True, exist_ok=True)
        info = psycopg.conninfo.conninfo_to_dict(env["WALBRIDGE_PG_DSN"])
        registry = env["WALBRIDGE_SCHEMA_REGISTRY_URL"]
        props = {
            "debezium.sink.type": "kafka",
            "debezium.sink.kafka.producer.bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"],
            "debezium.sink.kafka.producer.key.serializer": (
                "org.apache.kafka.common.serialization.ByteArraySerializer"
            ),
            "debezium.sink.kafka.producer.value.serializer": (
                "org.apache.kafka.common.serialization.ByteArraySerializer"
            ),
            "debezium.format.key": "avro",
            "debezium.format.value": "avro",
            "debezium.format.key.schema.registry.url": registry,
            "debezium.format.value.schema.registry.url": registry,
            "debezium.source.connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "debezium.source.plugin.name": "pgoutput",
            "debezium.source.slot.name": slot,
            "debezium.source.publication.name": publication,
            "debezium.source.publication.autocreate.mode": "disabled",
            "debezium.source.snapshot.mode": "no_data",
            "debezium.source.offset.storage.file.filename": str(self.dir / "offsets.dat"),
            "debezium.source.offset.flush.interval.ms": "0",
            "debezium.source.database.hostname": info.get("host", "127.0.0.1"),
            "debezium.source.database.port": info.get("port", "5432"),
            "debezium.source.database.user": info["user"],
            "debezium.source.database.password": info["password"],
            "debezium.source.database.dbname": info["dbname"],
            "debezium.source.topic.prefix": prefix,
            "debezium.source.table.include.list": ",".join(tables),
            "debezium.source.provide.transaction.metadata": "true",
            "debezium.source.skipped.operations": "none",
            "debezium.source.include.unknown.datatypes": "true",
            "quarkus.http.port": str(free_port()),
            "quarkus.log.level": "WARN",
            "quarkus.log.console.json": "false",
        }
        (self.dir / "application.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in props.items())
        )
        self.log_path = self.dir / "debezium.log"
        self.bootstrap = env["WALBRIDGE_KAFKA_BOOTSTRAP"]
        self.topics = [f"{prefix}.{t}" for t in tables] + [f"{prefix}.transaction"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DebeziumProcess:
        # The local broker does not create topics on demand (walbridge's producer creates its
        # own); Debezium relies on auto-creation, so its topics are made here.
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        wanted = [NewTopic(t, 1, -1) for t in self.topics]
        existing = admin.list_topics(timeout=10).topics
        new = [t for t in wanted if t.topic not in existing]
        for future in admin.create_topics(new).values() if new else []:
            future.result()
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(DEBEZIUM), "run", str(self.dir)], stdout=log, stderr=subprocess.STDOUT
        )
        return self

    def check(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            sys.exit(f"Debezium exited {self.proc.returncode}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)  # config, offsets, log: kept only on failure


def install_debezium() -> None:
    subprocess.run([str(DEBEZIUM), "install"], check=True, stdout=subprocess.DEVNULL)


# --- Kafka helpers -------------------------------------------------------------------------


def topic_count(topic: str, consumer: Consumer) -> int:
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return 0
    total = 0
    for p in meta.partitions:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        except KafkaException:  # a topic just created has no leader yet
            return 0
        total += high - low
    return total


def read_topic(env: dict[str, str], topic: str, quiet: float = 3.0) -> list[tuple[Any, Any, int]]:
    """(key, value, append ms) of every record, decoded with the registry, partition order."""
    consumer = Consumer(
        {"bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"], "group.id": uuid.uuid4().hex}
    )
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    deserialize = AvroDeserializer(
        SchemaRegistryClient({"url": env["WALBRIDGE_SCHEMA_REGISTRY_URL"]})
    )
    out: list[tuple[Any, Any, int]] = []
    last = time.monotonic()
    while time.monotonic() - last < quiet:
        for m in consumer.consume(5000, 0.5):
            if m.error() is not None:
                continue
            key = m.key()
            value = m.value()
            out.append(
                (
                    None
                    if key is None
                    else deserialize(key, SerializationContext(topic, MessageField.KEY)),
                    None
                    if value is None
                    else deserialize(value, SerializationContext(topic, MessageField.VALUE)),
                    m.timestamp()[1],
                )
            )
            last = time.monotonic()
    consumer.close()
    return out


@contextmanager
def slots_and_publication(
    dsn: str, publication: str, tables: list[str], slots: list[str]
) -> Iterator[None]:
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(publication),
                sql.SQL(", ").join(sql.Identifier(*t.split(".")) for t in tables),
            )
        )
        for slot in slots:
            db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        yield
    finally:
        drop_slots_and_publication(dsn, publication, slots)


def drop_slots_and_publication(dsn: str, publication: str, slots: list[str]) -> None:
    """Drop the run's slots (each retried while its reader is still letting go of it) and its
    publication; a slot or publication already gone is no error."""
    with psycopg.connect(dsn, autocommit=True) as db:
        for slot in slots:
            for _ in range(50):
                try:
                    db.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s",
                        (slot,),
                    )
                    break
                except psycopg.errors.ObjectInUse:
                    time.sleep(0.2)
        db.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
