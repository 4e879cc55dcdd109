"""Errors of the consumer: one small hierarchy, each naming what it is about."""

from __future__ import annotations


class ConsumerError(Exception):
    """Base of every error the consumer raises on purpose."""

    kind = "consumer"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.kind}: {detail}")
        self.detail = detail


class ConfigError(ConsumerError):
    kind = "config"


class RecordError(ConsumerError):
    """A Kafka record that cannot be decoded; names its coordinates."""

    kind = "record"

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(f"{reason} (topic {topic!r}, partition {partition}, offset {offset})")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason


class UnknownSchemaError(RecordError):
    kind = "unknown-schema"


class TransactionError(ConsumerError):
    """A source transaction that breaks the contract or waited too long."""

    kind = "transaction"


class ApplyError(ConsumerError):
    """A change that cannot be applied to its Delta table."""

    kind = "apply"
