"""Left-out columns emptied in the values that wait in the pending table (pending_redaction.py)."""

from __future__ import annotations

import io
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas.wire import header
from spark_consumer.lake_options import TableOptions
from spark_consumer.pending_redaction import redact, redaction, zero

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ROW: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.customers",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"]},
        {"name": "ssn", "type": ["null", "string"]},  # nullable: becomes null
        {"name": "salary", "type": DEC},  # NOT NULL decimal: becomes 0
        {"name": "token", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["gold", "iron"]}},
        {"name": "tier2", "type": "shop.public.customers.Tier"},  # a named type, used again
        {"name": "born", "type": {"type": "int", "logicalType": "date"}},
    ],
}
ENVELOPE: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.public.customers",
    "fields": [
        {"name": "before", "type": ["null", ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
    ],
}
SECRET_ROW = {
    "id": 7,
    "name": "Ada",
    "ssn": "078-05-1120",
    "salary": Decimal("123456.78"),
    "token": "6f1c8a52-3f0e-4c2f-9d55-0b3a1f3f8e21",
    "tier": "iron",
    "tier2": "iron",
    "born": 12345,
}
LEFT_OUT = ("ssn", "salary", "token", "tier", "tier2", "born")


def _framed(record: dict[str, Any], schema_id: int = 41) -> bytes:
    out = io.BytesIO()
    out.write(header(schema_id))
    schemaless_writer(out, parse_schema(ENVELOPE), record)
    return out.getvalue()


def _read(value: bytes) -> Any:
    return schemaless_reader(io.BytesIO(value[5:]), parse_schema(ENVELOPE), None)


def test_left_out_fields_are_emptied_on_both_sides_and_the_rest_is_kept() -> None:
    r = redaction(ENVELOPE, TableOptions(except_columns=LEFT_OUT))
    assert r is not None
    value = _framed({"before": SECRET_ROW, "after": {**SECRET_ROW, "name": "Bea"}, "op": "u"})
    out = redact(value, {41: r})
    assert out[:5] == value[:5]  # the same header: the same writer schema id
    got = _read(out)
    for side, name in (("before", "Ada"), ("after", "Bea")):
        assert got[side]["id"] == 7 and got[side]["name"] == name
        assert got[side]["ssn"] is None
        assert got[side]["salary"] == Decimal(0)
        assert str(got[side]["token"]) == "00000000-0000-0000-0000-000000000000"
        assert got[side]["tier"] == "gold" and got[side]["tier2"] == "gold"
        assert got[side]["born"] == date(1970, 1, 1)  # day 0
    assert got["op"] == "u"
    # None of the secret's bytes are left in the body.
    assert b"078-05-1120" in value and b"078-05-1120" not in out


def test_a_kept_columns_list_empties_everything_else() -> None:
    r = redaction(ENVELOPE, TableOptions(columns=("id", "name")))
    assert r is not None
    assert set(r.empties) == set(LEFT_OUT)


def test_a_missing_side_stays_missing() -> None:
    r = redaction(ENVELOPE, TableOptions(except_columns=("ssn",)))
    assert r is not None
    got = _read(redact(_framed({"before": None, "after": SECRET_ROW, "op": "c"}), {41: r}))
    assert got["before"] is None and got["after"]["ssn"] is None
    assert got["after"]["salary"] == SECRET_ROW["salary"]


def test_values_of_other_schemas_are_left_as_they_are() -> None:
    r = redaction(ENVELOPE, TableOptions(except_columns=("ssn",)))
    assert r is not None
    value = _framed({"before": None, "after": SECRET_ROW, "op": "c"}, schema_id=42)
    assert redact(value, {41: r}) is value


def test_a_schema_that_keeps_every_field_needs_no_redaction() -> None:
    assert redaction(ENVELOPE, TableOptions(except_columns=("not_there",))) is None


@pytest.mark.parametrize(
    ("avro_type", "want"),
    [
        ("long", 0),
        (["null", "long"], None),
        (["string", "null"], None),
        ({"type": "fixed", "name": "F", "size": 3}, b"\0\0\0"),
        ({"type": "array", "items": "int"}, []),
        ({"type": "map", "values": "int"}, {}),
        ({"type": "record", "name": "P", "fields": [{"name": "x", "type": "double"}]}, {"x": 0.0}),
        ({"type": "long", "logicalType": "timestamp-micros"}, 0),
    ],
)
def test_zero_of_each_kind_of_type(avro_type: Any, want: Any) -> None:
    assert zero(avro_type, {}) == want


def test_a_body_that_does_not_decode_stops_naming_the_record() -> None:
    r = redaction(ENVELOPE, TableOptions(except_columns=("ssn",)))
    assert r is not None
    with pytest.raises(ValueError, match=r"shop\.public\.customers\[0\]@9 \(writer schema 41\)"):
        redact(header(41) + b"\x02", {41: r}, "shop.public.customers[0]@9")
