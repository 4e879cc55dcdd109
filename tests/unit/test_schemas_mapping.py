"""Type mapping: every type of issue 4's table maps losslessly, with the agreed Avro form."""

from __future__ import annotations

import json

import fastavro
import pytest

from schemas.type_catalog import Attribute, PgType, TypeCatalog, TypeKind
from schemas.type_mapping import (
    INTERVAL_RECORD,
    MappingContext,
    field_names,
    field_schema,
    format_pg_type,
    map_type,
    numeric_typmod,
)

pytestmark = pytest.mark.unit

MOOD, POSINT, ADDRESS, CITEXT, HSTORE, FLOATRANGE = 70001, 70002, 70003, 70004, 70005, 70006
MOOD_ARRAY, ADDRESS_ARRAY = 70011, 70013


def numeric_mod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def catalog() -> TypeCatalog:
    return TypeCatalog(
        [
            PgType(MOOD, "public", "mood", TypeKind.ENUM, labels=("sad", "ok", "happy")),
            PgType(MOOD_ARRAY, "public", "_mood", TypeKind.ARRAY, element_oid=MOOD),
            PgType(POSINT, "public", "posint", TypeKind.DOMAIN, base_oid=23),
            PgType(
                ADDRESS,
                "public",
                "address",
                TypeKind.COMPOSITE,
                attributes=(
                    Attribute("street", 25, -1),
                    Attribute("zip code", 1043, 14),
                    Attribute("since", 1082, -1),
                ),
            ),
            PgType(ADDRESS_ARRAY, "public", "_address", TypeKind.ARRAY, element_oid=ADDRESS),
            PgType(CITEXT, "public", "citext", TypeKind.BASE),
            PgType(HSTORE, "public", "hstore", TypeKind.BASE),
            PgType(FLOATRANGE, "public", "floatrange", TypeKind.RANGE, subtype_oid=701),
        ]
    )


