"""Where each subscribed partition ends in Kafka now, for a reader of committed records only
(the consumer's Kafka source reads with `read_committed`): the last stable offsets."""

from __future__ import annotations

from typing import Any

from schemas.topics import subscribed
from spark_consumer.batch_cap import Offsets

TIMEOUT_S = 30.0


def committed_ends(conf: dict[str, Any], prefix: str) -> Offsets:
    """The next offset after the last committed record, per partition of every topic the
    consumer subscribes to (``schemas.topics.subscribe_pattern``)."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient(conf)
    meta = admin.list_topics(timeout=TIMEOUT_S)
    wanted = {
        TopicPartition(name, p): OffsetSpec.latest()
        for name, topic in meta.topics.items()
        if topic.error is None and subscribed(prefix, name)
        for p in topic.partitions
    }
    ends: Offsets = {}
    if not wanted:
        return ends
    futures = admin.list_offsets(
        wanted, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=TIMEOUT_S
    )
    for tp, future in futures.items():
        ends.setdefault(tp.topic, {})[str(tp.partition)] = int(future.result().offset)
    return ends
