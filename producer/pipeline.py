"""The producer loop: replication stream -> events -> Kafka, confirming only what Kafka acked.

Protocol 1 without streaming or two-phase: PostgreSQL sends each transaction whole at its
commit, in commit order, and Begin carries the commit LSN, so events are produced while they
are decoded (memory stays bounded by librdkafka's queue, whatever the transaction size) and
no transaction state outlives its Commit. Streaming (v2) would interleave uncommitted
transactions and force buffering or reordering; two-phase (v3) would publish prepared
transactions that may still roll back.

Transactions that publish no event (other tables, DDL only) get no markers; their end LSN
is still confirmed once everything before them is acknowledged.

With exactly-once on (the default), every record goes into a Kafka transaction
(``producer.kafka_transactions``): only what a committed Kafka transaction holds is confirmed,
and on start-up what Kafka already committed (its resume point) is skipped, so a restart
after any crash produces nothing twice.
"""

from __future__ import annotations

import logging
import signal
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import KafkaException

from producer.config import ProducerConfig
from producer.delivery import DeliveryTracker, Ticket
from producer.envelope_writer import TableEnvelopeWriter
from producer.errors import DeliveryError, StreamStateError
from producer.events import (
    Row,
    RowChange,
    delete_changes,
    insert_changes,
    message_envelope,
    source_block,
    truncate_envelope,
    update_changes,
)
from producer.health import HealthServer, HealthState
from producer.kafka_sink import DeliveryCallback, KafkaSink, producer_settings
from producer.kafka_transactions import CommitPolicy, KafkaTransactions
from producer.lag import LagMonitor
from producer.metrics import Metrics
from producer.pgoutput import (
    Begin,
    Commit,
    Decoder,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    Truncate,
    Type,
    Update,
    format_lsn,
)
from producer.replication import (
    ErrorKind,
    ReplicationClient,
    ReplicationConfig,
    ReplicationError,
    SlotInfo,
)
from producer.snapshot import catalog as snapshot_catalog
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.coordinator import SnapshotCoordinator
from producer.snapshot.watermarks import INTERNAL_PREFIX
from producer.sql_session import SqlSession
from producer.tables import TableRoute, TableRoutes, table_topics
from producer.topics import TopicManager, TopicPolicy
from producer.transactions import Transaction
from schemas import snapshot_state
from schemas.catalog import on_type_message
from schemas.envelope import (
    heartbeat_schema,
    message_envelope_schema,
    message_key_schema,
    transaction_key_schema,
    transaction_metadata_schema,
)
from schemas.safe_names import name_part
from schemas.snapshot_state import TableState
from schemas.topics import (
    heartbeat_topic,
    message_topic,
    offsets_topic,
    snapshot_topic,
    transaction_topic,
)
from schemas.type_catalog import TypeCatalog
from schemas.wire import AvroEncoder

if TYPE_CHECKING:
    from schemas.registry import SchemaRegistry

log = logging.getLogger(__name__)

_POLL_EVERY = 1024
_TAG_INSERT: Final = ord("I")
_TAG_UPDATE: Final = ord("U")
_TAG_DELETE: Final = ord("D")
_DML_TAGS: Final = frozenset((_TAG_INSERT, _TAG_UPDATE, _TAG_DELETE))
_MARKER_NEW: Final = ord("N")
_MARKER_KEY: Final = ord("K")
_MARKER_OLD: Final = ord("O")
_unpack_rel_marker: Final = struct.Struct("!IB").unpack_from  # relation_id, tuple marker
_OP_OF_TAG: Final = {_TAG_INSERT: "c", _TAG_UPDATE: "u", _TAG_DELETE: "d"}
_ANY_PARTITION: Final = -1  # confluent-kafka's produce(): let the partitioner choose
_STATUS_MIN_GAP_S = 0.1  # serve delivery reports at least this often inside big transactions
# While acknowledgements are outstanding, a quiet stream hands control back this soon (instead
# of after idle_after_s) to serve delivery reports: the last transaction before a pause is
# confirmed within about linger.ms + a broker round trip.
_ACK_WAIT_S = 0.02
# With exactly-once, how long start-up waits for a producer it fenced to release the slot
# (above heartbeat_interval_s's default: an idle fenced producer notices at its next commit).
_FENCED_SLOT_WAIT_S = 60.0
_KAFKA_DOWN: Final = "Kafka brokers unreachable"


def _version() -> str:
    try:
        return metadata.version("walbridge")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _no_sink(*_args: Any, **_kwargs: Any) -> None:
    raise AssertionError("produce before setup()")


class ShutdownRequested(Exception):
    """SIGTERM/SIGINT noticed while blocked on Kafka or the registry, or inside a transaction."""


