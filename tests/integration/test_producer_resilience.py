"""The producer under failure: kill -9 and restart, Kafka broker and registry outages,
PostgreSQL restart, and a schema change mid-stream. Nothing committed may be lost, per-key
order holds, and with exactly-once (the default) a read_committed reader finds no duplicate
(test_producer_exactly_once.py has the many-crash version).

The outage tests stop and start services of the stack, so they need a stack started by the
test session (``stack.run``); run them on a private stack to leave others' services alone,
e.g. WALBRIDGE_HOME=/tmp/x WALBRIDGE_PG_PORT=56432 ... (see deploy/local/stack)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

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
    update_batches,
    verify_counter_table,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("res")
    create_counter_table(pg_dsn, name)
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    src = Source.create(pg_dsn, [table], "res")
    yield src
    src.drop()


def topic(source: Source, table: str) -> str:
    return f"{source.prefix}.public.{table}"


def in_thread(target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def finish(producer: ProducerProcess, source: Source) -> None:
    """Everything committed is confirmed, then a clean SIGTERM stop with exit status 0."""
    source.wait_confirmed(source.current_lsn(), timeout=180)
    assert producer.proc is not None and producer.proc.poll() is None, producer.log()
    assert producer.stop() == 0, producer.log()


def test_kill_9_mid_workload_then_restart(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()

    def workload() -> None:  # 100k inserts then 100k updates, in transactions of 10k rows
        insert_batches(pg_dsn, table, 1, 10, 10_000)
        update_batches(pg_dsn, table, 1, 10, 10_000)

    writer = in_thread(workload)
    deadline = time.monotonic() + 120
    while metric(producer, "walbridge_events_total") < 60_000:
        assert time.monotonic() < deadline, producer.log()
        time.sleep(0.1)
    producer.kill()
    confirmed_at_kill = source.confirmed_lsn()
    restarted = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    writer.join(120)
    assert not writer.is_alive()
    finish(restarted, source)
    assert confirmed_at_kill is not None
    records = TopicReader(kafka_bootstrap, registry_url).read(
        [topic(source, table)], expect=200_000, timeout=300
    )
    # Exactly-once (the default): a read_committed reader finds no duplicate after kill -9.
    assert verify_counter_table(records, pg_dsn, table, 200_000) == 0


def test_kafka_broker_outage(
    stack: Any, pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    writer = in_thread(insert_batches, pg_dsn, table, 1, 120, 50, 0.4)  # ~50 s of traffic
    time.sleep(5)
    stack.run("down", "kafka")
    not_ready = 0
    try:
        for _ in range(30):
            time.sleep(1)
            if producer.http("/readyz")[0] == 503:
                not_ready += 1
    finally:
        stack.run("up", "kafka")
    writer.join(180)
    finish(producer, source)
    assert not_ready > 0  # readiness reflected the outage
    records = TopicReader(kafka_bootstrap, registry_url).read([topic(source, table)], expect=6000)
    assert verify_counter_table(records, pg_dsn, table, 6000) == 0  # the outage: no duplicate


def test_registry_outage_during_schema_change(
    stack: Any, pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    insert_batches(pg_dsn, table, 1, 5, 20)
    source.wait_confirmed(source.current_lsn())
    stack.run("down", "registry")
    try:
        # A new column needs a new schema version: the producer must wait for the registry.
        sql(pg_dsn, f"ALTER TABLE {table} ADD COLUMN extra text")
        sql(
            pg_dsn,
            f"INSERT INTO {table} SELECT g, 0, 'p' || g, 'x' || g FROM generate_series(101, 200) g",
        )
        time.sleep(20)
        assert producer.http("/readyz")[0] == 503
        assert producer.proc is not None and producer.proc.poll() is None
        assert metric(producer, "walbridge_registry_retries_total") > 0
    finally:
        stack.run("up", "registry")
    sql(
        pg_dsn,
        f"INSERT INTO {table} SELECT g, 0, 'p' || g, 'y' || g FROM generate_series(201, 300) g",
    )
    finish(producer, source)
    records = TopicReader(kafka_bootstrap, registry_url).read([topic(source, table)], expect=300)
    afters = {r.value["after"]["id"]: r.value["after"] for r in records}
    assert len(records) == 300 and len(afters) == 300
    assert "extra" not in afters[1]
    assert afters[150]["extra"] == "x150" and afters[250]["extra"] == "y250"
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    assert len(client.get_versions(f"{topic(source, table)}-value")) == 2


def test_postgres_restart(
    stack: Any, pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    insert_batches(pg_dsn, table, 1, 10, 100)
    source.wait_confirmed(source.current_lsn())
    stack.run("down", "postgres")
    time.sleep(3)
    stack.run("up", "postgres")
    insert_batches(pg_dsn, table, 1001, 10, 100)
    update_batches(pg_dsn, table, 1, 2, 1000)
    source.wait_confirmed(source.current_lsn(), timeout=180)
    assert metric(producer, "walbridge_replication_reconnects_total") >= 1
    finish(producer, source)
    records = TopicReader(kafka_bootstrap, registry_url).read([topic(source, table)], expect=4000)
    assert verify_counter_table(records, pg_dsn, table, 4000) == 0  # reconnect: no duplicate
    assert "replication reconnected" in producer.log()


def test_schema_change_mid_stream(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    insert_batches(pg_dsn, table, 1, 1, 10)
    sql(pg_dsn, f"ALTER TABLE {table} ADD COLUMN note text DEFAULT 'n'")
    sql(pg_dsn, f"INSERT INTO {table} VALUES (11, 1, 'p11', 'hello')")
    sql(pg_dsn, f"UPDATE {table} SET v = 5 WHERE id = 1")
    finish(producer, source)
    records = TopicReader(kafka_bootstrap, registry_url).read([topic(source, table)], expect=12)
    by_id = {(r.value["op"], r.value["after"]["id"]): r.value["after"] for r in records}
    assert len(records) == 12
    assert "note" not in by_id[("c", 1)]
    assert by_id[("c", 11)]["note"] == "hello"
    assert by_id[("u", 1)] == {"id": 1, "v": 5, "pad": "p1", "note": "n"}
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    assert len(client.get_versions(f"{topic(source, table)}-value")) == 2


def test_every_change_after_a_schema_change_carries_the_new_column(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    """Many-row transactions after ADD COLUMN (the demo's shape): every one of their events is
    written with the new schema, the new column's value included."""
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    insert_batches(pg_dsn, table, 1, 1, 40)
    sql(pg_dsn, f"ALTER TABLE {table} ADD COLUMN points int")
    for rest in range(2):
        sql(pg_dsn, f"UPDATE {table} SET points = id * 10 WHERE id % 2 = {rest}")
    finish(producer, source)
    records = TopicReader(kafka_bootstrap, registry_url).read([topic(source, table)], expect=80)
    updates = {r.value["after"]["id"]: r.value["after"] for r in records if r.value["op"] == "u"}
    assert len(records) == 80 and len(updates) == 40
    wrong = {
        i: after.get("points") for i, after in updates.items() if after.get("points") != i * 10
    }
    assert wrong == {}
