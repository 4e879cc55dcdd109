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

The parts, each built once by ``producer.wiring``: ``EventEmitter`` produces one source
transaction's events (``producer.fast_dml`` is its hot path), ``Confirmation`` tells
PostgreSQL and Kafka how far we got, the snapshot coordinator reads existing rows between
watermarks. This module routes each stream item to them and decides when to commit, confirm
and stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from producer.config import ProducerConfig
from producer.confirmation import Confirmation
from producer.delivery import DeliveryTracker
from producer.emitter import EventEmitter
from producer.errors import PublicationMissingError, StreamStateError
from producer.fast_dml import DML_TAGS, FastDml
from producer.health import POSTGRES, HealthServer, HealthState
from producer.kafka_sink import KafkaSink
from producer.kafka_transactions import KafkaTransactions
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
from producer.replication import ReplicationClient, ReplicationError
from producer.slot_guard import SlotGuard, lost_error
from producer.snapshot.coordinator import SnapshotCoordinator
from producer.sql_session import SqlSession
from producer.stopping import StopFlag
from producer.tables import TableRoutes
from schemas.catalog import on_type_message
from schemas.type_catalog import TypeCatalog

log = logging.getLogger(__name__)

# Between two commits' housekeeping (delivery reports, confirming, health, the slot's state,
# snapshot ticks, heartbeats, metric counts) at least this long: a stream of one-change
# transactions commits every few microseconds, and doing all of it per commit cost more than
# the transaction's three records (profiled). A quiet stream does it on its idle ticks.
HOUSEKEEPING_EVERY_S: Final = 0.002


