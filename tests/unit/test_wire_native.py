"""The compiled TupleData encoder (schemas._wire_native) gives the generated Python wire
encoder's result, byte for byte, or gives up exactly where it does: on every mapped type's
edge values, on the values its native operations parse themselves (integers, numerics, text,
booleans, floats, jsonb) and on random and mutated TupleData."""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schemas_convert import CASES, NUMERIC_12_2, dump_binary
from test_schemas_row_encoder import (
    BOOL,
    FLOAT8,
    INT4,
    INT8,
    TEXT,
    TEXT_ARRAY,
    codec_for,
    insert_payload,
)

from producer.pgoutput import UNCHANGED_TOAST, Value
from schemas import native_encoder, row_encoder
from schemas.relation import RelationCodec

pytestmark = pytest.mark.unit

JSONB, INT2, OID, TIMESTAMPTZ, TIMESTAMP, BYTEA, VARCHAR = 3802, 21, 26, 1184, 1114, 17, 1043
VARCHAR_ARRAY, INT4_ARRAY = 1015, 1007
NUMERIC_38_4 = ((38 << 16) | 4) + 4
NUMERIC_5_0 = ((5 << 16) | 0) + 4


def test_the_extension_is_built_and_used() -> None:
    """The dev install compiles it (setup.py): a build that silently failed would leave the
    producer on the slower path with every test still green."""
    assert native_encoder.NATIVE_BUILT
    codec = codec_for(("id", INT8, -1, True), ("name", TEXT, -1, False))
    assert type(row_encoder.wire_encoder(codec.encode_row_key)).__name__ == "TupleEncoder"
    assert type(row_encoder.wire_encoder(codec.encode_row)).__name__ == "TupleEncoder"


def test_pure_python_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WALBRIDGE_PURE_PYTHON", "1")
    codec = codec_for(("id", INT8, -1, True), ("name", TEXT, -1, False))
    wire = row_encoder.wire_encoder(codec.encode_row_key)
    assert wire is codec.encode_row_key.wire_python  # type: ignore[attr-defined]


def outcome(result: Any, buf: bytes, pos: int) -> Any:
    """What the caller acts on: None (the careful path) or the encoded row, key and end."""
    if result is None:
        return None
    row, unchanged, key, end = result
    return None if end != len(buf) else (row, unchanged, key, end)


def assert_native_agrees(codec: RelationCodec, buf: bytes, pos: int = 6) -> Any:
    results = []
    for encoder in (codec.encode_row, codec.encode_row_key):
        native = row_encoder.wire_encoder(encoder)
        if native is None:
            continue
        reference = encoder.wire_python  # type: ignore[attr-defined]
        assert native is not reference
        try:
            expected = outcome(reference(buf, pos), buf, pos)
        except (IndexError, struct.error):  # a length past the end, read past: same answer
            expected = None
        got = outcome(native(buf, pos), buf, pos)
        assert got == expected, (buf, pos)
        results.append(got)
    return results[-1]


@pytest.mark.parametrize("label", sorted(CASES))
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_every_mapped_types_edge_values(label: str, binary: bool) -> None:
    oid, typmod, text, binary_form, _ = CASES[label]
    value = Value(binary_form, True) if binary else Value(text, False)
    for key_first in (True, False):  # the type as a value column and as the key
        cols = [("id", INT8, -1, key_first), ("c", oid, typmod, not key_first)]
        codec = codec_for(*cols)
        ident = Value(b"7", False)
        for row in ((ident, value), (ident, None), (ident, UNCHANGED_TOAST)):
            assert_native_agrees(codec, insert_payload(row))


INTEGER_TEXTS = [
    b"0", b"-0", b"7", b"-7", b"007", b"+7", b" 7", b"7 ", b"1_000", b"", b"-", b"--1",
    b"999999999999999999", b"-999999999999999999", b"1000000000000000000",
    b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808", b"\xd9\xa3",
    b"12a", b"1.0",
]  # fmt: skip


