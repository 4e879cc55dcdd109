"""The fast path (``producer.fast_dml``: Insert/Update/Delete bytes -> produced events, no
decoded messages) produces exactly what the careful path (decode, then the emitter's message
handlers) produces, and steps aside for everything else. Real codecs, envelope writer and
emitter; Kafka is a recorder; no services."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from producer.delivery import DeliveryTracker, Ticket
from producer.emitter import POLL_EVERY, EventEmitter, FixedEncoders, SourceNames
from producer.envelope_writer import TableEnvelopeWriter
from producer.errors import StreamStateError
from producer.events import TableShape
from producer.fast_dml import FastDml, fast_dml
from producer.health import HealthState
from producer.metrics import Metrics
from producer.pgoutput import (
    UNCHANGED_TOAST,
    Column,
    Decoder,
    Delete,
    Insert,
    Relation,
    Update,
    Value,
)
from producer.tables import TableRoute, wire_row_key_encoder
from producer.transactions import Transaction
from schemas.envelope import transaction_key_schema, transaction_metadata_schema
from schemas.relation import build_relation_codec
from schemas.type_catalog import TypeCatalog
from schemas.wire import AvroEncoder, header
from tests.support.pgoutput_encoder import encode

pytestmark = pytest.mark.unit

INT4, TEXT, NUMERIC = 23, 25, 1700
REL = 4242


def route_for(identity: str, key: tuple[str, ...]) -> TableRoute:
    columns = tuple(
        Column(1 if name in key else 0, name, oid, -1, name in key)
        for name, oid in (("id", INT4), ("code", TEXT), ("val", TEXT), ("amount", NUMERIC))
    )
    relation = Relation(None, REL, "public", "t", identity, columns)  # type: ignore[arg-type]
    codec = build_relation_codec(relation, TypeCatalog(), "db.public.t")
    return TableRoute(
        shape=TableShape.of(codec, identity),
        topic="db.public.t",
        table="public.t",
        key_header=None if codec.encode_key is None else header(2),
        value_encoder=AvroEncoder(codec.envelope_schema, 3),
        source={},
        writer=TableEnvelopeWriter(
            codec.envelope_schema,
            3,
            version="1",
            prefix="db",
            db="db",
            schema="public",
            table="t",
        ),
        counts=[0, 0],
        wire=wire_row_key_encoder(codec),
    )


class Recorder:
    """Stands in for confluent-kafka's ``Producer.produce``, called positionally as the
    pipeline does: (topic, value, key, partition, on_delivery)."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes, bytes | None, int]] = []

    def __call__(
        self, topic: str, value: bytes, key: bytes | None, partition: int, on_delivery: Any
    ) -> None:
        assert callable(on_delivery)
        self.produced.append((topic, value, key, partition))


@dataclass
class Rig:
    """An emitter on a recorder, with its fast path."""

    em: EventEmitter
    fast: FastDml


class FakeKafka:
    """The KafkaSink methods the emitter calls outside produce (which the recorder takes)."""

    def __init__(self, recorder: Recorder) -> None:
        self.raw_produce = recorder
        self.in_transaction = False

    def callback_for(self, ticket: Any) -> Any:
        return lambda error, message: None

    def begin_transaction(self) -> None:
        self.in_transaction = True

    def poll(self, timeout: float = 0.0) -> None:
        pass


def fixed_encoders() -> FixedEncoders:
    return FixedEncoders(
        tx_topic="db.transaction",
        tx_key=AvroEncoder(transaction_key_schema(), 5),
        tx_value=AvroEncoder(transaction_metadata_schema(), 6),
        hb_topic="db.heartbeat",
        hb_value=AvroEncoder({"type": "null"}, 7),
        msg_topic="db.message",
        msg_key=None,
        msg_value=None,
        snapshot_topic="db.snapshot",
    )


