"""The consumer's Prometheus metrics: what it applied, how far behind the source it is (in
source commit time and in Kafka records), its rate, and when it should have caught up.

Why our own endpoint and not Spark's metrics system: Spark's sinks report JVM and stage
figures, not ours (source commit time, transactions, pending state), and its Prometheus
servlet lives on the driver UI port, which a streaming job may not expose. This is the same
prometheus-client the producer uses, on `--metrics-port`.

Two feeds: `observe_batch` after each micro-batch (from `BatchReport`), and
`observe_progress` with Spark's `StreamingQuery.lastProgress`, whose Kafka source entry
holds the offsets read (`endOffset`) and the newest available (`latestOffset`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from spark_consumer.lake_metrics import LakeMetrics

if TYPE_CHECKING:
    from spark_consumer.batch_report import BatchReport

log = logging.getLogger("walbridge.consumer")

# Weight of the newest batch in the smoothed rate (an exponential moving average): a few
# batches of history, so one slow batch does not swing the ETA.
_RATE_WEIGHT = 0.3


def offsets_behind(progress: Mapping[str, Any]) -> int | None:
    """Kafka records available but not read yet, summed over partitions, from one
    `StreamingQueryProgress` (as a dict); None when the progress has no Kafka offsets."""
    total = 0
    found = False
    for source in progress.get("sources") or ():
        latest, read = source.get("latestOffset"), source.get("endOffset")
        if not isinstance(latest, Mapping) or not isinstance(read, Mapping):
            continue
        found = True
        for topic, partitions in latest.items():
            done = read.get(topic) or {}
            for partition, offset in partitions.items():
                total += max(0, int(offset) - int(done.get(partition, 0)))
    return total if found else None


@dataclass(frozen=True)
class CatchUp:
    behind: int  # Kafka records available but not read yet
    records_per_s: float | None  # smoothed read rate
    eta_s: float | None  # None: no rate measured yet


class ConsumerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.batches = Counter("walbridge_consumer_batches", "micro-batches applied", registry=r)
        self.transactions = Counter(
            "walbridge_consumer_applied_transactions",
            "source transactions applied to the lake",
            registry=r,
        )
        self.changes = Counter(
            "walbridge_consumer_applied_changes",
            "row changes applied, by table",
            ["table"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "walbridge_consumer_batch_seconds",
            "wall time of a micro-batch",
            registry=r,
            buckets=(0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300),
        )
        self.commit_lsn = Gauge(
            "walbridge_consumer_commit_lsn",
            "source commit LSN the whole lake has reached",
            registry=r,
        )
        self.lag_seconds = Gauge(
            "walbridge_consumer_lag_seconds",
            "now minus the source commit time of the last applied transaction",
            registry=r,
        )
        self.kafka_lag = Gauge(
            "walbridge_consumer_kafka_lag_records",
            "Kafka records available but not read yet",
            registry=r,
        )
        self.rate = Gauge(
            "walbridge_consumer_transactions_per_second",
            "applied source transactions per second (smoothed)",
            registry=r,
        )
        self.records_rate = Gauge(
            "walbridge_consumer_records_per_second",
            "Kafka records read per second (smoothed)",
            registry=r,
        )
        self.eta = Gauge(
            "walbridge_consumer_catch_up_eta_seconds",
            "Kafka lag / records per second (0 when caught up)",
            registry=r,
        )
        self.pending_transactions = Gauge(
            "walbridge_consumer_pending_transactions", "incomplete transactions waiting", registry=r
        )
        self.pending_records = Gauge(
            "walbridge_consumer_pending_records",
            "records of incomplete transactions waiting",
            registry=r,
        )
        self.pending_oldest_age = Gauge(
            "walbridge_consumer_pending_oldest_age_seconds",
            "age of the oldest incomplete transaction waiting (0: none waits)",
            registry=r,
        )
        # A counter, not the quarantine table's size: reading the table would cost a Spark job,
        # and an alert needs only to know that records went there (rate > 0).
        self.quarantined = Counter(
            "walbridge_consumer_quarantined_records",
            "undecodable records written to the quarantine table",
            registry=r,
        )
        self.lake = LakeMetrics(r)  # maintenance.py's
        self._tx_rate: float | None = None
        self._records_rate: float | None = None
        self._last_commit_ts_ms: int | None = None

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, port)

    def observe_batch(self, report: BatchReport, now_ms: int | None = None) -> None:
        if report.skipped:
            return
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.batches.inc()
        self.batch_seconds.observe(report.seconds)
        self.transactions.inc(report.applied_transactions)
        for table, n in report.changes_by_table.items():
            self.changes.labels(table).inc(n)
        self.commit_lsn.set(report.commit_lsn)
        if report.commit_ts_ms is not None:
            self._last_commit_ts_ms = report.commit_ts_ms
        if self._last_commit_ts_ms is not None:
            self.lag_seconds.set(max(0.0, (now_ms - self._last_commit_ts_ms) / 1000))
        if report.seconds > 0:
            self._tx_rate = _smooth(self._tx_rate, report.applied_transactions / report.seconds)
            self.rate.set(self._tx_rate)
        self.pending_transactions.set(report.pending_transactions)
        self.pending_records.set(report.pending_records)
        self.pending_oldest_age.set(report.pending_oldest_age_s or 0.0)
        self.quarantined.inc(report.quarantined)

    def observe_progress(self, progress: Mapping[str, Any]) -> CatchUp | None:
        """Kafka lag, read rate and ETA from Spark's last progress (None: no Kafka offsets)."""
        behind = offsets_behind(progress)
        if behind is None:
            return None
        self.kafka_lag.set(behind)
        rows, ms = (
            progress.get("numInputRows"),
            (progress.get("durationMs") or {}).get("triggerExecution"),
        )
        if rows and ms:
            self._records_rate = _smooth(self._records_rate, rows * 1000 / ms)
            self.records_rate.set(self._records_rate)
        eta: float | None = None
        if behind == 0:
            eta = 0.0
        elif self._records_rate:
            eta = behind / self._records_rate
        if eta is not None:
            self.eta.set(eta)
        return CatchUp(behind, self._records_rate, eta)


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + _RATE_WEIGHT * (new - old)
