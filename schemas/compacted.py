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
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s)
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
