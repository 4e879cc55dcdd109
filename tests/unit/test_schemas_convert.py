"""Value conversion: text and binary pgoutput values give the same Avro datum, edge values
stay lossless, and everything produced decodes with fastavro."""

from __future__ import annotations

import datetime as dt
import io
import math
import struct
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.adapt import PyFormat, Transformer

from schemas import pg_datetime
from schemas.type_catalog import TypeCatalog
from schemas.type_mapping import AvroMapping, MappingContext, field_schema, map_type

pytestmark = pytest.mark.unit

_TX = Transformer()
NUMERIC_12_2 = ((12 << 16) | 2) + 4


def dump_binary(value: object) -> bytes:
    return bytes(_TX.get_dumper(value, PyFormat.BINARY).dump(value) or b"")


def mapping(oid: int, typmod: int = -1) -> AvroMapping:
    return map_type(MappingContext(TypeCatalog(), "t"), oid, typmod, "Value_c")


def avro_round_trip(m: AvroMapping, datum: Any) -> Any:
    """Encode ``datum`` in a one-field record with the mapping's schema, decode it back."""
    schema = fastavro.parse_schema(
        {"type": "record", "name": "R", "fields": [field_schema("c", "c", m)]}
    )
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, {"c": datum})
    decoded: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), schema, None)  # type: ignore[assignment]
    return decoded["c"]


