"""Exactly-once bookkeeping without services: the commit policy, the resume point record, what a
Kafka transaction commits and caps, and a resent transaction skipping what Kafka holds.
Kafka is a fake sink / a recorder."""

from __future__ import annotations

from typing import Any

import pytest

from producer.confirmation import Confirmation
from producer.health import HealthState
from producer.kafka_transactions import CommitPolicy, KafkaTransactions
from producer.metrics import Metrics
from producer.pgoutput import Insert
from producer.resume_point import ResumePoint
from producer.stopping import StopFlag
from tests.support.pgoutput_encoder import encode
from tests.unit.test_producer_fast_path import (
    REL,
    careful,
    pipeline_with,
    route_for,
    row,
    with_markers,
)

pytestmark = pytest.mark.unit


class FakeSink:
    """The KafkaSink methods KafkaTransactions uses."""

    def __init__(self) -> None:
        self.in_transaction = False
        self.transaction_started = 0.0
        self.produced: list[tuple[str, bytes | None, bytes]] = []
        self.commits = 0

    def begin_transaction(self) -> None:
        self.in_transaction = True

    def produce(
        self, topic: str, key: bytes | None, value: bytes, callback: Any, on_wait: Any
    ) -> None:
        assert self.in_transaction
        self.produced.append((topic, key, value))

    def callback_for(self, ticket: Any) -> Any:
        return lambda error, message: None

    def commit_transaction(self, on_wait: Any) -> None:
        self.commits += 1
        self.in_transaction = False


def transactions(sink: FakeSink) -> KafkaTransactions:
    return KafkaTransactions(
        sink,  # type: ignore[arg-type]
        CommitPolicy(100, 1000, 1 << 20),
        offsets_topic="db.offsets",
        slot="s1",
        metrics=Metrics(),
    )


def test_commit_policy_bounds() -> None:
    policy = CommitPolicy(max_ms=100, max_events=1000, max_bytes=4096)
    assert not policy.due(0.05, 999, 4095)
    assert policy.due(0.1, 0, 0)
    assert policy.due(0.0, 1000, 0)
    assert policy.due(0.0, 0, 4096)


def test_resume_point_round_trip_and_refusals() -> None:
    point = ResumePoint(0x1234, 17, complete=False)
    assert ResumePoint.decode(point.encode()) == point
    for raw in (b"{}", b'{"v": 9, "commit_lsn": 1, "total_order": 1, "complete": true}', b"xx"):
        with pytest.raises(ValueError, match="unreadable resume point"):
            ResumePoint.decode(raw)


def test_a_commit_carries_the_position_once_and_caps_confirmation() -> None:
    sink = FakeSink()
    eot = transactions(sink)
    assert eot.confirm_cap() is None  # nothing open: nothing to cap
    sink.begin_transaction()
    eot.source_finished(commit_lsn=0x100, event_count=5, end_lsn=0x180)
    assert eot.confirm_cap() == 0  # finished, but not committed yet
    eot.commit(lambda: None)
    assert sink.produced == [("db.offsets", b"s1", ResumePoint(0x100, 5, True).encode())]
    assert eot.committed_lsn == 0x180 and eot.data_commits == 1 and not sink.in_transaction
    # A source transaction without events moves the confirmable LSN, not the record.
    sink.begin_transaction()
    eot.source_finished(commit_lsn=0x200, event_count=0, end_lsn=0x280)
    eot.commit(lambda: None)
    assert len(sink.produced) == 1 and eot.committed_lsn == 0x280 and eot.data_commits == 1


def test_a_partial_commit_records_how_far_and_reopens() -> None:
    sink = FakeSink()
    eot = transactions(sink)
    sink.begin_transaction()
    eot.commit(lambda: None, partial=(0x300, 3000))
    assert sink.produced[-1][2] == ResumePoint(0x300, 3000, False).encode()
    assert sink.in_transaction  # the big transaction goes on in a new Kafka transaction
    eot.commit(lambda: None, partial=(0x300, 4000), reopen=False)
    assert sink.produced[-1][2] == ResumePoint(0x300, 4000, False).encode()
    assert not sink.in_transaction and eot.committed_lsn == 0  # nothing finished: no confirm


