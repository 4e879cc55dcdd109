"""Start-up: every connection and long-lived object the producer streams with, built once, in
order, and handed to ``Pipeline`` fully wired (``build_pipeline``).

Independent steps overlap (start-up is part of every restart's catch-up): the registry client's
import (about a third of the producer's imports) runs in a thread while PostgreSQL is set up,
and the fixed topics are created in a thread while the fixed schemas are registered. Registry
calls stay on this thread; every thread's failure is raised here, before anything is
streamed. If any step fails, what was opened so far is closed again.

Until the pipeline streams, a wait (for the registry, Kafka, or a slot a fenced producer still
holds) only honours a stop request; from then on it also keeps the walsender alive
(``_KeepAlive``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from psycopg import sql

from producer.config import ProducerConfig, default_snapshot_workers
from producer.confirmation import Confirmation
from producer.delivery import DeliveryTracker
from producer.emitter import EventEmitter, FixedEncoders, SourceNames
from producer.envelope_writer import TableEnvelopeWriter
from producer.errors import ConfigError, DeliveryError
from producer.events import Row, source_block
from producer.fast_dml import fast_dml
from producer.health import POSTGRES, HealthServer, HealthState
from producer.kafka_sink import KafkaSink, producer_settings
from producer.kafka_transactions import CommitPolicy, KafkaTransactions
from producer.lag import LagMonitor
from producer.metrics import Metrics
from producer.pgoutput import Decoder
from producer.pipeline import Pipeline
from producer.replication import (
    ErrorKind,
    ReplicationClient,
    ReplicationConfig,
    ReplicationError,
    SlotInfo,
)
from producer.slot_guard import SlotGuard
from producer.snapshot import catalog as snapshot_catalog
from producer.snapshot.as_of import MIN_SERVER_VERSION, AsOf
from producer.snapshot.coordinator import SnapshotCoordinator
from producer.snapshot.pacing import SendDelay
from producer.sql_session import SqlSession
from producer.stopping import StopFlag
from producer.tables import TableRoutes, table_topics
from producer.topic_admin import TopicManager, TopicPolicy
from schemas import snapshot_state
from schemas.envelope import (
    heartbeat_schema,
    message_envelope_schema,
    message_key_schema,
    transaction_key_schema,
    transaction_metadata_schema,
)
from schemas.native_encoder import encoder_in_use
from schemas.safe_names import name_part
from schemas.topics import (
    TableTopics,
    heartbeat_topic,
    message_topic,
    offsets_topic,
    snapshot_topic,
    transaction_topic,
)
from schemas.type_catalog import TypeCatalog
from schemas.wire import AvroEncoder

if TYPE_CHECKING:
    import psycopg

    from schemas.registry import SchemaRegistry

log = logging.getLogger(__name__)

# With exactly-once, how long start-up waits for a producer it fenced to release the slot
# (above heartbeat_interval_s's default: an idle fenced producer notices at its next commit).
FENCED_SLOT_WAIT_S = 60.0


def version() -> str:
    try:
        return metadata.version("walbridge")
    except metadata.PackageNotFoundError:
        return "0.0.0"


class _KeepAlive:
    """The wait callback handed to the registry, the Kafka sink and the emitter: before
    streaming it only honours a stop request; ``streaming`` switches it to the pipeline's
    keep-alive (status updates, confirmation), which needs the stream to exist."""

    def __init__(self, stop: StopFlag) -> None:
        self.target: Callable[[], None] = stop.check

    def __call__(self) -> None:
        self.target()


def build_pipeline(
    config: ProducerConfig, stop: StopFlag, health: HealthState, metrics: Metrics
) -> Pipeline:
    """Connect, create what is missing (publication, topics, schemas, slot) and return the
    pipeline ready to ``run``."""
    with ExitStack() as opened:
        pipeline = _build(config, stop, health, metrics, opened)
        opened.pop_all()  # the pipeline owns them now (Pipeline.close)
        return pipeline


@dataclass(frozen=True)
class _Connections:
    """What start-up opens before anything is read: PostgreSQL, Kafka, the registry."""

    client: ReplicationClient
    names: SourceNames
    topic_names: TableTopics
    sink: KafkaSink
    topics: TopicManager
    sql: SqlSession
    registry: SchemaRegistry
    fixed: FixedEncoders
    eot: KafkaTransactions | None
    resume_lsn: int  # what Kafka already holds (exactly-once): skipped when resent
    partial: tuple[int, int] | None
    http: HealthServer | None


def _connect(
    cfg: ProducerConfig,
    stop: StopFlag,
    health: HealthState,
    metrics: Metrics,
    tracker: DeliveryTracker,
    wait: Callable[[], None],
    on_reconnect: Callable[[int], None],
    opened: ExitStack,
) -> _Connections:
    with ThreadPoolExecutor(2, thread_name_prefix="walbridge-setup") as pool:
        registry_future = pool.submit(open_registry, cfg, metrics, health, wait)
        http = None
        if cfg.metrics_port:
            http = HealthServer(cfg.metrics_host, cfg.metrics_port, health, metrics.registry)
            http.start()
            opened.callback(http.stop)
        client = ReplicationClient(
            cfg.pg_dsn,
            _replication_config(cfg),
            on_reconnect=on_reconnect,
            on_connection_lost=lambda exc: health.unreachable(POSTGRES, str(exc)),
        )
        opened.callback(client.close)
        identity = client.open()
        prefix = cfg.topic_prefix or name_part(identity.dbname)
        topic_names = table_topics(prefix, client.ensure_publication().tables)
        # The Kafka producer first: it connects and gets its producer id in librdkafka's
        # threads while the rest is set up.
        transactional_id = (
            (cfg.transactional_id or f"walbridge.{prefix}.{cfg.slot}") if cfg.exactly_once else None
        )
        sink = KafkaSink(
            producer_settings(cfg, transactional_id),
            tracker,
            prefix,
            on_delivery_error=lambda topic: metrics.delivery_errors.labels(topic).inc(),
        )
        topics = TopicManager.connect(
            cfg.kafka_client(),
            TopicPolicy(
                cfg.create_topics,
                cfg.topic_partitions,
                cfg.topic_replication_factor,
                cfg.topic_retention_ms,
            ),
        )
        sql = SqlSession(cfg.pg_dsn, "walbridge_catalog")
        opened.callback(sql.close)
        fixed_topics = pool.submit(_ensure_fixed_topics, cfg, topics, sql, prefix)
        eot, resume_lsn, partial = None, 0, None
        if transactional_id is not None:
            fixed_topics.result()  # the offsets topic exists before it is read
            eot, resume_lsn, partial = _start_exactly_once(
                cfg, sink, prefix, transactional_id, metrics, stop
            )
        registry = registry_future.result()
        fixed = _register_fixed_schemas(registry, prefix, cfg.messages)
        fixed_topics.result()
    return _Connections(
        client=client, names=SourceNames(version(), prefix, identity.dbname),
        topic_names=topic_names, sink=sink, topics=topics, sql=sql, registry=registry,
        fixed=fixed, eot=eot, resume_lsn=resume_lsn, partial=partial, http=http,
    )  # fmt: skip


def _build(
    cfg: ProducerConfig, stop: StopFlag, health: HealthState, metrics: Metrics, opened: ExitStack
) -> Pipeline:
    keep_alive = _KeepAlive(stop)
    decoder = Decoder()
    tracker = DeliveryTracker()
    reconnect = _Reconnect()
    c = _connect(cfg, stop, health, metrics, tracker, keep_alive, reconnect, opened)
    client, names, sink, sql, eot, fixed = c.client, c.names, c.sink, c.sql, c.eot, c.fixed
    catalog = TypeCatalog()
    tables = TableRoutes(
        table_topics=c.topic_names,
        catalog=catalog,
        sql=sql,
        registry=c.registry,
        topics=c.topics,
        source_for=lambda schema, table: _source_for(names, schema, table),
        writer_for=lambda envelope, schema_id, schema, table: _writer_for(
            names, envelope, schema_id, schema, table
        ),
        timestamptz=cfg.timestamptz_format,
    )
    # The slot's past before its present: snapshot progress and the slot record tell a lost
    # slot from one never made (producer.slot_guard); with resnapshot, the loss is logged, the
    # lost slot dropped, and everything below starts over as for a new slot.
    snap_topic = fixed.snapshot_topic
    c.topics.ensure([snap_topic], single_partition=True, config={"cleanup.policy": "compact"})
    states = snapshot_state.load(cfg.kafka_client(), snap_topic)
    guard = SlotGuard(
        slot=cfg.slot, resnapshot=cfg.on_slot_loss == "resnapshot",
        kafka_conf=cfg.kafka_client(), offsets_topic=offsets_topic(names.prefix), sink=sink,
        eot=eot, metrics=metrics, on_wait=stop.check,
    )  # fmt: skip
    loss = guard.check_start(client, guard.evidence(states))
    resume_lsn, partial = c.resume_lsn, c.partial
    if loss is not None:
        resume_lsn, partial = 0, None
        if eot is not None:
            guard.forget_resume_point()
            eot.committed = None
    lag = LagMonitor(cfg.pg_dsn, cfg.slot, cfg.lag_interval_s, metrics, cfg.publication)
    control = Confirmation(
        client=client, sink=sink, tracker=tracker, eot=eot, lag=lag, metrics=metrics,
        health=health, stop=stop, status_interval_s=cfg.status_interval_s,
        heartbeat_interval_s=cfg.heartbeat_interval_s, heartbeat_topic=fixed.hb_topic,
        heartbeat_encoder=fixed.hb_value,
    )  # fmt: skip
    emitter = EventEmitter(
        names=names, fixed=fixed, sink=sink, tracker=tracker, tables=tables, eot=eot,
        metrics=metrics, health=health, control=control, keep_alive=keep_alive,
        publish_messages=cfg.messages,
        resume_lsn=resume_lsn, partial=partial,
    )  # fmt: skip
    # Snapshot state before the slot: a new slot's tables are recorded as to be read (and
    # acknowledged by Kafka) before the slot exists, so a crash in between can't leave a slot
    # whose existing rows nobody reads.
    delay = SendDelay()
    snapshots, initial_needed = _start_snapshots(
        cfg, states, sql, sink, eot, emitter, metrics, stop,
        lambda: delay.delay_s(client.last_send_time) if client.last_send_time else None,
        replace_all=loss is not None,
    )  # fmt: skip
    opened.callback(snapshots.stop)
    emitter.watch(snapshots)
    health.activity = snapshots.describe()
    # An initial snapshot (not one replacing a lost slot's rows), on a server that can tell
    # out-of-line values apart (producer.snapshot.as_of).
    bounded = initial_needed and loss is None and client.server_version >= MIN_SERVER_VERSION
    slot = ensure_slot(
        client, cfg.slot, waiting=eot is not None, stop=stop, export_snapshot=bounded
    )
    exported = slot.snapshot_name
    if exported is not None:
        # Valid until the next command on the replication connection: read it first.
        as_of = sql.run(lambda conn: consistent_point_snapshot(conn, exported))
        snapshots.bound_initial(as_of)
        acknowledge_states(sink, eot, stop, emitter.fixed.snapshot_topic)
        log.info(
            "initial snapshot bounded by the slot's consistent point",
            extra={"slot": slot.slot_name, "snapshot": as_of.text()},
        )
    if slot.created != initial_needed and (cfg.snapshot != "never" or loss is not None):
        log.warning(
            "the slot appeared or vanished during start-up; check for another producer",
            extra={"slot": slot.slot_name},
        )
    guard.remember(client, slot)
    log.info(
        "slot ready",
        extra={
            "slot": slot.slot_name, "slot_created": slot.created, "prefix": names.prefix,
            "failover": slot.failover, "server_version": client.server_version,
            "row_encoder": encoder_in_use(),
        },
    )  # fmt: skip
    lag.start()
    opened.callback(lag.stop)
    pipeline = Pipeline(
        config=cfg, stop=stop, health=health, metrics=metrics, decoder=decoder, tracker=tracker,
        client=client, sink=sink, sql=sql, catalog=catalog, tables=tables, eot=eot,
        emitter=emitter, fast_dml=fast_dml(emitter, decoder), control=control,
        snapshots=snapshots, lag=lag, http=c.http, guard=guard,
    )  # fmt: skip
    reconnect.target = pipeline.on_reconnect
    keep_alive.target = control.keep_alive
    return pipeline


class _Reconnect:
    """The client's reconnect callback: a reconnect can only happen once the pipeline streams."""

    def __init__(self) -> None:
        self.target: Callable[[int], None] | None = None

    def __call__(self, lsn: int) -> None:
        if self.target is None:
            raise RuntimeError("replication reconnected before the pipeline was built")
        self.target(lsn)


