"""Exact round trip, PostgreSQL as the oracle: literal -> INSERT -> pgoutput (text and binary)
-> decode -> convert -> Avro with the schema registered in the real registry -> decode ==
what psycopg reads for the same row with a plain SELECT (or, where psycopg cannot load a
value - BC dates, infinities, 24:00:00 - PostgreSQL's own text of it)."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg.types import TypeInfo
from psycopg.types.composite import CompositeInfo, register_composite
from psycopg.types.hstore import register_hstore

from producer.pgoutput import Decoder, Insert, Relation, Type
from producer.pgoutput.tuples import Value
from schemas.catalog import ensure_types, on_type_message
from schemas.envelope import envelope_record
from schemas.pg_datetime import INTERVAL_INFINITY, INTERVAL_MINUS_INFINITY
from schemas.registry import RegistryConfig, SchemaRegistry
from schemas.relation import RelationCodec, build_relation_codec
from schemas.type_catalog import PgType, TypeCatalog, TypeKind
from schemas.wire import AvroDecoder, AvroEncoder, split_frame
from tests.support.pg_versions import pg_dsn_of  # noqa: F401

pytestmark = pytest.mark.integration

SCHEMA = f"wb_schemas_rt_{os.getpid()}"
# The producer's session settings for text values (see docs/producer.md); synchronous_commit on because the
# SQL peek functions only read WAL that is flushed, and the local stack runs with it off.
SESSION = (
    "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; "
    "SET synchronous_commit = on"
)

# column -> (SQL type, literals of the rows; None = NULL). Row 0 is all NULL.
COLUMNS: dict[str, tuple[str, list[str | None]]] = {
    "b": ("bool", ["true", "false", None, None]),
    "i2": ("int2", ["-32768", "32767", "0", None]),
    "i4": ("int4", ["-2147483648", "2147483647", "0", None]),
    "i8": ("int8", ["-9223372036854775808", "9223372036854775807", "0", None]),
    "o": ("oid", ["4294967295", "0", None, None]),
    "f4": ("float4", ["1.1", "NaN", "-0", "-Infinity"]),
    "f8": ("float8", ["3.141592653589793", "NaN", "-0", "Infinity"]),
    "n": ("numeric(12,2)", ["1234567890.12", "NaN", "-9999999999.99", "0"]),
    "nn": ("numeric(5,-2)", ["1234500", "-100", None, None]),
    "nu": ("numeric", ["123456789012345678901234567890.123456789", "Infinity", "-0.000001", "1e-30"]),
    "m": ("money", ["1234.56", "-92233720368547758.08", "0", None]),
    "ch": ('"char"', ["a", None, None, None]),
    "bp": ("char(5)", ["ab", "", None, None]),
    "vc": ("varchar(10)", ["😀é", "", None, None]),
    "t": ("text", ["plain", "", "tab\there\nnewline", "a😀\\b'"]),
    "nm": ("name", ["some_name", None, None, None]),
    "ci": ("citext", ["MiXeD", None, None, None]),
    "by": ("bytea", ["\\x00ff10", "\\x", None, None]),
    "u": ("uuid", ["12345678-1234-5678-1234-567812345678", None, None, None]),
    "j": ("json", ['{"a": [1, 2.50]}', "null", None, None]),
    "jb": ("jsonb", ['{"b": "😀", "a": null}', "[]", None, None]),
    "x": ("xml", ["<a>1</a>", None, None, None]),
    "d": ("date", ["2024-02-29", "4714-11-24 BC", "infinity", "5874897-12-31"]),
    "d2": ("date", ["0001-01-01", "9999-12-31", "-infinity", "10000-01-01"]),
    "tm": ("time", ["24:00:00", "00:00:00", "12:34:56.789012", "23:59:59.999999"]),
    "tz": ("timetz", ["12:00:00+05:30", "23:59:59.5-12", "24:00:00+14", None]),
    "ts": ("timestamp", ["2024-05-01 10:00:00.123456", "4713-01-01 00:00:00 BC", "infinity", "294276-12-31 23:59:59.999999"]),
    "tt": ("timestamptz", ["2024-05-01 10:00:00.5+02", "-infinity", "10000-01-01 00:00:00+00", "0044-03-15 12:00:00+00 BC"]),
    "t3": ("timestamptz(3)", ["9999-12-31 23:59:59.999+00", "0001-01-01 00:00:00+00", None, None]),
    "iv": ("interval", ["1 year 2 mons 3 days 04:05:06.789", "-1 mons +1 days -00:00:01", "0", "178956970 years 7 mons 2147483647 days 2562047788:00:54.775807"]),
    "ip": ("inet", ["192.168.0.1", "10.0.0.0/8", "2001:db8::1/64", "::1"]),
    "cd": ("cidr", ["10.0.0.0/8", "2001:db8::/32", None, None]),
    "mc": ("macaddr", ["08:00:2b:01:02:03", None, None, None]),
    "m8": ("macaddr8", ["08:00:2b:01:02:03:04:05", None, None, None]),
    "bt": ("bit(4)", ["1010", None, None, None]),
    "vb": ("varbit", ["", "1", "10101010101", None]),
    "tv": ("tsvector", ["'it''s' a:1A fat:2B,4C cat:5", "", None, None]),
    "tq": ("tsquery", ["fat & (rat | !cat)", "a <-> b", "a <2> (b & c)", "x:*AB & !(y | z)"]),
    "pt": ("point", ["(1.5,-2)", "(1e+20,0.1)", None, None]),
    "ln": ("line", ["{1,-1,0}", None, None, None]),
    "ls": ("lseg", ["[(1,2),(3,4)]", None, None, None]),
    "bx": ("box", ["(3,4),(1,2)", None, None, None]),
    "pa": ("path", ["[(0,0),(1,1)]", "((0,0),(1,0),(0,1))", None, None]),
    "pg": ("polygon", ["((0,0),(1,0),(0,1))", None, None, None]),
    "cr": ("circle", ["<(0,0),2.5>", None, None, None]),
    "r4": ("int4range", ["[1,10)", "empty", "(,5]", None]),
    "r8": ("int8range", ["[1,9223372036854775806]", None, None, None]),
    "rn": ("numrange", ["(1.50,2.5]", "[-Infinity,0)"[0:0] + "(,0)", None, None]),
    "rs": ("tsrange", ['["2024-01-01 00:00:00",infinity)', None, None, None]),
    "rz": ("tstzrange", ['["2024-01-01 00:00:00+00","2024-02-01 12:30:00+00")', None, None, None]),
    "rd": ("daterange", ["[2024-01-01,2024-02-01)", "[2024-01-01,infinity)", None, None]),
    "lsn": ("pg_lsn", ["16/B374D848", "FFFFFFFF/FFFFFFFF", "0/0", None]),
    "hs": ("hstore", ['a=>1, b=>NULL, "c d"=>"x\\"y"', "", None, None]),
    "en": (f"{SCHEMA}.mood", ["happy", "sad", None, None]),
    "dm": (f"{SCHEMA}.posint", ["5", None, None, None]),
    "cp": (f"{SCHEMA}.address", ["(\"Main St\",12345,\"0044-03-15 BC\")", "(,\"\",)", None, None]),
    "ai": ("int4[]", ["{1,NULL,3}", "[0:1][1:2]={{1,2},{3,4}}", "{}", "{{{1}}}"]),
    "at": ("text[]", ['{"a b",NULL,"NULL","q\\"x",😀,""}', "{}", None, None]),
    "ad": ("date[]", ['{2024-01-01,infinity,"0044-03-15 BC",NULL}', None, None, None]),
    "an": ("numeric(5,2)[]", ["{1.50,NaN,NULL}", None, None, None]),
    "ae": (f"{SCHEMA}.mood[]", ["{happy,sad}", None, None, None]),
    "ac": (f"{SCHEMA}.address[]", ['{"(x,1,2024-01-01)",NULL}', None, None, None]),
    "av": ("interval[]", ['{"1 mon",NULL}', None, None, None]),
    "ab": ("box[]", ["{(1,1),(0,0);(3,3),(2,2)}", None, None, None]),
    "aj": ("jsonb[]", ['{"{\\"a\\": 1}",null}', None, None, None]),
}  # fmt: skip
ROWS = 4


@dataclass(frozen=True)
class Captured:
    relation: Relation
    inserts: list[tuple[int, Insert]]  # (lsn, message)
    catalog: TypeCatalog


def _has_libxml(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute("SELECT '<a/>'::xml")
        except psycopg.errors.FeatureNotSupported:
            return False
    return True


@pytest.fixture(scope="module")
def roundtrip_dsn(pg_dsn: str, pg_dsn_of: Callable[[int], str]) -> str:
    """Every type needs a server that parses them all: PyPI's PostgreSQL 18 build (the stack's
    default) has no libxml and refuses xml values, so the round trip then runs on the newest
    major here that has it (17, zonky's build); the other types run on 18 in the e2e suite."""
    if _has_libxml(pg_dsn):
        return pg_dsn
    dsn = pg_dsn_of(17)
    assert _has_libxml(dsn), "no PostgreSQL with libxml to round-trip xml values on"
    return dsn


@pytest.fixture(scope="module")
def conn(roundtrip_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(roundtrip_dsn, autocommit=True) as c:
        c.execute(SESSION)
        c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        c.execute("CREATE EXTENSION IF NOT EXISTS citext")
        c.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        c.execute(f"CREATE SCHEMA {SCHEMA}")
        c.execute(f"CREATE TYPE {SCHEMA}.mood AS ENUM ('sad', 'ok', 'happy')")
        c.execute(f"CREATE DOMAIN {SCHEMA}.posint AS int4 CHECK (VALUE > 0)")
        c.execute(f"CREATE TYPE {SCHEMA}.address AS (street text, zip varchar(10), since date)")
        columns = ", ".join(f"{name} {sql}" for name, (sql, _) in COLUMNS.items())
        c.execute(f"CREATE TABLE {SCHEMA}.t (id int PRIMARY KEY, {columns})")
        c.execute(f"CREATE PUBLICATION {SCHEMA}_pub FOR TABLE {SCHEMA}.t")
        register_hstore(TypeInfo.fetch(c, "hstore"), c)  # type: ignore[arg-type]
        info = CompositeInfo.fetch(c, f"{SCHEMA}.address")
        assert info is not None
        register_composite(info, c)
        try:
            yield c
        finally:
            for mode in ("text", "binary"):
                c.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (f"{SCHEMA}_{mode}",),
                )
            c.execute(f"DROP PUBLICATION IF EXISTS {SCHEMA}_pub")
            c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


def _insert_rows(conn: psycopg.Connection[Any]) -> None:
    names = list(COLUMNS)
    conn.execute(f"INSERT INTO {SCHEMA}.t (id) VALUES (0)")  # the all-NULL row
    for row in range(ROWS):
        values = [COLUMNS[n][1][row] for n in names]
        placeholders = ", ".join(f"%s::{COLUMNS[n][0]}" for n in names)
        conn.execute(
            f"INSERT INTO {SCHEMA}.t (id, {', '.join(names)}) VALUES ({row + 1}, {placeholders})",
            values,
        )


def _capture(conn: psycopg.Connection[Any], binary: bool) -> Captured:
    slot = f"{SCHEMA}_{'binary' if binary else 'text'}"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    conn.execute(f"DELETE FROM {SCHEMA}.t")
    _insert_rows(conn)
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'binary', %s)",
        (slot, f"{SCHEMA}_pub", "true" if binary else "false"),
    ).fetchall()
    decoder = Decoder()
    catalog = TypeCatalog()
    relation: Relation | None = None
    inserts: list[tuple[int, Insert]] = []
    for lsn_text, data in rows:
        message = decoder.decode(data)
        if isinstance(message, Type):
            on_type_message(catalog, conn, message.type_oid)
        elif isinstance(message, Relation):
            relation = message
            ensure_types(catalog, conn, [c.type_oid for c in message.columns])
        elif isinstance(message, Insert):
            hi, lo = lsn_text.split("/")
            inserts.append(((int(hi, 16) << 32) | int(lo, 16), message))
    assert relation is not None and len(inserts) == ROWS + 1
    return Captured(relation, inserts, catalog)


