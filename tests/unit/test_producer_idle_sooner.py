"""Prompt confirmation before a pause: while Kafka acknowledgements are outstanding the
producer asks the replication stream for short idle ticks (``idle_sooner``), and goes back to
``idle_after_s`` once everything is acknowledged. Fakes only, no services."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from test_replication_stream import WAIT, FakeClock, FakeConn, make_stream, xlogdata

from producer.config import load_config
from producer.confirmation import ACK_WAIT_S, Confirmation
from producer.delivery import DeliveryTracker
from producer.emitter import EventEmitter, SourceNames
from producer.health import HealthState
from producer.metrics import Metrics
from producer.pgoutput import Commit, Decoder
from producer.pipeline import Pipeline
from producer.replication import ReplicationError
from producer.stopping import StopFlag
from producer.transactions import Transaction

pytestmark = pytest.mark.unit


def test_stream_idles_sooner_while_asked_then_after_idle_after_again() -> None:
    clock = FakeClock()
    script: list[Any] = [xlogdata(1, 1, b"a"), WAIT, WAIT, WAIT, WAIT, WAIT]
    conn = FakeConn(script, clock)
    stream = make_stream([conn], clock, interval=10.0)
    it = stream.with_idle(1.0)
    assert next(it) is not None
    stream.idle_sooner(0.25)
    assert next(it) is None
    assert conn.waits == [0.25]  # the socket wait was cut to the shorter tick
    stream.idle_sooner(None)
    assert next(it) is None
    assert conn.waits == [0.25, 1.0]


def test_idle_sooner_never_lengthens_and_does_nothing_without_with_idle() -> None:
    clock = FakeClock()
    conn = FakeConn([xlogdata(1, 1, b"a"), WAIT, WAIT, WAIT], clock)
    stream = make_stream([conn], clock, interval=10.0)
    it = stream.with_idle(0.5)
    assert next(it) is not None
    stream.idle_sooner(5.0)
    assert next(it) is None
    assert conn.waits == [0.5]
    with pytest.raises(ReplicationError):
        stream.idle_sooner(0.0)
    plain = FakeConn([xlogdata(1, 1, b"a"), WAIT, xlogdata(2, 2, b"b")], clock)
    no_idle = make_stream([plain], clock, interval=10.0)
    items = iter(no_idle)
    assert next(items) is not None
    no_idle.idle_sooner(0.02)
    item = next(items)  # never None without with_idle: waited for data instead
    assert item is not None and item[1] == 2


class FakeClient:
    confirmed_lsn = 0
    server_wal_end = 0

    def __init__(self) -> None:
        self.idle_asks: list[float | None] = []

    def idle_sooner(self, seconds: float | None) -> None:
        self.idle_asks.append(seconds)

    def confirm(self, lsn: int) -> None:
        self.confirmed_lsn = max(lsn, self.confirmed_lsn)

    def send_status(self) -> None:
        pass


class FakeSink:
    broker_down = False
    raw_produce = None  # nothing is produced here

    def poll(self, timeout: float = 0.0) -> None:
        pass

    def __len__(self) -> int:
        return 0


def _marker_encoders() -> SimpleNamespace:
    """What the emitter reads of FixedEncoders when it is made (the markers' schema ids)."""
    return SimpleNamespace(
        tx_topic="db.transaction",
        tx_key=SimpleNamespace(schema_id=1),
        tx_value=SimpleNamespace(schema_id=2),
    )


def test_pipeline_asks_for_short_ticks_while_acks_are_outstanding() -> None:
    config = load_config(
        [],
        {
            "WALBRIDGE_PG_DSN": "host=localhost dbname=db",
            "WALBRIDGE_KAFKA_BOOTSTRAP": "localhost:9092",
            "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://localhost:8081",
        },
    )
    client, sink, tracker, stop = FakeClient(), FakeSink(), DeliveryTracker(), StopFlag()
    metrics, health = Metrics(), HealthState(stall_after_s=120.0)
    control = Confirmation(
        client=client, sink=sink, tracker=tracker, eot=None, lag=SimpleNamespace(anchor_ms=None),
        metrics=metrics, health=health, stop=stop, status_interval_s=10.0,
        heartbeat_interval_s=0.0, heartbeat_topic="db.heartbeat", heartbeat_encoder=None,
    )  # type: ignore[arg-type]  # fmt: skip
    emitter = EventEmitter(
        names=SourceNames("1", "db", "db"), fixed=_marker_encoders(), sink=sink, tracker=tracker,
        tables=SimpleNamespace(routes={}), eot=None, metrics=metrics, health=health,
        control=control, keep_alive=stop.check, publish_messages=False, resume_lsn=0,
        partial=None,
    )  # type: ignore[arg-type]  # fmt: skip
    snapshots = SimpleNamespace(
        on_commit=lambda lsn: None, on_confirmed=lambda lsn: None, tick=lambda quiet=False: None,
        describe=lambda: "", active=False, unconfirmed=False, window=None,
    )  # fmt: skip
    emitter.watch(snapshots)  # type: ignore[arg-type]
    pipeline = Pipeline(
        config=config, stop=stop, health=health, metrics=metrics, decoder=Decoder(),
        tracker=tracker, client=client, sink=sink, sql=None, catalog=None, tables=None,
        eot=None, emitter=emitter, fast_dml=None, control=control, snapshots=snapshots,
        lag=SimpleNamespace(loss=None, publication_missing_at=None), http=None, guard=None,
    )  # type: ignore[arg-type]  # fmt: skip
    # A transaction whose one event Kafka has not acknowledged yet at its Commit.
    emitter.ticket = tracker.open(0x200)
    emitter.ticket.outstanding = 1
    emitter.tx = Transaction(5, 0x200, 0)
    pipeline._on_commit(Commit(flags=0, commit_lsn=0x200, end_lsn=0x210, commit_ts=0), 0x200)
    assert client.idle_asks == [ACK_WAIT_S]
    assert client.confirmed_lsn == 0
    pipeline._on_idle()  # still outstanding: keep the short ticks
    assert client.idle_asks == [ACK_WAIT_S]
    for ticket in list(pipeline.tracker._fifo):  # the acknowledgements arrive
        ticket.outstanding = 0
        ticket.closed = True
    pipeline._on_idle()
    assert client.confirmed_lsn == 0x210
    assert client.idle_asks == [ACK_WAIT_S, None]
