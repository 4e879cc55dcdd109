"""`WALBRIDGE_KAFKA_BROKERS=3 deploy/local/stack up`: three KRaft brokers with replication factor 3
and min.insync.replicas=2. The producer keeps publishing, and a consumer group keeps reading from
its committed offsets, after the broker leading the data topic is killed with SIGKILL.

The cluster runs in a throw-away state directory on free ports; PostgreSQL and the registry are
the session stack's (the registry keeps its schemas in its own database, not in Kafka).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    create_counter_table,
    insert_batches,
    sql,
    unique,
    update_batches,
)
from tests.support.scratch_stack import ScratchStack, free_block

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScratchStack]:
    base = free_block(6)  # broker i on base + 2(i-1), its controller on base + 2(i-1) + 1
    stack = ScratchStack(
        tmp_path_factory.mktemp("kafka3") / "home",
        WALBRIDGE_KAFKA_BROKERS="3",
        WALBRIDGE_KAFKA_PORT=str(base),
        WALBRIDGE_KAFKA_CONTROLLER_PORT=str(base + 1),
        WALBRIDGE_KAFKA_HEAP="512m",
    )
    try:
        stack.up("kafka", "kafka-2", "kafka-3")
        yield stack
    finally:
        stack.down()


def read_events(
    bootstrap: str, group: str, topic: str, registry: SchemaRegistryClient, want: int
) -> list[dict[str, Any]]:
    """`want` events of `topic` for consumer group `group`, from its committed offsets; commits."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    decode = AvroDeserializer(registry)
    consumer.subscribe([topic])
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 180
    try:
        while len(events) < want:
            assert time.monotonic() < deadline, f"{len(events)} of {want} events read"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
                continue
            events.append(decode(msg.value(), SerializationContext(topic, MessageField.VALUE)))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return events


def test_producer_and_consumer_survive_a_killed_broker(
    cluster: ScratchStack, pg_dsn: str, registry_url: str
) -> None:
    bootstrap = cluster.exports()["WALBRIDGE_KAFKA_BOOTSTRAP"]
    assert bootstrap.count(",") == 2, bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker_config = admin.describe_configs([ConfigResource("broker", "1")])
    config = next(iter(broker_config.values())).result(timeout=30)
    for key, want in {
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
        "offsets.topic.replication.factor": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
    }.items():
        assert config[key].value == want, (key, config[key].value)

    table = unique("k3")
    create_counter_table(pg_dsn, table)
    source = Source.create(pg_dsn, [table], "k3")
    topic = f"{source.prefix}.public.{table}"
    registry = SchemaRegistryClient({"url": registry_url})
    group = unique("k3group")
    producer = ProducerProcess(source, bootstrap, registry_url)
    try:
        producer.start()
        insert_batches(pg_dsn, table, 1, 5, 200)  # 1,000 events
        source.wait_confirmed(source.current_lsn(), timeout=120)
        first = read_events(bootstrap, group, topic, registry, 1_000)

        meta = admin.list_topics(topic, timeout=30).topics[topic]
        assert {len(p.replicas) for p in meta.partitions.values()} == {3}
        leader = meta.partitions[0].leader
        service = "kafka" if leader == 1 else f"kafka-{leader}"
        os.kill(cluster.pid(service), signal.SIGKILL)

        # Two of three replicas in sync still satisfy acks=all with min.insync.replicas=2.
        update_batches(pg_dsn, table, 1, 5, 200)  # 1,000 more, on the surviving brokers
        source.wait_confirmed(source.current_lsn(), timeout=180)
        assert producer.proc is not None and producer.proc.poll() is None, producer.log()
        second = read_events(bootstrap, group, topic, registry, 1_000)

        after = admin.list_topics(topic, timeout=30).topics[topic]
        assert after.partitions[0].leader != leader  # leadership moved off the dead broker
        assert producer.stop() == 0, producer.log()
    finally:
        if producer.proc is not None and producer.proc.poll() is None:
            producer.kill()
        source.drop()
        sql(pg_dsn, f"DROP TABLE IF EXISTS {table}")

    # Nothing lost and nothing read twice by the group: every insert, then every update.
    assert sorted(e["after"]["id"] for e in first if e["op"] == "c") == list(range(1, 1_001))
    assert sorted(e["after"]["id"] for e in second if e["op"] == "u") == list(range(1, 1_001))
    assert all(e["after"]["v"] == 1 for e in second)
    cluster.up(service)  # it rejoins: `stack up <broker>` restarts one broker of the cluster
    assert Path(cluster.home / "run" / f"{service}.pid").exists()
