"""Prometheus metrics of the producer (prometheus_client), on their own registry.

Rates (events/s, bytes/s) come from the counters via PromQL ``rate()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


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
        self.in_flight_events = Gauge(
            "walbridge_in_flight_events", "Events produced and not yet acknowledged", registry=r
        )
        self.replication_reconnects = Counter(
            "walbridge_replication_reconnects",
            "Replication connection re-establishments",
            registry=r,
        )
