"""Helpers for the producer's integration tests and benchmarks (no tests in this module).

Runs the real producer as a subprocess (``python -m producer run``) against the local stack,
and reads topics back with confluent-kafka's Consumer and AvroDeserializer.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from psycopg import sql as pgsql

from schemas.client_config import parse_pairs
from tests.support import security

ROOT = Path(__file__).resolve().parents[2]


def unique(name: str) -> str:
    return f"{name}_{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def query(dsn: str, statement: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, tuple(params)).fetchall()


@dataclass
class Source:
    """A publication + slot + topic prefix of one test; ``drop`` removes the slot (it holds WAL)."""

    dsn: str
    publication: str
    slot: str
    prefix: str

    @classmethod
    def create(cls, dsn: str, tables: Iterable[str], name: str = "wbp") -> Source:
        prefix = security.under_acl_prefix(unique(name))
        src = cls(dsn, unique(name + "pub"), unique(name + "slot"), prefix)
        sql(dsn, f"CREATE PUBLICATION {src.publication} FOR TABLE {', '.join(tables)}")
        return src

    def confirmed_lsn(self) -> int | None:
        rows = query(
            self.dsn,
            "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot,),
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def current_lsn(self) -> int:
        return int(query(self.dsn, "SELECT pg_current_wal_insert_lsn() - '0/0'")[0][0])

    def wait_confirmed(self, lsn: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            confirmed = self.confirmed_lsn()
            if confirmed is not None and confirmed >= lsn:
                return
            time.sleep(0.2)
        raise AssertionError(f"slot {self.slot} did not confirm {lsn} (at {self.confirmed_lsn()})")

    def drop(self) -> None:
        for _ in range(50):
            try:
                sql(
                    self.dsn,
                    f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    f"WHERE slot_name = '{self.slot}'",
                )
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.2)
        sql(self.dsn, f"DROP PUBLICATION IF EXISTS {self.publication}")


class ProducerProcess:
    def __init__(self, source: Source, bootstrap: str, registry_url: str, **settings: Any) -> None:
        self.source = source
        self.port = free_port()
        self.log_path = Path(f"/tmp/{source.prefix}-producer.log")
        self.env = (
            {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")}
            | {
                "WALBRIDGE_PG_DSN": source.dsn,
                "WALBRIDGE_KAFKA_BOOTSTRAP": bootstrap,
                "WALBRIDGE_SCHEMA_REGISTRY_URL": registry_url,
                "WALBRIDGE_PUBLICATION": source.publication,
                "WALBRIDGE_SLOT": source.slot,
                "WALBRIDGE_TOPIC_PREFIX": source.prefix,
                "WALBRIDGE_METRICS_PORT": str(self.port),
                "WALBRIDGE_METRICS_HOST": "127.0.0.1",
                "WALBRIDGE_IDLE_AFTER_S": "0.5",
                # Tests of streaming count exact events; snapshot tests ask for snapshots
                # (a new slot would otherwise read rows written right after start-up twice:
                # streamed, and as "r" events).
                "WALBRIDGE_SNAPSHOT": "never",
            }
            | security.producer_env()  # the secure stack's producer principal, when active
            | {f"WALBRIDGE_{k.upper()}": str(v) for k, v in settings.items()}
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: bool = True) -> ProducerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "producer", "run"], cwd=ROOT, env=self.env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        if wait_ready:
            self.wait_ready()
        return self

    def http(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"producer exited {self.proc.returncode}:\n{self.log()}")
            try:
                if self.http("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"producer not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: Any
    value: Any


class TopicReader:
    """Reads topics from the beginning, decoding keys and values with the registry."""

    def __init__(
        self,
        bootstrap: str,
        registry_url: str,
        kafka_config: dict[str, str] | None = None,
        registry_config: dict[str, Any] | None = None,
        group: str = "walbridge_reader",
    ) -> None:
        """``kafka_config``/``registry_config``: TLS and auth settings; by default the active
        secure stack's consumer principal (tests.support.security), else none."""
        creds = security.active()
        if creds is not None:
            kafka_config = kafka_config or parse_pairs(creds.consumer_kafka, "kafka")
            registry_config = registry_config or parse_pairs(creds.consumer_registry, "registry")
        self.bootstrap = bootstrap
        self.kafka_config = kafka_config or {}
        self.group = group
        client = SchemaRegistryClient({**(registry_config or {}), "url": registry_url})
        self._deserializer = AvroDeserializer(client)

    def read(
        self,
        topics: list[str],
        expect: int | None = None,
        timeout: float = 60.0,
        quiet: float = 3.0,
    ) -> list[Record]:
        """Until ``expect`` records arrived (or ``quiet`` s without one when ``expect`` is None)."""
        consumer = Consumer(
            {
                **self.kafka_config,
                "bootstrap.servers": self.bootstrap,
                "group.id": unique(self.group),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        deadline = time.monotonic() + timeout
        # assign(), not subscribe(): no group rebalances that re-read from the start.
        partitions: list[TopicPartition] = []
        while True:
            meta = consumer.list_topics(timeout=10).topics
            if all(t in meta and meta[t].partitions for t in topics):
                break
            if time.monotonic() > deadline:
                consumer.close()
                raise AssertionError(f"topics {topics} never appeared")
            time.sleep(0.3)
        for t in topics:
            partitions += [TopicPartition(t, p, OFFSET_BEGINNING) for p in meta[t].partitions]
        consumer.assign(partitions)
        records: list[Record] = []
        last = time.monotonic()
        try:
            while time.monotonic() < deadline:
                batch = consumer.consume(5000, 0.5)
                for m in batch:
                    err = m.error()
                    if err is not None:
                        if err.code() in (
                            KafkaError._PARTITION_EOF,
                            KafkaError.UNKNOWN_TOPIC_OR_PART,
                        ):
                            continue
                        raise AssertionError(f"consume error: {err}")
                    records.append(self._record(m))
                    last = time.monotonic()
                if expect is not None and len(records) >= expect:
                    # Linger a little: more than expected is a failure the caller must see.
                    if time.monotonic() - last > 1.0:
                        break
                elif expect is None and records and time.monotonic() - last > quiet:
                    break
        finally:
            consumer.close()
        return records

    def read_to_end(self, topics: list[str], timeout: float = 300.0) -> list[Record]:
        """Every committed record of the topics up to their ends now (read_committed: the end
        is the last stable offset; offsets are not counts once transaction markers take some)."""
        return list(self.each_to_end(topics, timeout))

    def each_to_end(self, topics: list[str], timeout: float = 300.0) -> Iterator[Record]:
        """read_to_end one record at a time (memory bounded by the caller, not the topics).
        ``timeout``: seconds without a record or a partition's end (a stall), so a big topic
        read on a busy machine is not cut off while it is still making progress."""
        consumer = Consumer(
            {
                **self.kafka_config,
                "bootstrap.servers": self.bootstrap,
                "group.id": unique("reader"),
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
        deadline = time.monotonic() + timeout
        try:
            meta = consumer.list_topics(timeout=10).topics
            partitions = [
                TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions
            ]
            consumer.assign(partitions)
            waiting = {(tp.topic, tp.partition) for tp in partitions}
            while waiting:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{sorted(waiting)} not read to their end: nothing read for {timeout}s"
                    )
                for m in consumer.consume(5000, 0.5):
                    deadline = time.monotonic() + timeout
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            waiting.discard((m.topic(), m.partition()))
                            continue
                        raise AssertionError(f"consume error: {err}")
                    yield self._record(m)
        finally:
            consumer.close()

    def _record(self, m: Message) -> Record:
        topic = m.topic()
        assert topic is not None
        key = self._decode(topic, m.key(), MessageField.KEY)
        value = self._decode(topic, m.value(), MessageField.VALUE)
        return Record(topic, m.partition() or 0, m.offset() or 0, key, value)

    def _decode(self, topic: str, data: bytes | None, field: MessageField) -> Any:
        if data is None:
            return None
        return self._deserializer(data, SerializationContext(topic, field))


def metric(producer: ProducerProcess, name: str) -> float:
    """Sum of a metric's samples (0 when absent or the endpoint is down)."""
    try:
        status, body = producer.http("/metrics")
    except OSError:
        return 0.0
    if status != 200:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def create_counter_table(dsn: str, name: str) -> None:
    sql(dsn, f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL, pad text)")


def _range_batches(
    dsn: str, statement: pgsql.Composed, first_id: int, n_tx: int, rows: int, pause: float
) -> None:
    """``statement`` (with the bounds of an id range as its two parameters) once per
    transaction, over consecutive ranges of ``rows`` ids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(n_tx):
            lo = first_id + i * rows
            conn.execute(statement, (lo, lo + rows - 1))
            if pause:
                time.sleep(pause)


def insert_batches(
    dsn: str, table: str, first_id: int, n_tx: int, rows: int, pause: float = 0.0
) -> None:
    statement = pgsql.SQL(
        "INSERT INTO {} SELECT g, 0, 'p' || g FROM generate_series(%s::int, %s::int) g"
    ).format(pgsql.Identifier(table))
    _range_batches(dsn, statement, first_id, n_tx, rows, pause)


def update_batches(
    dsn: str, table: str, first_id: int, n_tx: int, rows: int, pause: float = 0.0
) -> None:
    statement = pgsql.SQL("UPDATE {} SET v = v + 1 WHERE id BETWEEN %s::int AND %s::int").format(
        pgsql.Identifier(table)
    )
    _range_batches(dsn, statement, first_id, n_tx, rows, pause)


def verify_counter_table(records: list[Record], dsn: str, table: str, changes: int) -> int:
    """No loss, per-key order, identical duplicates, final state equal to PostgreSQL's.

    Returns the number of duplicates seen."""
    first: dict[tuple[int, int], dict[str, Any]] = {}
    last_per_key: dict[int, tuple[int, int]] = {}
    partition_of: dict[int, int] = {}
    final: dict[int, dict[str, Any] | None] = {}
    duplicates = 0
    for r in records:  # partition order is preserved by the reader
        v = r.value
        dedup = (v["source"]["commit_lsn"], v["transaction"]["total_order"])
        body = {k: val for k, val in v.items() if k != "ts_ms"}
        if dedup in first:
            assert first[dedup] == body, f"duplicate {dedup} differs"
            duplicates += 1
            continue
        first[dedup] = body
        key = r.key["id"]
        assert partition_of.setdefault(key, r.partition) == r.partition, f"key {key} moved"
        assert last_per_key.get(key, (-1, -1)) < dedup, f"key {key} out of order at {dedup}"
        last_per_key[key] = dedup
        final[key] = v["after"]
    assert len(first) == changes, f"{len(first)} distinct events, expected {changes}"
    rows = query(dsn, f"SELECT id, v, pad FROM {table}")
    assert len(rows) == len(final)
    for id_, val, pad in rows:
        assert final[id_] == {"id": id_, "v": val, "pad": pad}
    return duplicates
