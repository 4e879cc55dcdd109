"""The Kafka side: confluent-kafka's Producer, idempotent, acks=all, Java-compatible partitioning.

Delivery reports are routed to the transaction's ``Ticket`` through one callback per
transaction (not per event). Memory stays bounded: librdkafka's local queue is capped in
messages and bytes, and a full queue (BufferError) is back-pressure: serve delivery reports
and retry, while ``on_wait`` keeps the replication connection alive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from producer.config import ProducerConfig
from producer.delivery import DeliveryTracker, Ticket
from producer.errors import DeliveryError

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]
_BACKPRESSURE_POLL_S = 0.05
_FATAL_CAUSE_WAIT_S = 5.0
_QUEUE_MAX_KBYTES = 64 * 1024  # librdkafka's default is 1 GiB: far above the 300 MB budget


def producer_settings(config: ProducerConfig) -> dict[str, Any]:
    return {
        **config.librdkafka_extra(),
        "bootstrap.servers": config.kafka_bootstrap,
        "enable.idempotence": True,  # implies max.in.flight <= 5 and retries that keep order
        # A failed batch would leave a gap after which later records still land: make it fatal
        # instead, so the producer stops and a restart resends in order.
        "enable.gapless.guarantee": True,
        "acks": "all",
        "partitioner": "murmur2_random",  # same partition as the Java clients for a key
        "compression.type": config.compression,
        "linger.ms": config.linger_ms,
        "queue.buffering.max.messages": config.queue_max_messages,
        "queue.buffering.max.kbytes": _QUEUE_MAX_KBYTES,
        "message.timeout.ms": config.message_timeout_ms,
    }


class KafkaSink:
    def __init__(
        self,
        settings: dict[str, Any],
        tracker: DeliveryTracker,
        prefix: str,
        on_delivery_error: Callable[[str], None] | None = None,
    ) -> None:
        self._tracker = tracker
        self._prefix = prefix
        self._on_delivery_error = on_delivery_error
        self.fatal: str | None = None
        self.failure: DeliveryError | None = None
        self.broker_down = False
        # librdkafka logs through logging (JSON) instead of printing to stderr.
        self._producer = Producer(
            {**settings, "error_cb": self._on_error, "logger": logging.getLogger("librdkafka")}
        )

    # -- callbacks (run inside poll/flush, on the calling thread) ---------------------------

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal = str(error)
            log.error("fatal Kafka producer error", extra={"error": str(error)})
            return
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.broker_down = True
        log.warning("Kafka client error (retried by librdkafka)", extra={"error": str(error)})

    def callback_for(self, ticket: Ticket) -> DeliveryCallback:
        tracker = self._tracker

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is None:
                ticket.outstanding -= 1
                self.broker_down = False
                return
            topic = message.topic() or "?"
            tracker.fail(ticket, str(error))
            if self.failure is None:
                self.failure = DeliveryError(
                    topic, self.table_of(topic), ticket.commit_lsn, str(error)
                )
            if self._on_delivery_error is not None:
                self._on_delivery_error(topic)

        return on_delivery

    def table_of(self, topic: str) -> str:
        head = self._prefix + "."
        return topic[len(head) :] if topic.startswith(head) else topic

    # -- producing ----------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        callback: DeliveryCallback,
        on_wait: Callable[[], None],
    ) -> None:
        try:
            self._producer.produce(topic, value, key, on_delivery=callback)
        except BufferError:
            self.wait_for_room(topic, key, value, callback, on_wait)

    @property
    def raw_produce(self) -> Callable[..., None]:
        """confluent-kafka's ``Producer.produce`` for a hot loop, called positionally
        (``topic, value, key, partition, on_delivery``; partition -1 = the partitioner); it
        raises BufferError when the local queue is full: call ``wait_for_room``."""
        produce: Callable[..., None] = self._producer.produce
        return produce

    def wait_for_room(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        callback: DeliveryCallback,
        on_wait: Callable[[], None],
    ) -> None:
        """Back-pressure: serve delivery reports until the full local queue takes the event."""
        while True:
            self._producer.poll(_BACKPRESSURE_POLL_S)
            self.raise_failure()
            on_wait()
            try:
                self._producer.produce(topic, value, key, on_delivery=callback)
                return
            except BufferError:
                continue

    def poll(self, timeout: float = 0.0) -> None:
        self._producer.poll(timeout)
        self.raise_failure()

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for every queued event; returns how many are still queued."""
        remaining: int = self._producer.flush(timeout)
        return remaining

    def raise_failure(self) -> None:
        if self.failure is not None:
            failure = self.failure
            # Deliveries fail as "Local: Fatal error"; the cause (e.g. an authorization
            # refused) comes as an error event that may lag behind them: wait for it briefly
            # (the producer stops anyway) so the error names what was refused.
            deadline = time.monotonic() + _FATAL_CAUSE_WAIT_S
            while self.fatal is None and "_FATAL" in failure.detail:
                if time.monotonic() > deadline:
                    break
                self._producer.poll(0.1)
            if self.fatal is not None and self.fatal not in failure.detail:
                failure = DeliveryError(
                    failure.topic,
                    failure.table,
                    failure.commit_lsn,
                    f"{failure.detail}, caused by: {self.fatal}",
                )
            raise failure
        if self.fatal is not None:
            raise DeliveryError("*", "*", None, f"fatal producer error: {self.fatal}")

    def __len__(self) -> int:
        return len(self._producer)