def _replication_config(cfg: ProducerConfig) -> ReplicationConfig:
    return ReplicationConfig.from_mapping(
        {
            "origin": cfg.origin,
            "failover_slot": cfg.failover_slot,
            # A failover leaves no primary for seconds to tens of seconds: keep trying, with
            # short delays (the gap until the new primary streams) for as long as allowed.
            "reconnect": {
                "initial_delay": 0.5,
                "max_delay": 5.0,
                "max_attempts": None,
                "max_elapsed": cfg.reconnect_timeout_s or None,
            },
            "slot": cfg.slot,
            "publication": cfg.publication,
            "tables": cfg.tables,
            "publish_via_partition_root": cfg.publish_via_partition_root,
            "publish_generated_columns": cfg.publish_generated_columns,
            "proto_version": 1,
            # Always on: snapshot watermarks and signals are logical messages; --no-messages
            # only stops publishing the application's own.
            "messages": True,
            "status_interval": cfg.status_interval_s,
            "receive_timeout": cfg.replication_receive_timeout_s,
            "application_name": "walbridge_producer",
        }
    )


def ensure_slot(
    client: ReplicationClient,
    slot: str,
    *,
    waiting: bool,
    stop: StopFlag,
    export_snapshot: bool = False,
) -> SlotInfo:
    """The slot; with exactly-once (``waiting``), wait a while for a fenced producer to let it
    go: it stops at its next Kafka commit (at the latest its next heartbeat's), as during a
    rolling update where the new pod starts before the old one has stopped. With
    ``export_snapshot``, a slot created now comes with its exported snapshot's name."""
    deadline = time.monotonic() + (FENCED_SLOT_WAIT_S if waiting else 0)
    delay = 0.5
    while True:
        try:
            return client.ensure_slot(export_snapshot=export_snapshot)
        except ReplicationError as exc:
            if exc.kind is not ErrorKind.SLOT_ACTIVE or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "slot in use; waiting for the fenced producer holding it to stop",
                extra={"slot": slot, "error": str(exc)},
            )
            stop.check()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _start_exactly_once(
    cfg: ProducerConfig,
    sink: KafkaSink,
    prefix: str,
    transactional_id: str,
    metrics: Metrics,
    stop: StopFlag,
) -> tuple[KafkaTransactions, int, tuple[int, int] | None]:
    """Fence a previous producer of this transactional id; what Kafka committed is skipped:
    returns the transactions, the last whole source transaction's commit LSN in Kafka and the
    one Kafka holds part of (commit LSN, events), if any."""
    eot = KafkaTransactions(
        sink,
        CommitPolicy(
            cfg.kafka_transaction_max_ms,
            cfg.kafka_transaction_max_events,
            cfg.kafka_transaction_max_bytes,
        ),
        offsets_topic=offsets_topic(prefix),
        slot=cfg.slot,
        metrics=metrics,
        exit_after_commits=cfg.fault_exit_after_kafka_commits,
    )
    point = eot.start(cfg.kafka_client(), stop.check)
    resume_lsn, partial = 0, None
    if point is not None:
        if point.complete:
            resume_lsn = point.commit_lsn
        else:
            resume_lsn = point.commit_lsn - 1
            partial = (point.commit_lsn, point.total_order)
    log.info(
        "exactly-once on", extra={"transactional_id": transactional_id, "resume_lsn": resume_lsn}
    )
    return eot, resume_lsn, partial


