"""The Kafka side: confluent-kafka's Producer, idempotent, acks=all, Java-compatible partitioning,
and with exactly-once on, transactional (``transactional.id``; every record inside a Kafka
transaction that the pipeline commits).

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

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producer.config import ProducerConfig
from producer.delivery import DeliveryTracker, Ticket
from producer.errors import DeliveryError, KafkaTransactionError

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]
_BACKPRESSURE_POLL_S = 0.05
_FATAL_CAUSE_WAIT_S = 5.0
_QUEUE_MAX_KBYTES = 64 * 1024  # librdkafka's default is 1 GiB: far above the 300 MB budget
# Transaction calls block at most this long at a time, then retry (librdkafka allows calling
# them again after a timeout): in between, the caller keeps the replication connection alive.
_TXN_CALL_S = 2.0


def producer_settings(
    config: ProducerConfig, transactional_id: str | None = None
) -> dict[str, Any]:
    """librdkafka settings; with a ``transactional_id``, a transactional producer (implies
    idempotence; a failed batch makes the open transaction abortable instead of leaving a gap,
    so the gapless guarantee is idempotent mode's only)."""
    if transactional_id:
        # A record can't wait for delivery longer than its transaction may stay open
        # (librdkafka refuses it; 0 means no limit).
        timeout = config.kafka_transaction_timeout_ms
        message_timeout = config.message_timeout_ms
        return {
            **_common_settings(config),
            "transactional.id": transactional_id,
            "transaction.timeout.ms": timeout,
            "message.timeout.ms": min(message_timeout, timeout) if message_timeout else timeout,
        }
    return {
        **_common_settings(config),
        # A failed batch would leave a gap after which later records still land: make it fatal
        # instead, so the producer stops and a restart resends in order.
        "enable.gapless.guarantee": True,
    }


def _common_settings(config: ProducerConfig) -> dict[str, Any]:
    return {
        # Before the operator's own settings, which may set it too.
        "socket.timeout.ms": config.kafka_socket_timeout_ms,
        **config.kafka_client(),
        "enable.idempotence": True,  # implies max.in.flight <= 5 and retries that keep order
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
        self.transactional_id: str | None = settings.get("transactional.id")
        self.in_transaction = False
        self.transaction_started = 0.0  # time.monotonic() of begin_transaction
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
        if self.transactional_id is not None and not self.in_transaction:
            self.begin_transaction()
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

    # -- transactions (exactly-once) ----------------------------------------------------------

    def init_transactions(self, on_wait: Callable[[], None]) -> None:
        """Register the transactional id: fences a previous producer with the same id and
        aborts (or completes) whatever transaction it left open, so what Kafka holds as
        committed is final before the resume point is read."""
        self._transaction_call("initialisation", self._producer.init_transactions, on_wait)

    def begin_transaction(self) -> None:
        """Open a Kafka transaction if none is open (local: no broker round trip)."""
        if self.in_transaction:
            return
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise self._transaction_error("begin", exc.args[0]) from exc
        self.in_transaction = True
        self.transaction_started = time.monotonic()

    def commit_transaction(self, on_wait: Callable[[], None]) -> None:
        """Flush and commit the open transaction (every record delivered, then made visible to
        read_committed readers at once). Raises ``KafkaTransactionError`` when it can't be
        committed; the caller must not confirm anything it holds."""
        if not self.in_transaction:
            return
        self._transaction_call("commit", self._producer.commit_transaction, on_wait)
        self.in_transaction = False

    def abort_transaction(self) -> None:
        """Discard the open transaction (its records are never visible to read_committed
        readers); best effort on the way out: a failure is logged, the coordinator aborts the
        transaction at its timeout or when the next producer with this id starts."""
        if not self.in_transaction:
            return
        self.in_transaction = False
        try:
            self._producer.abort_transaction(_TXN_CALL_S * 5)
        except KafkaException as exc:
            log.warning("Kafka transaction abort failed", extra={"error": str(exc.args[0])})

    def _transaction_call(
        self, action: str, call: Callable[[float], None], on_wait: Callable[[], None]
    ) -> None:
        while True:
            try:
                call(_TXN_CALL_S)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and not error.fatal() and not error.txn_requires_abort():
                    self.broker_down = True
                    on_wait()  # keeps PostgreSQL's connection alive; may raise to stop
                    continue
                self.raise_failure_if_fenced()  # a fatal error's cause came through error_cb
                raise self._transaction_error(action, error) from exc

    def raise_failure_if_fenced(self) -> None:
        """Fencing is a fatal error reported through error_cb: name it as such."""
        if self.fatal is not None and "fenced" in self.fatal.lower():
            raise KafkaTransactionError(
                "use", self.transactional_id or "?", self.fatal, fenced=True
            )

    def _transaction_error(self, action: str, error: KafkaError) -> KafkaTransactionError:
        fenced = error.code() in (
            KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH
        )  # fmt: skip
        return KafkaTransactionError(
            action, self.transactional_id or "?", str(error), fenced=fenced
        )

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
        self.raise_failure_if_fenced()
        if self.fatal is not None:
            raise DeliveryError("*", "*", None, f"fatal producer error: {self.fatal}")

    def __len__(self) -> int:
        return len(self._producer)
