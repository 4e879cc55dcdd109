"""The hand-written envelope encoder matches fastavro byte for byte (rows, nulls, TOAST lists,
big and negative longs, one writer across transactions and milliseconds), and refuses an
envelope layout it does not know."""

from __future__ import annotations

import copy
import io
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.envelope_writer import TableEnvelopeWriter, TransactionBytes, long_bytes
from producer.pgoutput import Column, Relation, Value
from schemas.envelope import envelope_record
from schemas.relation import build_relation_codec
from schemas.type_catalog import TypeCatalog
from schemas.wire import AvroEncoder

pytestmark = pytest.mark.unit

COLS = (("id", 20), ("name", 25), ("price", 1700), ("tags", 1009), ("active", 16))
REL = Relation(
    None, 1, "public", "t", "d",
    tuple(Column(1 if n == "id" else 0, n, oid, -1, n == "id") for n, oid in COLS),
)  # fmt: skip
CODEC = build_relation_codec(REL, TypeCatalog(), "db.public.t")


def reference(
    op: str, before: Any, after: Any, xid: int, commit_lsn: int, commit_ts: int, lsn: int,
    ts_ms: int, total: int, dco: int, toast: list[str],
) -> bytes:  # fmt: skip
    source = {
        "version": "1.2.3", "connector": "postgresql", "name": "db", "ts_ms": commit_ts,
        "snapshot": "false", "db": "wal bridge", "sequence": None, "schema": "public",
        "table": "t", "txId": xid, "lsn": lsn, "commit_lsn": commit_lsn, "xmin": None,
    }  # fmt: skip
    block = {"id": f"{xid}:{commit_lsn}", "total_order": total, "data_collection_order": dco}
    datum = envelope_record(
        CODEC.value_schema["name"], op, before, after, source, ts_ms, block, toast
    )
    return AvroEncoder(CODEC.envelope_schema, 42).encode(datum)


def row_body(row: dict[str, Any] | None) -> bytes | None:
    """A row record's Avro body, as the compiled row encoder gives it (checked elsewhere)."""
    if row is None:
        return None
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(CODEC.value_schema), row)
    return buf.getvalue()


def new_writer() -> TableEnvelopeWriter:
    return TableEnvelopeWriter(
        CODEC.envelope_schema, 42, version="1.2.3", prefix="db", db="wal bridge",
        schema="public", table="t",
    )  # fmt: skip


def ours(
    op: str, before: Any, after: Any, xid: int, commit_lsn: int, commit_ts: int, lsn: int,
    ts_ms: int, total: int, dco: int, toast: list[str], writer: TableEnvelopeWriter | None = None,
) -> bytes:  # fmt: skip
    tx = TransactionBytes(xid, commit_lsn, commit_ts, f"{xid}:{commit_lsn}")
    return (writer or new_writer()).encode(
        op, row_body(before), row_body(after), tx, lsn, ts_ms, total, dco, toast
    )


ROW = CODEC.convert_row(
    tuple(Value(v.encode(), False) for v in ("7", "ä-name", "12.34", '{a,NULL,"b c"}', "t"))
)[0]


@pytest.mark.parametrize(
    ("op", "before", "after", "toast"),
    [
        ("c", None, ROW, []),
        ("u", None, {**ROW, "name": None}, ["name"]),
        ("u", ROW, ROW, ["name", "tags"]),
        ("d", {"id": 7, "name": None, "price": None, "tags": None, "active": None}, None, []),
        ("t", None, None, []),
    ],
)
def test_matches_fastavro(op: str, before: Any, after: Any, toast: list[str]) -> None:
    args = (
        op,
        before,
        after,
        123456,
        2**40 + 5,
        1_700_000_000_123,
        2**40 + 1,
        1_700_000_000_999,
        3,
        2,
        toast,
    )
    assert ours(*args) == reference(*copy.deepcopy(args))


@given(
    st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1), st.integers(-(2**62), 2**62),
    st.integers(1, 2**40), st.integers(1, 2**40),
)  # fmt: skip
def test_longs_match_fastavro(xid: int, lsn: int, ts: int, total: int, dco: int) -> None:
    args: tuple[Any, ...] = ("c", None, ROW, xid, lsn, ts, lsn, ts, total, dco, [])
    assert ours(*args) == reference(*args)


def test_one_writer_across_transactions_ops_and_milliseconds() -> None:
    """The writer caches per-transaction, per-op and per-millisecond parts: they must follow."""
    writer = new_writer()
    events = [
        ("c", None, ROW, 1, 100, 5_000, 90, 1_000, 1, 1, []),
        ("c", None, ROW, 1, 100, 5_000, 91, 1_000, 2, 2, []),
        ("d", ROW, None, 1, 100, 5_000, 92, 1_001, 3, 3, ["tags"]),
        ("u", ROW, ROW, 2, 200, 6_000, 190, 1_001, 1, 1, []),
        ("c", None, ROW, 2, 200, 6_000, 191, 999, 2, 2, []),
    ]
    for args in events:
        assert ours(*args, writer=writer) == reference(*copy.deepcopy(args))  # type: ignore[misc]


def test_long_bytes_known_values() -> None:
    assert long_bytes(0) == b"\x00"
    assert long_bytes(-1) == b"\x01"
    assert long_bytes(1) == b"\x02"
    assert long_bytes(64) == b"\x80\x01"
    assert long_bytes(8191) == b"\xfe\x7f"  # from the small-value table
    assert long_bytes(16383) == b"\xfe\xff\x01"  # last table entry
    assert long_bytes(16384) == b"\x80\x80\x02"  # first computed one
    assert long_bytes(-(2**63)) == b"\xff" * 9 + b"\x01"