def _start_snapshots(
    cfg: ProducerConfig,
    states: dict[str, snapshot_state.TableState],
    sql: SqlSession,
    sink: KafkaSink,
    eot: KafkaTransactions | None,
    emitter: EventEmitter,
    metrics: Metrics,
    stop: StopFlag,
    stream_delay: Callable[[], float | None],
    *,
    replace_all: bool,
) -> tuple[SnapshotCoordinator, bool]:
    """The snapshot coordinator, with the resume records read from Kafka; True when the slot
    is to be created with a snapshot of every published table (queued, and acknowledged by
    Kafka, before the slot exists). ``replace_all``: the slot replaces a lost one,
    and every published table is read again whatever --snapshot says (it was asked for with
    --on-slot-loss resnapshot)."""
    snap_topic = emitter.fixed.snapshot_topic

    def look(conn: Any) -> tuple[bool, bool, list[str]]:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s),"
            " pg_is_in_recovery()",
            (cfg.slot,),
        ).fetchone()
        published = sorted(snapshot_catalog.published(conn, cfg.publication))
        return bool(row[0]), bool(row[1]), published

    slot_exists, on_standby, published = sql.run(look)
    if on_standby and (cfg.snapshot != "never" or replace_all):
        # A snapshot's watermarks are logical messages the reader session writes, and a
        # standby is read-only; its reads would also not be fenced by them in the stream.
        raise ConfigError(
            "the producer reads from a standby (pg_is_in_recovery), where snapshots cannot run: "
            "their watermarks are logical messages, which only a primary can write. Run it with "
            "--snapshot never (streaming works on a standby, PostgreSQL 16+), or point it at "
            "the primary"
            + (" (--on-slot-loss resnapshot needs the primary too)" if replace_all else "")
        )
    new_slot = not slot_exists and (cfg.snapshot != "never" or replace_all)
    initial = published if new_slot else []
    snapshots = SnapshotCoordinator(
        dsn=cfg.pg_dsn,
        publication=cfg.publication,
        sql=sql,
        sink=emitter,
        chunk_rows=cfg.snapshot_chunk_rows,
        chunk_bytes=cfg.snapshot_chunk_bytes,
        chunk_budget_s=cfg.snapshot_chunk_budget_ms / 1000,
        auto_new_tables=cfg.snapshot != "never",
        metrics=metrics,
        stream_delay=stream_delay,
        on_standby=on_standby,
        workers=cfg.snapshot_workers or default_snapshot_workers(),
        timestamptz=cfg.timestamptz_format,
    )
    snapshots.start(states, published, initial, replace_all=replace_all)
    if initial:
        acknowledge_states(sink, eot, stop, snap_topic)
        if replace_all:
            log.warning(
                "snapshot of every published table queued to replace what readers hold (the "
                "slot was lost); each table's snapshot starts with a truncate",
                extra={"tables": len(initial), "slot": cfg.slot},
            )
        else:
            log.info("initial snapshot queued", extra={"tables": len(initial)})
    return snapshots, new_slot


