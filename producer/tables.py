"""Relation message -> everything needed to publish that table's events (I/O: catalog, registry,
topic creation), done once per Relation, before the table's first event is produced."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from producer.envelope_writer import TableEnvelopeWriter
from producer.errors import ConfigError, EventError
from producer.events import Row, TableShape
from producer.pgoutput import Relation
from producer.replication.identifiers import TableName
from producer.sql_session import SqlSession
from producer.topic_admin import TopicManager
from schemas.catalog import ensure_types
from schemas.envelope import Schema
from schemas.relation import RelationCodec, UnmappedColumnLog, build_relation_codec
from schemas.row_encoder import WireRowKeyEncoder, wire_encoder
from schemas.topics import TableTopics, TopicNameError
from schemas.type_catalog import TypeCatalog
from schemas.type_mapping import TIMESTAMPTZ_MICROS
from schemas.wire import AvroEncoder, header

if TYPE_CHECKING:  # imported by the pipeline in a thread at start-up (it is slow to import)
    from schemas.registry import SchemaRegistry

log = logging.getLogger(__name__)

_PRIMARY_KEY = """
SELECT a.attname::text FROM pg_index i
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
 WHERE i.indrelid = %s AND i.indisprimary
"""


def table_topics(prefix: str, published: Iterable[TableName]) -> TableTopics:
    """The topic names of the publication's tables, checked at start-up: two tables that would
    share a topic stop the producer before it reads anything."""
    try:
        return TableTopics(prefix, ((t.schema, t.name) for t in published))
    except TopicNameError as exc:
        raise ConfigError(str(exc)) from exc


@dataclass
class TableRoute:
    """One table's codec, topic and encoders; ``source`` is reused per event (encoded at once)."""

    shape: TableShape
    topic: str
    table: str  # "schema.table" (the data_collection)
    key_header: bytes | None  # Confluent header of the Key schema; None: null Kafka keys
    value_encoder: AvroEncoder
    source: Row
    writer: TableEnvelopeWriter  # row events; value_encoder serves the rare truncate events
    counts: list[int]  # events, bytes produced since the metrics were last updated
    # (payload, TupleData offset) -> what shape.codec.encode_row_key gives for the decoded
    # tuple, + the end offset; None when the table's encoders have no such twin.
    wire: WireRowKeyEncoder | None = None


def wire_row_key_encoder(codec: RelationCodec) -> WireRowKeyEncoder | None:
    """The TupleData-reading twin of ``codec.encode_row_key``: the compiled row + key encoder's
    twin, or for a table without a key the row encoder's (its key is None, as
    ``encode_row_key`` gives)."""
    if codec.encode_key is None:
        return wire_encoder(codec.encode_row)
    return wire_encoder(codec.encode_row_key)


class TableRoutes:
    def __init__(
        self,
        *,
        table_topics: TableTopics,
        catalog: TypeCatalog,
        sql: SqlSession,
        registry: SchemaRegistry,
        topics: TopicManager,
        source_for: Callable[[str, str], Row],
        writer_for: Callable[[Schema, int, str, str], TableEnvelopeWriter],
        timestamptz: str = TIMESTAMPTZ_MICROS,
    ) -> None:
        # Topic names, checked against every other table's (a clash stops the producer).
        self._table_topics = table_topics
        self._catalog = catalog
        self._sql = sql
        self._registry = registry
        self._topics = topics
        self._source_for = source_for
        self._writer_for = writer_for
        self._timestamptz = timestamptz
        self._unmapped = UnmappedColumnLog(log.warning)
        self._warned_keyless: set[str] = set()
        self.routes: dict[int, TableRoute] = {}
        # Relations announced but not used by a change yet (with the LSN of their message).
        self._announced: dict[int, tuple[Relation, int]] = {}

    def on_relation(self, relation: Relation, lsn: int) -> None:
        """Remember a Relation message; its route is built at the relation's first change.

        Lazily, because a Relation is not always followed by changes of that relation: with
        publish_via_partition_root, PostgreSQL 15's pgoutput sends a partition's own Relation
        right after its root's, while the changes name the root. Building eagerly gave every
        leaf partition a topic and registered schemas that never carry an event."""
        self.routes.pop(relation.relation_id, None)  # a new Relation replaces the old shape
        self._announced[relation.relation_id] = (relation, lsn)

    def route(self, relation_id: int) -> TableRoute | None:
        """The relation's route, built now if this is its first change since its Relation;
        None when no Relation message announced it."""
        route = self.routes.get(relation_id)
        if route is None:
            announced = self._announced.get(relation_id)
            if announced is None:
                return None
            route = self._build(*announced)  # may raise (registry, catalog): nothing is lost
            del self._announced[relation_id]
        return route

    def _build(self, relation: Relation, lsn: int) -> TableRoute:
        schema = relation.namespace or "pg_catalog"
        try:
            topic = self._table_topics.topic(schema, relation.name)
        except TopicNameError as exc:
            raise EventError(f"{schema}.{relation.name}", lsn, str(exc)) from exc
        oids = [c.type_oid for c in relation.columns]
        self._sql.run(lambda conn: ensure_types(self._catalog, conn, oids))
        if relation.replica_identity == "f":
            relation = self._key_by_primary_key(relation)
        codec = build_relation_codec(
            relation, self._catalog, topic, self._unmapped, timestamptz=self._timestamptz
        )
        shape = TableShape.of(codec, relation.replica_identity)
        if codec.encode_key is None and codec.table not in self._warned_keyless:
            self._warned_keyless.add(codec.table)
            log.warning(
                "table has no replica identity: events get a null Kafka key (append-only), "
                "no before image",
                extra={"table": codec.table, "replica_identity": relation.replica_identity},
            )
        self._topics.ensure([topic])
        ids = self._registry.register_relation(codec, lsn)
        route = TableRoute(
            shape=shape,
            topic=topic,
            table=codec.table,
            key_header=None
            if codec.encode_key is None or ids.key_id is None
            else header(ids.key_id),
            value_encoder=AvroEncoder(codec.envelope_schema, ids.value_id),
            source=self._source_for(schema, relation.name),
            writer=self._writer_for(codec.envelope_schema, ids.value_id, schema, relation.name),
            counts=[0, 0],
            wire=wire_row_key_encoder(codec),
        )
        self.routes[relation.relation_id] = route
        return route

    def _key_by_primary_key(self, relation: Relation) -> Relation:
        """FULL marks every column as identity; key the events by the primary key when there is
        one, so one row's changes keep one Kafka key (and partition)."""

        def query(conn: psycopg.Connection[Any]) -> set[str]:
            return {r[0] for r in conn.execute(_PRIMARY_KEY, (relation.relation_id,)).fetchall()}

        pk = self._sql.run(query)
        if not pk:
            return relation
        columns = tuple(dataclasses.replace(c, is_key=c.name in pk) for c in relation.columns)
        return dataclasses.replace(relation, columns=columns)
