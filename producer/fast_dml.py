"""The producer's hot path: an Insert, Update or Delete straight from pgoutput bytes to a
produced event, without decoding it into a message.

It shadows three steps of the careful path: ``producer.pgoutput``'s decoding of the message,
``producer.events``' ``insert_changes``/``update_changes``/``delete_changes``, and the
emitter's ``_emit_row``. The table's wire encoder (``schemas.row_encoder``) reads the
TupleData bytes and gives what the careful path gives, byte for byte (tests/unit's fast-path
tests and the fuzzer compare the two). Only the plain shapes take it: an Insert, an Update
without an old tuple (key unchanged), a Delete. Anything else or anything unusual (unknown
relation, short or malformed payload, a value the wire encoder refuses, outside a transaction,
inside a skipped, resumed or streamed transaction) returns False with nothing done, and the
caller takes the careful path, which raises the precise error or handles the message.

Why a closure over the emitter and not a method of it: this is the loop body for almost every
event, so the emitter's steps are inlined here rather than called (two Python calls less per
event, profiled), and keeping those inlined copies apart from the readable careful path makes
both easier to check against each other.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Final

from confluent_kafka import KafkaException

from producer.emitter import ANY_PARTITION, POLL_EVERY, EventEmitter
from producer.errors import DeliveryError
from producer.pgoutput import Decoder

TAG_INSERT: Final = ord("I")
TAG_UPDATE: Final = ord("U")
TAG_DELETE: Final = ord("D")
DML_TAGS: Final = frozenset((TAG_INSERT, TAG_UPDATE, TAG_DELETE))
_MARKER_NEW: Final = ord("N")
_MARKER_KEY: Final = ord("K")
_MARKER_OLD: Final = ord("O")
_unpack_rel_marker: Final = struct.Struct("!IB").unpack_from  # relation_id, tuple marker
_OP_OF_TAG: Final = {TAG_INSERT: "c", TAG_UPDATE: "u", TAG_DELETE: "d"}

FastDml = Callable[[bytes | memoryview, int, int], bool]


def fast_dml(emitter: EventEmitter, decoder: Decoder) -> FastDml:
    """The fast path bound to ``emitter``: ``(payload, tag, lsn) -> produced?``."""
    em = emitter
    routes = em.routes

    def produce_plain_dml(payload: bytes | memoryview, tag: int, lsn: int) -> bool:
        tx = em.tx
        if tx is None or em.skipping or tx.resume_after or decoder.stream_xid is not None:
            return False
        buf = payload if type(payload) is bytes else bytes(payload)
        if len(buf) < 6:
            return False
        relation_id, marker = _unpack_rel_marker(buf, 1)
        route = routes.get(relation_id)
        if route is None:
            return False
        wire = route.wire
        if wire is None:
            return False
        if tag == TAG_DELETE:
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
        window = em.snapshots.window  # a snapshot chunk between its watermarks: note the change
        if window is not None and window.opened and window.table.oid == relation_id:
            if window.whole:  # a table without a key: its whole rows, and which transaction
                deleted = tag == TAG_DELETE  # an update here has no old row (only N)
                window.saw_image(tx.xid, row if deleted else None, None if deleted else row)
            else:
                window.saw(row if key is None else key, bool(unchanged))
        # From here on as EventEmitter._emit_row with its produce, inlined.
        count = tx.event_count
        if count == 0:
            em.produce_begin_marker(tx)
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
        ticket = em.ticket
        assert ticket is not None  # set with tx
        ticket.outstanding += 1  # before produce: a delivery report can't come earlier
        try:
            # Positional (partition -1: the configured partitioner): confluent-kafka parses
            # keyword arguments at about twice the cost of the rest of the call.
            em.kafka_produce(route.topic, value, key, ANY_PARTITION, em.callback)
        except BufferError:
            em.wait_for_room(route.topic, key, value)
        except KafkaException as exc:  # refused at once, e.g. a record over message.max.bytes
            raise DeliveryError(route.topic, table, tx.commit_lsn, str(exc)) from exc
        counts = route.counts
        counts[0] += 1
        counts[1] += size
        em.since_poll += 1
        if em.since_poll >= POLL_EVERY:
            em.since_poll = 0
            em.serve()
        return True

    return produce_plain_dml