NATIVE_ERROR = object()


def _oracle(conn: psycopg.Connection[Any], expr: str, row_id: int) -> tuple[Any, str | None]:
    """(psycopg's value or NATIVE_ERROR, PostgreSQL's text) of ``expr`` in row ``row_id``."""
    # format('%s') applies the type's output function, as pgoutput does (::text may differ: inet).
    (text,) = conn.execute(
        f"SELECT CASE WHEN ({expr}) IS NULL THEN NULL ELSE format('%%s', {expr}) END FROM {SCHEMA}.t WHERE id = %s",
        (row_id,),
    ).fetchone() or (None,)
    try:
        (native,) = conn.execute(
            f"SELECT {expr} FROM {SCHEMA}.t WHERE id = %s", (row_id,)
        ).fetchone() or (None,)
    except (psycopg.DataError, OverflowError, ValueError):
        native = NATIVE_ERROR
    return native, text


def _resolve(catalog: TypeCatalog, oid: int) -> PgType:
    pg_type = catalog.get(oid)
    assert pg_type is not None
    while pg_type.kind is TypeKind.DOMAIN:
        base = catalog.get(pg_type.base_oid)
        assert base is not None
        pg_type = base
    return pg_type


TEXT_COMPARED = {
    "money", "inet", "cidr", "macaddr", "macaddr8", "bit", "varbit", "tsvector", "tsquery", "point",
    "line", "lseg", "box", "path", "polygon", "circle", "int4range", "int8range", "numrange",
    "tsrange", "tstzrange", "daterange", "pg_lsn", "timetz", "text", "varchar", "name",
    '"char"', "citext", "xml", "json", "jsonb",
}  # fmt: skip