@pytest.mark.parametrize("text", INTEGER_TEXTS)
def test_integer_texts(text: bytes) -> None:
    for oid in (INT2, INT4, INT8, OID):
        codec = codec_for(("id", INT8, -1, True), ("n", oid, -1, False))
        assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(text, False))))
        key = codec_for(("k", oid, -1, True), ("v", TEXT, -1, False))
        assert_native_agrees(key, insert_payload((Value(text, False), Value(b"x", False))))


NUMERIC_TEXTS = [
    b"0.00", b"-0.00", b"1.28", b"-1.28", b"-1.27", b"1.27", b"-1.29", b"327.67", b"-327.68",
    b"1234567890.12", b"-1234567890.12", b"9999999999999999.99", b"99999999999999999.99",
    b"1.2", b"1.234", b"1", b".12", b"-.12", b"1.", b"NaN", b"Infinity", b"-Infinity",
    b"1e5", b"+1.00", b"1,00", b"",
]  # fmt: skip


@pytest.mark.parametrize("text", NUMERIC_TEXTS)
def test_numeric_texts(text: bytes) -> None:
    for typmod in (NUMERIC_12_2, NUMERIC_38_4, NUMERIC_5_0):
        codec = codec_for(("id", INT8, -1, True), ("n", 1700, typmod, False))
        assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(text, False))))


def test_numeric_binary_and_scales() -> None:
    codec = codec_for(("id", INT8, -1, True), ("n", 1700, NUMERIC_12_2, False))
    for number in ("0", "-1.5", "1234567890.12", "NaN"):
        data = dump_binary(Decimal(number))
        assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(data, True))))
    for scale in range(0, 19):
        typmod = ((38 << 16) | scale) + 4
        codec = codec_for(("id", INT8, -1, True), ("n", 1700, typmod, False))
        for whole in ("0", "-1", "123456789012345678"[: 18 - scale] or "0"):
            text = (whole + ("." + "9" * scale if scale else "")).encode()
            got = assert_native_agrees(
                codec, insert_payload((Value(b"1", False), Value(text, False)))
            )
            assert got is not None


TEXTS = [
    b"", b"plain", "é".encode(), "日本".encode(), "😀".encode(), b"\xc0\x80", b"\xed\xa0\x80",
    b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xff", b"abc\xe2\x82", b"\x00", b"x" * 5000,
]  # fmt: skip


@pytest.mark.parametrize("text", TEXTS)
def test_text_like_values(text: bytes) -> None:
    for oid in (TEXT, VARCHAR):
        codec = codec_for(("id", INT8, -1, True), ("s", oid, -1, False))
        for binary in (False, True):
            row = (Value(b"1", False), Value(text, binary))
            assert_native_agrees(codec, insert_payload(row))
    codec = codec_for(("id", INT8, -1, True), ("j", JSONB, -1, False))
    for data in (b"\x01" + text, b"\x02" + text, text):
        assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(data, True))))
    assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(text, False))))
    raw = codec_for(("id", INT8, -1, True), ("b", BYTEA, -1, False))
    assert_native_agrees(raw, insert_payload((Value(b"1", False), Value(text, True))))


@pytest.mark.parametrize(
    "oid,data",
    [
        (BOOL, b""), (BOOL, b"\x00"), (BOOL, b"\x01"), (BOOL, b"\x02"), (BOOL, b"\x00\x00"),
        (FLOAT8, b"\x00" * 7), (FLOAT8, b"\x00" * 8), (FLOAT8, b"\x7f\xf8" + b"\x01" * 6),
        (FLOAT8, b"\x00" * 9), (INT2, b"\x80\x00"), (INT2, b"\x00"), (INT4, b"\xff" * 4),
        (INT4, b"\x00" * 5), (INT8, b"\x80" + b"\x00" * 7), (INT8, b"\xff" * 8),
        (OID, b"\xff" * 4), (OID, b"\x00" * 3),
    ],
)  # fmt: skip
def test_binary_scalars(oid: int, data: bytes) -> None:
    codec = codec_for(("id", INT8, -1, True), ("c", oid, -1, False))
    assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(data, True))))


