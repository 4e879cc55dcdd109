"""Relation codecs: schemas derived from a Relation, row/key conversion, envelope encoding."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from producer.pgoutput.messages import Column, Relation
from producer.pgoutput.tuples import UNCHANGED_TOAST, Value
from schemas.envelope import (
    envelope_record,
    heartbeat_schema,
    message_envelope_schema,
    message_key_schema,
    schema_text,
    topic_namespace,
    transaction_key_schema,
    transaction_metadata_schema,
)
from schemas.errors import ConversionError
from schemas.relation import UnmappedColumnLog, build_relation_codec
from schemas.type_catalog import PgType, TypeCatalog, TypeKind
from schemas.wire import AvroDecoder, AvroEncoder, split_frame

pytestmark = pytest.mark.unit

MOOD = 80_001
COLUMNS = (
    Column(1, "id", 20, -1, True),
    Column(0, "note", 25, -1, False),
    Column(0, "amount", 1700, ((12 << 16) | 2) + 4, False),
    Column(0, "tags", 1009, -1, False),
    Column(0, "mood", MOOD, -1, False),
    Column(0, "span", 1186, -1, False),
    Column(0, "pause", 1186, -1, False),
)
SOURCE = {
    "version": "0.1.0", "connector": "postgresql", "name": "db", "ts_ms": 1, "snapshot": "false",
    "db": "db", "sequence": None, "schema": "public", "table": "orders", "txId": 7, "lsn": 100,
    "commit_lsn": 200, "xmin": None,
}  # fmt: skip


def catalog() -> TypeCatalog:
    return TypeCatalog([PgType(MOOD, "public", "mood", TypeKind.ENUM, labels=("sad", "happy"))])


def relation(columns: tuple[Column, ...] = COLUMNS, name: str = "orders") -> Relation:
    return Relation(None, 16_384, "public", name, "d", columns)


def row_values() -> tuple[Any, ...]:
    return (
        Value(b"42", False),
        Value("😀 ".encode(), False),
        Value(b"-10.50", False),
        Value(b'{a,NULL,"b c"}', False),
        Value(b"happy", False),
        Value(b"1 mon 2 days", False),
        None,
    )


def encode_decode(codec: Any, record: dict[str, Any]) -> Any:
    encoder = AvroEncoder(codec.envelope_schema, 17)
    message = encoder.encode(record)
    assert split_frame(message)[0] == 17 and message[:5] == b"\x00\x00\x00\x00\x11"
    return AvroDecoder(codec.envelope_schema).decode(message)


def test_same_relation_gives_the_same_schema_text() -> None:
    a = build_relation_codec(
        relation(), catalog(), "db.public.orders", unchanged_toast=UNCHANGED_TOAST
    )
    b = build_relation_codec(
        relation(), catalog(), "db.public.orders", unchanged_toast=UNCHANGED_TOAST
    )
    assert schema_text(a.envelope_schema) == schema_text(b.envelope_schema)
    assert a.key_schema is not None and schema_text(a.key_schema) == schema_text(b.key_schema or {})


def test_schema_names_follow_the_topic() -> None:
    codec = build_relation_codec(relation(), catalog(), "my-db.public.1orders")
    assert topic_namespace("my-db.public.1orders") == "my_db.public._1orders"
    assert codec.envelope_schema["name"] == "my_db.public._1orders.Envelope"
    assert codec.value_schema["name"] == "my_db.public._1orders.Value"
    assert codec.key_schema is not None and codec.key_schema["name"] == "my_db.public._1orders.Key"
    assert [f["name"] for f in codec.key_schema["fields"]] == ["id"]


def test_envelope_matches_the_contract_fields() -> None:
    codec = build_relation_codec(relation(), catalog(), "db.public.orders")
    names = [f["name"] for f in codec.envelope_schema["fields"]]
    assert names == ["before", "after", "source", "op", "ts_ms", "transaction", "unchanged_toast"]
    source = codec.envelope_schema["fields"][2]["type"]
    assert [f["name"] for f in source["fields"]] == [
        "version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "schema", "table",
        "txId", "lsn", "commit_lsn", "xmin",
    ]  # fmt: skip
    assert codec.envelope_schema["fields"][6]["default"] == []


def test_row_converts_encodes_and_decodes() -> None:
    codec = build_relation_codec(relation(), catalog(), "db.public.orders")
    row, toast = codec.convert_row(row_values())
    assert toast == []
    record = envelope_record(codec.value_schema["name"], "c", None, row, SOURCE, 5, None, toast)
    decoded = encode_decode(codec, record)
    after = decoded["after"]
    assert after["id"] == 42 and after["note"] == "😀 " and str(after["amount"]) == "-10.50"
    assert after["tags"] == ["a", None, "b c"]
    assert after["mood"] == "happy"
    assert after["span"] == {"months": 1, "days": 2, "micros": 0}
    assert after["pause"] is None
    assert decoded["before"] is None and decoded["op"] == "c"


def test_unchanged_toast_is_listed_not_passed_off_as_a_value() -> None:
    codec = build_relation_codec(
        relation(), catalog(), "db.public.orders", unchanged_toast=UNCHANGED_TOAST
    )
    values = list(row_values())
    values[1] = UNCHANGED_TOAST
    row, toast = codec.convert_row(values)
    assert toast == ["note"]
    decoded = encode_decode(
        codec,
        envelope_record(codec.value_schema["name"], "u", None, row, SOURCE, None, None, toast),
    )
    assert decoded["unchanged_toast"] == ["note"]


def test_key_comes_from_replica_identity_columns() -> None:
    codec = build_relation_codec(relation(), catalog(), "db.public.orders")
    assert codec.convert_key is not None
    key_only = (Value(b"7", False), None, None, None, None, None, None)  # an old 'K' tuple
    assert codec.convert_key(key_only) == {"id": 7}
    with pytest.raises(ConversionError, match="unchanged TOAST"):
        codec.convert_key((UNCHANGED_TOAST, *key_only[1:]), lsn=5)


def test_table_without_replica_identity_has_no_key() -> None:
    columns = tuple(Column(0, c.name, c.type_oid, c.type_modifier, False) for c in COLUMNS)
    codec = build_relation_codec(relation(columns), catalog(), "db.public.orders")
    assert codec.key_schema is None and codec.convert_key is None


def test_conversion_error_names_table_column_type_value_and_lsn() -> None:
    codec = build_relation_codec(relation(), catalog(), "db.public.orders")
    values = list(row_values())
    values[2] = Value(b"12abc", False)
    with pytest.raises(ConversionError) as info:
        codec.convert_row(values, lsn=123_456)
    err = info.value
    assert (err.table, err.column, err.pg_type, err.raw, err.lsn) == (
        "public.orders",
        "amount",
        "numeric(12,2)",
        b"12abc",
        123_456,
    )
    assert "public.orders.amount" in str(err) and "12abc" in str(err) and "123456" in str(err)


def test_wrong_tuple_width_is_an_error() -> None:
    codec = build_relation_codec(relation(), catalog(), "db.public.orders")
    with pytest.raises(ConversionError, match="7"):
        codec.convert_row(row_values()[:3])


def test_unmapped_column_is_reported_once() -> None:
    reports: list[str] = []
    log = UnmappedColumnLog(reports.append)
    columns = (*COLUMNS, Column(0, "tx", 28, -1, False))  # xid: no mapping
    for _ in range(3):
        codec = build_relation_codec(
            relation(columns), catalog(), "db.public.orders", on_unmapped=log
        )
    assert len(reports) == 1 and "public.orders.tx" in reports[0] and "xid" in reports[0]
    field = codec.value_schema["fields"][-1]
    assert field["pg.unmapped"] is True and field["pg.type"] == "xid"


def test_columns_with_awkward_names_keep_the_original_name() -> None:
    columns = (Column(1, "Order ID", 20, -1, True), Column(0, "order_id", 20, -1, False))
    codec = build_relation_codec(relation(columns), catalog(), "db.public.orders")
    fields = codec.value_schema["fields"]
    assert [f["name"] for f in fields] == ["Order_ID", "order_id"]
    assert fields[0]["pg.name"] == "Order ID" and "pg.name" not in fields[1]
    row, _ = codec.convert_row((Value(b"1", False), Value(b"2", False)))
    assert row == {"Order_ID": 1, "order_id": 2}


def _round_trip(schema: dict[str, Any], datum: dict[str, Any]) -> Any:
    parsed = fastavro.parse_schema(schema)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, datum)
    return fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), parsed, None)


def test_transaction_marker_heartbeat_and_message_schemas_encode() -> None:
    end = {
        "status": "END", "id": "7451:23456789", "event_count": 3,
        "data_collections": [{"data_collection": "public.orders", "event_count": 3}],
        "ts_ms": 1, "commit_lsn": 23_456_789,
    }  # fmt: skip
    assert _round_trip(transaction_metadata_schema(), end) == end
    begin = {**end, "status": "BEGIN", "event_count": None, "data_collections": None}
    assert _round_trip(transaction_metadata_schema(), begin) == begin
    assert _round_trip(transaction_key_schema(), {"id": "1:2"}) == {"id": "1:2"}
    assert _round_trip(heartbeat_schema(), {"ts_ms": 1, "lsn": 2}) == {"ts_ms": 1, "lsn": 2}
    assert _round_trip(message_key_schema(), {"prefix": "p"}) == {"prefix": "p"}
    message = {
        "op": "m",
        "ts_ms": None,
        "source": SOURCE,
        "message": {"prefix": "p", "content": b"\x00x"},
        "transaction": None,
    }
    assert _round_trip(message_envelope_schema("db.message"), message) == message
    assert transaction_metadata_schema()["name"] == "io.walbridge.TransactionMetadata"
