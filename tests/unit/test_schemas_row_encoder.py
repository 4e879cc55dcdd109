"""The compiled row/key encoders give the same bytes as fastavro.schemaless_writer on the
converted row, for every mapped type and edge value, in text and binary mode, and fail with
the reference converter's ConversionError."""

from __future__ import annotations

import io
import math
import struct
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schemas_convert import CASES, NUMERIC_12_2  # the type table's edge values

from producer.pgoutput import UNCHANGED_TOAST, Column, Insert, Relation, Value
from schemas import row_encoder
from schemas.avro_binary import _varint_slow, long_bytes, varint
from schemas.errors import ConversionError
from schemas.relation import RelationCodec, _fastavro_row_encoder, build_relation_codec
from schemas.type_catalog import Attribute, PgType, TypeCatalog, TypeKind
from tests.support.pgoutput_encoder import encode

pytestmark = pytest.mark.unit

INT4, INT8, TEXT, BOOL, FLOAT4, FLOAT8, DATE, BOX = 23, 20, 25, 16, 700, 701, 1082, 603
INT4_ARRAY, TEXT_ARRAY, BOX_ARRAY, DATE_ARRAY, INT8_ARRAY = 1007, 1009, 1020, 1182, 1016
MOOD, MOOD_ARRAY, POSINT, ADDRESS, ADDRESS_ARRAY, CITEXT, HSTORE, SHORT_TEXT = (
    70001, 70011, 70002, 70003, 70013, 70004, 70005, 70006,
)  # fmt: skip
UNKNOWN_BASE = 70099  # a base type with no mapping (unmapped: string/bytes)

CATALOG = TypeCatalog(
    [
        PgType(MOOD, "public", "mood", TypeKind.ENUM, labels=("sad", "ok", "happy")),
        PgType(MOOD_ARRAY, "public", "_mood", TypeKind.ARRAY, element_oid=MOOD),
        PgType(POSINT, "public", "posint", TypeKind.DOMAIN, base_oid=INT4),
        PgType(SHORT_TEXT, "public", "short_text", TypeKind.DOMAIN, base_oid=TEXT),
        PgType(
            ADDRESS,
            "public",
            "address",
            TypeKind.COMPOSITE,
            attributes=(
                Attribute("street", TEXT, -1),
                Attribute("zip", INT4, -1),
                Attribute("since", DATE, -1),
                Attribute("tags", TEXT_ARRAY, -1),
            ),
        ),
        PgType(ADDRESS_ARRAY, "public", "_address", TypeKind.ARRAY, element_oid=ADDRESS),
        PgType(CITEXT, "public", "citext", TypeKind.BASE),
        PgType(HSTORE, "public", "hstore", TypeKind.BASE),
        PgType(UNKNOWN_BASE, "public", "mystery", TypeKind.BASE),
    ]
)


def codec_for(*columns: tuple[str, int, int, bool]) -> RelationCodec:
    cols = tuple(
        Column(1 if key else 0, name, oid, typmod, key) for name, oid, typmod, key in columns
    )
    return build_relation_codec(Relation(None, 1, "public", "t", "d", cols), CATALOG, "db.public.t")