@pytest.mark.parametrize("text", [b"t", b"f", b"true", b"x", b"", b"T"])
def test_bool_texts(text: bytes) -> None:
    codec = codec_for(("id", INT8, -1, True), ("ok", BOOL, -1, False))
    assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(text, False))))


def test_wide_tables_long_rows_composite_keys_in_key_order() -> None:
    """More columns than the encoder's stack bounds (16), rows beyond its 1 KiB buffer, and a
    key whose field order differs from the columns' order."""
    columns = [(f"c{i}", TEXT if i % 2 else INT8, -1, i in (3, 30)) for i in range(40)]
    codec = codec_for(*columns)
    row = tuple(
        Value(("x" * (i * 40)).encode(), False) if i % 2 else Value(str(i).encode(), False)
        for i in range(40)
    )
    got = assert_native_agrees(codec, insert_payload(row))
    assert got is not None and got[2] is not None and len(got[0]) > 1024
    toast = tuple(UNCHANGED_TOAST if i in (5, 7) else v for i, v in enumerate(row))
    got = assert_native_agrees(codec, insert_payload(toast))
    assert got is not None and got[1] == ["c5", "c7"]
    in_key = tuple(UNCHANGED_TOAST if i == 3 else v for i, v in enumerate(row))
    assert assert_native_agrees(codec, insert_payload(in_key)) is None


def test_fallback_columns_keep_their_caches_and_errors() -> None:
    """Timestamps and arrays go through their column's Python statements (cache included);
    an error there that is not a conversion failure reaches the caller, as in Python."""
    codec = codec_for(
        ("id", INT8, -1, True), ("at", TIMESTAMPTZ, -1, False), ("tags", TEXT_ARRAY, -1, False)
    )
    for at in (b"2026-12-04 01:20:00.123456+00", b"2026-12-04 01:20:00.123456+00", b"bogus"):
        row = (Value(b"1", False), Value(at, False), Value(b'{a,"b c",NULL}', False))
        assert_native_agrees(codec, insert_payload(row))


def test_gives_up_on_malformed_tuples_like_the_reference() -> None:
    codec = codec_for(("id", INT8, -1, True), ("name", TEXT, -1, False), ("n", INT4, -1, False))
    good = insert_payload((Value(b"7", False), Value(b"seven", False), Value(b"3", False)))
    assert assert_native_agrees(codec, good) is not None
    for cut in range(6, len(good)):
        assert_native_agrees(codec, good[:cut])
    padded = b"junk" + good + b"tail"
    wire = row_encoder.wire_encoder(codec.encode_row_key)
    assert wire is not None
    assert wire(padded, 10) == (*codec.encode_row_key.wire_python(good, 6)[:3], len(good) + 4)  # type: ignore[attr-defined]
    assert wire(good, 10**6) is None
    assert wire(good, -1) is None
    with pytest.raises(TypeError):
        wire(good)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        wire("text", 6)  # type: ignore[arg-type]


WIDE = codec_for(
    ("id", INT8, -1, True), ("name", TEXT, -1, False), ("n", INT4, -1, False),
    ("tags", TEXT_ARRAY, -1, False), ("d", FLOAT8, -1, False), ("ok", BOOL, -1, False),
    ("price", 1700, NUMERIC_12_2, False), ("j", JSONB, -1, False), ("s", INT2, -1, True),
)  # fmt: skip
WIDE_ROW = (
    Value(b"123", False), Value("naïve".encode(), False), Value(struct.pack("!i", -5), True),
    Value(b"{x,y}", False), Value(struct.pack("!d", 2.5), True), Value(b"t", False),
    Value(b"-12.50", False), Value(b'\x01{"a": 1}', True), Value(b"-3", False),
)  # fmt: skip