# (oid, typmod) -> (expected non-null Avro type, expected pg.type)
EXPECTED = {
    "bool": (16, -1, "boolean", "boolean"),
    "int2": (21, -1, "int", "smallint"),
    "int4": (23, -1, "int", "integer"),
    "int8": (20, -1, "long", "bigint"),
    "oid": (26, -1, "long", "oid"),
    "float4": (700, -1, "float", "real"),
    "float8": (701, -1, "double", "double precision"),
    "numeric(12,2)": (
        1700,
        numeric_mod(12, 2),
        [{"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}, "string"],
        "numeric(12,2)",
    ),
    "numeric": (1700, -1, "string", "numeric"),
    "money": (790, -1, "string", "money"),
    "char": (18, -1, "string", '"char"'),
    "bpchar": (1042, 9, "string", "character(5)"),
    "varchar": (1043, 14, "string", "character varying(10)"),
    "text": (25, -1, "string", "text"),
    "name": (19, -1, "string", "name"),
    "citext": (CITEXT, -1, "string", "public.citext"),
    "bytea": (17, -1, "bytes", "bytea"),
    "uuid": (2950, -1, {"type": "string", "logicalType": "uuid"}, "uuid"),
    "json": (114, -1, "string", "json"),
    "jsonb": (3802, -1, "string", "jsonb"),
    "xml": (142, -1, "string", "xml"),
    "date": (1082, -1, [{"type": "int", "logicalType": "date"}, "string"], "date"),
    "time": (
        1083,
        -1,
        [{"type": "long", "logicalType": "time-micros"}, "string"],
        "time without time zone",
    ),
    "timetz": (1266, -1, "string", "time with time zone"),
    "timestamp": (
        1114,
        -1,
        [{"type": "long", "logicalType": "local-timestamp-micros"}, "string"],
        "timestamp without time zone",
    ),
    "timestamptz(3)": (
        1184,
        3,
        [{"type": "long", "logicalType": "timestamp-micros"}, "string"],
        "timestamp(3) with time zone",
    ),
    "inet": (869, -1, "string", "inet"),
    "cidr": (650, -1, "string", "cidr"),
    "macaddr": (829, -1, "string", "macaddr"),
    "macaddr8": (774, -1, "string", "macaddr8"),
    "bit": (1560, 3, "string", "bit(3)"),
    "varbit": (1562, 8, "string", "bit varying(8)"),
    "tsvector": (3614, -1, "string", "tsvector"),
    "tsquery": (3615, -1, "string", "tsquery"),
    "point": (600, -1, "string", "point"),
    "line": (628, -1, "string", "line"),
    "lseg": (601, -1, "string", "lseg"),
    "box": (603, -1, "string", "box"),
    "path": (602, -1, "string", "path"),
    "polygon": (604, -1, "string", "polygon"),
    "circle": (718, -1, "string", "circle"),
    "int4range": (3904, -1, "string", "int4range"),
    "int8range": (3926, -1, "string", "int8range"),
    "numrange": (3906, -1, "string", "numrange"),
    "tsrange": (3908, -1, "string", "tsrange"),
    "tstzrange": (3910, -1, "string", "tstzrange"),
    "daterange": (3912, -1, "string", "daterange"),
    "pg_lsn": (3220, -1, "string", "pg_lsn"),
    "hstore": (HSTORE, -1, {"type": "map", "values": ["null", "string"]}, "public.hstore"),
    "enum": (MOOD, -1, {"type": "string", "pg.enum.labels": ["sad", "ok", "happy"]}, "public.mood"),
    "domain": (POSINT, -1, "int", "public.posint"),
    "floatrange": (FLOATRANGE, -1, "string", "public.floatrange"),
}


@pytest.mark.parametrize("label", sorted(EXPECTED))
def test_builtin_and_learned_types_map_as_documented(label: str) -> None:
    oid, typmod, avro, pg_type = EXPECTED[label]
    mapping = map_type(MappingContext(catalog(), "db.public.t"), oid, typmod, "Value_c")
    assert mapping.mapped
    assert mapping.avro == avro
    assert mapping.pg_type == pg_type


@pytest.mark.parametrize("label", sorted(EXPECTED))
def test_every_mapping_is_a_valid_nullable_avro_field(label: str) -> None:
    oid, typmod, _avro, _pg = EXPECTED[label]
    mapping = map_type(MappingContext(catalog(), "db.public.t"), oid, typmod, "Value_c")
    field = field_schema("c", "c", mapping)
    assert field["type"][0] == "null" and field["default"] is None
    fastavro.parse_schema({"type": "record", "name": "R", "fields": [field]})


def test_interval_is_a_shared_named_record_defined_once() -> None:
    ctx = MappingContext(catalog(), "db.public.t")
    first = map_type(ctx, 1186, -1, "Value_a")
    second = map_type(ctx, 1186, -1, "Value_b")
    assert first.avro["name"] == INTERVAL_RECORD
    assert [f["name"] for f in first.avro["fields"]] == ["months", "days", "micros"]
    assert second.avro == INTERVAL_RECORD


def test_array_is_a_plain_array_or_a_dims_bounds_elements_record_with_nullable_elements() -> None:
    mapping = map_type(MappingContext(catalog(), "db.public.t"), 1009, -1, "Value_tags")
    assert mapping.pg_type == "text[]"
    plain, record = mapping.avro
    assert plain == {"type": "array", "items": ["null", "string"]}
    assert record["name"] == "db.public.t.Value_tags"
    assert record["fields"] == [
        {"name": "dims", "type": {"type": "array", "items": "int"}},
        {"name": "lower_bounds", "type": {"type": "array", "items": "int"}},
        {"name": "elements", "type": {"type": "array", "items": ["null", "string"]}},
    ]


def test_array_of_union_typed_elements_splices_the_union() -> None:
    mapping = map_type(MappingContext(catalog(), "n"), 1182, -1, "Value_days")  # date[]
    plain, record = mapping.avro
    elements = record["fields"][2]["type"]["items"]
    assert elements == ["null", {"type": "int", "logicalType": "date"}, "string"]
    assert plain["items"] == elements
    assert mapping.pg_type == "date[]"


def test_numeric_array_keeps_the_column_typmod() -> None:
    mapping = map_type(MappingContext(catalog(), "n"), 1231, numeric_mod(10, 3), "Value_a")
    assert mapping.pg_type == "numeric(10,3)[]"
    assert mapping.avro[0]["items"][1]["scale"] == 3
    assert mapping.avro[1]["fields"][2]["type"]["items"][1]["scale"] == 3


def test_enum_array_and_composite_array() -> None:
    ctx = MappingContext(catalog(), "n")
    assert map_type(ctx, MOOD_ARRAY, -1, "Value_m").pg_type == "public.mood[]"
    comp = map_type(ctx, ADDRESS_ARRAY, -1, "Value_addrs")
    record = comp.avro[0]["items"][1]  # defined in the plain array, referred to in the record
    assert comp.avro[1]["fields"][2]["type"]["items"] == ["null", "n.Value_addrs_element"]
    assert record["name"] == "n.Value_addrs_element"
    assert [f["name"] for f in record["fields"]] == ["street", "zip_code", "since"]
    assert record["fields"][1]["pg.name"] == "zip code"
    assert record["fields"][1]["pg.type"] == "character varying(10)"


def test_composite_maps_to_record_of_nullable_fields() -> None:
    mapping = map_type(MappingContext(catalog(), "n"), ADDRESS, -1, "Value_home")
    assert mapping.pg_type == "public.address"
    assert all(f["type"][0] == "null" and f["default"] is None for f in mapping.avro["fields"])


def test_unknown_oid_and_unmapped_type_become_tagged_string_or_bytes() -> None:
    ctx = MappingContext(catalog(), "n")
    xid = map_type(ctx, 28, -1, "Value_x")
    assert not xid.mapped and xid.avro == ["string", "bytes"] and xid.pg_type == "xid"
    assert field_schema("x", "x", xid)["pg.unmapped"] is True
    unknown = map_type(ctx, 999_999, -1, "Value_y")
    assert not unknown.mapped and unknown.pg_type == "oid:999999"
    assert xid.text(b"1234") == "1234" and xid.binary(b"\x00\x00\x04\xd2") == b"\x00\x00\x04\xd2"


@pytest.mark.parametrize(
    ("typmod", "expected"),
    [
        (-1, None),
        (numeric_mod(12, 2), (12, 2)),
        (numeric_mod(5, -2), (5, -2)),
        (numeric_mod(3, 5), (3, 5)),
    ],
)
def test_numeric_typmod(typmod: int, expected: tuple[int, int] | None) -> None:
    assert numeric_typmod(typmod) == expected


def test_numeric_negative_scale_and_scale_above_precision_stay_valid_avro() -> None:
    ctx = MappingContext(catalog(), "n")
    negative = map_type(ctx, 1700, numeric_mod(5, -2), "a").avro[0]
    assert (negative["precision"], negative["scale"]) == (7, 0)
    tiny = map_type(ctx, 1700, numeric_mod(3, 5), "b").avro[0]
    assert (tiny["precision"], tiny["scale"]) == (5, 5)
    assert map_type(ctx, 1700, numeric_mod(5, -2), "a").pg_type == "numeric(5,-2)"


def test_format_pg_type_for_interval_precision_and_schema_qualified_names() -> None:
    cat = catalog()
    interval = cat.get(1186)
    assert interval is not None
    assert format_pg_type(interval, -1) == "interval"
    assert format_pg_type(interval, 0x7FFF0003) == "interval(3)"
    mood = cat.get(MOOD)
    assert mood is not None and format_pg_type(mood, -1) == "public.mood"


def test_field_names_are_sanitized_and_unique() -> None:
    assert field_names(("id", "zip code", "zip_code", "1st", "é")) == (
        "id",
        "zip_code",
        "zip_code_2",
        "_1st",
        "_",
    )


def test_mapping_is_deterministic() -> None:
    a = map_type(MappingContext(catalog(), "n"), ADDRESS_ARRAY, -1, "Value_x")
    b = map_type(MappingContext(catalog(), "n"), ADDRESS_ARRAY, -1, "Value_x")
    assert json.dumps(a.avro) == json.dumps(b.avro)