def emitter_with(
    route: TableRoute | None, recorder: Recorder, *, control: Any = None, eot: Any = None
) -> EventEmitter:
    em = EventEmitter(
        names=SourceNames("1", "db", "db"),
        fixed=fixed_encoders(),
        sink=FakeKafka(recorder),  # type: ignore[arg-type]
        tracker=DeliveryTracker(),
        tables=SimpleNamespace(routes={} if route is None else {REL: route}),  # type: ignore[arg-type]
        eot=eot,
        metrics=Metrics(),
        health=HealthState(stall_after_s=120.0),
        control=control,
        keep_alive=lambda: None,
        publish_messages=False,
        resume_lsn=0,
        partial=None,
    )
    em.watch(SimpleNamespace(window=None))  # type: ignore[arg-type]
    return em


def pipeline_with(route: TableRoute, monkeypatch: pytest.MonkeyPatch) -> tuple[Rig, Recorder]:
    """An emitter inside a transaction that has produced its BEGIN marker already."""
    monkeypatch.setattr("producer.fast_dml.time.time_ns", lambda: 1_700_000_000_123_000_000)
    recorder = Recorder()
    em = emitter_with(route, recorder)
    em.tx = Transaction(77, 0x1000, 0)
    em.tx.event_count = 1  # markers are not this test's business
    em.ticket = Ticket(0x1000)
    em.callback = lambda error, message: None
    return Rig(em, fast_dml(em, Decoder())), recorder


def careful(rig: Rig, payload: bytes, lsn: int) -> None:
    message = Decoder().decode(payload)
    em = rig.em
    handler = {Insert: em.on_insert, Update: em.on_update, Delete: em.on_delete}
    handler[type(message)](message, lsn)  # type: ignore[operator]


def row(*values: Any) -> tuple[Any, ...]:
    return tuple(
        v if v is None or v is UNCHANGED_TOAST else Value(str(v).encode(), False) for v in values
    )


FAST_SHAPES = [
    ("d", ("id",), Insert(None, REL, row(1, "a", "x", "1.50"))),
    ("d", ("id",), Insert(None, REL, row(2, None, "é", None))),
    ("d", ("id",), Update(None, REL, None, None, row(1, "b", UNCHANGED_TOAST, "2.00"))),
    ("d", ("id",), Delete(None, REL, "K", row(1, None, None, None))),
    ("f", (), Delete(None, REL, "O", row(1, "a", "x", "3"))),
    ("n", (), Insert(None, REL, row(3, "c", "y", "-4.25"))),
    ("n", (), Update(None, REL, None, None, row(3, "c", "z", "0"))),
    ("i", ("id", "code"), Insert(None, REL, row(5, "k", "v", "1e3"))),
]


