"""Exactly-once into Kafka: which records each Kafka transaction holds, when it commits, and
what may be confirmed to PostgreSQL because of it.

One Kafka transaction holds whole source transactions (and, for a big one, a stretch of its
events), with the resume point of what it holds (``producer.resume_point``), so the events and
the record of how far they got commit or abort together. It commits when it is
``kafka_transaction_max_ms`` old or holds ``kafka_transaction_max_events`` events or
``kafka_transaction_max_bytes`` bytes, checked when a source transaction ends and every 1024
events inside one; the pipeline commits at once when the stream goes quiet. Committing many
small source transactions together keeps the commit's cost (a flush and a coordinator round
trip, during which the stream waits) off each of them; splitting a big one keeps each Kafka
transaction far from the coordinator's timeout whatever the source transaction's size.

Only what a committed Kafka transaction holds is confirmed to PostgreSQL: the confirmable LSN
is capped at the end LSN of the last source transaction finished before the last commit.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from producer import resume_point
from producer.delivery import Ticket
from producer.resume_point import ResumePoint

if TYPE_CHECKING:
    from collections.abc import Callable

    from producer.kafka_sink import KafkaSink
    from producer.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitPolicy:
    max_ms: int
    max_events: int
    max_bytes: int

    def due(self, age_s: float, events: int, size: int) -> bool:
        return age_s * 1000 >= self.max_ms or events >= self.max_events or size >= self.max_bytes


class KafkaTransactions:
    def __init__(
        self,
        sink: KafkaSink,
        policy: CommitPolicy,
        *,
        offsets_topic: str,
        slot: str,
        metrics: Metrics,
        exit_after_commits: int = 0,
    ) -> None:
        self.sink = sink
        self.policy = policy
        self.offsets_topic = offsets_topic
        self.slot_key = slot.encode()
        self.metrics = metrics
        self.exit_after_commits = exit_after_commits
        self.data_commits = 0  # commits that carried events
        # Since the open Kafka transaction began: events and bytes produced (counted by the
        # emitter's metric flush, at most COUNTS_EVERY_S late), source transactions finished,
        # and the last finished one's end LSN and position.
        self.events = 0
        self.bytes = 0
        self.sources = 0
        self._finished_lsn: int | None = None
        self._position: ResumePoint | None = None
        self._finished: tuple[int, int] | None = None  # (commit LSN, events): a newer position
        self.committed_lsn = 0  # end LSN of the last source transaction finished and committed
        self.committed: ResumePoint | None = None

    def start(self, conf: dict[str, Any], on_wait: Callable[[], None]) -> ResumePoint | None:
        """Fence any previous producer of this transactional id, then read where Kafka's
        committed events end for this slot (None: nothing committed yet)."""
        self.sink.init_transactions(on_wait)
        self.committed = resume_point.load(conf, self.offsets_topic, self.slot_key.decode())
        if self.committed is not None:
            log.info(
                "exactly-once resume point read from Kafka",
                extra={
                    "commit_lsn": self.committed.commit_lsn,
                    "total_order": self.committed.total_order,
                    "complete": self.committed.complete,
                },
            )
        return self.committed

    def count(self, events: int, size: int) -> None:
        self.events += events
        self.bytes += size

    def source_finished(self, commit_lsn: int, event_count: int, end_lsn: int) -> None:
        """A source transaction's last record (END marker) is in the open Kafka transaction."""
        self.sources += 1
        self._finished_lsn = end_lsn
        if event_count:
            # The ResumePoint is made at the commit: one source transaction in thousands needs it.
            self._finished = (commit_lsn, event_count)

    def _latest_position(self) -> ResumePoint | None:
        if self._finished is not None:
            self._position = ResumePoint(*self._finished, complete=True)
            self._finished = None
        return self._position

    def due(self, unflushed_events: int = 0, unflushed_bytes: int = 0) -> bool:
        """The open Kafka transaction is to be committed; the caller adds what it produced
        that ``count`` has not been told of yet."""
        if not self.sink.in_transaction:
            return False
        age = time.monotonic() - self.sink.transaction_started
        return self.policy.due(age, self.events + unflushed_events, self.bytes + unflushed_bytes)

    def confirm_cap(self) -> int | None:
        """The highest LSN that may be confirmed while a Kafka transaction is open (None: no
        cap, everything produced is committed)."""
        return self.committed_lsn if self.sink.in_transaction else None

    def commit(
        self,
        on_wait: Callable[[], None],
        partial: tuple[int, int] | None = None,
        *,
        reopen: bool | None = None,
    ) -> None:
        """Commit the open Kafka transaction; ``partial`` (commit LSN, events produced) when a
        source transaction is still being produced: by default it goes on in a new Kafka
        transaction (``reopen``)."""
        sink = self.sink
        if not sink.in_transaction:
            return
        position = self._latest_position()
        if partial is not None:
            position = ResumePoint(partial[0], partial[1], complete=False)
        carries_events = position is not None and position != self.committed
        if carries_events:
            assert position is not None
            ticket = Ticket(None)  # confirms nothing itself: the commit does
            ticket.outstanding = 1
            sink.produce(
                self.offsets_topic,
                self.slot_key,
                position.encode(),
                sink.callback_for(ticket),
                on_wait,
            )
        started = time.perf_counter()
        sink.commit_transaction(on_wait)
        self.metrics.kafka_commit_seconds.observe(time.perf_counter() - started)
        self.metrics.kafka_transactions.labels("committed").inc()
        self.metrics.source_transactions_per_kafka_transaction.observe(self.sources)
        self.committed = position
        if self._finished_lsn is not None:
            self.committed_lsn = self._finished_lsn
        self.events = self.bytes = self.sources = 0
        if carries_events:
            self.data_commits += 1
        if self.exit_after_commits and self.data_commits >= self.exit_after_commits:
            log.warning(
                "fault injection: exiting right after a Kafka commit, before confirming it",
                extra={"commits": self.data_commits},
            )
            logging.shutdown()
            os._exit(137)
        if reopen if reopen is not None else partial is not None:
            sink.begin_transaction()

    def abort(self) -> None:
        """Discard the open Kafka transaction (on the way out: nothing of it is confirmed)."""
        if self.sink.in_transaction:
            self.sink.abort_transaction()
            self.metrics.kafka_transactions.labels("aborted").inc()
            self.events = self.bytes = self.sources = 0
            self._finished_lsn = None
            self._finished = None
            self._position = self.committed
