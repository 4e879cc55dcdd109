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
