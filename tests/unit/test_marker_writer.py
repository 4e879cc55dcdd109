"""The hand-written BEGIN/END marker encoding equals fastavro's, byte for byte."""

from __future__ import annotations

import copy

import pytest

from producer.marker_writer import MarkerWriter, check_marker_layout
from producer.transactions import Transaction
from schemas.envelope import transaction_key_schema, transaction_metadata_schema
from schemas.wire import AvroEncoder

KEY_ID, VALUE_ID = 3, 70000  # a schema id past one byte, to see the header is written whole


def _references() -> tuple[AvroEncoder, AvroEncoder]:
    return (
        AvroEncoder(transaction_key_schema(), KEY_ID),
        AvroEncoder(transaction_metadata_schema(), VALUE_ID),
    )


@pytest.mark.parametrize(
    ("xid", "commit_lsn", "commit_ts"),
    [(1, 1, 0), (7451, 23456789, 817_000_000_000), (2**32 - 1, 2**40 + 5, -(2**40))],
)
@pytest.mark.parametrize(
    "collections",
    [
        ["public.a"],
        ["public.a", "public.b", "public.a", "db.message"],
        ["ünïcode.tåble"] * 9000,  # counts past one varint byte
        [f"s.t{i}" for i in range(70)],  # more collections than fit one varint byte
    ],
)
def test_markers_equal_fastavro(
    xid: int, commit_lsn: int, commit_ts: int, collections: list[str]
) -> None:
    key_ref, value_ref = _references()
    writer = MarkerWriter(KEY_ID, VALUE_ID)
    tx = Transaction(xid, commit_lsn, commit_ts)
    assert writer.key(tx.encoded) == key_ref.encode(tx.marker_key())
    assert writer.begin(tx.encoded) == value_ref.encode(tx.begin_marker())
    for name in collections:
        tx.next_order(name)
    assert writer.end(tx.encoded, tx.event_count, tx.collections) == value_ref.encode(
        tx.end_marker()
    )
    # the name cache gives the same bytes the second time
    assert writer.end(tx.encoded, tx.event_count, tx.collections) == value_ref.encode(
        tx.end_marker()
    )


def test_an_end_marker_without_collections_is_an_empty_array() -> None:
    _, value_ref = _references()
    tx = Transaction(5, 10, 0)
    expected = value_ref.encode({**tx.end_marker(), "event_count": 0})
    assert MarkerWriter(KEY_ID, VALUE_ID).end(tx.encoded, 0, {}) == expected


def test_a_changed_marker_schema_is_refused() -> None:
    key, value = transaction_key_schema(), transaction_metadata_schema()
    check_marker_layout(key, value)
    moved = copy.deepcopy(value)
    moved["fields"].reverse()
    with pytest.raises(ValueError, match="marker layout"):
        check_marker_layout(key, moved)
    widened = copy.deepcopy(value)
    widened["fields"][2]["type"] = ["null", "int"]
    with pytest.raises(ValueError, match="marker layout"):
        check_marker_layout(key, widened)