@pytest.mark.parametrize(("identity", "key", "message"), FAST_SHAPES)
def test_fast_path_produces_what_the_careful_path_produces(
    identity: str, key: tuple[str, ...], message: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = encode(message)
    fast, fast_out = pipeline_with(route_for(identity, key), monkeypatch)
    slow, slow_out = pipeline_with(route_for(identity, key), monkeypatch)
    assert fast.fast(payload, payload[0], 0x900) is True
    assert fast.fast(memoryview(payload), payload[0], 0x910) is True  # the stream's type
    careful(slow, payload, 0x900)
    careful(slow, payload, 0x910)
    assert len(fast_out.produced) == 2
    assert fast_out.produced == slow_out.produced
    assert fast.em.tx is not None and slow.em.tx is not None
    assert fast.em.tx.event_count == slow.em.tx.event_count == 3
    assert fast.em.ticket is not None and fast.em.ticket.outstanding == 2


STEP_ASIDE = [
    # An update with the old key: may become delete + create, the careful path decides.
    Update(None, REL, "K", row(1, None, None, None), row(9, "a", "x", "1")),
    Insert(None, REL + 1, row(1, "a", "x", "1")),  # unknown relation: careful path raises
    Insert(None, REL, row(1, "a", "x")),  # a column short
    Insert(None, REL, row("one", "a", "x", "1")),  # a value the encoder refuses
    Delete(None, REL, "K", row(UNCHANGED_TOAST, None, None, None)),  # TOAST in the key
]


@pytest.mark.parametrize("message", STEP_ASIDE)
def test_fast_path_steps_aside(message: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline, recorder = pipeline_with(route_for("d", ("id",)), monkeypatch)
    assert pipeline.fast(encode(message), encode(message)[0], 0x900) is False
    assert recorder.produced == []


def test_fast_path_steps_aside_for_malformed_payloads_and_skipped_transactions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline, recorder = pipeline_with(route_for("d", ("id",)), monkeypatch)
    good = encode(Insert(None, REL, row(1, "a", "x", "1")))
    for cut in range(len(good)):
        assert pipeline.fast(good[:cut], good[0], 0x900) is False
    assert pipeline.fast(good + b"\x00", good[0], 0x900) is False  # trailing byte
    pipeline.em.skipping = True
    assert pipeline.fast(good, good[0], 0x900) is False
    pipeline.em.skipping = False
    assert recorder.produced == []
    assert pipeline.fast(good, good[0], 0x900) is True
    assert len(recorder.produced) == 1


def with_markers(rig: Rig) -> Rig:
    """A fresh transaction (no event yet: the first event brings its BEGIN marker)."""
    rig.em.tx = Transaction(78, 0x2000, 0)
    return rig


def test_fast_path_matches_the_careful_path_over_a_whole_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From the first event (BEGIN marker first) over mixed ops: same records in the same
    order, same transaction counts and the same number of outstanding deliveries."""
    messages = [
        Insert(None, REL, row(1, "a", "x", "1.50")),
        Update(None, REL, None, None, row(1, "b", UNCHANGED_TOAST, "2.00")),
        Insert(None, REL, row(2, None, "é", None)),
        Delete(None, REL, "K", row(1, None, None, None)),
    ]
    fast, fast_out = pipeline_with(route_for("d", ("id",)), monkeypatch)
    slow, slow_out = pipeline_with(route_for("d", ("id",)), monkeypatch)
    with_markers(fast)
    with_markers(slow)
    for n, message in enumerate(messages):
        payload = encode(message)
        assert fast.fast(payload, payload[0], 0x2100 + n) is True
        careful(slow, payload, 0x2100 + n)
    assert fast_out.produced[0][0] == "db.transaction"  # the BEGIN marker comes first
    assert len(fast_out.produced) == len(messages) + 1
    assert fast_out.produced == slow_out.produced
    assert fast.em.tx is not None and slow.em.tx is not None
    assert (fast.em.tx.event_count, fast.em.tx.collections) == (4, {"public.t": 4})
    assert (slow.em.tx.event_count, slow.em.tx.collections) == (4, {"public.t": 4})
    assert fast.em.ticket is not None and slow.em.ticket is not None
    assert fast.em.ticket.outstanding == slow.em.ticket.outstanding == 5


def test_fast_path_steps_aside_outside_a_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """No transaction open: nothing produced, and the careful path raises the precise error."""
    pipeline, recorder = pipeline_with(route_for("d", ("id",)), monkeypatch)
    pipeline.em.tx = None
    payload = encode(Insert(None, REL, row(1, "a", "x", "1")))
    assert pipeline.fast(payload, payload[0], 0x900) is False
    assert recorder.produced == []
    with pytest.raises(StreamStateError, match="outside a transaction"):
        careful(pipeline, payload, 0x900)


def test_snapshot_rows_in_short_runs_are_still_served_every_poll_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table's snapshot rows come in many short runs when they are wide (a spooled batch
    is 4 MiB): delivery reports, status updates and stop requests are served every
    POLL_EVERY events across runs, not only within a run that reaches it."""
    route = route_for("d", ("id",))
    rig, recorder = pipeline_with(route, monkeypatch)
    served: list[int] = []
    rig.em.serve = lambda: served.append(len(recorder.produced))  # type: ignore[method-assign]
    body = route.shape.codec.encode_row(row(1, "a", "x", "1.50"))[0]
    runs = 3 * POLL_EVERY // 100 + 1
    for _ in range(runs):
        rig.em.emit_reads(route, [(body, None)] * 100, False, 0x1000)
    assert len(recorder.produced) == runs * 100
    assert served == [POLL_EVERY, 2 * POLL_EVERY, 3 * POLL_EVERY]
