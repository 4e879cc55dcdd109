"""What the producer tells PostgreSQL and Kafka besides events: the confirmed position (only
what Kafka acknowledged, and with exactly-once only what a committed Kafka transaction holds),
status updates that keep the walsender from timing us out, heartbeats, and Kafka transaction
commits with their waits."""

from __future__ import annotations

import time
from typing import Final

from producer.delivery import DeliveryTracker, Ticket
from producer.health import HealthState
from producer.kafka_sink import KafkaSink
from producer.kafka_transactions import KafkaTransactions
from producer.lag import LagMonitor
from producer.metrics import Metrics
from producer.replication import ReplicationClient
from producer.stopping import StopFlag
from producer.transactions import Transaction, now_ms
from schemas.wire import AvroEncoder

STATUS_MIN_GAP_S: Final = 0.1  # serve delivery reports at least this often inside big transactions
# While acknowledgements are outstanding, a quiet stream hands control back this soon (instead
# of after idle_after_s) to serve delivery reports: the last transaction before a pause is
# confirmed within about linger.ms + a broker round trip.
ACK_WAIT_S: Final = 0.02
KAFKA_DOWN: Final = "Kafka brokers unreachable"


class Confirmation:
    def __init__(
        self,
        *,
        client: ReplicationClient,
        sink: KafkaSink,
        tracker: DeliveryTracker,
        eot: KafkaTransactions | None,
        lag: LagMonitor,
        metrics: Metrics,
        health: HealthState,
        stop: StopFlag,
        status_interval_s: float,
        heartbeat_interval_s: float,
        heartbeat_topic: str,
        heartbeat_encoder: AvroEncoder,
    ) -> None:
        self.client = client
        self.sink = sink
        self.tracker = tracker
        self.eot = eot
        self.lag = lag
        self.metrics = metrics
        self.health = health
        self.stop = stop
        self.status_interval_s = status_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.hb_topic = heartbeat_topic
        self.hb_value = heartbeat_encoder
        self.acked_lsn = 0  # the highest end LSN Kafka acknowledged (all before it too)
        self.idle_sooner = False  # asked the stream for ACK_WAIT_S idle ticks
        self._reported_lsn = 0
        self._reported_at = 0.0
        self._next_status = 0.0
        self._next_heartbeat = (
            time.monotonic() + heartbeat_interval_s if heartbeat_interval_s else float("inf")
        )

    # --- confirming ----------------------------------------------------------------------------

    def confirm_acked(self) -> None:
        acked = self.tracker.confirmable()
        if acked is not None and acked > self.acked_lsn:
            self.acked_lsn = acked
        lsn = self.acked_lsn
        if self.eot is not None:
            cap = self.eot.confirm_cap()
            if cap is not None and cap < lsn:
                lsn = cap  # acknowledged, but in a Kafka transaction not committed yet
        if lsn <= self.client.confirmed_lsn:
            return
        self.client.confirm(lsn)
        self.metrics.confirmed_lsn.set(lsn)
        last = self.tracker.last_confirmed
        if last is not None:
            self.lag.anchor_ms = last.commit_ts_ms
        self.report_confirmed(force=False)

    def confirm_unpublished_wal(self) -> None:
        """Nothing of ours in flight: let the slot move past WAL of unpublished tables."""
        wal_end = self.client.server_wal_end
        if wal_end > self.client.confirmed_lsn:
            self.client.confirm(wal_end)
            self.metrics.confirmed_lsn.set(wal_end)
        self.lag.anchor_ms = None

    def report_confirmed(self, *, force: bool) -> None:
        """Tell the server soon, not at the next periodic status update (status_interval_s):
        the slot then releases WAL promptly and slot lag shows the truth. At most every
        STATUS_MIN_GAP_S while busy, so small transactions don't cost a packet each."""
        confirmed = self.client.confirmed_lsn
        if confirmed == self._reported_lsn:
            return
        now = time.monotonic()
        if force or now - self._reported_at >= STATUS_MIN_GAP_S:
            self.client.send_status()
            self._reported_lsn = confirmed
            self._reported_at = now

    def wait_for_acks_sooner(self, on: bool) -> None:
        if on != self.idle_sooner:
            self.idle_sooner = on
            self.client.idle_sooner(ACK_WAIT_S if on else None)

    def report_idle(self) -> None:
        """A quiet moment: force the status update, refresh gauges and health."""
        self.report_confirmed(force=True)
        self.metrics.in_flight_events.set(len(self.sink))
        if self.sink.broker_down:
            self.health.degraded = KAFKA_DOWN
        elif self.health.degraded == KAFKA_DOWN:
            self.health.degraded = None
        self.health.progress()

    # --- heartbeats and keep-alive -------------------------------------------------------------

    def heartbeat_if_due(self) -> None:
        if time.monotonic() < self._next_heartbeat:
            return
        self._next_heartbeat = time.monotonic() + self.heartbeat_interval_s
        ticket = Ticket(None)  # not in the FIFO: a heartbeat confirms nothing
        ticket.outstanding = 1
        value = self.hb_value.encode({"ts_ms": now_ms(), "lsn": self.client.confirmed_lsn})
        self.sink.produce(
            self.hb_topic, None, value, self.sink.callback_for(ticket), self.keep_alive
        )

    def keep_alive(self) -> None:
        """While blocked on Kafka or the registry: keep the walsender from timing us out,
        confirm what got acknowledged, and honour a stop request (blocked, or deep in a big
        transaction: the partial transaction is not confirmed and is resent after a
        restart)."""
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + min(5.0, self.status_interval_s / 2)
            self.sink.poll(0)
            self.confirm_acked()
            self.client.send_status()
            self.health.progress()
        self.stop.check()

    # --- Kafka transactions --------------------------------------------------------------------

    def commit_kafka(self, partial: Transaction | None = None, reopen: bool | None = None) -> None:
        """Commit the open Kafka transaction (see KafkaTransactions.commit), with ``partial``
        the source transaction still being produced; while brokers can't be reached the
        commit is retried and /readyz says so."""
        assert self.eot is not None  # called with exactly-once on only
        position = None if partial is None else (partial.commit_lsn, partial.counted)
        self.eot.commit(self._kafka_wait, position, reopen=reopen)
        if self.health.degraded == KAFKA_DOWN:
            self.health.degraded = None

    def _kafka_wait(self) -> None:
        self.health.degraded = KAFKA_DOWN
        self.keep_alive()