def test_unknown_layout_is_refused() -> None:
    bad = copy.deepcopy(CODEC.envelope_schema)
    bad["fields"] = bad["fields"][1:]
    with pytest.raises(ValueError, match="unexpected envelope fields"):
        TableEnvelopeWriter(bad, 1, version="v", prefix="p", db="d", schema="s", table="t")


# --- encode_image: the fast path's one-image form of encode ------------------------------------

IMAGE_OPS = st.sampled_from(["c", "u", "d"])
TOAST_NAMES = st.lists(st.sampled_from(["name", "tags", "ä"]), max_size=3)


def image_args(op: str, row: bytes, *rest: Any) -> tuple[Any, ...]:
    """encode's arguments for the event encode_image(op, row, ...) stands for."""
    before, after = (row, None) if op == "d" else (None, row)
    return (op, before, after, *rest)


@given(
    IMAGE_OPS, st.binary(max_size=40), st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1),
    st.integers(-(2**62), 2**62), st.integers(0, 2**63 - 1), st.integers(-(2**62), 2**62),
    st.integers(1, 2**40), st.integers(1, 2**40), TOAST_NAMES,
)  # fmt: skip
def test_encode_image_is_encode(
    op: str, row: bytes, xid: int, commit_lsn: int, commit_ts: int, lsn: int, ts: int,
    total: int, dco: int, toast: list[str],
) -> None:  # fmt: skip
    tx = TransactionBytes(xid, commit_lsn, commit_ts, f"{xid}:{commit_lsn}")
    fast = new_writer().encode_image(op, row, tx, lsn, ts, total, dco, list(toast))
    careful = new_writer().encode(*image_args(op, row, tx, lsn, ts, total, dco, list(toast)))
    assert fast == careful


@given(
    st.lists(
        st.tuples(IMAGE_OPS, st.booleans(), st.integers(0, 3), st.integers(0, 2), TOAST_NAMES),
        min_size=1,
        max_size=30,
    )
)
def test_encode_image_and_encode_interleaved_on_one_writer(
    events: list[tuple[str, bool, int, int, list[str]]],
) -> None:
    """Both methods share the writer's per-transaction, per-op and per-millisecond caches: any
    interleaving, across transactions and milliseconds, gives what a fresh writer gives."""
    shared = new_writer()
    txs = [TransactionBytes(x, 1000 * x, 7 * x, f"{x}:{1000 * x}") for x in range(4)]
    for n, (op, fast, tx_index, ms, toast) in enumerate(events, start=1):
        row = bytes([n % 256]) * (n % 5)
        rest = (txs[tx_index], 5000 + n, 1_700_000_000_000 + ms, n, n, toast)
        expected = new_writer().encode(*image_args(op, row, *rest))
        if fast:
            assert shared.encode_image(op, row, *rest) == expected
        else:
            assert shared.encode(*image_args(op, row, *rest)) == expected


def test_encode_image_matches_fastavro() -> None:
    body = row_body(ROW)
    assert body is not None
    tx = TransactionBytes(123456, 2**40 + 5, 1_700_000_000_123, f"123456:{2**40 + 5}")
    for op in ("c", "u", "d"):
        before, after = (ROW, None) if op == "d" else (None, ROW)
        args = (op, before, after, 123456, 2**40 + 5, 1_700_000_000_123, 2**40 + 1,
                1_700_000_000_999, 3, 2, ["name"])  # fmt: skip
        fast = new_writer().encode_image(op, body, tx, 2**40 + 1, 1_700_000_000_999, 3, 2, ["name"])
        assert fast == reference(*copy.deepcopy(args))


@pytest.mark.parametrize(
    "lsn",
    [0, 1, 2**13 - 1, 2**13, 2**27 - 1, 2**27, 2**27 + 1, 2**33 + 12345, 2**41 - 1, 2**41,
     2**41 + 1, 2**63 - 1],
)  # fmt: skip
def test_encode_image_lsn_around_the_inlined_range(lsn: int) -> None:
    tx = TransactionBytes(9, 2**35, 1_700_000_000_000, f"9:{2**35}")
    for op in ("c", "d"):
        fast = new_writer().encode_image(op, b"row", tx, lsn, 5, 1, 1, [])
        assert fast == new_writer().encode(*image_args(op, b"row", tx, lsn, 5, 1, 1, []))
        assert long_bytes(lsn) in fast


@given(
    IMAGE_OPS, st.binary(max_size=40), st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(-(2**62), 2**62),
    st.integers(1, 2**40), st.integers(1, 2**40),
)  # fmt: skip
def test_image_parts_around_a_row_and_its_orders_are_encode_image(
    op: str, row: bytes, xid: int, commit_lsn: int, commit_ts: int, lsn: int, ts: int,
    total: int, dco: int,
) -> None:  # fmt: skip
    """The snapshot's run of rows (EventEmitter.emit_reads) joins these parts per row."""
    tx = TransactionBytes(xid, commit_lsn, commit_ts, f"{xid}:{commit_lsn}")
    writer = new_writer()
    lead, middle, tail = writer.image_parts(op, tx, lsn, ts)
    joined = lead + row + middle + long_bytes(total) + long_bytes(dco) + tail
    assert joined == new_writer().encode_image(op, row, tx, lsn, ts, total, dco, [])
    assert joined == writer.encode_image(op, row, tx, lsn, ts, total, dco, [])  # caches agree
