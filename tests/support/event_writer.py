"""Write producer-shaped events exactly per docs/event-format.md, independent of the producer.

Schemas are built here from the contract text (not from `schemas/`), so the consumer's side of the
contract is pinned by tests even if the producer drifts. Values are framed by confluent-kafka's
AvroSerializer (magic byte 0, 4-byte big-endian schema id, Avro body), registering under
TopicNameStrategy subjects `<topic>-key` / `<topic>-value`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

SOURCE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Source",
    "namespace": "io.walbridge.postgresql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "snapshot", "type": "string", "default": "false"},
        {"name": "db", "type": "string"},
        {"name": "sequence", "type": ["null", "string"], "default": None},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "txId", "type": ["null", "long"], "default": None},
        {"name": "lsn", "type": ["null", "long"], "default": None},
        {"name": "commit_lsn", "type": ["null", "long"], "default": None},
        {"name": "xmin", "type": ["null", "long"], "default": None},
    ],
}

TRANSACTION_BLOCK: dict[str, Any] = {
    "type": "record",
    "name": "TransactionBlock",
    "namespace": "io.walbridge",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"},
    ],
}

TRANSACTION_KEY: dict[str, Any] = {
    "type": "record",
    "name": "TransactionKey",
    "namespace": "io.walbridge",
    "fields": [{"name": "id", "type": "string"}],
}

TRANSACTION_METADATA: dict[str, Any] = {
    "type": "record",
    "name": "TransactionMetadata",
    "namespace": "io.walbridge",
    "fields": [
        {"name": "status", "type": "string"},
        {"name": "id", "type": "string"},
        {"name": "event_count", "type": ["null", "long"], "default": None},
        {
            "name": "data_collections",
            "type": [
                "null",
                {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "DataCollection",
                        "fields": [
                            {"name": "data_collection", "type": "string"},
                            {"name": "event_count", "type": "long"},
                        ],
                    },
                },
            ],
            "default": None,
        },
        {"name": "ts_ms", "type": "long"},
        {"name": "commit_lsn", "type": "long"},
    ],
}


def avro_namespace(topic: str) -> str:
    """Topic -> Avro namespace as the event format says: sanitize each dot-separated part."""
    parts = []
    for part in topic.split("."):
        clean = re.sub(r"[^A-Za-z0-9_]", "_", part)
        parts.append(f"_{clean}" if clean[:1].isdigit() else clean)
    return ".".join(parts)


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    avro_type: Any  # the non-null Avro type (a name, a dict with a logicalType, or a union list)
    pg_type: str


@dataclass(frozen=True)
class TableSpec:
    schema: str
    table: str
    columns: tuple[ColumnSpec, ...]
    key: tuple[str, ...]  # replica identity columns; empty = append-only, null Kafka key

    @property
    def data_collection(self) -> str:
        return f"{self.schema}.{self.table}"

    def topic(self, prefix: str) -> str:
        return f"{prefix}.{self.schema}.{self.table}"

    def _fields(self, names: Iterable[str]) -> list[dict[str, Any]]:
        by_name = {c.name: c for c in self.columns}
        return [
            {
                "name": n,
                # A union type (e.g. numeric's [decimal, string]) gains a null branch.
                "type": ["null", *t]
                if isinstance(t := by_name[n].avro_type, list)
                else ["null", t],
                "default": None,
                "pg.type": by_name[n].pg_type,
            }
            for n in names
        ]

    def value_schema(self, prefix: str) -> dict[str, Any]:
        ns = avro_namespace(self.topic(prefix))
        row = {
            "type": "record",
            "name": "Value",
            "namespace": ns,
            "fields": self._fields(c.name for c in self.columns),
        }
        return {
            "type": "record",
            "name": "Envelope",
            "namespace": ns,
            "fields": [
                {"name": "before", "type": ["null", row], "default": None},
                {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
                {"name": "source", "type": SOURCE_SCHEMA},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "transaction", "type": ["null", TRANSACTION_BLOCK], "default": None},
                {
                    "name": "unchanged_toast",
                    "type": {"type": "array", "items": "string"},
                    "default": [],
                },
            ],
        }

    def key_schema(self, prefix: str) -> dict[str, Any]:
        ns = avro_namespace(self.topic(prefix))
        return {"type": "record", "name": "Key", "namespace": ns, "fields": self._fields(self.key)}


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    key: bytes | None
    value: bytes


class _Serializers:
    """One AvroSerializer per (subject, schema), created lazily; registration is automatic."""

    def __init__(self, registry: SchemaRegistryClient) -> None:
        self._registry = registry
        self._cache: dict[tuple[str, str], AvroSerializer] = {}

    def frame(
        self, topic: str, field: MessageField, schema: Mapping[str, Any], value: Mapping[str, Any]
    ) -> bytes:
        text = json.dumps(schema, sort_keys=True)
        ser = self._cache.get((topic + str(field), text))
        if ser is None:
            # An explicit TopicNameStrategy: confluent-kafka 2.16's default first asks the registry
            # for topic associations, an API that neither mock:// nor Apicurio's ccompat offers.
            ser = AvroSerializer(
                self._registry,
                text,
                conf={
                    "auto.register.schemas": True,
                    "subject.name.strategy": topic_subject_name_strategy,
                },
            )
            self._cache[(topic + str(field), text)] = ser
        out = ser(dict(value), SerializationContext(topic, field))
        assert out is not None
        return out


@dataclass
class Transaction:
    """Builds one source transaction: BEGIN, its events, END (call `records()`)."""

    writer: EventWriter
    xid: int
    commit_lsn: int
    ts_ms: int
    _events: list[
        tuple[TableSpec, str, dict[str, Any] | None, dict[str, Any] | None, tuple[str, ...]]
    ] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.xid}:{self.commit_lsn}"

    def insert(self, table: TableSpec, row: Mapping[str, Any]) -> Transaction:
        self._events.append((table, "c", None, dict(row), ()))
        return self

    def read(self, table: TableSpec, row: Mapping[str, Any]) -> Transaction:
        self._events.append((table, "r", None, dict(row), ()))
        return self

    def update(
        self, table: TableSpec, row: Mapping[str, Any], unchanged_toast: Iterable[str] = ()
    ) -> Transaction:
        toast = tuple(unchanged_toast)
        after = {k: (None if k in toast else v) for k, v in row.items()}
        self._events.append((table, "u", None, after, toast))
        return self

    def delete(self, table: TableSpec, old_key: Mapping[str, Any]) -> Transaction:
        self._events.append((table, "d", dict(old_key), None, ()))
        return self

    def truncate(self, table: TableSpec) -> Transaction:
        self._events.append((table, "t", None, None, ()))
        return self

    def records(self, *, with_end: bool = True) -> list[KafkaRecord]:
        w = self.writer
        out = [w.marker(self, "BEGIN")]
        per_collection: Counter[str] = Counter()
        for total_order, (table, op, before, after, toast) in enumerate(self._events, start=1):
            per_collection[table.data_collection] += 1
            out.append(
                w.event(
                    self,
                    table,
                    op,
                    before,
                    after,
                    toast,
                    total_order,
                    per_collection[table.data_collection],
                )
            )
        if with_end:
            out.append(w.marker(self, "END", per_collection))
        return out


def registry_client(url: str) -> SchemaRegistryClient:
    """A registry client; `mock://...` gives confluent-kafka's in-process mock."""
    return SchemaRegistryClient.new_client({"url": url})


