"""Prometheus metrics of the producer (prometheus_client), on their own registry.

Rates (events/s, bytes/s) come from the counters via PromQL ``rate()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# pg_replication_slots.wal_status's values, plus "missing" (no slot of that name): the gauge
# has one sample per state, 1 for the current one, so an alert needs no knowledge of the rest.
WAL_STATUSES: Final = ("reserved", "extended", "unreserved", "lost", "missing")


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events = Counter(
            "walbridge_events", "Events produced, by table (or message/transaction topic)",
            ["table"], registry=r,
        )  # fmt: skip
        self.event_bytes = Counter(
            "walbridge_event_bytes", "Bytes of key+value produced, by table", ["table"], registry=r
        )
        self.transactions = Counter(
            "walbridge_transactions", "Transactions with published events", registry=r
        )
        self.delivery_errors = Counter(
            "walbridge_delivery_errors", "Failed Kafka deliveries, by topic", ["topic"], registry=r
        )
        self.registry_calls = Counter(
            "walbridge_registry_calls", "Schema registry HTTP calls, by operation",
            ["operation"], registry=r,
        )  # fmt: skip
        self.registry_retries = Counter(
            "walbridge_registry_retries",
            "Schema registry calls retried after an outage",
            registry=r,
        )
        self.confirmed_lsn = Gauge(
            "walbridge_confirmed_lsn", "LSN last confirmed to PostgreSQL", registry=r
        )
        self.slot_lag_bytes = Gauge(
            "walbridge_slot_lag_bytes", "pg_current_wal_lsn() - the slot's confirmed_flush_lsn",
            registry=r,
        )  # fmt: skip
        self.slot_lag_seconds = Gauge(
            "walbridge_slot_lag_seconds",
            "now - commit time of the last confirmed transaction (0 when idle and caught up)",
            registry=r,
        )
        self.slot_wal_status = Gauge(
            "walbridge_slot_wal_status",
            "The slot's wal_status: 1 for the current state, 0 for the others (reserved, "
            "extended, unreserved: WAL beyond max_wal_size kept, lost: invalidated; missing: "
            "no such slot)",
            ["status"], registry=r,
        )  # fmt: skip
        self.slot_safe_wal_size_bytes = Gauge(
            "walbridge_slot_safe_wal_size_bytes",
            "pg_replication_slots.safe_wal_size: WAL that can still be written before the slot "
            "is invalidated (NaN: no limit, max_slot_wal_keep_size = -1)",
            registry=r,
        )
        self.slot_retained_wal_bytes = Gauge(
            "walbridge_slot_retained_wal_bytes",
            "WAL the slot keeps on the server: pg_current_wal_lsn() - restart_lsn",
            registry=r,
        )
        self.slot_losses = Counter(
            "walbridge_slot_losses",
            "Replication slot losses found (missing, wal_status lost, invalidated), by reason",
            ["reason"], registry=r,
        )  # fmt: skip
        self.in_flight_events = Gauge(
            "walbridge_in_flight_events", "Events produced and not yet acknowledged", registry=r
        )
        self.snapshot_rows = Counter(
            "walbridge_snapshot_rows", "Snapshot rows published (op r), by table", ["table"],
            registry=r,
        )  # fmt: skip
        self.snapshot_rows_dropped = Counter(
            "walbridge_snapshot_rows_dropped",
            "Snapshot rows not published because the row changed between the chunk's watermarks "
            "(its streamed change is newer), by table",
            ["table"], registry=r,
        )  # fmt: skip
        self.snapshot_chunks_reread = Counter(
            "walbridge_snapshot_chunks_reread",
            "Snapshot chunks read again because their read missed a transaction committed "
            "before the chunk's low watermark (not yet visible then), by table",
            ["table"], registry=r,
        )  # fmt: skip
        self.snapshot_worker_ranges = Counter(
            "walbridge_snapshot_worker_ranges",
            "Ranges the snapshot workers read, by table and kind (key: a keyed table's key "
            "ranges; block: a table without a key's heap block ranges)",
            ["table", "kind"], registry=r,
        )  # fmt: skip
        self.snapshot_rows_estimate = Gauge(
            "walbridge_snapshot_rows_estimate",
            "Rows the planner estimates the table holds (pg_class.reltuples), by table",
            ["table"], registry=r,
        )  # fmt: skip
        self.snapshot_eta_seconds = Gauge(
            "walbridge_snapshot_eta_seconds",
            "Estimated seconds until the table's snapshot is done (-1: unknown), by table",
            ["table"], registry=r,
        )  # fmt: skip
        self.snapshot_tables_queued = Gauge(
            "walbridge_snapshot_tables_queued", "Tables whose snapshot is queued or under way",
            registry=r,
        )  # fmt: skip
        self.replication_reconnects = Counter(
            "walbridge_replication_reconnects",
            "Replication connection re-establishments",
            registry=r,
        )
        self.kafka_transactions = Counter(
            "walbridge_kafka_transactions",
            "Kafka transactions (exactly-once), by outcome: committed or aborted",
            ["outcome"],
            registry=r,
        )
        self.source_transactions_per_kafka_transaction = Histogram(
            "walbridge_source_transactions_per_kafka_transaction",
            "Source transactions finished in each committed Kafka transaction",
            buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
            registry=r,
        )
        self.kafka_commit_seconds = Histogram(
            "walbridge_kafka_commit_seconds",
            "Time a Kafka transaction commit blocks the stream (its flush included)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )

    def set_wal_status(self, status: str | None) -> None:
        """One sample per state, 1 for ``status`` (None: the slot is missing)."""
        current = "missing" if status is None else status
        for state in WAL_STATUSES:
            self.slot_wal_status.labels(state).set(1.0 if state == current else 0.0)
        if current not in WAL_STATUSES:  # a state a later PostgreSQL may add
            self.slot_wal_status.labels(current).set(1.0)
