"""The slot's safety at start-up and on stream errors: gathers what ``producer.slot_loss``
decides from, acts on its verdict (stop, or start over with a new slot and a snapshot), and
keeps the slot record (``producer.slot_record``) in Kafka.

Nothing here re-creates a slot quietly: a slot is created only when nothing under this prefix
says one existed, or after a loss was logged at ERROR and ``--on-slot-loss resnapshot`` asked
for a new one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from producer import slot_loss
from producer.delivery import Ticket
from producer.errors import DeliveryError, SlotLostError
from producer.pgoutput import format_lsn
from producer.replication import ErrorKind, ReplicationError, SlotInfo, SystemIdentity
from producer.resume_point import ResumePoint
from producer.slot_loss import Evidence, LossReason, SlotLoss
from producer.slot_record import SlotRecord, record_key
from schemas.compacted import read_latest
from schemas.snapshot_state import PENDING, TableState

if TYPE_CHECKING:
    from producer.kafka_sink import KafkaSink
    from producer.kafka_transactions import KafkaTransactions
    from producer.metrics import Metrics
    from producer.replication import ReplicationClient

log = logging.getLogger(__name__)

EXIT_SLOT_LOST = 3
RESTART_HINT = (
    "To start over with a new slot and a snapshot of every published table, restart with "
    "--on-slot-loss resnapshot (WALBRIDGE_ON_SLOT_LOSS=resnapshot); docs/postgresql-versions.md, "
    "'Slot loss and failover'"
)
RESNAPSHOT_ACTION = (
    "--on-slot-loss resnapshot: dropping what is left of the slot, creating a new one and "
    "snapshotting every published table again"
)


def lost_error(loss: SlotLoss, *, while_running: bool) -> SlotLostError:
    if while_running:
        done = "The producer stopped; what it confirmed before is in Kafka."
    else:
        done = "The producer created no slot and streamed nothing."
    return SlotLostError(loss, while_running=while_running, action=f"{done} {RESTART_HINT}")


def snapshot_progress(states: Mapping[str, TableState]) -> bool:
    """Whether a snapshot chunk was ever published under this prefix: only a slot's stream
    carries chunks, while ``pending`` records are written before the slot is created."""
    return any(s.status != PENDING for s in states.values())


class SlotGuard:
    def __init__(
        self,
        *,
        slot: str,
        resnapshot: bool,
        kafka_conf: dict[str, Any],
        offsets_topic: str,
        sink: KafkaSink,
        eot: KafkaTransactions | None,
        metrics: Metrics,
        on_wait: Callable[[], None],
    ) -> None:
        self.slot = slot
        self.resnapshot = resnapshot
        self._conf = kafka_conf
        self._topic = offsets_topic
        self._sink = sink
        self._eot = eot
        self._metrics = metrics
        self._on_wait = on_wait
        self.record: SlotRecord | None = None

    # --- start-up ----------------------------------------------------------------------------

    def evidence(self, states: Mapping[str, TableState]) -> Evidence:
        """What Kafka holds of this slot: its record, the exactly-once resume point (read after
        fencing, so it is final), and snapshot progress."""
        held = read_latest(self._conf, self._topic)
        raw_record = held.get(record_key(self.slot))
        raw_point = held.get(self.slot.encode())
        self.record = None if raw_record is None else SlotRecord.decode(raw_record)
        point = None if raw_point is None else ResumePoint.decode(raw_point)
        return Evidence(
            record=self.record,
            resume_lsn=None if point is None or point.commit_lsn == 0 else point.commit_lsn,
            snapshot_progress=snapshot_progress(states),
        )

    def check_start(self, client: ReplicationClient, evidence: Evidence) -> SlotLoss | None:
        """The verdict before anything is created or streamed. With --on-slot-loss stop a loss
        raises ``SlotLostError``; with resnapshot it is logged at ERROR, what is left of the
        slot is dropped, and the loss is returned for the caller to start over."""
        identity = client.open()
        state, server_lsn = client.observe_slot()
        if state is not None and self.record is not None:
            self._note_server(identity)
        loss = slot_loss.at_start(self.slot, state, identity, evidence, server_lsn)
        if loss is None:
            return None
        self._metrics.slot_losses.labels(loss.reason.name.lower()).inc()
        if not self.resnapshot:
            raise lost_error(loss, while_running=False)
        log.error(
            f"{loss.describe()}. {RESNAPSHOT_ACTION}",
            extra={
                "slot": self.slot,
                "reason": loss.reason.value,
                "detail": loss.detail,
                "from_lsn": None if loss.from_lsn is None else format_lsn(loss.from_lsn),
                "to_lsn": format_lsn(loss.to_lsn),
            },
        )
        if state is not None:
            client.drop_slot()
        return loss

    def _note_server(self, identity: SystemIdentity) -> None:
        record = self.record
        assert record is not None
        if identity.system_id != record.system_id:
            log.warning(
                "the slot's server is another database cluster than when it was recorded "
                "(a restore or an upgrade?); the slot exists, so streaming goes on",
                extra={
                    "slot": self.slot,
                    "system_id_recorded": record.system_id,
                    "system_id": identity.system_id,
                },
            )
        elif identity.timeline != record.timeline:
            log.warning(
                "the server is on a new timeline since the last start: it was promoted "
                "(failover) or recovered; the slot is there, so streaming resumes from it",
                extra={
                    "slot": self.slot,
                    "timeline_recorded": record.timeline,
                    "timeline": identity.timeline,
                },
            )

    def remember(self, client: ReplicationClient, slot: SlotInfo) -> None:
        """Write the slot's record and wait for Kafka to acknowledge it, before streaming: a
        new slot's, or the current position and timeline of one found alive."""
        identity = client.identity
        if slot.created or self.record is None or self.record.system_id != identity.system_id:
            created_lsn = slot.consistent_point if slot.created else 0
            record = SlotRecord(
                slot=self.slot, system_id=identity.system_id, timeline=identity.timeline,
                database=identity.dbname, created_lsn=created_lsn or 0,
                created_ms=time.time_ns() // 1_000_000, confirmed_lsn=slot.confirmed_flush_lsn,
                failover=slot.failover,
            )  # fmt: skip
        else:
            record = self.record.seen(
                timeline=identity.timeline, confirmed_lsn=slot.confirmed_flush_lsn
            )
        if record == self.record:
            return
        self._write(record_key(self.slot), record.encode())
        self.record = record
        log.info(
            "slot recorded in Kafka",
            extra={"slot": self.slot, "topic": self._topic, "slot_created": slot.created},
        )

    def forget_resume_point(self) -> None:
        """Before a new slot streams: a resume point of the lost one must not make the new
        slot's transactions look produced already (its LSNs may lie below it, on another
        cluster or behind a standby that lagged), so it is reset to nothing."""
        self._write(self.slot.encode(), ResumePoint(0, 0, complete=True).encode())

    def _write(self, key: bytes, value: bytes) -> None:
        ticket = Ticket(None)  # confirms nothing: state of the producer, not a change
        ticket.outstanding = 1
        sink = self._sink
        sink.produce(self._topic, key, value, sink.callback_for(ticket), self._on_wait)
        if self._eot is not None:
            self._eot.commit(self._on_wait)
        if sink.flush(60.0) or ticket.outstanding:
            raise DeliveryError(self._topic, "slot record", None, "not acknowledged within 60s")
        if sink.failure is not None:
            raise sink.failure

    # --- while streaming -----------------------------------------------------------------------

    def from_stream_error(
        self, client: ReplicationClient, exc: ReplicationError, confirmed_lsn: int
    ) -> SlotLostError | None:
        """START_REPLICATION refused the slot (missing or invalidated): a loss, confirmed from
        pg_replication_slots when the server answers (None: the slot is fine after all, the
        error is the caller's to raise). Never retried: what the slot held is gone."""
        if exc.kind is not ErrorKind.SLOT_LOST:
            return None
        try:
            state, server_lsn = client.observe_slot()
        except ReplicationError:
            # No SQL session either: the walsender's answer is the evidence.
            reason = LossReason.MISSING if exc.sqlstate == "42704" else LossReason.INVALIDATED
            loss = SlotLoss(
                self.slot, reason, f"server said: {exc.server_message}", confirmed_lsn or None,
                exc.lsn or confirmed_lsn,
            )  # fmt: skip
        else:
            found = slot_loss.while_running(
                self.slot, state, confirmed_lsn, server_lsn,
                identity=client.identity, record=self.record,
            )  # fmt: skip
            if found is None:
                return None
            loss = found
        self._metrics.slot_losses.labels(loss.reason.name.lower()).inc()
        return lost_error(loss, while_running=True)
