"""Topic names: the one home of the naming contract (CONTRACT.md, "Events"). Pure functions.

`<prefix>.<schema>.<table>` per table (each name made a valid topic part by
`schemas.safe_names`), and the prefix's own topics: `<prefix>.transaction` (markers, one
partition), `<prefix>.heartbeat`, `<prefix>.message` (logical messages), `<prefix>.snapshot`
(the producer's snapshot resume records, internal), `<prefix>.offsets` (the producer's own
state per slot, internal: with exactly-once on, the resume point written in each Kafka
transaction; always, the slot record that tells a lost slot from a new one).
Subjects follow TopicNameStrategy (`<topic>-key`, `<topic>-value`: `schemas.registry`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum

from schemas.safe_names import name_part


class TopicKind(Enum):
    DATA = "data"
    TRANSACTION = "transaction"
    HEARTBEAT = "heartbeat"
    MESSAGE = "message"
    SNAPSHOT = "snapshot"  # the producer's snapshot resume records (internal, compacted)
    OFFSETS = "offsets"  # the producer's exactly-once resume point (internal, compacted)


# Suffixes of the prefix's own topics; everything else under the prefix is a table's data topic.
_SPECIAL = {kind.value: kind for kind in TopicKind if kind is not TopicKind.DATA}


# Kafka's own limits (org.apache.kafka.common.internals.Topic): legal characters and length.
MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")


class TopicNameError(ValueError):
    """A prefix or table that cannot get a topic of its own; the message says why."""


def check_prefix(prefix: str) -> str:
    """A topic prefix must be a valid topic name itself (it may hold dots: `prod.cdc`)."""
    if not _LEGAL.fullmatch(prefix) or prefix in (".", ".."):
        raise TopicNameError(
            f"topic prefix {prefix!r} is not a valid Kafka topic name: use ASCII letters, "
            "digits, '.', '_' and '-'"
        )
    return prefix


def table_topic(prefix: str, schema: str, table: str) -> str:
    """`<prefix>.<schema part>.<table part>` (`safe_names.name_part`); the original names
    travel in each event's `source.schema` and `source.table`."""
    topic = f"{prefix}.{name_part(schema)}.{name_part(table)}"
    if len(topic) > MAX_TOPIC_LENGTH:
        raise TopicNameError(
            f"table {schema!r}.{table!r}: topic {topic!r} is longer than Kafka's "
            f"{MAX_TOPIC_LENGTH} characters; use a shorter topic prefix"
        )
    return topic


def _kafka_collision_key(topic: str) -> str:
    # Kafka refuses a topic that differs from an existing one only by '.' vs '_' (their metric
    # names would be the same), so such pairs clash too.
    return topic.replace(".", "_")


class TableTopics:
    """Each table's topic, refusing two tables that would share one (or collide in Kafka).

    One per producer: fed the publication's tables at start-up (a clash stops it before it
    reads anything) and every table it later publishes."""

    def __init__(self, prefix: str, tables: Iterable[tuple[str, str]] = ()) -> None:
        self.prefix = check_prefix(prefix)
        own = (transaction_topic, heartbeat_topic, message_topic, snapshot_topic)
        self._owners: dict[str, tuple[str, str] | str] = {
            _kafka_collision_key(f(prefix)): f(prefix) for f in own
        }
        # `schema.table`, unquoted, names a table in markers, the progress table and snapshot
        # signals (as Debezium's data collections do): `a.b`.`c` and `a`.`b.c` would share one.
        self._collections: dict[str, tuple[str, str]] = {}
        for schema, table in tables:
            self.topic(schema, table)

    def topic(self, schema: str, table: str) -> str:
        collection = f"{schema}.{table}"
        other_table = self._collections.setdefault(collection, (schema, table))
        if other_table != (schema, table):
            raise TopicNameError(
                f"tables {schema!r}.{table!r} and {other_table[0]!r}.{other_table[1]!r} share "
                f"the name {collection!r} that transaction markers, the progress table and "
                'snapshot signals use (CONTRACT.md, "Names"); rename one of them'
            )
        topic = table_topic(self.prefix, schema, table)
        key = _kafka_collision_key(topic)
        owner = self._owners.setdefault(key, (schema, table))
        if owner != (schema, table):
            other = f"{owner[0]!r}.{owner[1]!r}" if isinstance(owner, tuple) else repr(owner)
            raise TopicNameError(
                f"tables {schema!r}.{table!r} and {other} map to the same Kafka topic "
                f'{topic!r} (CONTRACT.md, "Names"); rename one of them or publish them '
                "under different topic prefixes"
            )
        return topic


def transaction_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.TRANSACTION.value}"


def heartbeat_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.HEARTBEAT.value}"


def message_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.MESSAGE.value}"


def snapshot_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.SNAPSHOT.value}"


def offsets_topic(prefix: str) -> str:
    return f"{prefix}.{TopicKind.OFFSETS.value}"


def subscribe_pattern(prefix: str) -> str:
    r"""Java regex for Kafka's subscribePattern: data topics and the transaction topic.

    ``\Q..\E`` quotes the prefix literally (it may hold dots or dashes); heartbeat, message
    and offsets topics are left out because nothing in them is applied; the producer's snapshot records
    are read (the consumer follows which tables are being snapshotted).
    """
    return rf"\Q{prefix}\E\.(?!heartbeat$|message$|offsets$).+"


def subscribed(prefix: str, topic: str) -> bool:
    """Whether ``subscribe_pattern(prefix)`` matches ``topic`` (the same rule, in Python)."""
    head = f"{prefix}."
    if not topic.startswith(head) or len(topic) == len(head):
        return False
    return classify(prefix, topic) not in (
        TopicKind.HEARTBEAT,
        TopicKind.MESSAGE,
        TopicKind.OFFSETS,
    )


def classify(prefix: str, topic: str) -> TopicKind:
    head = f"{prefix}."
    if not topic.startswith(head):
        raise ValueError(f"topic {topic!r} is not under prefix {prefix!r}")
    return _SPECIAL.get(topic[len(head) :], TopicKind.DATA)