def acknowledge_states(
    sink: KafkaSink, eot: KafkaTransactions | None, stop: StopFlag, topic: str
) -> None:
    """Snapshot records written at start-up are in Kafka (committed, with exactly-once)
    before streaming starts: a crash after it can't leave a table nobody reads."""
    if eot is not None:
        eot.commit(stop.check)
    if sink.flush(60.0):
        raise DeliveryError(topic, "snapshot state", None, "not acknowledged")


def consistent_point_snapshot(conn: psycopg.Connection[Any], name: str) -> AsOf:
    """The exported snapshot of a slot just created, as ``pg_current_snapshot()`` shows it
    from inside (``SET TRANSACTION SNAPSHOT`` needs a repeatable-read transaction)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
        row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    finally:
        conn.execute("ROLLBACK")
    assert row is not None
    return AsOf.parse(row[0])


def open_registry(
    cfg: ProducerConfig, metrics: Metrics, health: HealthState, wait: Callable[[], None]
) -> SchemaRegistry:
    """Imported here, not at module level: confluent-kafka's registry client pulls in httpx
    and authlib (0.15-0.3 s), which start-up overlaps with PostgreSQL's set-up."""
    from schemas.registry import RegistryConfig, SchemaRegistry

    def on_retry(subject: str, attempt: int, _delay: float, _error: BaseException) -> None:
        metrics.registry_retries.inc()
        health.degraded = f"schema registry unreachable ({subject}, attempt {attempt})"
        wait()

    return SchemaRegistry(
        # Subject levels belong to the operator (and the registry's global default): setting
        # them here on every start would undo the override that resolves a refused change.
        RegistryConfig(
            url=cfg.schema_registry_url,
            client_config=cfg.registry_client_config(),
            max_attempts=cfg.registry_max_attempts,
            manage_compatibility=False,
        ),
        on_call=lambda op, _subject: metrics.registry_calls.labels(op).inc(),
        on_retry=on_retry,
    )