def _check(
    conn: psycopg.Connection[Any],
    catalog: TypeCatalog,
    oid: int,
    typmod: int,
    expr: str,
    row_id: int,
    avro: Any,
) -> None:
    """Assert the decoded Avro value ``avro`` equals what PostgreSQL holds at ``expr``."""
    pg_type = _resolve(catalog, oid)
    native, text = _oracle(conn, expr, row_id)
    where = (
        f"{expr} (row {row_id}, {pg_type.name}): avro {avro!r}, psycopg {native!r}, text {text!r}"
    )
    if text is None:
        assert avro is None, where
        return
    assert avro is not None, where
    name = pg_type.name
    if pg_type.kind is TypeKind.ARRAY:
        _check_array(conn, catalog, pg_type, typmod, expr, row_id, avro, text)
    elif pg_type.kind is TypeKind.COMPOSITE:
        for attr in pg_type.attributes:
            _check(
                conn,
                catalog,
                attr.type_oid,
                attr.type_modifier,
                f"({expr}).{attr.name}",
                row_id,
                avro[attr.name],
            )
    elif pg_type.kind is TypeKind.ENUM or name in TEXT_COMPARED:
        assert avro == text, where
    elif name == "numeric":
        assert (str(avro) if not isinstance(avro, str) else avro) == text, where
    elif name == "float4":
        assert (math.isnan(avro) and math.isnan(native)) or struct.pack("!f", avro) == struct.pack(
            "!f", native
        ), where
    elif name == "float8":
        assert (math.isnan(avro) and math.isnan(native)) or struct.pack("!d", avro) == struct.pack(
            "!d", native
        ), where
    elif name in ("date", "time", "timestamp", "timestamptz"):
        if isinstance(avro, str):
            assert native is NATIVE_ERROR or name == "timestamptz", (
                where
            )  # only edge values are strings
            assert avro == text, where
        else:
            assert avro == native, where
    elif name == "interval":
        (finite, positive) = conn.execute(
            f"SELECT isfinite({expr}), {expr} > interval '0' FROM {SCHEMA}.t WHERE id = %s",
            (row_id,),
        ).fetchone() or (None, None)
        if finite is False:  # 17+: 'infinity' / '-infinity', kept as the server stores them
            want = INTERVAL_INFINITY if positive else INTERVAL_MINUS_INFINITY
            assert avro == want, where
            return
        parts = conn.execute(
            f"SELECT (extract(year from {expr}) * 12 + extract(month from {expr}))::int8, extract(day from {expr})::int8, "
            f"(extract(hour from {expr}) * 3600000000 + extract(minute from {expr}) * 60000000 + extract(microseconds from {expr}))::int8 "
            f"FROM {SCHEMA}.t WHERE id = %s",
            (row_id,),
        ).fetchone()
        assert parts is not None and (avro["months"], avro["days"], avro["micros"]) == tuple(
            parts
        ), where
    else:  # bool, integers, oid, bytea, uuid, hstore, bpchar (::text trims it)...: psycopg's value
        assert native is not NATIVE_ERROR and avro == native, where


