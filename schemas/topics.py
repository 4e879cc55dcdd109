"""Topic names: the one home of the naming contract (CONTRACT.md, "Events"). Pure functions.

`<prefix>.<schema>.<table>` per table, and the prefix's own topics: `<prefix>.transaction`
(markers, one partition), `<prefix>.heartbeat`, `<prefix>.message` (logical messages),
`<prefix>.snapshot` (the producer's snapshot resume records, internal).
Subjects follow TopicNameStrategy (`<topic>-key`, `<topic>-value`: `schemas.registry`).
"""

from __future__ import annotations

from enum import Enum


class TopicKind(Enum):
    DATA = "data"
    TRANSACTION = "transaction"
    HEARTBEAT = "heartbeat"
    MESSAGE = "message"
    SNAPSHOT = "snapshot"  # the producer's snapshot resume records (internal, compacted)


# Suffixes of the prefix's own topics; everything else under the prefix is a table's data topic.
_SPECIAL = {kind.value: kind for kind in TopicKind if kind is not TopicKind.DATA}


def table_topic(prefix: str, schema: str, table: str) -> str:
    return f"{prefix}.{schema}.{table}"


def transaction_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.TRANSACTION.value}"


def heartbeat_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.HEARTBEAT.value}"


def message_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.MESSAGE.value}"


def snapshot_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.SNAPSHOT.value}"


def subscribe_pattern(prefix: str) -> str:
    r"""Java regex for Kafka's subscribePattern: data topics and the transaction topic.

    ``\Q..\E`` quotes the prefix literally (it may hold dots or dashes); heartbeat and message
    topics are left out because nothing in them is applied; the producer's snapshot records
    are read (the consumer follows which tables are being snapshotted).
    """
    return rf"\Q{prefix}\E\.(?!heartbeat$|message$).+"


def classify(prefix: str, topic: str) -> TopicKind:
    head = f"{prefix}."
    if not topic.startswith(head):
        raise ValueError(f"topic {topic!r} is not under prefix {prefix!r}")
    return _SPECIAL.get(topic[len(head) :], TopicKind.DATA)
