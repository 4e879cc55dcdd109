"""Kafka smoke test: create a topic, produce with the producer settings walbridge uses, consume back."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def test_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    topic = f"smoke.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(
        timeout=30
    )

    acked: list[tuple[bytes, int]] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        assert err is None, err
        acked.append((msg.key(), msg.offset()))  # type: ignore[attr-defined]

    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(20)}
    for key, value in sent.items():
        producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert sorted(k for k, _ in acked) == sorted(sent)

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"smoke-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    received: dict[bytes, bytes] = {}
    try:
        for _ in range(60):
            for msg in consumer.consume(num_messages=100, timeout=1.0):
                assert msg.error() is None, msg.error()
                received[msg.key()] = msg.value()
            if len(received) == len(sent):
                break
    finally:
        consumer.close()
    assert received == sent