def fastavro_bytes(schema: Any, datum: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    return buf.getvalue()


def insert_payload(values: tuple[Any, ...]) -> bytes:
    """A pgoutput Insert of ``values`` (relation 1); its TupleData starts at offset 6."""
    return encode(Insert(None, 1, tuple(values)))


def assert_wire_twins_agree(codec: RelationCodec, values: tuple[Any, ...]) -> None:
    """The TupleData-reading twins (``wire``) give what the compiled encoders give for the
    decoded tuple, at any offset, or None exactly where those raise."""
    for encoder, with_key in ((codec.encode_row, False), (codec.encode_row_key, True)):
        wire = row_encoder.wire_encoder(encoder)
        if wire is None:
            assert with_key and codec.encode_key is None  # the row-only wrapper: no twin
            continue
        payload = insert_payload(values)
        padded = b"junk" + payload + b"tail"
        try:
            expected = encoder(values)
        except ConversionError:
            assert wire(payload, 6) is None
            continue
        if not with_key:
            expected = (*expected, None)
        assert wire(payload, 6) == (*expected, len(payload))
        assert wire(padded, 10) == (*expected, len(payload) + 4)


def assert_same_bytes(codec: RelationCodec, values: tuple[Any, ...]) -> None:
    """The compiled encoders against fastavro on the reference converters' output."""
    row, unchanged = codec.convert_row(values)
    body, ours_unchanged = codec.encode_row(values)
    assert body == fastavro_bytes(codec.value_schema, row)
    assert ours_unchanged == unchanged
    if codec.encode_key is not None and codec.convert_key is not None:
        assert codec.key_schema is not None
        assert codec.encode_key(values) == fastavro_bytes(
            codec.key_schema, codec.convert_key(values)
        )
    assert_wire_twins_agree(codec, values)


ID = Value(b"7", False)


@pytest.mark.parametrize("label", sorted(CASES))
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_type_table_edge_values(label: str, binary: bool) -> None:
    oid, typmod, text, binary_form, _ = CASES[label]
    codec = codec_for(("id", INT8, -1, True), ("c", oid, typmod, False))
    value = Value(binary_form, True) if binary else Value(text, False)
    assert_same_bytes(codec, (ID, value))
    assert_same_bytes(codec, (ID, None))
    assert codec.encode_row((ID, UNCHANGED_TOAST)) == (b"\x02\x0e\x00", ["c"])


@pytest.mark.parametrize("label", sorted(CASES))
def test_type_as_key_column(label: str) -> None:
    oid, typmod, text, binary_form, _ = CASES[label]
    codec = codec_for(("k", oid, typmod, True), ("v", TEXT, -1, False))
    assert_same_bytes(codec, (Value(text, False), Value(b"x", False)))
    assert_same_bytes(codec, (Value(binary_form, True), Value(b"x", True)))


FLOAT_BITS = [
    struct.pack("!d", v) for v in (0.0, -0.0, math.inf, -math.inf, math.nan, 1e308, 5e-324)
] + [bytes.fromhex(h) for h in ("7ff0000000000001", "fff8000000000000", "7ff4000000000000")]
FLOAT4_BITS = [struct.pack("!f", v) for v in (0.0, -0.0, math.inf, math.nan, 3.4e38)] + [
    bytes.fromhex(h) for h in ("7fc00001", "ffc00000", "7f800001")
]


def test_floats_keep_every_bit_like_fastavro() -> None:
    codec = codec_for(("d", FLOAT8, -1, False), ("f", FLOAT4, -1, False))
    for d in FLOAT_BITS:
        for f in FLOAT4_BITS:
            assert_same_bytes(codec, (Value(d, True), Value(f, True)))
    for text in (b"NaN", b"-0", b"Infinity", b"-Infinity", b"1.5e-310"):
        assert_same_bytes(codec, (Value(text, False), Value(text, False)))


def array_send(elem_oid: int, dims: list[tuple[int, int]], items: list[bytes | None]) -> bytes:
    out = struct.pack("!iii", len(dims), int(None in items), elem_oid)
    for size, lower in dims:
        out += struct.pack("!ii", size, lower)
    for item in items:
        out += struct.pack("!i", -1) if item is None else struct.pack("!i", len(item)) + item
    return out


ARRAYS: dict[str, tuple[int, bytes]] = {
    "int4 2-d bounds": (INT4_ARRAY, b"[0:1][1:3]={{1,NULL,3},{4,5,NULL}}"),
    "int4 1-d": (INT4_ARRAY, b"{1,-2,2147483647,NULL}"),
    "int8 1-d": (INT8_ARRAY, b"{-9223372036854775808,0,9223372036854775807}"),
    "int4 bounds 1-d": (INT4_ARRAY, b"[-3:-2]={1,2}"),
    "text empty": (TEXT_ARRAY, b"{}"),
    "text plain": (TEXT_ARRAY, b"{alpha,beta,NULL}"),
    "text quoted": (TEXT_ARRAY, b'{"",NULL,"NULL","a,b","q\\"\\\\",\xf0\x9f\x98\x80}'),
    "text 2-d": (TEXT_ARRAY, b'{{a,"b c"},{NULL,d}}'),
    "text unicode": (TEXT_ARRAY, "{é,日本,😀}".encode()),
    "text long item": (TEXT_ARRAY, b"{" + b"x" * 20_000 + b"}"),
    "box semicolon": (BOX_ARRAY, b"{(3,4),(1,2);(1,1),(0,0)}"),
    "date edges": (DATE_ARRAY, b'{2024-01-01,infinity,"0044-03-15 BC",NULL}'),
    "enum": (MOOD_ARRAY, b"{sad,NULL,happy}"),
    "composite": (ADDRESS_ARRAY, b'{"(\\"1 Main St\\",123,2024-01-01,\\"{a,b}\\")",NULL}'),
}


@pytest.mark.parametrize("label", sorted(ARRAYS))
def test_arrays_text(label: str) -> None:
    oid, text = ARRAYS[label]
    codec = codec_for(("id", INT8, -1, True), ("a", oid, -1, False), ("b", oid, -1, False))
    assert_same_bytes(codec, (ID, Value(text, False), None))
    assert_same_bytes(codec, (ID, None, Value(text, False)))


def test_arrays_binary() -> None:
    codec = codec_for(
        ("id", INT8, -1, True), ("i", INT4_ARRAY, -1, False), ("t", TEXT_ARRAY, -1, False),
        ("m", MOOD_ARRAY, -1, False), ("l", INT8_ARRAY, -1, False), ("d", DATE_ARRAY, -1, False),
    )  # fmt: skip
    i4 = [struct.pack("!i", v) for v in (1, -2, 2**31 - 1)]
    cases = [
        (array_send(INT4, [], []), array_send(TEXT, [], []), array_send(MOOD, [], [])),
        (
            array_send(INT4, [(2, 0), (2, 1)], [i4[0], None, i4[1], i4[2]]),
            array_send(TEXT, [(3, 1)], [b"a", None, "😀".encode()]),
            array_send(MOOD, [(1, -5)], [b"ok"]),
        ),
        (
            array_send(INT4, [(1, 1)], [None]),
            array_send(TEXT, [(1, 1), (2, 1)], [b"x" * 9000, b""]),
            array_send(MOOD, [(2, 1)], [None, None]),
        ),
    ]
    longs = array_send(INT8, [(2, 1)], [struct.pack("!q", -(2**63)), struct.pack("!q", 2**63 - 1)])
    dates = array_send(DATE, [(2, 1)], [struct.pack("!i", 2**31 - 1), struct.pack("!i", 0)])
    for i, t, m in cases:
        values = (ID, Value(i, True), Value(t, True), Value(m, True), Value(longs, True))
        assert_same_bytes(codec, (*values, Value(dates, True)))


def record_send(fields: list[tuple[int, bytes | None]]) -> bytes:
    out = struct.pack("!i", len(fields))
    for oid, data in fields:
        out += (
            struct.pack("!Ii", oid, -1)
            if data is None
            else struct.pack("!Ii", oid, len(data)) + data
        )
    return out


def hstore_send(pairs: dict[bytes, bytes | None]) -> bytes:
    out = struct.pack("!i", len(pairs))
    for k, v in pairs.items():
        out += struct.pack("!i", len(k)) + k
        out += struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v
    return out


def test_learned_types_enum_domain_composite_hstore_citext_unmapped() -> None:
    codec = codec_for(
        ("id", INT8, -1, True), ("mood", MOOD, -1, False), ("pos", POSINT, -1, False),
        ("st", SHORT_TEXT, -1, False), ("addr", ADDRESS, -1, False), ("ci", CITEXT, -1, False),
        ("hs", HSTORE, -1, False), ("x", UNKNOWN_BASE, -1, False),
        ("addr2", ADDRESS, -1, False),  # a second use of the named record: a reference
    )  # fmt: skip
    text = (
        ID, Value(b"happy", False), Value(b"42", False), Value("ü".encode(), False),
        Value(b'("1 Main St",,2024-01-01,"{a,NULL}")', False), Value(b"MiXeD", False),
        Value(b'"a"=>"1", "b"=>NULL', False), Value(b"\xc3\xa9 raw", False),
        Value(b"(,,,)", False),
    )  # fmt: skip
    assert_same_bytes(codec, text)
    address = record_send(
        [(TEXT, b"1 Main St"), (INT4, struct.pack("!i", 5)), (DATE, None),
         (TEXT_ARRAY, array_send(TEXT, [(1, 1)], [b"q"]))]
    )  # fmt: skip
    binary = (
        ID, Value(b"sad", True), Value(struct.pack("!i", -1), True), Value(b"", True),
        Value(address, True), Value(b"x", True), Value(hstore_send({b"k": b"v", b"n": None}), True),
        Value(b"\x00\xffraw", True), Value(record_send([(TEXT, None)] * 4), True),
    )  # fmt: skip
    assert_same_bytes(codec, binary)
    assert_same_bytes(codec, (ID, *([UNCHANGED_TOAST] * 4), *([None] * 4)))


def test_numeric_fast_and_slow_text_forms() -> None:
    codec = codec_for(("id", INT8, -1, True), ("n", 1700, NUMERIC_12_2, False))
    for text in (b"0.00", b"-0.01", b"9999999999.99", b"1.5", b"12", b"NaN", b"Infinity"):
        assert_same_bytes(codec, (ID, Value(text, False)))
    assert "partition" in codec.encode_row.__walbridge_source__  # type: ignore[attr-defined]
    scale0 = codec_for(("id", INT8, -1, True), ("n", 1700, ((5 << 16) | 0) + 4, False))
    for text in (b"0", b"-128", b"127", b"-129", b"32768", b"NaN", b"-Infinity", b"1.0"):
        assert_same_bytes(scale0, (ID, Value(text, False)))


def test_mixed_nulls_and_toast_list_columns_in_order() -> None:
    codec = codec_for(("id", INT8, -1, True), ("a", TEXT, -1, False), ("b", TEXT, -1, False))
    body, unchanged = codec.encode_row((ID, UNCHANGED_TOAST, UNCHANGED_TOAST))
    assert unchanged == ["a", "b"] and body == b"\x02\x0e\x00\x00"
    assert_same_bytes(codec, (None, Value(b"", False), None))


def test_composite_key_of_several_columns_in_one_pass() -> None:
    codec = codec_for(
        ("a", TEXT, -1, True), ("x", INT4, -1, False), ("b", TEXT_ARRAY, -1, True),
        ("c", INT8, -1, True),
    )  # fmt: skip
    assert_same_bytes(codec, (Value(b"k", False), None, Value(b"{q,NULL}", False), None))
    assert_same_bytes(codec, (Value("é".encode(), True), Value(struct.pack("!i", 3), True),
                              Value(array_send(TEXT, [(1, 1)], [b"z"]), True),
                              Value(struct.pack("!q", 2**40), True)))  # fmt: skip


def test_key_with_array_column_uses_the_key_records_names() -> None:
    codec = codec_for(("tags", TEXT_ARRAY, -1, True), ("v", INT4, -1, False))
    assert codec.key_schema is not None and codec.convert_key is not None
    values = (Value(b"{a,b}", False), Value(b"1", False))
    assert codec.convert_key(values)["tags"] == ["a", "b"]  # one dimension from 1: plain
    assert_same_bytes(codec, values)
    shaped = (Value(b"[0:1]={a,b}", False), Value(b"1", False))
    assert codec.convert_key(shaped)["tags"][0].endswith(".Key_tags")
    assert_same_bytes(codec, shaped)


def test_errors_are_the_reference_conversion_errors() -> None:
    codec = codec_for(("id", INT8, -1, True), ("name", TEXT, -1, False), ("ok", BOOL, -1, False))
    with pytest.raises(ConversionError, match=r"public\.t\.name \(text, text value b'\\xff'\)"):
        codec.encode_row((ID, Value(b"\xff", False), None), 77)
    with pytest.raises(ConversionError, match=r"public\.t\.ok .* at LSN 77"):
        codec.encode_row((ID, None, Value(b"yes", False)), 77)
    with pytest.raises(ConversionError, match="tuple has 2 columns, relation has 3"):
        codec.encode_row((ID, None))
    assert codec.encode_key is not None
    with pytest.raises(ConversionError, match="unchanged TOAST"):
        codec.encode_key((UNCHANGED_TOAST, None, None), 5)
    with pytest.raises(ConversionError, match="unchanged TOAST"):
        codec.encode_row_key((UNCHANGED_TOAST, None, None), 5)  # the row alone is fine
    with pytest.raises(ConversionError, match=r"public\.t\.name"):
        codec.encode_row_key((ID, Value(b"\xff", False), None), 5)
    with pytest.raises(ConversionError, match=r"public\.t\.id"):
        codec.encode_key((Value(b"x", False), None, None), 5)


def test_a_fast_path_disagreeing_with_the_reference_is_reported(monkeypatch: Any) -> None:
    codec = codec_for(
        ("id", INT8, -1, True),
    )
    globals_ = codec.encode_row.__globals__  # type: ignore[attr-defined]
    monkeypatch.setitem(globals_, "_long", lambda x: 1 / 0)
    with pytest.raises(ConversionError, match="compiled row encoder failed"):
        codec.encode_row((Value(b"1000000000000", False),))


def test_unsupported_schema_falls_back_to_fastavro() -> None:
    with pytest.raises(row_encoder.UnsupportedSchema):
        row_encoder.value_writer({"type": "enum", "name": "E", "symbols": ["A"]}, {})
    with pytest.raises(row_encoder.UnsupportedSchema):
        row_encoder.value_writer({"type": "int", "logicalType": "time-millis"}, {})
    codec = codec_for(("id", INT8, -1, True), ("a", TEXT_ARRAY, -1, False))
    slow = _fastavro_row_encoder(codec.value_schema, codec.convert_row)
    values = (ID, Value(b"{x,NULL}", False))
    assert slow(values) == codec.encode_row(values)


# --- property tests ----------------------------------------------------------------------------


def test_varint_tables_match_the_loop() -> None:
    for n in [0, 127, 128, 2**14 - 1, 2**14, 2**28 - 1, 2**28, 2**42, 2**56 - 1, 2**56, 2**64 - 1]:
        assert varint(n) == _varint_slow(n)
    with pytest.raises(OverflowError):
        varint(2**64)
    with pytest.raises(OverflowError):
        long_bytes(2**63)


@given(st.integers(-(2**63), 2**63 - 1))
def test_long_bytes_matches_fastavro(value: int) -> None:
    assert long_bytes(value) == fastavro_bytes("long", value)


PROP_CODEC = codec_for(
    ("id", INT8, -1, True), ("name", TEXT, -1, False), ("n", INT4, -1, False),
    ("tags", TEXT_ARRAY, -1, False), ("d", FLOAT8, -1, False), ("ok", BOOL, -1, False),
)  # fmt: skip


def _quote(item: str) -> str:
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


cell = st.one_of(st.none(), st.just(UNCHANGED_TOAST))


@settings(max_examples=300)
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.one_of(cell, st.text()),
    st.one_of(cell, st.integers(-(2**31), 2**31 - 1)),
    st.one_of(cell, st.lists(st.one_of(st.none(), st.text()), max_size=5)),
    st.one_of(cell, st.binary(min_size=8, max_size=8)),
    st.one_of(cell, st.booleans()),
    st.booleans(),
)
def test_random_rows_text_and_binary(
    ident: int, name: Any, n: Any, tags: Any, d: Any, ok: Any, binary: bool
) -> None:
    def v(text: bytes, wire: bytes) -> Value:
        return Value(wire, True) if binary else Value(text, False)

    def cellv(x: Any, make: Any) -> Any:
        return x if x is None or x is UNCHANGED_TOAST else make(x)

    tags_text = lambda t: "{" + ",".join("NULL" if i is None else _quote(i) for i in t) + "}"  # noqa: E731
    tags_bin = lambda t: array_send(  # noqa: E731
        TEXT, [(len(t), 1)] if t else [], [None if i is None else i.encode() for i in t]
    )
    values = (
        v(str(ident).encode(), struct.pack("!q", ident)),
        cellv(name, lambda s: v(s.encode(), s.encode())),
        cellv(n, lambda i: v(str(i).encode(), struct.pack("!i", i))),
        cellv(tags, lambda t: v(tags_text(t).encode(), tags_bin(t))),
        cellv(d, lambda b: v(repr(struct.unpack("!d", b)[0]).encode(), b)),
        cellv(ok, lambda b: v(b"t" if b else b"f", b"\x01" if b else b"\x00")),
    )
    assert_same_bytes(PROP_CODEC, values)


