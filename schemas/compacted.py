"""Read a small compacted, single-partition topic to its end: the latest value of each key.

The producer keeps its own state in such topics (snapshot resume records, the exactly-once
resume point), so it needs no write access to PostgreSQL. Read with ``read_committed``: a
record of an aborted or still open Kafka transaction is never taken for state.
"""

from __future__ import annotations

import time
import uuid
from typing import Any


def read_latest(
    conf: dict[str, Any], topic: str, timeout_s: float = 30.0
) -> dict[bytes, bytes | None]:
    """Every key's latest value (None: a tombstone), reading partition 0 from its start to
    its end; empty when the topic doesn't exist (listing all topics: asking for one by name
    may auto-create it)."""
    from confluent_kafka import (
        OFFSET_BEGINNING,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    consumer = Consumer(
        {
            **conf,
            "group.id": f"walbridge-state-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    latest: dict[bytes, bytes | None] = {}
    try:
        if topic not in consumer.list_topics(timeout=timeout_s).topics:
            return latest
        low, high = _watermarks(consumer, TopicPartition(topic, 0), timeout_s)
        if high <= low:
            return latest
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took more than {timeout_s:.0f}s")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                # read_committed: the end is the last stable offset, reported as EOF (the high
                # watermark may lie past control records or an open transaction).
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise KafkaException(error)
            key, offset = msg.key(), msg.offset()
            if key is not None:
                latest[key] = msg.value()
            if offset is not None and offset + 1 >= high:
                break
    finally:
        consumer.close()
    return latest


def _watermarks(consumer: Any, partition: Any, timeout_s: float) -> tuple[int, int]:
    """The partition's low and high watermarks. A topic created a moment ago (the producer
    creates its state topics at start-up) is listed by one broker before its partition's
    leader knows it: on a 3-broker cluster the leader answered UNKNOWN_TOPIC_OR_PART and the
    producer stopped. Such answers are asked again, with backoff, until ``timeout_s``."""
    from confluent_kafka import KafkaError, KafkaException

    not_ready = (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    )
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=max(left, 0.1))
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() not in not_ready:
                raise
            if left <= delay:
                raise TimeoutError(
                    f"topic {partition.topic!r} partition {partition.partition}: not ready "
                    f"after {timeout_s:.0f}s ({error.str()})"
                ) from exc
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