def _ensure_fixed_topics(
    cfg: ProducerConfig, topics: TopicManager, sql: SqlSession, prefix: str
) -> None:
    """The transaction, heartbeat and message topics; also opens the catalog session, so the
    first Relation's type look-up finds it connected."""
    topics.ensure([transaction_topic(prefix)], single_partition=True)
    # Always: besides exactly-once's resume point it holds the slot record (slot_record.py).
    topics.ensure(
        [offsets_topic(prefix)], single_partition=True, config={"cleanup.policy": "compact"}
    )
    topics.ensure([heartbeat_topic(prefix)] + ([message_topic(prefix)] if cfg.messages else []))
    sql.run(lambda _conn: None)


def _register_fixed_schemas(registry: SchemaRegistry, prefix: str, messages: bool) -> FixedEncoders:
    from schemas.registry import key_subject, value_subject

    def encoder(subject: str, schema: dict[str, Any]) -> AvroEncoder:
        return AvroEncoder(schema, registry.register(subject, schema))

    tx_topic, hb_topic, msg_topic = (
        transaction_topic(prefix),
        heartbeat_topic(prefix),
        message_topic(prefix),
    )
    msg_key = msg_value = None
    if messages:
        msg_key = encoder(key_subject(msg_topic), message_key_schema())
        msg_value = encoder(value_subject(msg_topic), message_envelope_schema(msg_topic))
    return FixedEncoders(
        tx_topic=tx_topic,
        tx_key=encoder(key_subject(tx_topic), transaction_key_schema()),
        tx_value=encoder(value_subject(tx_topic), transaction_metadata_schema()),
        hb_topic=hb_topic,
        hb_value=encoder(value_subject(hb_topic), heartbeat_schema()),
        msg_topic=msg_topic,
        msg_key=msg_key,
        msg_value=msg_value,
        snapshot_topic=snapshot_topic(prefix),
    )


def _writer_for(
    names: SourceNames, envelope: dict[str, Any], schema_id: int, schema: str, table: str
) -> TableEnvelopeWriter:
    return TableEnvelopeWriter(
        envelope, schema_id, version=names.version, prefix=names.prefix, db=names.db,
        schema=schema, table=table,
    )  # fmt: skip


def _source_for(names: SourceNames, schema: str, table: str) -> Row:
    return source_block(
        version=names.version, prefix=names.prefix, db=names.db, schema=schema, table=table,
        ts_ms=0, xid=None, lsn=None, commit_lsn=None,
    )  # fmt: skip