def test_a_resent_transaction_skips_what_kafka_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ``resume_after`` events and the BEGIN marker are counted, not produced; the
    rest is produced with the same total_order as in a run that was never interrupted."""
    inserts = [encode(Insert(None, REL, row(i, "a", "x", "1"))) for i in range(1, 6)]
    whole, whole_out = pipeline_with(route_for("d", ("id",)), monkeypatch)
    resumed, resumed_out = pipeline_with(route_for("d", ("id",)), monkeypatch)
    with_markers(whole)
    with_markers(resumed)
    assert resumed.em.tx is not None
    resumed.em.tx.resume_after = 3
    for n, payload in enumerate(inserts):
        assert whole.fast(payload, payload[0], 0x2100 + n) is True
        # a resumed transaction takes the careful path (the fast path steps aside)
        assert resumed.fast(payload, payload[0], 0x2100 + n) is False
        careful(resumed, payload, 0x2100 + n)
    assert resumed_out.produced == whole_out.produced[-2:]  # no BEGIN, events 4 and 5
    assert resumed.em.tx.event_count == whole.em.tx.event_count == 5  # type: ignore[union-attr]


def test_a_commit_while_still_skipping_never_moves_the_position_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reconnect (or a clean stop) part-way through the skipped events must record at least
    what Kafka already held, or the next resend would produce events 2..3 twice."""
    pipeline, recorder = pipeline_with(route_for("d", ("id",)), monkeypatch)
    with_markers(pipeline)
    sink = FakeSink()
    eot = transactions(sink)
    control = Confirmation(
        client=None, sink=None, tracker=None, eot=eot, lag=None, metrics=Metrics(),
        health=HealthState(stall_after_s=120.0), stop=StopFlag(), status_interval_s=10.0,
        heartbeat_interval_s=0.0, heartbeat_topic="db.heartbeat", heartbeat_encoder=None,
    )  # type: ignore[arg-type]  # fmt: skip
    tx = pipeline.em.tx
    assert tx is not None
    tx.resume_after = 3
    payload = encode(Insert(None, REL, row(1, "a", "x", "1")))
    careful(pipeline, payload, 0x2100)
    assert recorder.produced == [] and tx.event_count == 1
    sink.begin_transaction()
    control.commit_kafka(partial=tx)
    assert sink.produced[-1][2] == ResumePoint(tx.commit_lsn, 3, False).encode()


class SplitControl:
    """The confirmation calls serve() makes; records the partial commits it asks for."""

    def __init__(self) -> None:
        self.partials: list[int] = []

    def confirm_acked(self) -> None:
        pass

    def keep_alive(self) -> None:
        pass

    def commit_kafka(self, partial: Any = None, reopen: Any = None) -> None:
        assert partial is not None
        self.partials.append(partial.event_count)


def test_a_big_transaction_splits_at_max_events_within_one_count_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit policy sees the events produced so far at every serve (POLL_EVERY events),
    not only at the periodic count flush: a fast producer fills one COUNTS_EVERY_S with far
    more than kafka_transaction_max_events (here the clock stands still, so the periodic
    flush never comes due)."""
    from producer.emitter import POLL_EVERY

    sink = FakeSink()
    sink.in_transaction = True
    sink.transaction_started = 1000.0
    eot = transactions(sink)  # max_events 1000
    control = SplitControl()
    rig, _ = pipeline_with(route_for("d", ("id",)), monkeypatch)
    em = rig.em
    em.eot, em.control = eot, control  # type: ignore[assignment]
    monkeypatch.setattr("producer.emitter.time.monotonic", lambda: 1000.0)
    em._next_counts = 2000.0  # the periodic flush is not due while the clock stands still
    inserts = [encode(Insert(None, REL, row(i, "a", "x", "1"))) for i in range(3 * POLL_EVERY)]
    for n, payload in enumerate(inserts):
        assert rig.fast(payload, payload[0], 0x3000 + n) is True
    assert control.partials, "no partial commit: the policy never saw the events"
    assert control.partials[0] <= POLL_EVERY + 1  # split at the first serve past 1,000 events


def test_after_a_split_the_next_kafka_transaction_counts_from_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each split commit starts the next Kafka transaction's count at zero: a 6,144-event
    source transaction with max_events 2,000 is split every 2,048 events (the first serve past
    2,000), not at every serve once the first split happened (the unflushed counts of before
    the commit must not be counted again). (``time.monotonic`` patched stands for both
    modules: the periodic flush never comes due, and the open transaction's age stays 0.)"""
    from producer.emitter import POLL_EVERY

    sink = FakeSink()
    sink.in_transaction = True
    sink.transaction_started = 1000.0
    eot = KafkaTransactions(
        sink,  # type: ignore[arg-type]
        CommitPolicy(100, 2000, 1 << 30),
        offsets_topic="db.offsets",
        slot="s1",
        metrics=Metrics(),
    )
    control = SplitControl()

    def commit_kafka(partial: Any = None, reopen: Any = None) -> None:
        control.partials.append(partial.event_count)
        eot.events = eot.bytes = 0  # what KafkaTransactions.commit does to its counts

    control.commit_kafka = commit_kafka  # type: ignore[method-assign]
    rig, _ = pipeline_with(route_for("d", ("id",)), monkeypatch)
    em = rig.em
    em.eot, em.control = eot, control  # type: ignore[assignment]
    monkeypatch.setattr("producer.emitter.time.monotonic", lambda: 1000.0)
    em._next_counts = 2000.0
    count = 6 * POLL_EVERY
    for n in range(count):
        payload = encode(Insert(None, REL, row(n, "a", "x", "1")))
        assert rig.fast(payload, payload[0], 0x4000 + n) is True
    assert len(control.partials) == count // (2 * POLL_EVERY), control.partials
