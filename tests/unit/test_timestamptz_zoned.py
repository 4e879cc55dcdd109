"""The ``zoned-string`` form of timestamptz (``--timestamptz-format``): Debezium's ZonedTimestamp
ISO string, its Avro type, the producer setting, and the consumer's lake columns for it."""

from __future__ import annotations

import datetime as dt
import io
import re
import struct
from typing import Any

import fastavro
import pytest
from test_schemas_row_encoder import CATALOG, assert_same_bytes

from producer.config import load_config
from producer.errors import ConfigError
from producer.pgoutput import Column, Relation, Value
from schemas import pg_datetime
from schemas.relation import build_relation_codec
from schemas.type_catalog import TypeCatalog
from schemas.type_mapping import (
    TIMESTAMPTZ_MICROS,
    TIMESTAMPTZ_ZONED,
    ZONED_TIMESTAMP,
    MappingContext,
    map_type,
)
from spark_consumer.columns import RowField
from spark_consumer.conversions import DEFAULT_CONVERSIONS, ISO_INSTANT
from spark_consumer.verify_forms import render_scalar

TIMESTAMPTZ, TIMESTAMPTZ_ARRAY, INT8 = 1184, 1185, 20
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix micros


def _binary(unix_us: int) -> bytes:
    return struct.pack("!q", unix_us - PG_EPOCH_US)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"2040-08-22 08:00:00.123456+00", "2040-08-22T08:00:00.123456Z"),
        (b"2040-08-22 08:00:00.5+00", "2040-08-22T08:00:00.5Z"),
        (b"2040-08-22 08:00:00+00", "2040-08-22T08:00:00Z"),
        (b"1969-12-31 23:59:59.999999+00", "1969-12-31T23:59:59.999999Z"),
        # what common readers cannot hold stays PostgreSQL's text, as in the union form
        (b"infinity", "infinity"),
        (b"0044-03-15 12:00:00+00 BC", "0044-03-15 12:00:00+00 BC"),
        (b"10000-01-01 00:00:00+00", "10000-01-01 00:00:00+00"),
    ],
)
def test_zoned_text(text: bytes, expected: str) -> None:
    assert pg_datetime.timestamptz_zoned_text(text) == expected


def test_zoned_binary_agrees_with_text_and_the_micros_form() -> None:
    for unix_us in (2_229_235_200_123_456, 0, -1, 1_700_000_000_000_000):
        zoned = pg_datetime.timestamptz_zoned_binary(_binary(unix_us))
        assert zoned.endswith("Z") and "T" in zoned
        assert pg_datetime.timestamptz_binary(_binary(unix_us)) == unix_us
        parsed = dt.datetime.fromisoformat(zoned.replace("Z", "+00:00"))
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        assert (parsed - epoch) // dt.timedelta(microseconds=1) == unix_us
    assert pg_datetime.timestamptz_zoned_binary(struct.pack("!q", 2**63 - 1)) == "infinity"


def test_the_setting_picks_the_avro_type() -> None:
    micros = map_type(MappingContext(TypeCatalog(), "n"), TIMESTAMPTZ, -1, "Value_c")
    assert micros.avro == [{"type": "long", "logicalType": "timestamp-micros"}, "string"]
    ctx = MappingContext(TypeCatalog(), "n", timestamptz=TIMESTAMPTZ_ZONED)
    zoned = map_type(ctx, TIMESTAMPTZ, -1, "Value_c")
    assert zoned.avro == {"type": "string", "connect.name": ZONED_TIMESTAMP}
    assert zoned.pg_type == "timestamp with time zone"
    element = map_type(ctx, TIMESTAMPTZ_ARRAY, -1, "Value_a").avro[0]["items"]
    assert element == ["null", {"type": "string", "connect.name": ZONED_TIMESTAMP}]


def test_compiled_encoders_match_fastavro_in_the_zoned_form() -> None:
    cols = (Column(1, "id", INT8, -1, True), Column(0, "at", TIMESTAMPTZ, -1, False))
    relation = Relation(None, 1, "public", "t", "d", cols)
    codec = build_relation_codec(relation, CATALOG, "db.public.t", timestamptz=TIMESTAMPTZ_ZONED)
    for at in (
        Value(b"2040-08-22 08:00:00.123456+00", False),
        Value(b"-infinity", False),
        Value(_binary(2_229_235_200_123_456), True),
        Value(struct.pack("!q", -(2**63)), True),
    ):
        assert_same_bytes(codec, (Value(b"7", False), at))
    row, _ = codec.convert_row((Value(b"7", False), Value(b"2040-08-22 08:00:00+00", False)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(codec.value_schema), row)
    buf.seek(0)
    decoded: Any = fastavro.schemaless_reader(buf, fastavro.parse_schema(codec.value_schema), None)
    assert decoded["at"] == "2040-08-22T08:00:00Z"


BASE = {
    "WALBRIDGE_PG_DSN": "postgresql://u:p@h/db",
    "WALBRIDGE_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://r",
}


def test_producer_setting() -> None:
    assert load_config([], BASE).timestamptz_format == TIMESTAMPTZ_MICROS
    env = BASE | {"WALBRIDGE_TIMESTAMPTZ_FORMAT": "zoned-string"}
    assert load_config([], env).timestamptz_format == TIMESTAMPTZ_ZONED
    with pytest.raises(ConfigError, match="timestamptz_format must be one of"):
        load_config(["--timestamptz-format", "iso"], BASE)


def test_consumer_lake_columns_and_verify_form() -> None:
    f = RowField("c", ["null", {"type": "string", "connect.name": ZONED_TIMESTAMP}], None)
    assert DEFAULT_CONVERSIONS.lake_columns((f,)) == ["c", "c__text"]
    assert re.match(ISO_INSTANT, "2040-08-22T08:00:00.123456Z")
    assert not re.match(ISO_INSTANT, "10000-01-01 00:00:00+00")
    assert render_scalar("timestamptz", "2040-08-22T08:00:00.5Z") == "2040-08-22 08:00:00.5+00"
