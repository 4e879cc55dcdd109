"""One source transaction's events into Kafka: its BEGIN/END markers, row changes, truncates,
logical messages and snapshot rows, each counted, ordered and tracked for delivery.

The emitter holds the transaction being produced (``tx``) and its delivery ticket; the
pipeline opens it at Begin (``begin``) and closes it at Commit (``finish``). Plain inserts,
updates and deletes skip decoding altogether (``producer.fast_dml``, which reads this
emitter's state); everything else arrives decoded here (the careful path).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import KafkaException

from producer.confirmation import Confirmation
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
from producer.health import HealthState
from producer.kafka_sink import DeliveryCallback, KafkaSink
from producer.kafka_transactions import KafkaTransactions
from producer.marker_writer import MarkerWriter
from producer.metrics import Metrics
from producer.pgoutput import Begin, Commit, Delete, Insert, Message, Truncate, Update, format_lsn
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.watermarks import INTERNAL_PREFIX
from producer.tables import TableRoute, TableRoutes
from producer.transactions import Transaction, now_ms
from schemas.avro_binary import SMALL_LONGS as _SMALL
from schemas.avro_binary import long_bytes
from schemas.snapshot_state import TableState
from schemas.wire import AvroEncoder

if TYPE_CHECKING:
    from producer.snapshot.coordinator import SnapshotCoordinator

log = logging.getLogger(__name__)

POLL_EVERY: Final = 1024  # events between two rounds of delivery reports and confirmation
# Per-table event counts go to Prometheus and to the Kafka commit policy's event and byte
# limits this often (and on idle ticks): flushing them per commit cost a labels() lookup and a
# locked inc() per table and topic, more than a one-change transaction's own records.
COUNTS_EVERY_S: Final = 0.2
ANY_PARTITION: Final = -1  # confluent-kafka's produce(): let the partitioner choose


@dataclass(frozen=True)
class FixedEncoders:
    """The topics every producer writes besides the tables', with their registered encoders."""

    tx_topic: str
    tx_key: AvroEncoder
    tx_value: AvroEncoder
    hb_topic: str
    hb_value: AvroEncoder
    msg_topic: str
    msg_key: AvroEncoder | None  # None with --no-messages
    msg_value: AvroEncoder | None
    snapshot_topic: str


@dataclass(frozen=True)
class SourceNames:
    """What every event's ``source`` block says about where it came from."""

    version: str
    prefix: str
    db: str