class Pipeline:
    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.health = HealthState(stall_after_s=max(120.0, 4 * config.status_interval_s))
        self.tracker = DeliveryTracker()
        self.decoder = Decoder()
        self.stop_requested = False
        self.version = _version()
        self._tx: Transaction | None = None
        self._ticket: Ticket | None = None
        self._callback: DeliveryCallback | None = None
        self._skipping = False  # a transaction resent after a reconnect, already produced
        self._last_commit_lsn = 0
        # Exactly-once: the source transaction Kafka holds part of (commit LSN, events), whose
        # resent events are counted and not produced again up to there.
        self._partial: tuple[int, int] | None = None
        self._acked_lsn = 0  # the highest end LSN Kafka acknowledged (all before it too)
        self.eot: KafkaTransactions | None = None
        self._since_poll = 0
        self._counts: dict[str, list[int]] = {}  # topics without a TableRoute (markers, messages)
        self._next_heartbeat = 0.0
        self._next_status = 0.0
        self._reported_lsn = 0
        self._reported_at = 0.0
        self._idle_sooner = False  # asked the stream for _ACK_WAIT_S idle ticks
        self.client: ReplicationClient | None = None
        self.sink: KafkaSink | None = None
        self._kafka_produce: Callable[..., None] = _no_sink
        self._routes: dict[int, TableRoute] = {}
        self._http: HealthServer | None = None
        self._lag: LagMonitor | None = None
        self._snap: SnapshotCoordinator | None = None
        # (table, value schema id, snapshot marker) -> the writer of that table's "r" events
        self._read_writers: dict[tuple[str, int, str], TableEnvelopeWriter] = {}

    # --- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Connections, slot, fixed topics and schemas. Independent steps overlap (start-up is
        part of every restart's catch-up): the registry client's import (about a third of
        the producer's imports) runs in a thread while PostgreSQL is set up, and the fixed
        topics are created in a thread while the fixed schemas are registered. Registry
        calls stay on this thread (their retries call ``_keep_alive``); every thread's
        failure is raised here, before anything is streamed."""
        cfg = self.config
        with ThreadPoolExecutor(2, thread_name_prefix="walbridge-setup") as pool:
            registry = pool.submit(self._open_registry)
            if cfg.metrics_port:
                self._http = HealthServer(
                    cfg.metrics_host, cfg.metrics_port, self.health, self.metrics.registry
                )
                self._http.start()
            repl = ReplicationConfig.from_mapping(
                {
                    "slot": cfg.slot,
                    "publication": cfg.publication,
                    "tables": cfg.tables,
                    "publish_via_partition_root": cfg.publish_via_partition_root,
                    "proto_version": 1,
                    # Always on: snapshot watermarks and signals are logical messages;
                    # --no-messages only stops publishing the application's own.
                    "messages": True,
                    "status_interval": cfg.status_interval_s,
                    "application_name": "walbridge_producer",
                }
            )
            self.client = ReplicationClient(cfg.pg_dsn, repl, on_reconnect=self._on_reconnect)
            identity = self.client.open()
            self.db = identity.dbname
            self.prefix = cfg.topic_prefix or name_part(identity.dbname)
            self.table_topics = table_topics(self.prefix, self.client.ensure_publication().tables)
            # The Kafka producer first: it connects and gets its idempotent producer id in
            # librdkafka's threads while the rest is set up.
            self.transactional_id = (
                (cfg.transactional_id or f"walbridge.{self.prefix}.{cfg.slot}")
                if cfg.exactly_once
                else None
            )
            self.sink = KafkaSink(
                producer_settings(cfg, self.transactional_id),
                self.tracker,
                self.prefix,
                on_delivery_error=lambda topic: self.metrics.delivery_errors.labels(topic).inc(),
            )
            # confluent-kafka's produce itself, bound once: the hot path skips the sink's
            # wrapper (a full queue is still handled by the sink, see _produce).
            self._kafka_produce = self.sink.raw_produce

            self.topics = TopicManager.connect(
                cfg.kafka_client(),
                TopicPolicy(
                    cfg.create_topics,
                    cfg.topic_partitions,
                    cfg.topic_replication_factor,
                    cfg.topic_retention_ms,
                ),
            )
            self.tx_topic = transaction_topic(self.prefix)
            self.hb_topic = heartbeat_topic(self.prefix)
            self.msg_topic = message_topic(self.prefix)
            self.sql = SqlSession(cfg.pg_dsn, "walbridge_catalog")
            fixed_topics = pool.submit(self._ensure_fixed_topics)
            if cfg.exactly_once:
                fixed_topics.result()  # the offsets topic exists before it is read
                self._start_exactly_once()
            self.registry = registry.result()
            self._register_fixed_schemas()
            fixed_topics.result()
        self.catalog = TypeCatalog()
        # Snapshot state before the slot: a new slot's tables are recorded as to be read
        # (and acknowledged by Kafka) before the slot exists, so a crash in between can't
        # leave a slot whose existing rows nobody reads.
        initial_needed = self._start_snapshots()
        slot = self._ensure_slot()
        if slot.created != initial_needed and cfg.snapshot != "never":
            log.warning(
                "the slot appeared or vanished during start-up; check for another producer",
                extra={"slot": slot.slot_name},
            )
        log.info(
            "slot ready",
            extra={"slot": slot.slot_name, "slot_created": slot.created, "prefix": self.prefix},
        )
        self.tables = TableRoutes(
            table_topics=self.table_topics,
            catalog=self.catalog,
            sql=self.sql,
            registry=self.registry,
            topics=self.topics,
            source_for=self._source_for,
            writer_for=self._writer_for,
            timestamptz=cfg.timestamptz_format,
        )
        self._routes = self.tables.routes  # the same dict, one attribute less per event
        self._lag = LagMonitor(cfg.pg_dsn, cfg.slot, cfg.lag_interval_s, self.metrics)
        self._lag.start()

    def _ensure_slot(self) -> SlotInfo:
        """The slot; with exactly-once, wait a while for a fenced producer to let it go: it
        stops at its next Kafka commit (at the latest its next heartbeat's), as during a
        rolling update where the new pod starts before the old one has stopped."""
        assert self.client is not None
        deadline = time.monotonic() + (_FENCED_SLOT_WAIT_S if self.eot is not None else 0)
        delay = 0.5
        while True:
            try:
                return self.client.ensure_slot()
            except ReplicationError as exc:
                if exc.kind is not ErrorKind.SLOT_ACTIVE or time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "slot in use; waiting for the fenced producer holding it to stop",
                    extra={"slot": self.config.slot, "error": str(exc)},
                )
                self._setup_wait()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _start_exactly_once(self) -> None:
        """Fence a previous producer of this transactional id and skip what Kafka committed."""
        cfg = self.config
        assert self.sink is not None and self.transactional_id is not None
        self.eot = KafkaTransactions(
            self.sink,
            CommitPolicy(
                cfg.kafka_transaction_max_ms,
                cfg.kafka_transaction_max_events,
                cfg.kafka_transaction_max_bytes,
            ),
            offsets_topic=offsets_topic(self.prefix),
            slot=cfg.slot,
            metrics=self.metrics,
            exit_after_commits=cfg.fault_exit_after_kafka_commits,
        )
        point = self.eot.start(cfg.kafka_client(), self._setup_wait)
        if point is not None:
            if point.complete:
                self._last_commit_lsn = point.commit_lsn
            else:
                self._last_commit_lsn = point.commit_lsn - 1
                self._partial = (point.commit_lsn, point.total_order)
        log.info(
            "exactly-once on",
            extra={"transactional_id": self.transactional_id, "resume_lsn": self._last_commit_lsn},
        )

    def _start_snapshots(self) -> bool:
        """The snapshot coordinator, with the resume records read from Kafka; True when the
        slot is new and the initial snapshot was queued."""
        cfg = self.config
        self.snap_topic = snapshot_topic(self.prefix)
        self.topics.ensure(
            [self.snap_topic], single_partition=True, config={"cleanup.policy": "compact"}
        )
        states = snapshot_state.load(cfg.kafka_client(), self.snap_topic)

        def look(conn: Any) -> tuple[bool, list[str]]:
            exists = conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (cfg.slot,)
            ).fetchone()
            return exists is not None, sorted(snapshot_catalog.published(conn, cfg.publication))

        slot_exists, published = self.sql.run(look)
        initial = published if not slot_exists and cfg.snapshot != "never" else []
        self._snap = SnapshotCoordinator(
            dsn=cfg.pg_dsn,
            publication=cfg.publication,
            sql=self.sql,
            sink=self,
            chunk_rows=cfg.snapshot_chunk_rows,
            chunk_bytes=cfg.snapshot_chunk_bytes,
            auto_new_tables=cfg.snapshot != "never",
            metrics=self.metrics,
        )
        self._snap.start(states, published, initial)
        self.health.activity = self._snap.describe()
        if initial:
            assert self.sink is not None
            if self.eot is not None:
                self.eot.commit(self._setup_wait)
            left = self.sink.flush(60.0)
            if left:
                raise DeliveryError(self.snap_topic, "snapshot state", None, "not acknowledged")
            log.info("initial snapshot queued", extra={"tables": len(initial)})
        return bool(initial)

    # --- snapshot sink (producer.snapshot.coordinator.SnapshotSink) ----------------------------

    def has_route(self, oid: int) -> bool:
        return oid in self._routes

    def snapshot_route(self, table: SnapshotTable, lsn: int) -> TableRoute:
        route = self._routes.get(table.oid)
        if route is None:
            route = self.tables.route(table.oid)
        if route is None:  # the stream has not named the table yet: describe it ourselves
            self.tables.on_relation(table.relation(), lsn)
            route = self._route(table.oid, lsn)
        return route

    def emit_read(
        self, route: TableRoute, row: bytes, key: bytes | None, last: bool, lsn: int
    ) -> None:
        """One snapshot row (``op: "r"``) in the current transaction (a high watermark's)."""
        tx = self._require_tx("snapshot row", lsn)
        tx.splittable = False  # the rows are read for this transaction, not resent with it
        marker = "last" if last else "true"
        schema_id = route.value_encoder.schema_id
        writer = self._read_writers.get((route.table, schema_id, marker))
        if writer is None:
            schema, _, name = route.table.partition(".")
            writer = TableEnvelopeWriter(
                route.shape.codec.envelope_schema, schema_id, version=self.version,
                prefix=self.prefix, db=self.db, schema=schema, table=name, snapshot=marker,
            )  # fmt: skip
            self._read_writers[(route.table, schema_id, marker)] = writer
        if tx.event_count == 0:
            self._produce_marker(tx.begin_marker())
        total_order, data_collection_order = tx.next_order(route.table)
        value = writer.encode(
            "r", None, row, tx.encoded, lsn, _now_ms(), total_order, data_collection_order, []
        )
        header = route.key_header
        framed = header + key if key is not None and header is not None else None
        self._produce(route.topic, route.counts, framed, value, route.table)

    def emit_snapshot_truncate(self, route: TableRoute, lsn: int) -> None:
        """A table without a key starts its snapshot with a ``t`` (source.snapshot "true"):
        its rows can't be upserted, so readers drop what they hold and take the rows read."""
        tx = self._require_tx("snapshot truncate", lsn)
        tx.splittable = False
        self._begin_marker_once(tx)
        block = tx.block(tx.next_order(route.table))
        source = self._fill_source(dict(route.source), tx, lsn)
        source["snapshot"] = "true"
        value = route.value_encoder.encode(truncate_envelope(source, block, _now_ms()))
        self._produce(route.topic, route.counts, None, value, route.table)

    def write_state(self, state: TableState) -> None:
        assert self.sink is not None
        ticket = Ticket(None)  # confirms nothing: written after what it covers was confirmed
        ticket.outstanding = 1
        self.sink.produce(
            self.snap_topic,
            state.table.encode(),
            state.encode(),
            self.sink.callback_for(ticket),
            self._keep_alive,
        )

    def _open_registry(self) -> SchemaRegistry:
        """Imported here, not at module level: confluent-kafka's registry client pulls in
        httpx and authlib (0.15-0.3 s), which ``setup`` overlaps with PostgreSQL's set-up."""
        from schemas.registry import RegistryConfig, SchemaRegistry

        return SchemaRegistry(
            # Subject levels belong to the operator (and the registry's global default): setting
            # them here on every start would undo the override that resolves a refused change.
            RegistryConfig(
                url=self.config.schema_registry_url,
                client_config=self.config.registry_client_config(),
                max_attempts=self.config.registry_max_attempts,
                manage_compatibility=False,
            ),
            on_call=lambda op, _subject: self.metrics.registry_calls.labels(op).inc(),
            on_retry=self._on_registry_retry,
        )

    def _ensure_fixed_topics(self) -> None:
        """The transaction, heartbeat and message topics; also opens the catalog session, so
        the first Relation's type look-up finds it connected."""
        self.topics.ensure([self.tx_topic], single_partition=True)
        if self.config.exactly_once:
            self.topics.ensure(
                [offsets_topic(self.prefix)],
                single_partition=True,
                config={"cleanup.policy": "compact"},
            )
        self.topics.ensure([self.hb_topic] + ([self.msg_topic] if self.config.messages else []))
        self.sql.run(lambda _conn: None)

    def _register_fixed_schemas(self) -> None:
        from schemas.registry import key_subject, value_subject

        reg = self.registry
        self.tx_key = AvroEncoder(
            transaction_key_schema(),
            reg.register(key_subject(self.tx_topic), transaction_key_schema()),
        )
        self.tx_value = AvroEncoder(
            transaction_metadata_schema(),
            reg.register(value_subject(self.tx_topic), transaction_metadata_schema()),
        )
        self.hb_value = AvroEncoder(
            heartbeat_schema(), reg.register(value_subject(self.hb_topic), heartbeat_schema())
        )
        if self.config.messages:
            self.msg_key = AvroEncoder(
                message_key_schema(),
                reg.register(key_subject(self.msg_topic), message_key_schema()),
            )
            envelope_schema = message_envelope_schema(self.msg_topic)
            self.msg_value = AvroEncoder(
                envelope_schema, reg.register(value_subject(self.msg_topic), envelope_schema)
            )

    def _writer_for(
        self, envelope_schema: dict[str, Any], schema_id: int, schema: str, table: str
    ) -> TableEnvelopeWriter:
        return TableEnvelopeWriter(
            envelope_schema, schema_id, version=self.version, prefix=self.prefix, db=self.db,
            schema=schema, table=table,
        )  # fmt: skip

    def _source_for(self, schema: str, table: str) -> Row:
        return source_block(
            version=self.version, prefix=self.prefix, db=self.db, schema=schema, table=table,
            ts_ms=0, xid=None, lsn=None, commit_lsn=None,
        )  # fmt: skip

    def _on_registry_retry(
        self, subject: str, attempt: int, delay: float, error: BaseException
    ) -> None:
        self.metrics.registry_retries.inc()
        self.health.degraded = f"schema registry unreachable ({subject}, attempt {attempt})"
        self._keep_alive()

    # --- main loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """Stream until stopped (returns) or a failure (raises, without confirming past it)."""
        assert self.client is not None and self.sink is not None
        self.health.streaming = True
        handlers: dict[type, Callable[[Any, int], None]] = {
            Begin: self._on_begin,
            Commit: self._on_commit,
            Relation: self._on_relation,
            Type: self._on_type,
            Insert: self._on_insert,
            Update: self._on_update,
            Delete: self._on_delete,
            Truncate: self._on_truncate,
            Message: self._on_message,
            Origin: self._ignore,
        }
        decode = self.decoder.decode
        fast_dml = self._fast_dml
        interval = self.config.heartbeat_interval_s
        self._next_heartbeat = time.monotonic() + interval if interval else float("inf")
        for item in self.client.stream(idle_after=self.config.idle_after_s):
            if item is None:
                self._on_idle()
            else:
                payload, wal_start, _wal_end = item
                tag = payload[0]
                # Insert, Update, Delete: the bulk of a stream, straight from bytes to events.
                if tag in _DML_TAGS and fast_dml(payload, tag, wal_start):
                    if self.stop_requested:
                        return
                    continue
                message = decode(payload)
                handler = handlers.get(type(message))
                if handler is None:
                    raise StreamStateError(
                        f"unexpected {type(message).__name__} with streaming and two-phase off",
                        wal_start,
                    )
                handler(message, wal_start)
            if self.stop_requested:
                return

    def _ignore(self, message: Any, lsn: int) -> None:
        pass

    def _on_begin(self, message: Begin, lsn: int) -> None:
        if self._tx is not None or self._skipping:
            raise StreamStateError(f"Begin of xid {message.xid} inside another transaction", lsn)
        if message.final_lsn <= self._last_commit_lsn:
            # Resent after a reconnect, and already produced: its delivery is tracked already.
            self._skipping = True
            return
        tx = Transaction(message.xid, message.final_lsn, message.commit_ts)
        partial = self._partial
        if partial is not None and message.final_lsn >= partial[0]:
            self._partial = None
            if message.final_lsn == partial[0]:
                tx.resume_after = partial[1]
                log.info(
                    "resuming a transaction part-way: its first events are in Kafka already",
                    extra={"xid": tx.xid, "commit_lsn": format_lsn(tx.commit_lsn),
                           "events_in_kafka": partial[1]},
                )  # fmt: skip
        self._tx = tx
        self._ticket = self.tracker.open(tx.commit_lsn, tx.commit_ts_ms)
        assert self.sink is not None
        self._callback = self.sink.callback_for(self._ticket)
        if self.eot is not None:
            self.sink.begin_transaction()  # the hot path produces without the sink's checks

    def _on_commit(self, message: Commit, lsn: int) -> None:
        if self._skipping:
            self._skipping = False
            return
        tx, ticket = self._tx, self._ticket
        if tx is None or ticket is None:
            raise StreamStateError("Commit outside a transaction", lsn)
        if tx.commit_lsn != message.commit_lsn:
            raise StreamStateError(
                f"Commit LSN {format_lsn(message.commit_lsn)} differs from Begin's final LSN "
                f"{format_lsn(tx.commit_lsn)} (xid {tx.xid})",
                lsn,
            )
        tx.splittable = False  # its END goes with the rest of it
        if tx.event_count:
            self._produce_marker(tx.end_marker())
            self.metrics.transactions.inc()
        self.tracker.close(ticket, message.end_lsn)
        self._last_commit_lsn = message.commit_lsn
        if self._snap is not None:
            self._snap.on_commit(message.commit_lsn)
        self._tx = self._ticket = self._callback = None
        assert self.sink is not None
        self.sink.poll(0)
        self._flush_counts()
        eot = self.eot
        if eot is not None:
            eot.source_finished(tx.commit_lsn, tx.event_count, message.end_lsn)
            if eot.due():
                self._commit_kafka()
        self._confirm_acked()
        self.health.progress()
        if self._snap is not None:
            self._snapshot_tick()
        if time.monotonic() >= self._next_heartbeat:
            self._heartbeat()
        if not self._idle_sooner and self.tracker.in_flight:
            self._set_idle_sooner(True)

    def _set_idle_sooner(self, on: bool) -> None:
        assert self.client is not None
        self._idle_sooner = on
        self.client.idle_sooner(_ACK_WAIT_S if on else None)

    def _on_relation(self, message: Relation, lsn: int) -> None:
        self.tables.on_relation(message, lsn)
        if self._snap is not None:
            self._snap.on_relation(message)

    def _on_type(self, message: Type, lsn: int) -> None:
        self.sql.run(lambda conn: on_type_message(self.catalog, conn, message.type_oid))

    def _route(self, relation_id: int, lsn: int) -> TableRoute:
        route = self._routes.get(relation_id)
        if route is None:
            # The first change since the Relation message: the route is built now (topic,
            # schemas), the fast path having declined an unknown relation.
            route = self.tables.route(relation_id)
            if route is None:
                raise StreamStateError(
                    f"change for relation {relation_id} before its Relation message", lsn
                )
            self.health.degraded = None  # the registry answered, after retries if any
        return route

    def _fast_dml(self, payload: bytes | memoryview, tag: int, lsn: int) -> bool:
        """Encode and produce an Insert/Update/Delete without decoding it into messages: the
        table's wire encoder reads the TupleData bytes and gives what ``insert_changes`` /
        ``update_changes`` / ``delete_changes`` give for the decoded message, byte for byte.
        Only the plain shapes: an Insert, an Update without an old tuple (key unchanged), a
        Delete. False (nothing done) for anything else or anything unusual (unknown relation,
        short or malformed payload, a value the fast paths refuse, outside a transaction,
        inside a skipped or streamed transaction): the caller then takes the careful path,
        which raises the precise error or handles the message.

        The producer's hot path, so ``_emit`` (with ``Transaction.next_order``) is inlined
        here rather than called: the same steps in the same order, one Python call less per
        event, and the envelope comes from the writer's one-image method (profiled)."""
        tx = self._tx
        if tx is None or self._skipping or tx.resume_after or self.decoder.stream_xid is not None:
            return False
        buf = payload if type(payload) is bytes else bytes(payload)
        if len(buf) < 6:
            return False
        relation_id, marker = _unpack_rel_marker(buf, 1)
        route = self._routes.get(relation_id)
        if route is None:
            return False
        wire = route.wire
        if wire is None:
            return False
        if tag == _TAG_DELETE:
            if marker != _MARKER_KEY and marker != _MARKER_OLD:
                return False
        elif marker != _MARKER_NEW:
            return False
        encoded = wire(buf, 6)
        if encoded is None:
            return False
        row, unchanged, key, end = encoded
        if end != len(buf):
            return False
        snap = self._snap
        if snap is not None:
            window = snap.window  # a snapshot chunk between its watermarks: note the change
            if window is not None and window.opened and window.table.oid == relation_id:
                window.saw(row if key is None else key, bool(unchanged))
        # From here on as _emit(route, op, key, before, after, unchanged, lsn) with its
        # _produce, inlined (the hottest path: two Python calls less per event).
        count = tx.event_count
        if count == 0:
            self._produce_marker(tx.begin_marker())
        count = tx.event_count = count + 1
        table = route.table
        collections = tx.collections
        position = collections[table] = collections.get(table, 0) + 1
        value = route.writer.encode_image(
            _OP_OF_TAG[tag],
            row,
            tx.encoded,
            lsn,
            time.time_ns() // 1_000_000,
            count,
            position,
            unchanged,
        )
        size = len(value)
        if key is not None:
            key_header = route.key_header
            if key_header is None:
                key = None
            else:
                key = key_header + key
                size += len(key)
        ticket = self._ticket
        assert ticket is not None
        ticket.outstanding += 1  # before produce: a delivery report can't come earlier
        try:
            # Positional (partition -1: the configured partitioner): confluent-kafka parses
            # keyword arguments at about twice the cost of the rest of the call.
            self._kafka_produce(route.topic, value, key, _ANY_PARTITION, self._callback)
        except BufferError:
            assert self.sink is not None and self._callback is not None
            self.sink.wait_for_room(route.topic, key, value, self._callback, self._keep_alive)
        except KafkaException as exc:  # refused at once, e.g. a record over message.max.bytes
            raise DeliveryError(route.topic, table, tx.commit_lsn, str(exc)) from exc
        counts = route.counts
        counts[0] += 1
        counts[1] += size
        self._since_poll += 1
        if self._since_poll >= _POLL_EVERY:
            self._serve_deliveries()
        return True

    def _on_insert(self, message: Insert, lsn: int) -> None:
        if self._skipping:
            return
        route = self._route(message.relation_id, lsn)
        for change in insert_changes(route.shape, message, lsn):
            self._emit_row(route, change, lsn)

    def _on_update(self, message: Update, lsn: int) -> None:
        if self._skipping:
            return
        route = self._route(message.relation_id, lsn)
        for change in update_changes(route.shape, message, lsn):
            self._emit_row(route, change, lsn)

    def _on_delete(self, message: Delete, lsn: int) -> None:
        if self._skipping:
            return
        route = self._route(message.relation_id, lsn)
        for change in delete_changes(route.shape, message, lsn):
            self._emit_row(route, change, lsn)

    def _on_truncate(self, message: Truncate, lsn: int) -> None:
        if self._skipping:
            return
        tx = self._require_tx("Truncate", lsn)
        for relation_id in message.relation_ids:
            route = self._route(relation_id, lsn)
            if self._snap is not None:
                self._snap.on_truncate(route.table)
            self._begin_marker_once(tx)
            order = tx.next_order(route.table)
            if order.total_order <= tx.resume_after:
                continue  # already in Kafka (exactly-once resume point)
            block = tx.block(order)
            source = self._fill_source(route.source, tx, lsn)
            value = route.value_encoder.encode(truncate_envelope(source, block, _now_ms()))
            self._produce(route.topic, route.counts, None, value, route.table)

    def _on_message(self, message: Message, lsn: int) -> None:
        if self._skipping:
            return
        if message.prefix.startswith(INTERNAL_PREFIX):  # watermarks, signals: never published
            if self._snap is not None:
                self._snap.on_message(
                    message.prefix, message.content, message.lsn,
                    in_tx=message.transactional and self._tx is not None,
                )  # fmt: skip
            return
        if not self.config.messages:
            return
        source = source_block(
            version=self.version, prefix=self.prefix, db=self.db, schema="", table="",
            ts_ms=_now_ms(), xid=None, lsn=message.lsn, commit_lsn=None,
        )  # fmt: skip
        key = self.msg_key.encode({"prefix": message.prefix})
        if message.transactional:
            tx = self._require_tx("transactional Message", lsn)
            self._begin_marker_once(tx)
            order = tx.next_order(self.msg_topic)
            if order.total_order <= tx.resume_after:
                return  # already in Kafka (exactly-once resume point)
            block = tx.block(order)
            self._fill_source(source, tx, message.lsn)
            value = self.msg_value.encode(
                message_envelope(message.prefix, message.content, source, block, _now_ms())
            )
            self._produce(self.msg_topic, self._counts_for(self.msg_topic), key, value)
            return
        if self._tx is not None:
            raise StreamStateError("non-transactional Message inside a transaction", lsn)
        # Outside any transaction: tracked on its own, confirms nothing (the idle path does).
        value = self.msg_value.encode(
            message_envelope(message.prefix, message.content, source, None, _now_ms())
        )
        ticket = self.tracker.open(None)
        assert self.sink is not None
        ticket.outstanding += 1
        self.sink.produce(
            self.msg_topic, key, value, self.sink.callback_for(ticket), self._keep_alive
        )
        self.tracker.close(ticket, None)
        self.metrics.events.labels(self.msg_topic).inc()

    # --- producing -----------------------------------------------------------------------------

    def _require_tx(self, what: str, lsn: int) -> Transaction:
        if self._tx is None:
            raise StreamStateError(f"{what} outside a transaction", lsn)
        return self._tx

    def _fill_source(self, source: Row, tx: Transaction, lsn: int) -> Row:
        source["ts_ms"] = tx.commit_ts_ms
        source["txId"] = tx.xid
        source["lsn"] = lsn
        source["commit_lsn"] = tx.commit_lsn
        return source

    def _begin_marker_once(self, tx: Transaction) -> None:
        if tx.event_count == 0 and not tx.resume_after:
            self._produce_marker(tx.begin_marker())

    def _emit_row(self, route: TableRoute, change: RowChange, lsn: int) -> None:
        op, key, before, after, unchanged_toast = change
        self._emit(route, op, key, before, after, unchanged_toast, lsn)

    def _emit(
        self,
        route: TableRoute,
        op: str,
        key: bytes | None,
        before: bytes | None,
        after: bytes | None,
        unchanged_toast: list[str],
        lsn: int,
    ) -> None:
        """Encode and produce one row event (the careful path; ``_fast_dml`` inlines the same
        steps for plain inserts, updates and deletes)."""
        tx = self._tx
        if tx is None:
            raise StreamStateError(f"row change of {route.table} outside a transaction", lsn)
        snap = self._snap
        if snap is not None:
            window = snap.window
            if window is not None and window.opened and window.table.collection == route.table:
                image = after if after is not None else before
                seen = key if key is not None else image
                if seen is not None:
                    window.saw(seen, bool(unchanged_toast))
        self._begin_marker_once(tx)
        total_order, data_collection_order = tx.next_order(route.table)
        if total_order <= tx.resume_after:
            return  # already in Kafka (exactly-once resume point)
        value = route.writer.encode(
            op,
            before,
            after,
            tx.encoded,
            lsn,
            time.time_ns() // 1_000_000,
            total_order,
            data_collection_order,
            unchanged_toast,
        )
        header = route.key_header
        framed = header + key if key is not None and header is not None else None
        self._produce(route.topic, route.counts, framed, value, route.table)

    def _produce_marker(self, marker: dict[str, Any]) -> None:
        tx = self._tx
        assert tx is not None
        self._produce(
            self.tx_topic,
            self._counts_for(self.tx_topic),
            self.tx_key.encode(tx.marker_key()),
            self.tx_value.encode(marker),
        )

    def _counts_for(self, name: str) -> list[int]:
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = [0, 0]
        return counts

    def _flush_counts(self) -> None:
        """Per-table counts go to Prometheus per commit, not per event (labels() + a locked
        inc() per event cost more than the Kafka produce call)."""
        for route in self.tables.routes.values():
            self._flush_count(route.table, route.counts)
        for name, counts in self._counts.items():
            self._flush_count(name, counts)

    def _flush_count(self, name: str, counts: list[int]) -> None:
        if counts[0]:
            self.metrics.events.labels(name).inc(counts[0])
            self.metrics.event_bytes.labels(name).inc(counts[1])
            if self.eot is not None:
                self.eot.count(counts[0], counts[1])
            counts[0] = counts[1] = 0

    def _produce(
        self,
        topic: str,
        counts: list[int],
        key: bytes | None,
        value: bytes,
        table: str | None = None,
    ) -> None:
        """Produce one framed record, counting it and the delivery it owes; ``table`` names
        the source table in a refusal (default: the topic)."""
        ticket = self._ticket
        assert ticket is not None
        ticket.outstanding += 1  # before produce: a delivery report can't come earlier
        try:
            self._kafka_produce(topic, value, key, _ANY_PARTITION, self._callback)
        except BufferError:
            assert self.sink is not None and self._callback is not None
            self.sink.wait_for_room(topic, key, value, self._callback, self._keep_alive)
        except KafkaException as exc:  # refused at once, e.g. a record over message.max.bytes
            commit_lsn = self._tx.commit_lsn if self._tx is not None else None
            raise DeliveryError(topic, table or topic, commit_lsn, str(exc)) from exc
        counts[0] += 1
        counts[1] += len(value) + (len(key) if key else 0)
        self._since_poll += 1
        if self._since_poll >= _POLL_EVERY:
            self._serve_deliveries()

    def _serve_deliveries(self) -> None:
        """Every _POLL_EVERY events: delivery reports, confirmation, metrics, keep-alive."""
        self._since_poll = 0
        assert self.sink is not None
        self.sink.poll(0)
        self._confirm_acked()
        self._flush_counts()
        eot, tx = self.eot, self._tx
        if eot is not None and tx is not None and tx.splittable and tx.event_count and eot.due():
            # A big source transaction: commit what it has produced so far, go on in a new one.
            self._commit_kafka(partial=tx)
        self._keep_alive()

    def _heartbeat(self) -> None:
        assert self.sink is not None and self.client is not None
        self._next_heartbeat = time.monotonic() + self.config.heartbeat_interval_s
        ticket = Ticket(None)  # not in the FIFO: a heartbeat confirms nothing
        ticket.outstanding = 1
        value = self.hb_value.encode({"ts_ms": _now_ms(), "lsn": self.client.confirmed_lsn})
        self.sink.produce(
            self.hb_topic, None, value, self.sink.callback_for(ticket), self._keep_alive
        )

    # --- confirming ----------------------------------------------------------------------------

    def _confirm_acked(self) -> None:
        acked = self.tracker.confirmable()
        if acked is not None and acked > self._acked_lsn:
            self._acked_lsn = acked
        lsn = self._acked_lsn
        if self.eot is not None:
            cap = self.eot.confirm_cap()
            if cap is not None and cap < lsn:
                lsn = cap  # acknowledged, but in a Kafka transaction not committed yet
        assert self.client is not None
        if lsn <= self.client.confirmed_lsn:
            return
        self.client.confirm(lsn)
        self.metrics.confirmed_lsn.set(lsn)
        if self._snap is not None:
            self._snap.on_confirmed(lsn)
        last = self.tracker.last_confirmed
        if self._lag is not None and last is not None:
            self._lag.anchor_ms = last.commit_ts_ms
        self._report_confirmed(force=False)

    def _report_confirmed(self, *, force: bool) -> None:
        """Tell the server soon, not at the next periodic status update (status_interval_s):
        the slot then releases WAL promptly and slot lag shows the truth. At most every
        _STATUS_MIN_GAP_S while busy, so small transactions don't cost a packet each."""
        assert self.client is not None
        confirmed = self.client.confirmed_lsn
        if confirmed == self._reported_lsn:
            return
        now = time.monotonic()
        if force or now - self._reported_at >= _STATUS_MIN_GAP_S:
            self.client.send_status()
            self._reported_lsn = confirmed
            self._reported_at = now

    def _on_idle(self) -> None:
        assert self.sink is not None and self.client is not None
        self.sink.poll(0)
        if self.eot is not None and self._tx is None:
            self._flush_counts()
            self._commit_kafka()  # quiet: make what is open visible now
        self._confirm_acked()
        if self._idle_sooner and not self.tracker.in_flight:
            self._set_idle_sooner(False)  # all acknowledged: back to idle_after_s ticks
        if self.tracker.in_flight == 0 and self._tx is None and not self._skipping:
            # Nothing of ours in flight: let the slot move past WAL of unpublished tables.
            wal_end = self.client.server_wal_end
            if wal_end > self.client.confirmed_lsn:
                self.client.confirm(wal_end)
                self.metrics.confirmed_lsn.set(wal_end)
            if self._snap is not None:
                self._snap.on_confirmed(self.client.confirmed_lsn)
            if self._lag is not None:
                self._lag.anchor_ms = None
        self._report_confirmed(force=True)
        self.metrics.in_flight_events.set(len(self.sink))
        if self.sink.broker_down:
            self.health.degraded = _KAFKA_DOWN
        elif self.health.degraded == _KAFKA_DOWN:
            self.health.degraded = None
        self.health.progress()
        if self._snap is not None:
            self._snapshot_tick()
        if time.monotonic() >= self._next_heartbeat:
            self._heartbeat()

    def _snapshot_tick(self) -> None:
        """Snapshot housekeeping between transactions; with --snapshot initial-only, stop once
        every snapshot is done and acknowledged."""
        snap = self._snap
        assert snap is not None
        if self._tx is None:
            snap.tick()
        self.health.activity = snap.describe()
        if (
            self.config.snapshot == "initial-only"
            and not snap.active
            and not snap.unconfirmed
            and self._tx is None
            and not self.tracker.in_flight
        ):
            log.info("initial snapshot done and acknowledged; stopping (--snapshot initial-only)")
            self.stop_requested = True

    def _keep_alive(self) -> None:
        """While blocked on Kafka or the registry: keep the walsender from timing us out,
        confirm what got acknowledged, and honour a stop request."""
        if self.client is None:
            return
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + min(5.0, self.config.status_interval_s / 2)
            if self.sink is not None:
                self.sink.poll(0)
            self._confirm_acked()
            self.client.send_status()
            self.health.progress()
        if self.stop_requested:
            # Blocked (full queue, registry outage) or deep in a big transaction: stop now;
            # the partial transaction is not confirmed and is resent after a restart.
            raise ShutdownRequested()

    def _commit_kafka(self, partial: Transaction | None = None, reopen: bool | None = None) -> None:
        """Commit the open Kafka transaction (see KafkaTransactions.commit), with ``partial``
        the source transaction still being produced; while brokers can't be reached the
        commit is retried and /readyz says so."""
        assert self.eot is not None
        position = None if partial is None else (partial.commit_lsn, partial.counted)
        self.eot.commit(self._kafka_wait, position, reopen=reopen)
        if self.health.degraded == _KAFKA_DOWN:
            self.health.degraded = None

    def _kafka_wait(self) -> None:
        self.health.degraded = _KAFKA_DOWN
        self._keep_alive()

    def _setup_wait(self) -> None:
        """While set-up waits on Kafka: nothing streams yet, so only honour a stop request."""
        if self.stop_requested:
            raise ShutdownRequested()

    def _on_reconnect(self, lsn: int) -> None:
        """The stream reconnected and resends from ``lsn``: drop the partial transaction."""
        self.metrics.replication_reconnects.inc()
        self.decoder.reset()
        self._skipping = False
        tx = self._tx
        if self.eot is not None and tx is not None:
            # Its first events are in the open Kafka transaction: commit them and skip them
            # when it is resent (or stop: snapshot rows are not resent with it).
            if not tx.splittable:
                raise StreamStateError(
                    f"replication reconnected inside transaction {tx.id} (a snapshot chunk's); "
                    "restart to resume from the last committed Kafka transaction",
                    lsn,
                )
            if tx.counted:
                self._flush_counts()
                self._commit_kafka(partial=tx)
                self._partial = (tx.commit_lsn, tx.counted)
        if self._ticket is not None:
            self.tracker.close(self._ticket, None)  # drains without confirming; resent anew
        self._tx = self._ticket = self._callback = None
        log.warning("replication reconnected; resuming", extra={"lsn": format_lsn(lsn)})

    # --- shutdown ------------------------------------------------------------------------------

    def request_stop(self, signum: int, _frame: FrameType | None) -> None:
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        self.stop_requested = True

    def drain(self) -> None:
        """Clean stop: flush Kafka for at most the grace period, confirm what was acked."""
        if self.sink is None or self.client is None:
            return
        tx, eot = self._tx, self.eot
        if eot is not None:
            # Commit what is whole (and a big transaction's stretch); snapshot rows of an
            # unfinished chunk's transaction can't be resumed: discard the Kafka transaction.
            self._flush_counts()
            if tx is not None and not tx.splittable:
                eot.abort()
            elif tx is not None and tx.counted:
                self._commit_kafka(partial=tx, reopen=False)
            else:
                self._commit_kafka()
        if self._ticket is not None:
            self.tracker.close(self._ticket, None)
            self._tx = self._ticket = self._callback = None
        remaining = self.sink.flush(self.config.shutdown_grace_s)
        self.sink.poll(0)
        self._confirm_acked()
        if remaining:
            log.warning(
                "grace period over with events unacknowledged; they are resent on restart",
                extra={"unacknowledged": remaining},
            )
        log.info("stopped", extra={"confirmed_lsn": format_lsn(self.client.confirmed_lsn)})

    def close(self) -> None:
        try:
            if self._snap is not None:
                self._snap.stop()
            if self.client is not None:
                self.client.close()
        finally:
            if self._lag is not None:
                self._lag.stop()
            if self._http is not None:
                self._http.stop()
            if hasattr(self, "sql"):
                self.sql.close()


def install_signal_handlers(pipeline: Pipeline) -> Callable[[], None]:
    previous = {s: signal.signal(s, pipeline.request_stop) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
