"""The lake's own health as Prometheus metrics (issue 40): files and bytes per table, the share
of small files, when each table was last compacted and vacuumed, and the oldest progress row a
reader may still read all tables at. Fed by maintenance.py (between batches) on the consumer's
registry; `walbridge-consumer status` prints the same figures."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LakeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.files = Gauge(
            "walbridge_consumer_lake_files",
            "data files in the table's latest version",
            ["table"],
            registry=r,
        )
        self.bytes = Gauge(
            "walbridge_consumer_lake_bytes", "bytes of those files", ["table"], registry=r
        )
        self.small_file_ratio = Gauge(
            "walbridge_consumer_lake_small_file_ratio",
            "share of the table's files below half its compaction target",
            ["table"],
            registry=r,
        )
        self.last_compaction = Gauge(
            "walbridge_consumer_lake_last_compaction_timestamp_seconds",
            "when this consumer last compacted the table (Unix time)",
            ["table"],
            registry=r,
        )
        self.last_vacuum = Gauge(
            "walbridge_consumer_lake_last_vacuum_timestamp_seconds",
            "when this consumer last vacuumed the table (Unix time)",
            ["table"],
            registry=r,
        )
        self.oldest_consistent_read = Gauge(
            "walbridge_consumer_lake_oldest_consistent_read_timestamp_seconds",
            "applied_at of the oldest progress row whose table versions are promised readable",
            registry=r,
        )
        self.maintenance_seconds = Counter(
            "walbridge_consumer_lake_maintenance_seconds",
            "time this consumer spent compacting and vacuuming",
            registry=r,
        )

    def observe_table(self, table: str, files: int, size: int) -> None:
        self.files.labels(table).set(files)
        self.bytes.labels(table).set(size)
