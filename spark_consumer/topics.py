"""Topic naming (DESIGN.md 'Topic, subject and event contracts'): pure functions."""

from __future__ import annotations

from enum import Enum


class TopicKind(Enum):
    DATA = "data"
    TRANSACTION = "transaction"
    HEARTBEAT = "heartbeat"
    MESSAGE = "message"


# Suffixes of the prefix's own topics; everything else under the prefix is a table's data topic.
_SPECIAL = {
    "transaction": TopicKind.TRANSACTION,
    "heartbeat": TopicKind.HEARTBEAT,
    "message": TopicKind.MESSAGE,
}


def transaction_topic(prefix: str) -> str:
    return f"{prefix}.transaction"


def subscribe_pattern(prefix: str) -> str:
    r"""Java regex for Kafka's subscribePattern: data topics and the transaction topic.

    ``\Q..\E`` quotes the prefix literally (it may hold dots or dashes); heartbeat and message
    topics are left out because nothing in them is applied to tables.
    """
    return rf"\Q{prefix}\E\.(?!heartbeat$|message$).+"


def classify(prefix: str, topic: str) -> TopicKind:
    head = f"{prefix}."
    if not topic.startswith(head):
        raise ValueError(f"topic {topic!r} is not under prefix {prefix!r}")
    rest = topic[len(head):]
    return _SPECIAL.get(rest, TopicKind.DATA)