class EventEmitter:
    # Set once by ``watch`` before streaming: the snapshot coordinator needs this emitter as
    # its sink, and this emitter needs the coordinator's open window, so one of the two is
    # handed over after both exist.
    snapshots: SnapshotCoordinator

    def __init__(
        self,
        *,
        names: SourceNames,
        fixed: FixedEncoders,
        sink: KafkaSink,
        tracker: DeliveryTracker,
        tables: TableRoutes,
        eot: KafkaTransactions | None,
        metrics: Metrics,
        health: HealthState,
        control: Confirmation,
        keep_alive: Callable[[], None],
        publish_messages: bool,
        resume_lsn: int,
        partial: tuple[int, int] | None,
    ) -> None:
        self.names = names
        self.fixed = fixed
        self.sink = sink
        self.tracker = tracker
        self.tables = tables
        self.routes = tables.routes  # the same dict, one attribute less per event
        self.eot = eot
        self.metrics = metrics
        self.health = health
        self.control = control
        self.keep_alive = keep_alive
        self.publish_messages = publish_messages
        # confluent-kafka's produce itself, bound once: the hot path skips the sink's wrapper
        # (a full queue is still handled by the sink, see produce).
        self.kafka_produce = sink.raw_produce
        self.tx: Transaction | None = None
        self.ticket: Ticket | None = None
        self.callback: DeliveryCallback | None = None
        self.skipping = False  # a transaction resent after a reconnect, already produced
        self.last_commit_lsn = resume_lsn
        # Exactly-once: the source transaction Kafka holds part of (commit LSN, events), whose
        # resent events are counted and not produced again up to there.
        self.partial = partial
        self.since_poll = 0
        self._counts: dict[str, list[int]] = {}  # topics without a TableRoute (markers, messages)
        self._transactions = 0  # published transactions not yet counted in Prometheus
        self._next_counts = 0.0
        self._count_children: dict[str, tuple[Any, Any]] = {}  # name -> (events, bytes)
        self.markers = MarkerWriter(fixed.tx_key.schema_id, fixed.tx_value.schema_id)
        self._marker_counts = self._counts_for(fixed.tx_topic)
        # (table, value schema id, snapshot marker) -> the writer of that table's "r" events
        self._read_writers: dict[tuple[str, int, str], TableEnvelopeWriter] = {}

    def watch(self, snapshots: SnapshotCoordinator) -> None:
        self.snapshots = snapshots

    # --- transaction boundaries ----------------------------------------------------------------

    def begin(self, message: Begin, lsn: int) -> None:
        if self.tx is not None or self.skipping:
            raise StreamStateError(f"Begin of xid {message.xid} inside another transaction", lsn)
        if message.final_lsn <= self.last_commit_lsn:
            # Resent after a reconnect, and already produced: its delivery is tracked already.
            self.skipping = True
            return
        tx = Transaction(message.xid, message.final_lsn, message.commit_ts)
        partial = self.partial
        if partial is not None and message.final_lsn >= partial[0]:
            self.partial = None
            if message.final_lsn == partial[0]:
                tx.resume_after = partial[1]
                log.info(
                    "resuming a transaction part-way: its first events are in Kafka already",
                    extra={"xid": tx.xid, "commit_lsn": format_lsn(tx.commit_lsn),
                           "events_in_kafka": partial[1]},
                )  # fmt: skip
        self.tx = tx
        self.ticket = self.tracker.open(tx.commit_lsn, tx.commit_ts_ms)
        self.callback = self.sink.callback_for(self.ticket)
        if self.eot is not None:
            self.sink.begin_transaction()  # the hot path produces without the sink's checks

    def finish(self, message: Commit, lsn: int) -> Transaction | None:
        """Close the transaction at its Commit (None: it was a resent one, skipped)."""
        if self.skipping:
            self.skipping = False
            return None
        tx, ticket = self.tx, self.ticket
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
            self.produce_end_marker(tx)
            self._transactions += 1  # to Prometheus with the counts (flush_counts)
        self.tracker.close(ticket, message.end_lsn)
        self.last_commit_lsn = message.commit_lsn
        self.tx = self.ticket = self.callback = None
        return tx

    def abandon(self) -> None:
        """Drop the open transaction without confirming it (it is resent, or resumed)."""
        if self.ticket is not None:
            self.tracker.close(self.ticket, None)
        self.tx = self.ticket = self.callback = None
        self.skipping = False

    # --- the careful path ----------------------------------------------------------------------

    def route(self, relation_id: int, lsn: int) -> TableRoute:
        route = self.routes.get(relation_id)
        if route is None:
            # The first change since the Relation message: the route is built now (topic,
            # schemas), the fast path having declined an unknown relation.
            route = self.tables.route(relation_id)
            if route is None:
                raise StreamStateError(
                    f"change for relation {relation_id} before its Relation message", lsn
                )
            self.health.degraded = None  # the registry answered, after retries if any
            self.snapshots.on_first_change(route.table)
        return route

    def on_insert(self, message: Insert, lsn: int) -> None:
        if not self.skipping:
            route = self.route(message.relation_id, lsn)
            for change in insert_changes(route.shape, message, lsn):
                self._emit_row(route, change, lsn)

    def on_update(self, message: Update, lsn: int) -> None:
        if not self.skipping:
            route = self.route(message.relation_id, lsn)
            for change in update_changes(route.shape, message, lsn):
                self._emit_row(route, change, lsn)

    def on_delete(self, message: Delete, lsn: int) -> None:
        if not self.skipping:
            route = self.route(message.relation_id, lsn)
            for change in delete_changes(route.shape, message, lsn):
                self._emit_row(route, change, lsn)

    def on_truncate(self, message: Truncate, lsn: int) -> None:
        if self.skipping:
            return
        tx = self._require_tx("Truncate", lsn)
        for relation_id in message.relation_ids:
            route = self.route(relation_id, lsn)
            self.snapshots.on_truncate(route.table)
            self.begin_marker_once(tx)
            order = tx.next_order(route.table)
            if order.total_order <= tx.resume_after:
                continue  # already in Kafka (exactly-once resume point)
            block = tx.block(order)
            source = _fill_source(route.source, tx, lsn)
            value = route.value_encoder.encode(truncate_envelope(source, block, now_ms()))
            self.produce(route.topic, route.counts, None, value, route.table)

    def on_message(self, message: Message, lsn: int) -> None:
        if self.skipping:
            return
        if message.prefix.startswith(INTERNAL_PREFIX):  # watermarks, signals: never published
            self.snapshots.on_message(
                message.prefix, message.content, message.lsn,
                in_tx=message.transactional and self.tx is not None,
            )  # fmt: skip
            return
        key_encoder, value_encoder = self.fixed.msg_key, self.fixed.msg_value
        if not self.publish_messages or key_encoder is None or value_encoder is None:
            return
        topic = self.fixed.msg_topic
        source = self._source_block("", "", message.lsn)
        source["ts_ms"] = now_ms()
        key = key_encoder.encode({"prefix": message.prefix})
        if message.transactional:
            tx = self._require_tx("transactional Message", lsn)
            self.begin_marker_once(tx)
            order = tx.next_order(topic)
            if order.total_order <= tx.resume_after:
                return  # already in Kafka (exactly-once resume point)
            block = tx.block(order)
            _fill_source(source, tx, message.lsn)
            value = value_encoder.encode(
                message_envelope(message.prefix, message.content, source, block, now_ms())
            )
            self.produce(topic, self._counts_for(topic), key, value)
            return
        if self.tx is not None:
            raise StreamStateError("non-transactional Message inside a transaction", lsn)
        # Outside any transaction: tracked on its own, confirms nothing (the idle path does).
        value = value_encoder.encode(
            message_envelope(message.prefix, message.content, source, None, now_ms())
        )
        ticket = self.tracker.open(None)
        ticket.outstanding += 1
        self.sink.produce(topic, key, value, self.sink.callback_for(ticket), self.keep_alive)
        self.tracker.close(ticket, None)
        self.metrics.events.labels(topic).inc()

    def _emit_row(self, route: TableRoute, change: RowChange, lsn: int) -> None:
        """Encode and produce one row event (``producer.fast_dml`` does the same steps for
        plain inserts, updates and deletes without decoding them)."""
        op, key, before, after, unchanged_toast = change
        tx = self.tx
        if tx is None:
            raise StreamStateError(f"row change of {route.table} outside a transaction", lsn)
        window = self.snapshots.window
        if window is not None and window.opened and window.table.collection == route.table:
            if window.whole:  # a table without a key: its whole rows, and which transaction
                window.saw_image(tx.xid, before, after)
            else:
                image = after if after is not None else before
                seen = key if key is not None else image
                if seen is not None:
                    window.saw(seen, bool(unchanged_toast))
        self.begin_marker_once(tx)
        total_order, data_collection_order = tx.next_order(route.table)
        if total_order <= tx.resume_after:
            return  # already in Kafka (exactly-once resume point)
        value = route.writer.encode(
            op, before, after, tx.encoded, lsn, now_ms(), total_order, data_collection_order,
            unchanged_toast,
        )  # fmt: skip
        header = route.key_header
        framed = header + key if key is not None and header is not None else None
        self.produce(route.topic, route.counts, framed, value, route.table)

    # --- snapshot sink (producer.snapshot.coordinator.SnapshotSink) ----------------------------

    def has_route(self, oid: int) -> bool:
        return oid in self.routes

    def snapshot_route(self, table: SnapshotTable, lsn: int) -> TableRoute:
        route = self.routes.get(table.oid)
        if route is None:
            route = self.tables.route(table.oid)
        if route is None:  # the stream has not named the table yet: describe it ourselves
            self.tables.on_relation(table.relation(), lsn)
            route = self.route(table.oid, lsn)
        return route

    def emit_reads(
        self, route: TableRoute, rows: Sequence[tuple[bytes, bytes | None]], last: bool, lsn: int
    ) -> None:
        """Snapshot rows (``op: "r"``; (row body, key body or None) each) in the current
        transaction (a high watermark's), in order; with ``last``, the final one is the
        table's last (``source.snapshot`` "last")."""
        if not rows:
            return
        tx = self._require_tx("snapshot row", lsn)
        tx.splittable = False  # the rows are read for this transaction, not resent with it
        if tx.event_count == 0:
            self.produce_begin_marker(tx)
        if last:
            self._emit_read_run(route, rows[:-1], "true", tx, lsn)
            self._emit_read_run(route, rows[-1:], "last", tx, lsn)
        else:
            self._emit_read_run(route, rows, "true", tx, lsn)

    def _emit_read_run(
        self,
        route: TableRoute,
        rows: Sequence[tuple[bytes, bytes | None]],
        marker: str,
        tx: Transaction,
        lsn: int,
    ) -> None:
        """``produce`` of each row's event, inlined: a snapshot publishes millions of rows in
        runs that share everything but the row, the key and the two orders (one join and
        one librdkafka call per row)."""
        schema_id = route.value_encoder.schema_id
        writer = self._read_writers.get((route.table, schema_id, marker))
        if writer is None:
            schema, _, name = route.table.partition(".")
            names = self.names
            writer = TableEnvelopeWriter(
                route.shape.codec.envelope_schema, schema_id, version=names.version,
                prefix=names.prefix, db=names.db, schema=schema, table=name, snapshot=marker,
            )  # fmt: skip
            self._read_writers[(route.table, schema_id, marker)] = writer
        lead, middle, tail = writer.image_parts("r", tx.encoded, lsn, now_ms())
        ticket = self.ticket
        assert ticket is not None  # inside a transaction
        topic, counts, header, table = route.topic, route.counts, route.key_header, route.table
        kafka_produce, callback = self.kafka_produce, self.callback
        small = _SMALL
        collections = tx.collections
        total, position = tx.event_count, collections.get(table, 0)
        sent = size = 0  # since counted
        # Served every POLL_EVERY events across runs (a table's rows come in many short runs
        # when they are wide): delivery reports, status updates and stop requests keep flowing.
        since_poll = self.since_poll
        try:
            for row, key in rows:
                total += 1
                position += 1
                t = small[total] if total < 0x2000 else long_bytes(total)
                value = b"".join(
                    (
                        lead, row, middle, t,
                        t if position == total else small[position] if position < 0x2000
                        else long_bytes(position),
                        tail,
                    )
                )  # fmt: skip
                framed = header + key if key is not None and header is not None else None
                ticket.outstanding += 1  # before produce: a delivery report can't come earlier
                try:
                    kafka_produce(topic, value, framed, ANY_PARTITION, callback)
                except BufferError:
                    self.wait_for_room(topic, framed, value)
                except KafkaException as exc:  # refused at once (e.g. over message.max.bytes)
                    raise DeliveryError(topic, table, tx.commit_lsn, str(exc)) from exc
                sent += 1
                size += len(value) + (len(framed) if framed else 0)
                since_poll += 1
                if since_poll >= POLL_EVERY:
                    tx.event_count, collections[table] = total, position
                    counts[0] += sent
                    counts[1] += size
                    sent = size = since_poll = self.since_poll = 0
                    self.serve()
        finally:
            self.since_poll = since_poll
            tx.event_count, collections[table] = total, position
            counts[0] += sent
            counts[1] += size

    def emit_snapshot_truncate(self, route: TableRoute, lsn: int) -> None:
        """A table without a key starts its snapshot with a ``t`` (source.snapshot "true"):
        its rows can't be upserted, so readers drop what they hold and take the rows read."""
        tx = self._require_tx("snapshot truncate", lsn)
        tx.splittable = False
        self.begin_marker_once(tx)
        block = tx.block(tx.next_order(route.table))
        source = _fill_source(dict(route.source), tx, lsn)
        source["snapshot"] = "true"
        value = route.value_encoder.encode(truncate_envelope(source, block, now_ms()))
        self.produce(route.topic, route.counts, None, value, route.table)

    def write_state(self, state: TableState) -> None:
        ticket = Ticket(None)  # confirms nothing: written after what it covers was confirmed
        ticket.outstanding = 1
        self.sink.produce(
            self.fixed.snapshot_topic,
            state.table.encode(),
            state.encode(),
            self.sink.callback_for(ticket),
            self.keep_alive,
        )

    # --- producing -----------------------------------------------------------------------------

    def begin_marker_once(self, tx: Transaction) -> None:
        if tx.event_count == 0 and not tx.resume_after:
            self.produce_begin_marker(tx)

    def produce_begin_marker(self, tx: Transaction) -> None:
        """``tx.begin_marker()``, encoded by the marker writer (Transaction gives the dicts, the
        reference the unit tests compare the bytes with)."""
        encoded, markers = tx.encoded, self.markers
        self.produce(
            self.fixed.tx_topic, self._marker_counts, markers.key(encoded), markers.begin(encoded)
        )

    def produce_end_marker(self, tx: Transaction) -> None:
        encoded, markers = tx.encoded, self.markers
        self.produce(
            self.fixed.tx_topic,
            self._marker_counts,
            markers.key(encoded),
            markers.end(encoded, tx.event_count, tx.collections),
        )

    def produce(
        self,
        topic: str,
        counts: list[int],
        key: bytes | None,
        value: bytes,
        table: str | None = None,
    ) -> None:
        """Produce one framed record, counting it and the delivery it owes; ``table`` names
        the source table in a refusal (default: the topic)."""
        ticket = self.ticket
        assert ticket is not None  # produce is called inside a transaction only
        ticket.outstanding += 1  # before produce: a delivery report can't come earlier
        try:
            self.kafka_produce(topic, value, key, ANY_PARTITION, self.callback)
        except BufferError:
            self.wait_for_room(topic, key, value)
        except KafkaException as exc:  # refused at once, e.g. a record over message.max.bytes
            commit_lsn = self.tx.commit_lsn if self.tx is not None else None
            raise DeliveryError(topic, table or topic, commit_lsn, str(exc)) from exc
        counts[0] += 1
        counts[1] += len(value) + (len(key) if key else 0)
        self.since_poll += 1
        if self.since_poll >= POLL_EVERY:
            self.since_poll = 0
            self.serve()

    def serve(self) -> None:
        """Every POLL_EVERY events: delivery reports, confirmation, metrics, keep-alive."""
        self.sink.poll(0)
        control = self.control
        control.confirm_acked()
        eot, tx = self.eot, self.tx
        self.flush_counts_if_due(time.monotonic())
        if eot is not None and tx is not None and tx.splittable and tx.event_count:
            # The policy also counts what the periodic flush has not handed it yet: exact to
            # POLL_EVERY events. (With the flush's counts alone it lagged by up to
            # COUNTS_EVERY_S: tens of thousands of events at today's rate, so a transaction
            # could outgrow kafka_transaction_max_events several times over.)
            events, size = self._unflushed()
            if eot.due(events, size):
                # A big source transaction: commit what it has produced so far, go on in a new
                # one. Counts flushed first, as at every commit: what the next Kafka
                # transaction counts starts at zero, not with this one's unflushed events.
                self.flush_counts()
                control.commit_kafka(partial=tx)
        control.keep_alive()

    def _unflushed(self) -> tuple[int, int]:
        """Events and bytes produced since the last count flush (what eot has not counted)."""
        events = size = 0
        for route in self.routes.values():
            counts = route.counts
            events += counts[0]
            size += counts[1]
        for counts in self._counts.values():
            events += counts[0]
            size += counts[1]
        return events, size

    def wait_for_room(self, topic: str, key: bytes | None, value: bytes) -> None:
        """librdkafka's queue is full: wait for deliveries (keeping the stream alive)."""
        assert self.callback is not None  # set with the ticket
        self.sink.wait_for_room(topic, key, value, self.callback, self.keep_alive)

    def _counts_for(self, name: str) -> list[int]:
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = [0, 0]
        return counts

    def flush_counts_if_due(self, now: float) -> None:
        if now >= self._next_counts:
            self.flush_counts()

    def flush_counts(self) -> None:
        """Per-table and transaction counts go to Prometheus every COUNTS_EVERY_S, not per
        event or commit (labels() + a locked inc() per event cost more than the Kafka produce
        call; the transaction counter's locked inc() was 2 % of a one-change transaction)."""
        self._next_counts = time.monotonic() + COUNTS_EVERY_S
        if self._transactions:
            self.metrics.transactions.inc(self._transactions)
            self._transactions = 0
        for route in self.routes.values():
            if route.counts[0]:
                self._flush_count(route.table, route.counts)
        for name, counts in self._counts.items():
            if counts[0]:
                self._flush_count(name, counts)

    def _flush_count(self, name: str, counts: list[int]) -> None:
        children = self._count_children.get(name)
        if children is None:
            metrics = self.metrics
            children = self._count_children[name] = (
                metrics.events.labels(name),
                metrics.event_bytes.labels(name),
            )
        children[0].inc(counts[0])
        children[1].inc(counts[1])
        if self.eot is not None:
            self.eot.count(counts[0], counts[1])
        counts[0] = counts[1] = 0

    def _require_tx(self, what: str, lsn: int) -> Transaction:
        if self.tx is None:
            raise StreamStateError(f"{what} outside a transaction", lsn)
        return self.tx

    def _source_block(self, schema: str, table: str, lsn: int | None) -> Row:
        names = self.names
        return source_block(
            version=names.version, prefix=names.prefix, db=names.db, schema=schema,
            table=table, ts_ms=0, xid=None, lsn=lsn, commit_lsn=None,
        )  # fmt: skip


def _fill_source(source: Row, tx: Transaction, lsn: int) -> Row:
    source["ts_ms"] = tx.commit_ts_ms
    source["txId"] = tx.xid
    source["lsn"] = lsn
    source["commit_lsn"] = tx.commit_lsn
    return source