@settings(max_examples=500)
@given(st.data())
def test_mutated_tuples_agree_with_the_reference(data: Any) -> None:
    payload = bytearray(insert_payload(WIDE_ROW))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(6, len(payload) - 1))] = data.draw(st.integers(0, 255))
    assert_native_agrees(WIDE, bytes(payload))


@settings(max_examples=300)
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.one_of(st.none(), st.just(UNCHANGED_TOAST), st.text()),
    st.integers(-(2**15), 2**15 - 1),
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False),
    st.booleans(),
)
def test_random_rows_agree_with_the_reference(
    ident: int, name: Any, small: int, price: Decimal, binary: bool
) -> None:
    def v(text: bytes, wire: bytes) -> Value:
        return Value(wire, True) if binary else Value(text, False)

    row = (
        v(str(ident).encode(), struct.pack("!q", ident)),
        name if name is None or name is UNCHANGED_TOAST else v(name.encode(), name.encode()),
        v(str(small).encode(), struct.pack("!i", small)),
        None,
        v(b"2.5", struct.pack("!d", 2.5)),
        v(b"f", b"\x00"),
        v(f"{price:.2f}".encode(), dump_binary(price)),
        v(b'{"a": 1}', b'\x01{"a": 1}'),
        v(str(small).encode(), struct.pack("!h", small)),
    )
    got = assert_native_agrees(WIDE, insert_payload(row))
    assert got is not None


TIMESTAMP_TEXTS = [
    b"2026-12-04 01:20:00", b"2026-12-04 01:20:00.5", b"2026-12-04 01:20:00.123456",
    b"1970-01-01 00:00:00", b"1969-12-31 23:59:59.999999", b"0001-01-01 00:00:00",
    b"9999-12-31 23:59:59.999999", b"2024-02-29 12:00:00", b"2023-02-29 12:00:00",
    b"1900-02-29 00:00:00", b"2000-02-29 00:00:00", b"2026-13-01 00:00:00",
    b"2026-00-10 00:00:00", b"2026-04-31 00:00:00", b"2026-12-04 24:00:00",
    b"2026-12-04 23:60:00", b"2026-12-04 01:20:60", b"2026-12-04 01:20:00.1234567",
    b"2026-12-04 01:20:00.", b"2026-12-04T01:20:00", b"0000-01-01 00:00:00",
    b"10000-01-01 00:00:00", b"0044-03-15 12:00:00 BC", b"infinity", b"-infinity",
    b"2026-12-04 1:20:00", b"2026-12-04 01:20:0x",
]  # fmt: skip
OFFSETS = [b"+00", b"", b"+01", b"-00", b"+05:30", b"+00:00", b"+00 BC"]


@pytest.mark.parametrize("text", TIMESTAMP_TEXTS)
def test_timestamp_texts(text: bytes) -> None:
    for offset in OFFSETS:
        for oid in (TIMESTAMPTZ, TIMESTAMP):
            codec = codec_for(("id", INT8, -1, True), ("at", oid, -1, False))
            row = (Value(b"1", False), Value(text + offset, False))
            got = assert_native_agrees(codec, insert_payload(row))
            assert got is not None  # every form is encoded, natively or by the fallback


TEXT_ARRAYS = [
    b"{}", b"{a}", b"{a,b}", b"{NULL}", b"{a,NULL,b}", b"{null,NULLx,NULL}", b'{"a b",c}',
    b'{"NULL",a}', b"{a\\,b}", b"{{a},{b}}", b"[0:1]={a,b}", b"{", b"{a", b"{,}", b"{,,}",
    "{é,日本}".encode(), b"{\xff}", b"{a}}", b"{a;b}", b"", b"{" + b",".join([b"x" * 50] * 200) + b"}",
    b"{" + b"y" * 9000 + b"}",
]  # fmt: skip


