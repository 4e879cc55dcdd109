"""Start-up and shutdown of the real producer: missing topics with creation off, a clean SIGTERM
in the middle of a large transaction, idle WAL confirmation and heartbeats."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    create_counter_table,
    insert_batches,
    metric,
    sql,
    unique,
    verify_counter_table,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("life")
    create_counter_table(pg_dsn, name)
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    src = Source.create(pg_dsn, [table], "life")
    yield src
    src.drop()


def test_missing_topic_with_creation_off_is_a_clear_error(
    kafka_bootstrap: str, registry_url: str, source: Source
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, create_topics="false")
    producer.start(wait_ready=False)
    assert producer.proc is not None
    assert producer.proc.wait(60) == 1
    assert f"topic '{source.prefix}.transaction'" in producer.log()
    assert "--no-create-topics" in producer.log()


def test_sigterm_mid_transaction_stops_cleanly_and_resumes(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, shutdown_grace_s=10)
    producer.start()
    insert_batches(pg_dsn, table, 1, 1, 10)
    source.wait_confirmed(source.current_lsn())
    confirmed_small = source.confirmed_lsn()
    insert_batches(pg_dsn, table, 11, 1, 150_000)  # one big transaction
    big_end = source.current_lsn()
    deadline = time.monotonic() + 120
    while metric(producer, "walbridge_events_total") < 10_000:  # counted per 1024 events
        assert time.monotonic() < deadline, producer.log()
        time.sleep(0.05)
    began = time.monotonic()
    code = producer.stop(timeout=30)
    assert code == 0, producer.log()
    assert time.monotonic() - began < 20
    confirmed = source.confirmed_lsn()
    assert confirmed is not None and confirmed_small is not None
    assert confirmed < big_end  # the unfinished transaction was not confirmed
    restarted = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    source.wait_confirmed(big_end, timeout=180)
    assert restarted.stop() == 0
    records = TopicReader(kafka_bootstrap, registry_url).read(
        [f"{source.prefix}.public.{table}"], expect=150_010, timeout=300
    )
    verify_counter_table(records, pg_dsn, table, 150_010)


def test_idle_confirms_wal_of_unpublished_tables_and_heartbeats(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source
) -> None:
    other = unique("unpub")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, heartbeat_interval_s=1)
    producer.start()
    try:
        sql(pg_dsn, f"CREATE TABLE {other} (id int)")
        for i in range(5):
            sql(pg_dsn, f"INSERT INTO {other} VALUES ({i})")
        lsn = source.current_lsn()
        source.wait_confirmed(lsn, timeout=30)  # nothing published, the slot still moves
        time.sleep(2.5)
    finally:
        assert producer.stop() == 0
        sql(pg_dsn, f"DROP TABLE IF EXISTS {other}")
    beats = TopicReader(kafka_bootstrap, registry_url).read([f"{source.prefix}.heartbeat"], quiet=2)
    assert len(beats) >= 2
    assert all(b.key is None for b in beats)
    assert max(b.value["lsn"] for b in beats) >= lsn
    assert max(b.value["ts_ms"] for b in beats) > min(b.value["ts_ms"] for b in beats)


def test_refused_schema_change_stops_without_confirming(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    insert_batches(pg_dsn, table, 1, 1, 10)
    source.wait_confirmed(source.current_lsn())
    # int -> text is not BACKWARD compatible in Avro: the registry answers 409.
    sql(pg_dsn, f"ALTER TABLE {table} ALTER COLUMN v TYPE text")
    mark = source.current_lsn()  # the (empty) ALTER transaction may be confirmed, not beyond
    sql(pg_dsn, f"INSERT INTO {table} VALUES (99, 'x', 'p')")
    assert producer.proc is not None
    assert producer.proc.wait(120) == 1
    log = producer.log()
    assert "SchemaEvolutionError" in log and f"public.{table}" in log
    confirmed = source.confirmed_lsn()
    assert confirmed is not None and confirmed <= mark