def pg_days(d: dt.date) -> bytes:
    return struct.pack("!i", d.toordinal() - dt.date(2000, 1, 1).toordinal())


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 2000-01-01 of a proleptic Gregorian date, astronomical year (0 = 1 BC).

    An independent oracle (the inverse of the code under test's civil_from_days).
    """
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468 - 10_957


def pg_us(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0
) -> int:
    return (
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    ) * 10**6 + micro


def bc_days(year: int, month: int, day: int) -> bytes:
    return struct.pack("!i", days_from_civil(year, month, day))


# (oid, typmod, text form, binary form, value after the Avro round trip)
CASES: dict[str, tuple[int, int, bytes, bytes, Any]] = {
    "bool": (16, -1, b"t", b"\x01", True),
    "int2 min": (21, -1, b"-32768", struct.pack("!h", -32768), -32768),
    "int4 max": (23, -1, b"2147483647", struct.pack("!i", 2**31 - 1), 2**31 - 1),
    "int8 min": (20, -1, b"-9223372036854775808", struct.pack("!q", -(2**63)), -(2**63)),
    "oid max": (26, -1, b"4294967295", struct.pack("!I", 2**32 - 1), 2**32 - 1),
    "float8 -0.0": (701, -1, b"-0", struct.pack("!d", -0.0), -0.0),
    "float8 inf": (701, -1, b"Infinity", struct.pack("!d", math.inf), math.inf),
    "float8 -inf": (701, -1, b"-Infinity", struct.pack("!d", -math.inf), -math.inf),
    "float8 tiny": (701, -1, b"5e-324", struct.pack("!d", 5e-324), 5e-324),
    "float4 1.5": (700, -1, b"1.5", struct.pack("!f", 1.5), 1.5),
    "numeric(12,2)": (1700, NUMERIC_12_2, b"-1234567890.12", dump_binary(Decimal("-1234567890.12")), Decimal("-1234567890.12")),
    "numeric(12,2) zero": (1700, NUMERIC_12_2, b"0.00", dump_binary(Decimal("0.00")), Decimal("0.00")),
    "numeric(12,2) NaN": (1700, NUMERIC_12_2, b"NaN", dump_binary(Decimal("NaN")), "NaN"),
    "numeric(12,2) -Infinity": (1700, NUMERIC_12_2, b"-Infinity", dump_binary(Decimal("-Infinity")), "-Infinity"),
    "numeric huge": (1700, -1, b"1" + b"0" * 300 + b".000001", dump_binary(Decimal("1" + "0" * 300 + ".000001")), "1" + "0" * 300 + ".000001"),
    "numeric scale kept": (1700, -1, b"1.50", dump_binary(Decimal("1.50")), "1.50"),
    "numeric Infinity": (1700, -1, b"Infinity", dump_binary(Decimal("Infinity")), "Infinity"),
    "text 4-byte utf8": (25, -1, "a😀é".encode(), "a😀é".encode(), "a😀é"),
    "text empty": (25, -1, b"", b"", ""),
    "bytea": (17, -1, b"\\x00ff10", b"\x00\xff\x10", b"\x00\xff\x10"),
    "uuid": (2950, -1, b"12345678-1234-5678-1234-567812345678", uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, uuid.UUID("12345678-1234-5678-1234-567812345678")),
    "jsonb": (3802, -1, b'{"a": [1, 2]}', b'\x01{"a": [1, 2]}', '{"a": [1, 2]}'),
    "date": (1082, -1, b"2024-02-29", pg_days(dt.date(2024, 2, 29)), dt.date(2024, 2, 29)),
    "date 0001-01-01": (1082, -1, b"0001-01-01", pg_days(dt.date(1, 1, 1)), dt.date(1, 1, 1)),
    "date 9999-12-31": (1082, -1, b"9999-12-31", pg_days(dt.date(9999, 12, 31)), dt.date(9999, 12, 31)),
    "date BC": (1082, -1, b"0044-03-15 BC", bc_days(-43, 3, 15), "0044-03-15 BC"),
    "date infinity": (1082, -1, b"infinity", struct.pack("!i", 2**31 - 1), "infinity"),
    "date -infinity": (1082, -1, b"-infinity", struct.pack("!i", -(2**31)), "-infinity"),
    "date 10000": (1082, -1, b"10000-01-01", bc_days(10000, 1, 1), "10000-01-01"),
    "time": (1083, -1, b"13:45:06.000789", struct.pack("!q", (13 * 3600 + 45 * 60 + 6) * 10**6 + 789), dt.time(13, 45, 6, 789)),
    "time 24:00": (1083, -1, b"24:00:00", struct.pack("!q", 86_400 * 10**6), "24:00:00"),
    "timetz": (1266, -1, b"12:00:00.5+05:30", struct.pack("!qi", 43_200_500_000, -19_800), "12:00:00.5+05:30"),
    "timetz west seconds": (1266, -1, b"00:00:01-00:00:30", struct.pack("!qi", 1_000_000, 30), "00:00:01-00:00:30"),
    "timestamp": (1114, -1, b"2024-05-01 10:00:00.123", struct.pack("!q", pg_us(2024, 5, 1, 10, 0, 0, 123_000)), dt.datetime(2024, 5, 1, 10, 0, 0, 123000)),
    "timestamp infinity": (1114, -1, b"infinity", struct.pack("!q", 2**63 - 1), "infinity"),
    "timestamp BC": (1114, -1, b"0001-12-31 23:59:59 BC", struct.pack("!q", days_from_civil(0, 12, 31) * 86_400 * 10**6 + 86_399 * 10**6), "0001-12-31 23:59:59 BC"),
    "timestamptz": (1184, -1, b"2024-05-01 10:00:00+00", struct.pack("!q", pg_us(2024, 5, 1, 10)), dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)),
    "timestamptz -infinity": (1184, -1, b"-infinity", struct.pack("!q", -(2**63)), "-infinity"),
    "timestamptz 10000": (1184, -1, b"10000-01-01 00:00:00+00", struct.pack("!q", pg_us(10000, 1, 1)), "10000-01-01 00:00:00+00"),
    "interval": (1186, -1, b"1 year 2 mons -3 days +04:05:06.5", struct.pack("!qii", 14_706_500_000, -3, 14), {"months": 14, "days": -3, "micros": 14_706_500_000}),
    "interval negative time": (1186, -1, b"-00:00:00.000001", struct.pack("!qii", -1, 0, 0), {"months": 0, "days": 0, "micros": -1}),
    "interval zero": (1186, -1, b"00:00:00", struct.pack("!qii", 0, 0, 0), {"months": 0, "days": 0, "micros": 0}),
    "inet host": (869, -1, b"192.168.0.1", bytes([2, 32, 0, 4, 192, 168, 0, 1]), "192.168.0.1"),
    "inet with mask": (869, -1, b"192.168.0.1/24", bytes([2, 24, 0, 4, 192, 168, 0, 1]), "192.168.0.1/24"),
    "cidr v6": (650, -1, b"2001:db8::/32", bytes([3, 32, 1, 16]) + bytes.fromhex("20010db8" + "00" * 12), "2001:db8::/32"),
    "macaddr": (829, -1, b"08:00:2b:01:02:03", bytes.fromhex("08002b010203"), "08:00:2b:01:02:03"),
    "macaddr8": (774, -1, b"08:00:2b:01:02:03:04:05", bytes.fromhex("08002b0102030405"), "08:00:2b:01:02:03:04:05"),
    "bit": (1560, 10, b"1010000001", struct.pack("!i", 10) + bytes([0b10100000, 0b01000000]), "1010000001"),
    "varbit empty": (1562, -1, b"", struct.pack("!i", 0), ""),
    "pg_lsn": (3220, -1, b"16/B374D848", struct.pack("!Q", (0x16 << 32) | 0xB374D848), "16/B374D848"),
    "point": (600, -1, b"(1.5,-2)", struct.pack("!dd", 1.5, -2.0), "(1.5,-2)"),
    "box": (603, -1, b"(3,4),(1,2)", struct.pack("!dddd", 3, 4, 1, 2), "(3,4),(1,2)"),
    "lseg": (601, -1, b"[(1,2),(3,4)]", struct.pack("!dddd", 1, 2, 3, 4), "[(1,2),(3,4)]"),
    "line": (628, -1, b"{1,-1,0}", struct.pack("!ddd", 1, -1, 0), "{1,-1,0}"),
    "path open": (602, -1, b"[(0,0),(1,1e+20)]", b"\x00" + struct.pack("!idddd", 2, 0, 0, 1, 1e20), "[(0,0),(1,1e+20)]"),
    "polygon": (604, -1, b"((0,0),(1,0),(0,1))", struct.pack("!idddddd", 3, 0, 0, 1, 0, 0, 1), "((0,0),(1,0),(0,1))"),
    "circle": (718, -1, b"<(0,0),2.5>", struct.pack("!ddd", 0, 0, 2.5), "<(0,0),2.5>"),
    "int4range": (3904, -1, b"[1,10)", b"\x02" + struct.pack("!ii", 4, 1) + struct.pack("!ii", 4, 10), "[1,10)"),
    "int8range empty": (3926, -1, b"empty", b"\x01", "empty"),
    "daterange unbounded": (3912, -1, b"[2024-01-01,)", b"\x12" + struct.pack("!i", 4) + pg_days(dt.date(2024, 1, 1)), "[2024-01-01,)"),
    "tstzrange": (3910, -1, b'["2024-05-01 10:00:00+00","2024-05-02 00:00:00+00")', b"\x02" + struct.pack("!iq", 8, pg_us(2024, 5, 1, 10)) + struct.pack("!iq", 8, pg_us(2024, 5, 2)), '["2024-05-01 10:00:00+00","2024-05-02 00:00:00+00")'),
    "numrange": (3906, -1, b"(1.50,2.5]", b"\x04" + struct.pack("!i", len(dump_binary(Decimal("1.50")))) + dump_binary(Decimal("1.50")) + struct.pack("!i", len(dump_binary(Decimal("2.5")))) + dump_binary(Decimal("2.5")), "(1.50,2.5]"),
    "money": (790, -1, b"-$1,234.56", struct.pack("!q", -123_456), "-$1,234.56"),
    "tsvector": (3614, -1, b"'a':1A,3 'it''s' 'z':2", struct.pack("!i", 3) + b"a\x00" + struct.pack("!HHH", 2, (3 << 14) | 1, 3) + b"it's\x00" + struct.pack("!H", 0) + b"z\x00" + struct.pack("!HH", 1, 2), "'a':1A,3 'it''s' 'z':2"),
}  # fmt: skip


@pytest.mark.parametrize("label", sorted(CASES))
def test_text_and_binary_give_the_same_lossless_value(label: str) -> None:
    oid, typmod, text, binary, expected = CASES[label]
    m = mapping(oid, typmod)
    from_text = avro_round_trip(m, m.text(text))
    from_binary = avro_round_trip(m, m.binary(binary))
    if expected is not None:
        assert from_text == expected
    assert from_binary == from_text
    if isinstance(expected, float):
        assert math.copysign(1, from_binary) == math.copysign(1, expected)


def test_float_nan_survives_in_both_modes() -> None:
    for oid, packed in ((701, struct.pack("!d", math.nan)), (700, struct.pack("!f", math.nan))):
        m = mapping(oid)
        assert math.isnan(avro_round_trip(m, m.text(b"NaN")))
        assert math.isnan(avro_round_trip(m, m.binary(packed)))


def test_bc_date_text_is_kept_verbatim() -> None:
    m = mapping(1082)
    assert avro_round_trip(m, m.text(b"4714-11-24 BC")) == "4714-11-24 BC"


def test_bc_date_binary_renders_like_postgresql() -> None:
    # 4714-11-24 BC is PostgreSQL's first date: Julian day 0 = 2000-01-01 minus 2451545 days.
    assert pg_datetime.date_binary(struct.pack("!i", -2_451_545)) == ("string", "4714-11-24 BC")
    assert pg_datetime.render_date(days_from_civil(0, 12, 31)) == "0001-12-31 BC"
    assert days_from_civil(-4713, 11, 24) == -2_451_545


def test_numeric_bounded_rejects_excess_scale_instead_of_rounding() -> None:
    m = mapping(1700, NUMERIC_12_2)
    with pytest.raises(ValueError):
        m.text(b"1.234")


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_any_binary_date_encodes_and_decodes(days: int) -> None:
    m = mapping(1082)
    decoded = avro_round_trip(m, m.binary(struct.pack("!i", days)))
    if isinstance(decoded, dt.date):
        assert decoded.toordinal() - dt.date(2000, 1, 1).toordinal() == days
    else:
        assert isinstance(decoded, str) and decoded


@given(st.integers(min_value=-211_813_488_000 * 10**6, max_value=9_223_371_331_200 * 10**6 - 1))
def test_any_binary_timestamp_encodes_and_decodes(pg_us: int) -> None:
    for oid in (1114, 1184):
        m = mapping(oid)
        decoded = avro_round_trip(m, m.binary(struct.pack("!q", pg_us)))
        if isinstance(decoded, dt.datetime):
            epoch = dt.datetime(2000, 1, 1, tzinfo=decoded.tzinfo)
            assert (decoded - epoch) // dt.timedelta(microseconds=1) == pg_us
        else:
            assert decoded.endswith(" BC") or decoded[:5].isdigit()


@given(
    st.datetimes(
        min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    )
)
def test_timestamp_text_and_binary_agree(value: dt.datetime) -> None:
    m = mapping(1114)
    text = value.isoformat(sep=" ").encode()
    binary = struct.pack("!q", (value - dt.datetime(2000, 1, 1)) // dt.timedelta(microseconds=1))
    assert avro_round_trip(m, m.text(text)) == value == avro_round_trip(m, m.binary(binary))


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_render_date_matches_python_inside_its_range(pg_day: int) -> None:
    unix_days = pg_day + pg_datetime.PG_EPOCH_DAYS
    year, month, day = pg_datetime.civil_from_days(unix_days)
    if 1 <= year <= 9999:
        assert dt.date(year, month, day) == dt.date(1970, 1, 1) + dt.timedelta(days=unix_days)


@given(
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 2),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
)
def test_interval_binary_keeps_the_three_parts(us: int, days: int, months: int) -> None:
    m = mapping(1186)
    decoded = avro_round_trip(m, m.binary(struct.pack("!qii", us, days, months)))
    assert decoded == {"months": months, "days": days, "micros": us}


@pytest.mark.parametrize(
    ("text", "us", "days", "months"),
    [
        (b"infinity", 2**63 - 1, 2**31 - 1, 2**31 - 1),
        (b"-infinity", -(2**63), -(2**31), -(2**31)),
    ],
)
def test_infinite_intervals_text_equals_binary(
    text: bytes, us: int, days: int, months: int
) -> None:
    """PostgreSQL 17+ sends 'infinity'/'-infinity' in text, and its stored extremes in binary."""
    m = mapping(1186)
    from_text = avro_round_trip(m, m.text(text))
    assert from_text == avro_round_trip(m, m.binary(struct.pack("!qii", us, days, months)))
    assert from_text == {"months": months, "days": days, "micros": us}


def test_array_text_and_binary_agree_with_nulls_dims_and_bounds() -> None:
    m = mapping(1007)  # int4[]
    text = b"[0:1][1:3]={{1,NULL,3},{4,5,NULL}}"
    items = [1, None, 3, 4, 5, None]
    binary = struct.pack("!iiiiiii", 2, 1, 23, 2, 0, 3, 1) + b"".join(
        struct.pack("!i", -1) if v is None else struct.pack("!ii", 4, v) for v in items
    )
    expected = {"dims": [2, 3], "lower_bounds": [0, 1], "elements": items}
    assert avro_round_trip(m, m.text(text)) == expected
    assert avro_round_trip(m, m.binary(binary)) == expected


def test_empty_array_and_quoted_text_elements() -> None:
    m = mapping(1009)  # text[]
    assert avro_round_trip(m, m.text(b"{}")) == []  # PostgreSQL's empty array has no dimensions
    assert avro_round_trip(m, m.binary(struct.pack("!iii", 0, 0, 25))) == []
    decoded = avro_round_trip(m, m.text(b'{"",NULL,"NULL","a,b","q\\"\\\\",\xf0\x9f\x98\x80}'))
    assert decoded == ["", None, "NULL", "a,b", 'q"\\', "😀"]


def test_one_dimensional_arrays_from_one_are_plain_avro_arrays_others_keep_their_shape() -> None:
    m = mapping(1007)  # int4[]
    one_d = struct.pack("!iiiii", 1, 1, 23, 2, 1) + struct.pack("!ii", 4, 7) + struct.pack("!i", -1)
    assert avro_round_trip(m, m.text(b"{7,NULL}")) == [7, None]
    assert avro_round_trip(m, m.binary(one_d)) == [7, None]
    shifted = {"dims": [2], "lower_bounds": [0], "elements": [7, None]}
    assert avro_round_trip(m, m.text(b"[0:1]={7,NULL}")) == shifted
    zero_based = struct.pack("!iiiii", 1, 1, 23, 2, 0) + one_d[20:]
    assert avro_round_trip(m, m.binary(zero_based)) == shifted


def test_box_array_uses_semicolon_delimiter() -> None:
    m = mapping(1020)  # box[]
    assert avro_round_trip(m, m.text(b"{(3,4),(1,2);(1,1),(0,0)}")) == [
        "(3,4),(1,2)",
        "(1,1),(0,0)",
    ]


def test_date_array_edge_elements() -> None:
    m = mapping(1182)  # date[]
    decoded = avro_round_trip(m, m.text(b'{2024-01-01,infinity,"0044-03-15 BC",NULL}'))
    assert decoded == [dt.date(2024, 1, 1), "infinity", "0044-03-15 BC", None]