class Pipeline:
    """A fully wired producer (``producer.wiring.build_pipeline`` makes one): ``run`` streams
    until stopped, ``drain`` stops cleanly, ``close`` lets everything go."""

    def __init__(
        self,
        *,
        config: ProducerConfig,
        stop: StopFlag,
        health: HealthState,
        metrics: Metrics,
        decoder: Decoder,
        tracker: DeliveryTracker,
        client: ReplicationClient,
        sink: KafkaSink,
        sql: SqlSession,
        catalog: TypeCatalog,
        tables: TableRoutes,
        eot: KafkaTransactions | None,
        emitter: EventEmitter,
        fast_dml: FastDml,
        control: Confirmation,
        snapshots: SnapshotCoordinator,
        lag: LagMonitor,
        http: HealthServer | None,
        guard: SlotGuard,
    ) -> None:
        self.config = config
        self.stop = stop
        self.health = health
        self.metrics = metrics
        self.decoder = decoder
        self.tracker = tracker
        self.client = client
        self.sink = sink
        self.sql = sql
        self.catalog = catalog
        self.tables = tables
        self.eot = eot
        self.emitter = emitter
        self.fast_dml = fast_dml
        self.control = control
        self.snapshots = snapshots
        self.lag = lag
        self.http = http
        self.guard = guard
        self._next_housekeeping = 0.0

    # --- main loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """Stream until stopped (returns) or a failure (raises, without confirming past it).
        A slot that is gone or invalidated (START_REPLICATION refused it on a reconnect, or
        the slot monitor saw it) raises ``SlotLostError``."""
        try:
            self._stream()
        except ReplicationError as exc:
            lost = self.guard.from_stream_error(self.client, exc, self._confirmed())
            if lost is None:
                raise
            raise lost from exc

    def _confirmed(self) -> int:
        try:
            return self.client.confirmed_lsn
        except ReplicationError:
            return 0  # the stream never started

    def _check_slot(self) -> None:
        """The slot monitor's verdict (its thread only records it)."""
        loss = self.lag.loss
        if loss is not None:
            self.metrics.slot_losses.labels(loss.reason.name.lower()).inc()
            raise lost_error(loss, while_running=True)
        missing_at = self.lag.publication_missing_at
        if missing_at is not None:
            raise PublicationMissingError(self.config.publication, self.config.slot, missing_at)

    def _stream(self) -> None:
        self.health.streaming = True
        em = self.emitter
        handlers: dict[type, Callable[[Any, int], None]] = {
            Begin: self._on_begin,
            Commit: self._on_commit,
            Relation: self._on_relation,
            Type: self._on_type,
            Insert: em.on_insert,
            Update: em.on_update,
            Delete: em.on_delete,
            Truncate: em.on_truncate,
            Message: em.on_message,
            Origin: _ignore,
        }
        decode = self.decoder.decode
        fast_dml = self.fast_dml
        stop = self.stop
        for item in self.client.stream(idle_after=self.config.idle_after_s):
            if item is None:
                self._on_idle()
            else:
                payload, wal_start, _wal_end = item
                tag = payload[0]
                # Insert, Update, Delete: the bulk of a stream, straight from bytes to events.
                if tag in DML_TAGS and fast_dml(payload, tag, wal_start):
                    if stop.requested:
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
            if stop.requested:
                return

    def _on_begin(self, message: Begin, lsn: int) -> None:
        self.emitter.begin(message, lsn)
        self.snapshots.on_begin(message.xid)

    def _on_commit(self, message: Commit, lsn: int) -> None:
        tx = self.emitter.finish(message, lsn)
        if tx is None:
            return  # a resent transaction, skipped
        self.snapshots.on_commit(message.commit_lsn)
        control, eot = self.control, self.eot
        if eot is not None:
            eot.source_finished(tx.commit_lsn, tx.event_count, message.end_lsn)
            if eot.due():
                # Counts flushed at every commit: the emitter's split check adds what is not
                # flushed yet, which must belong to the open Kafka transaction only.
                self.emitter.flush_counts()
                control.commit_kafka()
        if self.tracker.in_flight:
            control.wait_for_acks_sooner(True)
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + HOUSEKEEPING_EVERY_S
        self.sink.poll(0)
        self.emitter.flush_counts_if_due(now)
        control.confirm_acked()
        self.snapshots.on_confirmed(self.client.confirmed_lsn)
        self.health.progress()
        self._check_slot()
        self._snapshot_tick()
        control.heartbeat_if_due()

    def _on_relation(self, message: Relation, lsn: int) -> None:
        self.tables.on_relation(message, lsn)
        self.snapshots.on_relation(message)

    def _on_type(self, message: Type, lsn: int) -> None:
        self.sql.run(lambda conn: on_type_message(self.catalog, conn, message.type_oid))

    def _on_idle(self) -> None:
        control, em = self.control, self.emitter
        self.sink.poll(0)
        if em.tx is None:
            em.flush_counts()
            if self.eot is not None:
                control.commit_kafka()  # quiet: make what is open visible now
        control.confirm_acked()
        if not self.tracker.in_flight:
            control.wait_for_acks_sooner(False)  # all acknowledged: back to idle_after_s ticks
            if em.tx is None and not em.skipping:
                control.confirm_unpublished_wal()
        self.snapshots.on_confirmed(self.client.confirmed_lsn)
        control.report_idle()
        self._check_slot()
        self._snapshot_tick(quiet=True)
        control.heartbeat_if_due()

    def _snapshot_tick(self, quiet: bool = False) -> None:
        """Snapshot housekeeping between transactions (``quiet``: the stream has nothing to
        read); with --snapshot initial-only, stop once every snapshot is done and acknowledged."""
        snap = self.snapshots
        idle = self.emitter.tx is None
        if idle:
            snap.tick(quiet)
        self.health.activity = snap.describe()
        if (
            self.config.snapshot == "initial-only"
            and idle
            and not snap.active
            and not snap.unconfirmed
            and not self.tracker.in_flight
        ):
            log.info("initial snapshot done and acknowledged; stopping (--snapshot initial-only)")
            self.stop.requested = True

    def on_reconnect(self, lsn: int) -> None:
        """The stream reconnected and resends from ``lsn``: drop the partial transaction."""
        self.metrics.replication_reconnects.inc()
        self.health.reachable(POSTGRES)
        self.decoder.reset()
        em = self.emitter
        tx = em.tx
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
                em.flush_counts()
                self.control.commit_kafka(partial=tx)
                em.partial = (tx.commit_lsn, tx.counted)
        em.abandon()  # drains without confirming; resent anew
        log.warning("replication reconnected; resuming", extra={"lsn": format_lsn(lsn)})

    # --- shutdown ------------------------------------------------------------------------------

    def drain(self) -> None:
        """Clean stop: flush Kafka for at most the grace period, confirm what was acked."""
        em, eot = self.emitter, self.eot
        tx = em.tx
        if eot is not None:
            # Commit what is whole (and a big transaction's stretch); snapshot rows of an
            # unfinished chunk's transaction can't be resumed: discard the Kafka transaction.
            em.flush_counts()
            if tx is not None and not tx.splittable:
                eot.abort()
            elif tx is not None and tx.counted:
                self.control.commit_kafka(partial=tx, reopen=False)
            else:
                self.control.commit_kafka()
        em.abandon()
        remaining = self.sink.flush(self.config.shutdown_grace_s)
        self.sink.poll(0)
        self.control.confirm_acked()
        if remaining:
            log.warning(
                "grace period over with events unacknowledged; they are resent on restart",
                extra={"unacknowledged": remaining},
            )
        log.info("stopped", extra={"confirmed_lsn": format_lsn(self.client.confirmed_lsn)})

    def close(self) -> None:
        try:
            self.snapshots.stop()
            self.client.close()
        finally:
            self.lag.stop()
            if self.http is not None:
                self.http.stop()
            self.sql.close()


def _ignore(message: Any, lsn: int) -> None:
    pass
