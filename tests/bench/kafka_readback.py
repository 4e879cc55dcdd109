"""What a benchmark's producer published, read back from Kafka: the records the Kafka ceilings
produce again (bench_snapshot.py's and producer_ceiling.py's)."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition


def read_back(bootstrap: str, topic: str, limit: int) -> list[tuple[bytes | None, bytes]]:
    """Up to ``limit`` (key, value) pairs of ``topic``'s committed records, each partition from
    its start, in offset order; exits if there is none."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
         "enable.auto.commit": False, "enable.partition.eof": True,
         "isolation.level": "read_committed"}
    )  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # 0: the first offset
        records: list[tuple[bytes | None, bytes]] = []
        ended: set[int] = set()
        while len(records) < limit and len(ended) < len(partitions):
            for message in consumer.consume(5_000, timeout=1.0):
                error = message.error()
                if error is None:
                    records.append((message.key(), message.value() or b""))
                elif error.code() == error._PARTITION_EOF:
                    ended.add(message.partition() or 0)
                else:
                    raise KafkaException(error)
        if not records:
            raise SystemExit(f"nothing to read back in {topic}")
        return records[:limit]
    finally:
        consumer.close()