class EventWriter:
    def __init__(self, registry: SchemaRegistryClient, prefix: str, db: str = "walbridge") -> None:
        self.prefix = prefix
        self.db = db
        self._ser = _Serializers(registry)
        self._lsn = 0

    def transaction(self, xid: int, commit_lsn: int, ts_ms: int = 1_700_000_000_000) -> Transaction:
        return Transaction(self, xid, commit_lsn, ts_ms)

    def marker(
        self, tx: Transaction, status: str, counts: Mapping[str, int] | None = None
    ) -> KafkaRecord:
        topic = f"{self.prefix}.transaction"
        value = {
            "status": status,
            "id": tx.id,
            "event_count": sum(counts.values()) if counts is not None else None,
            "data_collections": (
                [{"data_collection": k, "event_count": v} for k, v in counts.items()]
                if counts is not None
                else None
            ),
            "ts_ms": tx.ts_ms,
            "commit_lsn": tx.commit_lsn,
        }
        return KafkaRecord(
            topic,
            self._ser.frame(topic, MessageField.KEY, TRANSACTION_KEY, {"id": tx.id}),
            self._ser.frame(topic, MessageField.VALUE, TRANSACTION_METADATA, value),
        )

    def event(
        self,
        tx: Transaction,
        table: TableSpec,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        unchanged_toast: tuple[str, ...],
        total_order: int,
        collection_order: int,
    ) -> KafkaRecord:
        topic = table.topic(self.prefix)
        self._lsn += 1
        value = {
            "before": before,
            "after": after,
            "source": {
                "version": "test",
                "connector": "postgresql",
                "name": self.prefix,
                "ts_ms": tx.ts_ms,
                "snapshot": "false",
                "db": self.db,
                "sequence": None,
                "schema": table.schema,
                "table": table.table,
                "txId": tx.xid,
                "lsn": tx.commit_lsn - 1000 + total_order,
                "commit_lsn": tx.commit_lsn,
                "xmin": None,
            },
            "op": op,
            "ts_ms": tx.ts_ms + 5,
            "transaction": {
                "id": tx.id,
                "total_order": total_order,
                "data_collection_order": collection_order,
            },
            "unchanged_toast": list(unchanged_toast),
        }
        key: bytes | None = None
        if table.key:
            row = before if op == "d" else after
            if row is not None:
                key = self._ser.frame(
                    topic,
                    MessageField.KEY,
                    table.key_schema(self.prefix),
                    {k: row[k] for k in table.key},
                )
        return KafkaRecord(
            topic,
            key,
            self._ser.frame(topic, MessageField.VALUE, table.value_schema(self.prefix), value),
        )


def produce(
    bootstrap: str, records: Iterable[KafkaRecord], partition_of: Mapping[str, int] | None = None
) -> None:
    """Send records in order with an idempotent producer and wait for every ack."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    for rec in records:
        kwargs: dict[str, Any] = {}
        if partition_of and rec.topic in partition_of:
            kwargs["partition"] = partition_of[rec.topic]
        producer.produce(rec.topic, key=rec.key, value=rec.value, **kwargs)
        producer.poll(0)
    remaining = producer.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} records not acknowledged by Kafka")