def _check_array(
    conn: psycopg.Connection[Any],
    catalog: TypeCatalog,
    pg_type: PgType,
    typmod: int,
    expr: str,
    row_id: int,
    avro: dict[str, Any] | list[Any],
    text: str,
) -> None:
    if isinstance(avro, list):  # one dimension from 1 (or empty): a plain Avro array
        avro = {
            "dims": [len(avro)] if avro else [],
            "lower_bounds": [1] if avro else [],
            "elements": avro,
        }
    (dims_text,) = conn.execute(
        f"SELECT coalesce(array_dims({expr}), '') FROM {SCHEMA}.t WHERE id = %s", (row_id,)
    ).fetchone() or ("",)
    expected_dims = "".join(
        f"[{lo}:{lo + n - 1}]" for lo, n in zip(avro["lower_bounds"], avro["dims"], strict=True)
    )
    assert expected_dims == dims_text, (
        f"{expr}: dims {avro['dims']} bounds {avro['lower_bounds']} vs {dims_text}"
    )
    count = conn.execute(
        f"SELECT cardinality({expr}) FROM {SCHEMA}.t WHERE id = %s", (row_id,)
    ).fetchone()
    assert count is not None and len(avro["elements"]) == count[0]
    for i, element in enumerate(avro["elements"]):
        # Element i in row-major order -> its subscripts, e.g. [0][2] for i=1 of '[0:1][1:2]'.
        subscripts: list[str] = []
        rest = i
        for lower, size in reversed(list(zip(avro["lower_bounds"], avro["dims"], strict=True))):
            rest, offset = divmod(rest, size)
            subscripts.insert(0, f"[{lower + offset}]")
        _check(
            conn,
            catalog,
            pg_type.element_oid,
            typmod,
            f"({expr}){''.join(subscripts)}",
            row_id,
            element,
        )