def test_repeated_and_alternating_values_through_the_last_value_caches() -> None:
    """Each generic column remembers its last wire value: repeats, alternations, NULLs and
    text/binary switches in one column must all still give the reference bytes."""
    labels = sorted(CASES)
    codec = codec_for(
        ("id", INT8, -1, True),
        *((f"c{i}", CASES[k][0], CASES[k][1], False) for i, k in enumerate(labels)),
    )
    text = tuple(Value(CASES[k][2], False) for k in labels)
    binary = tuple(Value(CASES[k][3], True) for k in labels)
    shifted = text[1:] + text[:1]  # every column gets another type's text: mostly errors
    for values in (text, text, binary, text, (None,) * len(labels), binary, binary, text):
        assert_same_bytes(codec, (ID, *values))
    for i in range(len(labels)):
        row = list(text)
        row[i] = shifted[i]
        try:
            codec.convert_row((ID, *row))
        except ConversionError:
            with pytest.raises(ConversionError):
                codec.encode_row((ID, *row))
            assert_wire_twins_agree(codec, (ID, *row))  # None: the careful path reports
            continue
        assert_same_bytes(codec, (ID, *row))
        assert_same_bytes(codec, (ID, *text))


WIRE_CODEC = codec_for(("id", INT8, -1, True), ("name", TEXT, -1, False), ("n", INT4, -1, False))
WIRE_ROW = (Value(b"7", False), Value(b"seven", False), Value(struct.pack("!i", 7), True))


