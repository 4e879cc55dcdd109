"""The streaming producer's ceiling on this machine: what any producer built on our stream reader
and confluent-kafka could reach if decoding, converting, encoding and all bookkeeping were free.

Issue 42 asks how much a compiled hot path (TupleData -> Avro bytes) would buy before one is
built. This bounds it from above: the same slot's stream, read by the producer's own
``ReplicationClient``, with each pgoutput message answered by the records the producer publishes
for it, already encoded (read back from the producer's topics beforehand, cycled): the BEGIN
marker for a Begin, the row event for an Insert, Update or Delete, the END marker for a Commit.
They go to the same topics, with the same keys, with the producer's own librdkafka settings, and
with exactly-once on, in Kafka transactions committed at the producer's own policy
(``kafka_transaction_max_ms``/``_events``/``_bytes``), checked at each Commit as the producer
does. Delivery reports only for errors, and no per-transaction Python work at all: this is the
most favourable case, so a real producer's ratio can only be lower.

Left out, so the ceiling is higher still than a real producer could reach: the resume-point
record each Kafka transaction carries (one record per commit, about 10 per second), LSN
confirmation to PostgreSQL (once at the end only), health and metrics.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from bench_replication import stream_to
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka_readback import read_back

from producer.config import load_config
from producer.kafka_sink import producer_settings
from producer.kafka_transactions import CommitPolicy
from producer.replication import ReplicationClient, ReplicationConfig
from schemas.topics import transaction_topic

Record = tuple[str, bytes | None, bytes]  # (topic, key, value)

SAMPLE: int = 20_000  # records read back per topic: enough variety, bounded memory

_BEGIN, _COMMIT = ord("B"), ord("C")
_CHANGES = frozenset(map(ord, "IUD"))


@dataclass(frozen=True)
class CeilingRun:
    seconds: float  # from the stream's start to every record acknowledged (and committed)
    records: int


def run_ceiling(
    env: dict[str, str],
    slot: str,
    publication: str,
    end_lsn: int,
    markers: list[Record],
    events: list[Record],
    *,
    exactly_once: bool,
) -> CeilingRun:
    """Stream ``slot`` up to ``end_lsn`` (pg_recvlogical's --endpos rule) and produce, for each
    message, the next of ``markers`` (Begin, Commit) or ``events`` (Insert, Update, Delete);
    timed until the last record is acknowledged (with exactly-once, its transaction committed).
    """
    config = load_config([], env | {"WALBRIDGE_EXACTLY_ONCE": "true" if exactly_once else "false"})
    transactional_id = f"bench-ceiling-{uuid.uuid4().hex[:8]}" if exactly_once else None
    errors: list[str] = []
    producer = Producer(
        {**producer_settings(config, transactional_id), "delivery.report.only.error": True,
         "on_delivery": lambda error, _message: errors.append(str(error))}
    )  # fmt: skip
    policy = CommitPolicy(
        config.kafka_transaction_max_ms,
        config.kafka_transaction_max_events,
        config.kafka_transaction_max_bytes,
    )
    marker_cycle: Iterator[Record] = itertools.cycle(markers)
    event_cycle: Iterator[Record] = itertools.cycle(events)
    produce, poll = producer.produce, producer.poll
    records = 0
    if transactional_id:
        producer.init_transactions(60)
    replication = ReplicationConfig(
        slot=slot, publication=publication, create_slot=False, create_publication=False
    )
    began = time.perf_counter()
    opened, in_tx, tx_records, tx_bytes = began, False, 0, 0
    with ReplicationClient(env["WALBRIDGE_PG_DSN"], replication) as client:
        client.open()
        for payload, _wal_start in stream_to(client, end_lsn):
            kind = payload[0]
            if kind in _CHANGES:
                topic, key, value = next(event_cycle)
            elif kind in (_BEGIN, _COMMIT):
                topic, key, value = next(marker_cycle)
            else:  # Relation, Type, Origin, Message: nothing published for them
                continue
            if transactional_id and not in_tx:
                producer.begin_transaction()
                opened, in_tx, tx_records, tx_bytes = time.monotonic(), True, 0, 0
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:  # the local queue is full: serve deliveries, retry
                    poll(0.05)
            records += 1
            tx_records += 1
            tx_bytes += len(value)
            if kind == _COMMIT:
                poll(0)  # error reports only: nothing to serve unless something failed
                if in_tx and policy.due(time.monotonic() - opened, tx_records, tx_bytes):
                    producer.commit_transaction(60)
                    in_tx = False
        if in_tx:
            producer.commit_transaction(60)
        elif producer.flush(300):
            raise SystemExit(f"producer ceiling: {len(producer)} records undelivered")
        seconds = time.perf_counter() - began
        client.confirm(end_lsn)
    if errors:
        raise SystemExit(f"producer ceiling: delivery errors {errors[:3]}")
    return CeilingRun(seconds, records)


@dataclass
class CeilingRecords:
    """What the producer published under ``prefix`` (its markers and ``data_topic``'s events),
    read back once, after its first run."""

    bootstrap: str
    prefix: str
    data_topic: str
    _read: tuple[list[Record], list[Record]] | None = None

    def get(self) -> tuple[list[Record], list[Record]]:
        if self._read is None:
            topics = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=30)
            marker_topic = transaction_topic(self.prefix)
            for topic in (marker_topic, self.data_topic):
                if topic not in topics.topics:
                    raise SystemExit(f"producer ceiling: no topic {topic}: has the producer run?")
            self._read = (
                [(marker_topic, k, v) for k, v in read_back(self.bootstrap, marker_topic, SAMPLE)],
                [
                    (self.data_topic, k, v)
                    for k, v in read_back(self.bootstrap, self.data_topic, SAMPLE)
                ],
            )
        return self._read
