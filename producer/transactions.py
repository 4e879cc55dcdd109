"""Per-transaction bookkeeping: ids, event order and the BEGIN/END markers. Pure, no I/O
(``now_ms`` reads the clock).

Protocol 1 (no streaming) delivers each committed transaction whole, in commit order, and
Begin already carries the commit LSN (``final_lsn``), so every event gets its final
``commit_lsn`` and ``total_order`` while it is decoded: nothing is buffered.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from producer.envelope_writer import TransactionBytes
from producer.pgoutput import pg_timestamp_to_unix_micros
from producer.pgoutput.timestamps import PG_EPOCH_UNIX_MICROS


def transaction_id(xid: int, commit_lsn: int) -> str:
    """``"<xid>:<commit_lsn>"``, both decimal (CONTRACT.md, "Events")."""
    return f"{xid}:{commit_lsn}"


def now_ms() -> int:
    """Wall-clock milliseconds, for events' ``ts_ms`` (when the producer handled them)."""
    return time.time_ns() // 1_000_000


def pg_ts_to_ms(pg_ts: int) -> int:
    return pg_timestamp_to_unix_micros(pg_ts) // 1000


class Order(NamedTuple):
    """A NamedTuple, not a frozen dataclass: one is made per event (3x cheaper to build)."""

    total_order: int
    data_collection_order: int


_new_order = tuple.__new__


class Transaction:
    """One committed transaction as it is decoded; counts what was published.

    ``data_collection``: ``"<schema>.<table>"`` for table events, the message topic for
    logical messages (CONTRACT.md, "Events"). Counts are 1-based positions.
    """

    __slots__ = (
        "collections", "commit_lsn", "commit_ts_ms", "encoded", "event_count", "id",
        "resume_after", "splittable", "xid",
    )  # fmt: skip

    def __init__(self, xid: int, commit_lsn: int, commit_ts: int) -> None:
        self.xid = xid
        self.commit_lsn = commit_lsn
        # pg_ts_to_ms and transaction_id inlined (two calls less per transaction; a unit test
        # keeps them equal): with the Prometheus counter batched, x0.965 the main thread's CPU
        # per one-change transaction (tests/bench/compare.py, 2026-12-03).
        self.commit_ts_ms = (commit_ts + PG_EPOCH_UNIX_MICROS) // 1000
        self.id = f"{xid}:{commit_lsn}"
        # The envelope parts shared by all of this transaction's events, Avro-encoded once.
        self.encoded = TransactionBytes(xid, commit_lsn, self.commit_ts_ms, self.id)
        self.event_count = 0
        self.collections: dict[str, int] = {}
        # Exactly-once: this many leading events (and the BEGIN marker) are already in Kafka,
        # committed before a restart or reconnect: they are counted, not produced again.
        self.resume_after = 0
        # Whether a Kafka transaction may commit in the middle of it: not once it carries
        # snapshot rows (they are read for this transaction, not resent with it) or its END.
        self.splittable = True

    @property
    def counted(self) -> int:
        """Events counted so far, and at least those Kafka held before a restart: what a Kafka
        commit in the middle of this transaction records as done (never going back)."""
        return max(self.event_count, self.resume_after)

    def next_order(self, data_collection: str) -> Order:
        self.event_count += 1
        position = self.collections.get(data_collection, 0) + 1
        self.collections[data_collection] = position
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (once per event).
        return _new_order(Order, (self.event_count, position))

    def block(self, order: Order) -> dict[str, Any]:
        """The envelope's ``transaction`` field."""
        return {
            "id": self.id,
            "total_order": order.total_order,
            "data_collection_order": order.data_collection_order,
        }

    def marker_key(self) -> dict[str, Any]:
        return {"id": self.id}

    def begin_marker(self) -> dict[str, Any]:
        return {
            "status": "BEGIN",
            "id": self.id,
            "event_count": None,
            "data_collections": None,
            "ts_ms": self.commit_ts_ms,
            "commit_lsn": self.commit_lsn,
        }

    def end_marker(self) -> dict[str, Any]:
        return {
            "status": "END",
            "id": self.id,
            "event_count": self.event_count,
            "data_collections": [
                {"data_collection": name, "event_count": count}
                for name, count in self.collections.items()
            ],
            "ts_ms": self.commit_ts_ms,
            "commit_lsn": self.commit_lsn,
        }
