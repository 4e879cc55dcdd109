"""Event building from decoded changes: before/after per replica identity, key changes, TOAST,
transaction order and markers; codecs from the real schemas package, no services. Rows and
keys come Avro-encoded: they are decoded here with fastavro to check their contents."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from producer.envelope_writer import TableEnvelopeWriter
from producer.events import (
    RowChange,
    TableShape,
    delete_changes,
    insert_changes,
    key_changed,
    update_changes,
)
from producer.pgoutput import UNCHANGED_TOAST, Column, Delete, Insert, Relation, Update, Value
from producer.transactions import Transaction, pg_ts_to_ms, transaction_id
from schemas.envelope import transaction_metadata_schema
from schemas.relation import build_relation_codec
from schemas.type_catalog import TypeCatalog
from schemas.wire import AvroDecoder, AvroEncoder, header

pytestmark = pytest.mark.unit

INT4, TEXT = 23, 25


def relation(identity: str, key: tuple[str, ...]) -> Relation:
    cols = tuple(
        Column(1 if name in key else 0, name, oid, -1, name in key)
        for name, oid in (("id", INT4), ("code", TEXT), ("val", TEXT))
    )
    return Relation(None, 4242, "public", "t", identity, cols)  # type: ignore[arg-type]


def shape(identity: str, key: tuple[str, ...]) -> TableShape:
    codec = build_relation_codec(relation(identity, key), TypeCatalog(), "db.public.t")
    return TableShape.of(codec, identity)


def tup(*values: Any) -> tuple[Any, ...]:
    return tuple(
        v if v is None or v is UNCHANGED_TOAST else Value(str(v).encode(), False) for v in values
    )


def _decode(schema: Any, body: bytes | None) -> Any:
    if body is None:
        return None
    buf = io.BytesIO(body)
    record = fastavro.schemaless_reader(buf, fastavro.parse_schema(schema), None)
    assert buf.read() == b"", "trailing bytes after the record"
    return record


def as_tuples(changes: Any) -> list[tuple[Any, ...]]:
    codec = DEFAULT.codec
    out = []
    for c in changes:
        assert isinstance(c, RowChange)
        key_schema = {"type": "record", "name": "k", "fields": []}
        if c.key is not None:
            key_schema = next(
                s.codec.key_schema
                for s in (DEFAULT, INDEX, FULL_NO_PK)
                if s.codec.key_schema is not None
                and s.codec.encode_key is not None
                and _fits(s.codec.key_schema, c.key)
            )
        out.append(
            (
                c.op,
                _decode(key_schema, c.key),
                _decode(codec.value_schema, c.before),
                _decode(codec.value_schema, c.after),
                c.unchanged_toast,
            )
        )
    return out


def _fits(schema: Any, body: bytes) -> bool:
    """Does ``body`` decode as exactly one ``schema`` record? (picks the key schema)"""
    buf = io.BytesIO(body)
    try:
        fastavro.schemaless_reader(buf, fastavro.parse_schema(schema), None)
    except (EOFError, ValueError, UnicodeDecodeError, IndexError):
        return False
    return buf.read() == b""


def row(i: Any, code: Any, val: Any) -> dict[str, Any]:
    return {"id": i, "code": code, "val": val}


DEFAULT = shape("d", ("id",))
FULL_PK = shape("f", ("id",))  # what the pipeline builds for FULL with a primary key
FULL_NO_PK = shape("f", ("id", "code", "val"))
INDEX = shape("i", ("code",))
NOTHING = shape("n", ())


def test_insert() -> None:
    assert as_tuples(insert_changes(DEFAULT, Insert(None, 4242, tup(1, "a", None)), 10)) == [
        ("c", {"id": 1}, None, row(1, "a", None), [])
    ]
    assert as_tuples(insert_changes(NOTHING, Insert(None, 4242, tup(1, "a", "x")), 10)) == [
        ("c", None, None, row(1, "a", "x"), [])
    ]


def test_default_update_key_kept_has_no_before() -> None:
    msg = Update(None, 4242, None, None, tup(1, "b", "x"))
    assert as_tuples(update_changes(DEFAULT, msg, 10)) == [
        ("u", {"id": 1}, None, row(1, "b", "x"), [])
    ]


def test_default_key_change_is_delete_then_create() -> None:
    msg = Update(None, 4242, "K", tup(1, None, None), tup(2, "a", "x"))
    assert as_tuples(update_changes(DEFAULT, msg, 10)) == [
        ("d", {"id": 1}, row(1, None, None), None, []),
        ("c", {"id": 2}, row(1, None, None), row(2, "a", "x"), []),  # before: the row it replaces
    ]


def test_old_key_sent_but_equal_is_a_plain_update() -> None:
    # PostgreSQL also logs the old key when a key column is TOASTed; that is no key change.
    msg = Update(None, 4242, "K", tup(1, None, None), tup(1, "a", "y"))
    assert as_tuples(update_changes(DEFAULT, msg, 10)) == [
        ("u", {"id": 1}, None, row(1, "a", "y"), [])
    ]


def test_full_update_has_whole_before_and_splits_pk_change() -> None:
    same = Update(None, 4242, "O", tup(1, "a", "x"), tup(1, "a", "y"))
    assert as_tuples(update_changes(FULL_PK, same, 10)) == [
        ("u", {"id": 1}, row(1, "a", "x"), row(1, "a", "y"), [])
    ]
    moved = Update(None, 4242, "O", tup(1, "a", "x"), tup(2, "a", "x"))
    assert as_tuples(update_changes(FULL_PK, moved, 10)) == [
        ("d", {"id": 1}, row(1, "a", "x"), None, []),
        ("c", {"id": 2}, row(1, "a", "x"), row(2, "a", "x"), []),
    ]


def test_full_without_pk_keeps_updates_keyed_by_the_old_row() -> None:
    msg = Update(None, 4242, "O", tup(1, "a", "x"), tup(1, "a", "y"))
    assert as_tuples(update_changes(FULL_NO_PK, msg, 10)) == [
        ("u", row(1, "a", "x"), row(1, "a", "x"), row(1, "a", "y"), [])
    ]


def test_index_identity_before_is_index_columns() -> None:
    msg = Delete(None, 4242, "K", tup(None, "a", None))
    assert as_tuples(delete_changes(INDEX, msg, 10)) == [
        ("d", {"code": "a"}, row(None, "a", None), None, [])
    ]
    moved = Update(None, 4242, "K", tup(None, "a", None), tup(1, "b", "x"))
    assert [c.op for c in update_changes(INDEX, moved, 10)] == ["d", "c"]


def test_unchanged_toast_listed_and_null() -> None:
    msg = Update(None, 4242, None, None, tup(1, "a", UNCHANGED_TOAST))
    (change,) = update_changes(DEFAULT, msg, 10)
    assert _decode(DEFAULT.codec.value_schema, change.after) == row(1, "a", None)
    assert change.unchanged_toast == ["val"]
    writer = TableEnvelopeWriter(
        DEFAULT.codec.envelope_schema, 1, version="0", prefix="db", db="db", schema="public",
        table="t",
    )  # fmt: skip
    tx = Transaction(5, 10, 0)
    value = writer.encode("u", None, change.after, tx.encoded, 9, 5, 1, 1, change.unchanged_toast)
    env = AvroDecoder(DEFAULT.codec.envelope_schema).decode(value)
    assert env["unchanged_toast"] == ["val"]
    assert env["after"] == row(1, "a", None)


def test_full_identity_unchanged_toast_comes_from_the_old_row() -> None:
    # FULL sends the whole old row, detoasted: the value left out of the new tuple is in it,
    # so `after` is the whole new row and nothing is listed (readers that ignore
    # unchanged_toast, like Flink, must not see NULL there).
    msg = Update(None, 4242, "O", tup(1, "a", "big old value"), tup(1, "b", UNCHANGED_TOAST))
    assert as_tuples(update_changes(FULL_PK, msg, 10)) == [
        ("u", {"id": 1}, row(1, "a", "big old value"), row(1, "b", "big old value"), [])
    ]
    assert as_tuples(update_changes(FULL_NO_PK, msg, 10)) == [
        (
            "u",
            row(1, "a", "big old value"),
            row(1, "a", "big old value"),
            row(1, "b", "big old value"),
            [],
        )
    ]
    # A key change splits into delete + create; the create's row is whole too.
    moved = Update(None, 4242, "O", tup(1, "a", "big"), tup(2, UNCHANGED_TOAST, UNCHANGED_TOAST))
    assert as_tuples(update_changes(FULL_PK, moved, 10)) == [
        ("d", {"id": 1}, row(1, "a", "big"), None, []),
        ("c", {"id": 2}, row(1, "a", "big"), row(2, "a", "big"), []),
    ]


def test_key_only_old_tuple_never_fills_unchanged_toast() -> None:
    # 'K' (DEFAULT / USING INDEX) has nulls outside the key: those are not the old values.
    moved = Update(None, 4242, "K", tup(1, None, None), tup(2, "a", UNCHANGED_TOAST))
    assert as_tuples(update_changes(DEFAULT, moved, 10)) == [
        ("d", {"id": 1}, row(1, None, None), None, []),
        ("c", {"id": 2}, row(1, None, None), row(2, "a", None), ["val"]),
    ]


def test_old_row_without_the_value_keeps_it_listed() -> None:
    # Never invent: if the old row lacks the value too, the column stays unchanged-TOAST.
    msg = Update(None, 4242, "O", tup(1, "a", UNCHANGED_TOAST), tup(1, "b", UNCHANGED_TOAST))
    (change,) = update_changes(FULL_PK, msg, 10)
    assert _decode(FULL_PK.codec.value_schema, change.after) == row(1, "b", None)
    assert change.unchanged_toast == ["val"]


def test_toasted_key_column_taken_from_old_tuple() -> None:
    msg = Update(None, 4242, "K", tup(None, "a", None), tup(1, UNCHANGED_TOAST, "y"))
    (change,) = update_changes(INDEX, msg, 10)
    assert INDEX.codec.key_schema is not None
    assert change.op == "u" and _decode(INDEX.codec.key_schema, change.key) == {"code": "a"}
    assert change.unchanged_toast == ["code"]


def test_key_changed_ignores_unchanged_toast() -> None:
    assert not key_changed((0,), tup(1, None, None), tup(UNCHANGED_TOAST, "a", "b"))
    assert key_changed((0,), tup(1, None, None), tup(2, "a", "b"))


def test_shape_split_rules() -> None:
    assert DEFAULT.split_key_changes and FULL_PK.split_key_changes and INDEX.split_key_changes
    assert not FULL_NO_PK.split_key_changes and not NOTHING.split_key_changes
    assert not NOTHING.keyed


def test_transaction_order_and_markers() -> None:
    tx = Transaction(7451, 23456789, 0)
    assert tx.id == transaction_id(7451, 23456789) == "7451:23456789"
    assert tx.commit_ts_ms == pg_ts_to_ms(0) == 946_684_800_000
    orders = [tx.next_order(c) for c in ("public.a", "public.b", "public.a", "db.message")]
    assert [(o.total_order, o.data_collection_order) for o in orders] == [
        (1, 1), (2, 1), (3, 2), (4, 1)
    ]  # fmt: skip
    assert tx.block(orders[2]) == {
        "id": "7451:23456789",
        "total_order": 3,
        "data_collection_order": 2,
    }
    begin, end = tx.begin_marker(), tx.end_marker()
    assert begin["status"] == "BEGIN" and begin["event_count"] is None
    assert end == {
        "status": "END",
        "id": "7451:23456789",
        "event_count": 4,
        "data_collections": [
            {"data_collection": "public.a", "event_count": 2},
            {"data_collection": "public.b", "event_count": 1},
            {"data_collection": "db.message", "event_count": 1},
        ],
        "ts_ms": 946_684_800_000,
        "commit_lsn": 23456789,
    }


def test_envelopes_encode_with_the_registered_schema() -> None:
    codec = DEFAULT.codec
    source = {
        "version": "0", "connector": "postgresql", "name": "db", "ts_ms": 1, "snapshot": "false",
        "db": "db", "sequence": None, "schema": "public", "table": "t", "txId": 5, "lsn": 9,
        "commit_lsn": 10, "xmin": None,
    }  # fmt: skip
    (change,) = insert_changes(DEFAULT, Insert(None, 4242, tup(1, "a", None)), 9)
    tx = Transaction(5, 10, 0)
    order = tx.next_order("public.t")
    block = tx.block(order)
    writer = TableEnvelopeWriter(
        codec.envelope_schema, 77, version="0", prefix="db", db="db", schema="public", table="t"
    )
    encoded = writer.encode(
        change.op, change.before, change.after, tx.encoded, 9, 123, order.total_order,
        order.data_collection_order, change.unchanged_toast,
    )  # fmt: skip
    assert encoded[:5] == b"\x00\x00\x00\x00\x4d"
    assert AvroDecoder(codec.envelope_schema).decode(encoded) == {
        "before": None, "after": row(1, "a", None),
        "source": {**source, "ts_ms": tx.commit_ts_ms}, "op": "c", "ts_ms": 123,
        "transaction": block, "unchanged_toast": [],
    }  # fmt: skip
    assert codec.key_schema is not None and change.key is not None
    key = header(1) + change.key
    assert AvroDecoder(codec.key_schema).decode(key) == {"id": 1}
    marker = AvroEncoder(transaction_metadata_schema(), 1).encode(tx.end_marker())
    assert AvroDecoder(transaction_metadata_schema()).decode(marker) == tx.end_marker()


@pytest.mark.parametrize(
    ("xid", "commit_lsn", "commit_ts"),
    [(1, 0, 0), (4_000_000_000, 2**63 - 1, -946_684_800_000_000), (77, 0x16B3748, 817_000_123_456)],
)
def test_a_transactions_inlined_id_and_timestamp_are_the_contracts(
    xid: int, commit_lsn: int, commit_ts: int
) -> None:
    """Transaction builds its id and commit milliseconds inline (the hot path): they must stay
    what transaction_id and pg_ts_to_ms, the contract's homes, give."""
    tx = Transaction(xid, commit_lsn, commit_ts)
    assert tx.id == transaction_id(xid, commit_lsn)
    assert tx.commit_ts_ms == pg_ts_to_ms(commit_ts)