def test_wire_twin_gives_up_on_anything_unusual() -> None:
    """Every anomaly gives None (the careful decoder then raises the precise error)."""
    wire = row_encoder.wire_encoder(WIRE_CODEC.encode_row_key)
    assert wire is not None
    good = insert_payload(WIRE_ROW)
    assert wire(good, 6) is not None
    for cut in range(6, len(good)):  # every truncation
        result = wire(good[:cut], 6)
        assert result is None or result[3] > cut  # ran past the end: never a clean end
    assert wire(insert_payload(WIRE_ROW[:2]), 6) is None  # a column short
    assert wire(insert_payload((*WIRE_ROW, None)), 6) is None  # a column too many
    bad_kind = bytearray(good)
    bad_kind[8] = ord("x")  # the first column's kind byte
    assert wire(bytes(bad_kind), 6) is None
    toast_key = (UNCHANGED_TOAST, *WIRE_ROW[1:])
    assert wire(insert_payload(toast_key), 6) is None  # the careful path raises for it
    with pytest.raises(ConversionError):
        WIRE_CODEC.encode_row_key(toast_key)
    huge = bytearray(good)
    huge[9:13] = struct.pack("!I", 2**32 - 1)  # a length far past the end
    assert wire(bytes(huge), 6) is None
    not_int = insert_payload((Value(b"x7", False), *WIRE_ROW[1:]))
    assert wire(not_int, 6) is None


@settings(max_examples=300)
@given(st.data())
def test_wire_twin_on_mutated_payloads_is_none_or_the_decoded_rows_bytes(data: Any) -> None:
    """Flip bytes anywhere in a TupleData: the twin either gives up or, when it reaches the
    payload's end, gives exactly what decoding and encoding the same bytes give."""
    from producer.pgoutput import Decoder

    wire = row_encoder.wire_encoder(WIRE_CODEC.encode_row_key)
    assert wire is not None
    payload = bytearray(insert_payload(WIRE_ROW))
    for _ in range(data.draw(st.integers(1, 3))):
        payload[data.draw(st.integers(6, len(payload) - 1))] = data.draw(st.integers(0, 255))
    buf = bytes(payload)
    result = wire(buf, 6)
    if result is None or result[3] != len(buf):
        return  # the careful path decides
    message = Decoder().decode(buf)  # a clean end: the careful path must agree
    assert isinstance(message, Insert)
    assert result[:3] == WIRE_CODEC.encode_row_key(message.new)
