"""What a benchmark's producer published, read back from Kafka: the records the Kafka ceilings
produce again (bench_snapshot.py's and producer_ceiling.py's)."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition


def _committed_reader(bootstrap: str) -> Consumer:
    """A consumer of committed records only, that reports each partition's end."""
    return Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
         "enable.auto.commit": False, "enable.partition.eof": True,
         "isolation.level": "read_committed"}
    )  # fmt: skip


def read_back(bootstrap: str, topic: str, limit: int) -> list[tuple[bytes | None, bytes]]:
    """Up to ``limit`` (key, value) pairs of ``topic``'s committed records, each partition from
    its start, in offset order; exits if there is none."""
    consumer = _committed_reader(bootstrap)
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


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset (high watermark); empty if the topic does not exist yet."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}"}
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in meta.partitions
        }
    finally:
        consumer.close()


def committed_since(bootstrap: str, topic: str, start: dict[int, int]) -> int:
    """How many committed records ``topic`` holds past ``start`` (partition -> offset, as
    ``end_offsets`` gave before a run; a partition missing there counts from its first): what
    a benchmark run published, each record counted once, aborted ones not at all."""
    consumer = _committed_reader(bootstrap)
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in partitions])
        count = 0
        ended: set[int] = set()
        while len(ended) < len(partitions):
            for message in consumer.consume(10_000, timeout=1.0):
                error = message.error()
                if error is None:
                    count += 1
                elif error.code() == error._PARTITION_EOF:
                    ended.add(message.partition() or 0)
                else:
                    raise KafkaException(error)
        return count
    finally:
        consumer.close()