@pytest.mark.parametrize("text", TEXT_ARRAYS)
def test_text_array_texts(text: bytes) -> None:
    for oid in (TEXT_ARRAY, VARCHAR_ARRAY, INT4_ARRAY):
        codec = codec_for(("id", INT8, -1, True), ("tags", oid, -1, False))
        assert_native_agrees(codec, insert_payload((Value(b"1", False), Value(text, False))))


def test_array_and_timestamp_columns_take_native_operations() -> None:
    """The plan: these columns are parsed natively, not only through their Python fallbacks."""
    from schemas import _wire_native as w

    codec = codec_for(
        ("id", INT8, -1, True), ("a", TIMESTAMPTZ, -1, False), ("b", TIMESTAMP, -1, False),
        ("c", TEXT_ARRAY, -1, False), ("d", INT4_ARRAY, -1, False), ("e", TEXT, -1, False),
        ("f", 1700, NUMERIC_12_2, False), ("g", JSONB, -1, False), ("h", BOOL, -1, False),
    )  # fmt: skip
    wire = row_encoder.wire_encoder(codec.encode_row_key)
    assert wire.ops == (  # type: ignore[union-attr]
        (w.OP_INT_TEXT, w.OP_INT8_BIN),
        (w.OP_TIMESTAMPTZ_TEXT, w.OP_CALL),
        (w.OP_TIMESTAMP_TEXT, w.OP_CALL),
        (w.OP_TEXT_ARRAY, w.OP_CALL),
        (w.OP_CALL, w.OP_CALL),  # integer arrays: the Python writer
        (w.OP_TEXT, w.OP_TEXT),
        (w.OP_NUMERIC_TEXT, w.OP_CALL),
        (w.OP_TEXT, w.OP_JSONB_BIN),
        (w.OP_BOOL_TEXT, w.OP_BOOL_BIN),
    )


def _copy_twins(codec: RelationCodec) -> tuple[Any, Any]:
    """(the compiled COPY twin, the generated Python one it hands backslash lines to)."""
    from producer.snapshot.copy_text import fields

    encoder = codec.encode_row if codec.encode_key is None else codec.encode_row_key
    native = row_encoder.copy_encoder(encoder, fields)
    python = encoder.copy_factory(fields)  # type: ignore[attr-defined]
    assert type(native).__name__ == "CopyEncoder"
    return native, python


@pytest.mark.parametrize("label", sorted(CASES))
def test_copy_rows_of_every_mapped_types_edge_values(label: str) -> None:
    oid, typmod, text, _, _ = CASES[label]
    for keyed in (True, False):
        codec = codec_for(
            ("id", INT8, -1, keyed), ("c", oid, typmod, False), ("n", INT4, -1, False)
        )
        native, python = _copy_twins(codec)
        for line in (
            b"7\t" + text + b"\t3", b"7\t\\N\t3", b"7\t" + text, b"7\t" + text + b"\t3\t4",
            b"x7\t" + text + b"\t3", b"7\t" + text + b"\t", b"", b"\t\t",
        ):  # fmt: skip
            assert native(line) == python(line), line


@settings(max_examples=300)
@given(
    st.lists(
        st.sampled_from([b"a", b"1", b"\t", b"\\", b"N", b"-", b".", b"{", b"}", b","]), max_size=20
    )
)
def test_copy_lines_agree_with_the_python_twin(pieces: list[bytes]) -> None:
    native, python = _copy_twins(WIDE)
    line = b"".join(pieces)
    assert native(line) == python(line)
    good = b"\t".join([b"12", b"x", b"-5", b"{a,b}", b"2.5", b"t", b"-1.25", b'{"a": 1}', b"7"])
    got = native(good)
    assert got is not None and got == python(good)