def _registered_round_trip(
    registry_url: str, codec: RelationCodec, lsn: int, row: dict[str, Any], toast: list[str]
) -> dict[str, Any]:
    ids = SchemaRegistry(RegistryConfig(registry_url)).register_relation(codec)
    source = {
        "version": "test", "connector": "postgresql", "name": "rt", "ts_ms": 0, "snapshot": "false",
        "db": "walbridge", "sequence": None, "schema": SCHEMA, "table": "t", "txId": None, "lsn": lsn,
        "commit_lsn": None, "xmin": None,
    }  # fmt: skip
    message = AvroEncoder(codec.envelope_schema, ids.value_id).encode(
        envelope_record(codec.value_schema["name"], "c", None, row, source, None, None, toast)
    )
    schema_id, _ = split_frame(message)
    registered = SchemaRegistryClient({"url": registry_url}).get_schema(schema_id)
    decoded: dict[str, Any] = AvroDecoder(json.loads(registered.schema_str or "")).decode(message)
    return decoded


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_every_type_round_trips_exactly(
    conn: psycopg.Connection[Any], registry_url: str, binary: bool
) -> None:
    captured = _capture(conn, binary)
    topic = f"rt{os.getpid()}.{SCHEMA}.t_{'binary' if binary else 'text'}"
    codec = build_relation_codec(captured.relation, captured.catalog, topic)
    unmapped = [c.name for c in codec.columns if not c.mapped]
    assert unmapped == []
    if binary:  # pgoutput really sent binary values (not text) for these columns
        assert all(isinstance(v, Value) and v.binary for v in captured.inserts[1][1].new)
    for lsn, insert in captured.inserts:
        row, toast = codec.convert_row(insert.new, lsn)
        decoded = _registered_round_trip(registry_url, codec, lsn, row, toast)["after"]
        row_id = decoded["id"]
        for column in captured.relation.columns:
            if column.name != "id":
                _check(
                    conn,
                    captured.catalog,
                    column.type_oid,
                    column.type_modifier,
                    column.name,
                    row_id,
                    decoded[column.name],
                )
