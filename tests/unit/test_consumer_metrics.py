"""The consumer's catch-up figures: Kafka lag from Spark's progress, lag in source commit
time, smoothed rates and the ETA."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from spark_consumer.batch_report import BatchReport
from spark_consumer.metrics import ConsumerMetrics, offsets_behind

pytestmark = pytest.mark.unit


def progress(
    read: dict[str, dict[str, int]],
    latest: dict[str, dict[str, int]],
    rows: int = 0,
    ms: int = 0,
    batch: int = 0,
) -> dict[str, object]:
    return {
        "batchId": batch,
        "numInputRows": rows,
        "durationMs": {"triggerExecution": ms},
        "sources": [{"endOffset": read, "latestOffset": latest}],
    }


def test_offsets_behind_sums_partitions_and_counts_unread_topics() -> None:
    p = progress(
        {"db.a": {"0": 10, "1": 5}}, {"db.a": {"0": 15, "1": 5}, "db.transaction": {"0": 7}}
    )
    assert offsets_behind(p) == 5 + 0 + 7
    assert offsets_behind({"sources": []}) is None
    assert offsets_behind({"sources": [{"endOffset": None, "latestOffset": None}]}) is None


def test_eta_follows_the_smoothed_read_rate() -> None:
    m = ConsumerMetrics()
    first = m.observe_progress(
        progress({"t": {"0": 1000}}, {"t": {"0": 11_000}}, rows=1000, ms=1000)
    )
    assert first is not None
    assert (first.behind, first.records_per_s, first.eta_s) == (10_000, 1000.0, 10.0)
    # A faster batch moves the rate part of the way (smoothed), and the ETA with it.
    second = m.observe_progress(
        progress({"t": {"0": 6000}}, {"t": {"0": 11_000}}, rows=5000, ms=1000)
    )
    assert second is not None and second.records_per_s is not None
    assert 1000 < second.records_per_s < 5000
    assert second.eta_s == pytest.approx(5000 / second.records_per_s)
    caught_up = m.observe_progress(progress({"t": {"0": 11_000}}, {"t": {"0": 11_000}}))
    assert caught_up is not None and caught_up.eta_s == 0.0
    assert b"walbridge_consumer_kafka_lag_records 0.0" in generate_latest(m.registry)


def test_batches_feed_counters_and_the_lag_in_source_time() -> None:
    m = ConsumerMetrics()
    m.observe_batch(
        BatchReport(
            1,
            commit_lsn=500,
            commit_ts_ms=10_000,
            applied_transactions=4,
            changes_by_table={"public.a": 12},
            seconds=2.0,
            pending_transactions=1,
            pending_records=3,
            pending_oldest_age_s=42.5,
            quarantined=2,
        ),
        now_ms=13_500,
    )
    # A batch that applied nothing keeps the last commit time: the lag keeps growing.
    m.observe_batch(BatchReport(2, commit_lsn=500, seconds=1.0), now_ms=20_000)
    m.observe_batch(BatchReport(3, skipped=True), now_ms=30_000)  # a replay: not counted
    text = generate_latest(m.registry).decode()
    assert "walbridge_consumer_batches_total 2.0" in text
    assert "walbridge_consumer_applied_transactions_total 4.0" in text
    assert 'walbridge_consumer_applied_changes_total{table="public.a"} 12.0' in text
    assert "walbridge_consumer_lag_seconds 10.0" in text
    assert "walbridge_consumer_quarantined_records_total 2.0" in text
    # Batch 2 left nothing waiting: the oldest pending age falls back to 0.
    assert "walbridge_consumer_pending_oldest_age_seconds 0.0" in text
    assert "walbridge_consumer_commit_lsn 500.0" in text
    assert "walbridge_consumer_pending_transactions 0.0" in text


def test_pending_age_follows_the_last_batch_and_quarantine_adds_up() -> None:
    m = ConsumerMetrics()
    m.observe_batch(BatchReport(1, pending_oldest_age_s=42.5, quarantined=2, seconds=1.0))
    text = generate_latest(m.registry).decode()
    assert "walbridge_consumer_pending_oldest_age_seconds 42.5" in text
    m.observe_batch(BatchReport(2, quarantined=3, seconds=1.0))
    text = generate_latest(m.registry).decode()
    assert "walbridge_consumer_pending_oldest_age_seconds 0.0" in text
    assert "walbridge_consumer_quarantined_records_total 5.0" in text
