"""Compiled row encoders: a decoded pgoutput tuple -> the Avro bytes of its row/key record.

The reference path converts every value to Python (``RelationCodec.convert_row``) and lets
fastavro walk the row schema per event; profiled, that was a third of the producer's CPU.
Here, once per Relation, a straight-line Python function is generated for the table (one
block per column, no per-column loop or dict) and compiled with ``exec``. Generated code is
used because it is the only way in pure Python to get rid of the per-column interpretation
overhead (plan tuples, dict stores, fastavro's schema walk); the source is built only from
our own column positions and constants, never from data.

Per column, text-like values (text, varchar, json, enum, domains over them, ...) go from the
wire bytes straight into Avro (zig-zag length + the raw UTF-8 bytes, validated without a
decode/encode round trip); integers, booleans and float8 have inlined fast paths; every other
type keeps its converter from ``schemas.type_mapping`` and is written by a small per-type
Avro writer built here from the field's schema (``value_writer``). The output must equal,
byte for byte, fastavro's ``schemaless_writer`` on the converted row: unit tests check that
for every mapped type and edge value, in text and binary mode.

Each converted column also remembers its last wire value and Avro bytes (a one-entry cache:
rows of a transaction often repeat now(), a status or a day). The key record's body is taken
from the row's bytes of the key columns (``compile_row_key_encoder``): same unions, same bytes.

A value that fails here is re-converted by the reference converter, which raises the usual
``ConversionError`` naming table, column, type and value.

Row and row + key encoders also get a twin (``wire_encoder``) that reads the pgoutput
TupleData bytes itself, with the same per-column statements: the producer's fast path for
Insert/Update/Delete skips building ``Value`` tuples and message objects. The twin never
raises for bad input; it returns None and the caller takes the careful path.

They also get a second twin, compiled on first use (``copy_encoder``), that reads one row of
``COPY ... TO STDOUT`` text: a snapshot row goes through the same per-column statements as a
streamed text value, without building ``Value`` tuples first. The COPY text rules (NULL, the
backslash escapes) stay in the caller's splitter, handed over at compile time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from psycopg import Error as PsycopgError

from schemas import array_encoder, pg_scalars
from schemas.avro_binary import VARINT_LAST as _LAST
from schemas.avro_binary import VARINT_MID as _MID
from schemas.avro_binary import bytes_bytes, long_bytes, string_bytes
from schemas.errors import ConversionError
from schemas.type_mapping import AvroMapping, AvroType, Convert, nullable

ValueWriter = Callable[[Any], bytes]
RowEncoder = Callable[..., tuple[bytes, list[str]]]  # (values, lsn=None) -> (body, unchanged)
KeyEncoder = Callable[..., bytes]  # (values, lsn=None) -> body
# (values, lsn=None) -> (row body, unchanged, key body or None)
RowKeyEncoder = Callable[..., tuple[bytes, list[str], bytes | None]]
# (pgoutput payload, TupleData offset) -> (row body, unchanged, key body or None, end) or None
WireRowKeyEncoder = Callable[[bytes, int], tuple[bytes, list[str], bytes | None, int] | None]
# (one COPY text row, without its newline) -> (row body, key body or None) or None
CopyRowKeyEncoder = Callable[[bytes], tuple[bytes, bytes | None] | None]
# (a COPY text row that holds a backslash, column count) -> its values (None = NULL), unescaped
CopySplitter = Callable[[bytes, int], list[bytes | None]]


class UnsupportedSchema(Exception):
    """An Avro shape this module does not encode: the caller keeps the fastavro path."""


_pack_float: Final = struct.Struct("<f").pack
_pack_double: Final = struct.Struct("<d").pack
_unpack_i16: Final = struct.Struct("!h").unpack
_unpack_i32: Final = struct.Struct("!i").unpack
_unpack_i64: Final = struct.Struct("!q").unpack
_unpack_u32: Final = struct.Struct("!I").unpack
_unpack_f32: Final = struct.Struct("!f").unpack
_unpack_u16_from: Final = struct.Struct("!H").unpack_from
_unpack_u32_from: Final = struct.Struct("!I").unpack_from

_NAMED_KINDS: Final = ("record", "enum", "fixed")
# Logical types whose converters hand over the plain base-type value (int, bytes, str).
_PASS_THROUGH_LOGICAL: Final = {
    "decimal": "bytes",
    "date": "int",
    "time-micros": "long",
    "timestamp-micros": "long",
    "local-timestamp-micros": "long",
    "uuid": "string",
}


def _null(datum: Any) -> bytes:
    return b""


def _boolean(datum: Any) -> bytes:
    return b"\x01" if datum else b"\x00"


def _float(datum: Any) -> bytes:
    return _pack_float(datum)


def _double(datum: Any) -> bytes:
    return _pack_double(datum)


_PRIMITIVES: Final[dict[str, ValueWriter]] = {
    "null": _null,
    "boolean": _boolean,
    "int": long_bytes,
    "long": long_bytes,
    "float": _float,
    "double": _double,
    "bytes": bytes_bytes,
    "string": string_bytes,
}

# Which union branch a Python value takes, by base type (fastavro picks the first branch the
# value validates against; these are the only pairs our converters produce).
_ACCEPTS: Final[dict[type, tuple[str, ...]]] = {
    bool: ("boolean",),
    int: ("int", "long"),
    float: ("double", "float"),
    str: ("string",),
    bytes: ("bytes",),
    dict: ("record", "map"),
    list: ("array",),
}


def _base_type(avro: AvroType, named: dict[str, Any]) -> str:
    """The type name fastavro matches a value (and a branch name) against."""
    if isinstance(avro, str):
        return "record" if avro in named else avro
    if isinstance(avro, dict):
        kind: str = avro["type"]
        return kind
    raise UnsupportedSchema(f"nested union {avro!r}")


def _branch_name(avro: AvroType) -> str:
    """The name of a union branch in fastavro's ``(name, datum)`` notation."""
    if isinstance(avro, str):
        return avro
    if avro["type"] in _NAMED_KINDS:
        name: str = avro["name"]
        return name
    base: str = avro["type"]
    return base


def value_writer(avro: AvroType, named: dict[str, ValueWriter]) -> ValueWriter:
    """A function writing a converted value of ``avro`` as fastavro does.

    ``named`` maps full names to writers of the named types defined so far (walk a schema in
    order: Avro defines a name before any reference to it). Full names only: our schemas never
    use names relative to an enclosing namespace.
    """
    if isinstance(avro, str):
        primitive = _PRIMITIVES.get(avro)
        if primitive is not None:
            return primitive
        writer = named.get(avro)
        if writer is None:
            raise UnsupportedSchema(f"unknown named type {avro!r}")
        return writer
    if isinstance(avro, list):
        return _union_writer(avro, named)
    kind = avro["type"]
    if kind == "record":
        return _record_writer(avro, named)
    if kind == "array":
        return _array_writer(value_writer(avro["items"], named))
    if kind == "map":
        return _map_writer(value_writer(avro["values"], named))
    if isinstance(kind, str) and kind in _PRIMITIVES:
        logical = avro.get("logicalType")
        if logical is not None and _PASS_THROUGH_LOGICAL.get(logical) != kind:
            raise UnsupportedSchema(f"logical type {logical!r} on {kind!r}")
        return _PRIMITIVES[kind]
    raise UnsupportedSchema(f"Avro type {kind!r}")


def _record_writer(avro: dict[str, Any], named: dict[str, ValueWriter]) -> ValueWriter:
    fields: list[tuple[str, ValueWriter, Any]] = []

    def write_record(datum: Any) -> bytes:
        # Like fastavro: a missing field is written as its default.
        return b"".join([w(datum.get(name, default)) for name, w, default in fields])

    named[avro["name"]] = write_record  # before the fields: a field may refer to it
    for field in avro["fields"]:
        fields.append((field["name"], value_writer(field["type"], named), field.get("default")))
    return write_record


def _array_writer(item: ValueWriter) -> ValueWriter:
    def write_array(datum: Any) -> bytes:
        if not datum:
            return b"\x00"
        parts = [long_bytes(len(datum))]
        parts.extend(map(item, datum))
        parts.append(b"\x00")  # the zero-length block that ends an array
        return b"".join(parts)

    return write_array


def _map_writer(values: ValueWriter) -> ValueWriter:
    def write_map(datum: Any) -> bytes:
        if not datum:
            return b"\x00"
        parts = [long_bytes(len(datum))]
        for key, value in datum.items():
            parts.append(string_bytes(key))
            parts.append(values(value))
        parts.append(b"\x00")
        return b"".join(parts)

    return write_map


def _union_writer(branches: list[Any], named: dict[str, ValueWriter]) -> ValueWriter:
    writers = [value_writer(b, named) for b in branches]
    heads = [long_bytes(i) for i in range(len(branches))]
    by_name = {_branch_name(b): i for i, b in reversed(list(enumerate(branches)))}
    bases = [_base_type(b, named) for b in branches]
    by_type: dict[type, int] = {}
    for pytype, accepted in _ACCEPTS.items():
        matches = [i for i, base in enumerate(bases) if base in accepted]
        if pytype is dict and len(matches) > 1:
            raise UnsupportedSchema("a union of several records/maps")  # fastavro scores fields
        if pytype is float and matches:
            # fastavro prefers double over float whatever their order (no precision loss).
            doubles = [i for i in matches if bases[i] == "double"]
            matches = doubles or matches
        if matches:
            by_type[pytype] = matches[0]
    null_index = bases.index("null") if "null" in bases else None

    def write_union(datum: Any) -> bytes:
        if datum is None:
            if null_index is None:
                raise ValueError("None for a union without null")
            return heads[null_index]
        if type(datum) is tuple:  # fastavro's (branch name, value) notation
            name, datum = datum
            index = by_name.get(name)
            if index is None:
                raise ValueError(f"union branch {name!r} not in {branches!r}")
        else:
            index = by_type.get(type(datum), -1)
            if index < 0:
                raise ValueError(f"{type(datum).__name__} fits no branch of {branches!r}")
        return heads[index] + writers[index](datum)

    return write_union


# --- raw-bytes fast paths ----------------------------------------------------------------------

# Converters whose result is the wire bytes themselves, decoded (text-like types, enums,
# unmapped text) or not (bytea/unmapped in binary mode): their Avro form is a length + the
# same bytes, so they skip the conversion.
_AS_TEXT: Final = (pg_scalars.decode_text,)
_INT_TEXT: Final = (pg_scalars.int_text,)
_INT_BINARY: Final = {
    pg_scalars.int2_binary: "_unpack_i16",
    pg_scalars.int4_binary: "_unpack_i32",
    pg_scalars.int8_binary: "_unpack_i64",
    pg_scalars.oid_binary: "_unpack_u32",
}
_INT_BINARY_STRUCTS: Final[dict[Convert, Callable[[bytes], tuple[int]]]] = {
    pg_scalars.int2_binary: _unpack_i16,
    pg_scalars.int4_binary: _unpack_i32,
    pg_scalars.int8_binary: _unpack_i64,
    pg_scalars.oid_binary: _unpack_u32,
}


def _is_raw(convert: Convert) -> bool:
    return convert is pg_scalars.raw_bytes or getattr(convert, "__name__", "") == "_raw"


_HEADS_CACHE: dict[bytes, tuple[bytes, ...]] = {}


def _length_heads(prefix: bytes) -> tuple[bytes, ...]:
    """prefix + long(n) for n < 8192: a union branch and a string/bytes length in one."""
    heads = _HEADS_CACHE.get(prefix)
    if heads is None:
        heads = _HEADS_CACHE[prefix] = tuple(prefix + long_bytes(n) for n in range(8192))
    return heads


class _Source:
    """Accumulates the generated function's text and the constants it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {
            "_long": long_bytes,
            "_unpack_i16": _unpack_i16,
            "_unpack_i32": _unpack_i32,
            "_unpack_i64": _unpack_i64,
            "_unpack_u32": _unpack_u32,
            "_unpack_f32": _unpack_f32,
            "_pack_float": _pack_float,
            # the converter's own table: the inlined numeric path must refuse exactly its specials
            "_NUMERIC_SPECIALS": pg_scalars.NUMERIC_SPECIALS,
        }

    def const(self, name: str, value: Any) -> str:
        self.names[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


def _branch_for(union: list[Any], base: str) -> int | None:
    for i, branch in enumerate(union):
        if branch == base or (isinstance(branch, dict) and branch.get("type") == base):
            return i
    return None


def _array_fast(
    mapping: AvroMapping, mode: str, union: list[Any], slow: array_encoder.Writer
) -> array_encoder.Writer | None:
    """A direct writer for arrays of text-like or integer elements, else None."""
    element = mapping.element
    # ["null", plain array, shaped record]: the writers' branch numbers
    if element is None or len(union) != 3 or _base_type(union[1], {}) != "array":
        return None
    element_union = nullable(element.avro)
    if mode == "t":
        if element.text in _AS_TEXT and _branch_for(element_union, "string") == 1:
            return array_encoder.array_text_writer(
                mapping.delimiter, array_encoder.text_elements, slow
            )
        if element.text in _INT_TEXT and _int_branch(element_union) == 1:
            return array_encoder.array_text_writer(
                mapping.delimiter, array_encoder.int_text_elements, slow
            )
        return None
    if element.binary in _AS_TEXT and _branch_for(element_union, "string") == 1:
        return array_encoder.array_binary_writer(array_encoder.text_elements)
    unpack = _INT_BINARY_STRUCTS.get(element.binary)
    if unpack is not None and _int_branch(element_union) == 1:
        return array_encoder.array_binary_writer(array_encoder.int_binary_elements(unpack))
    return None


def _bounded_numeric_text(convert: Convert) -> bool:
    return getattr(convert, "__qualname__", "") == "numeric_bounded_text.<locals>.convert"


def _bounded_numeric_text_scale(convert: Convert, union: list[Any]) -> int | None:
    """The scale of a numeric(p,s) column's text converter whose decimal is union branch 1."""
    if not _bounded_numeric_text(convert) or len(union) < 2:
        return None
    decimal = union[1]
    if not (isinstance(decimal, dict) and decimal.get("logicalType") == "decimal"):
        return None
    scale = decimal.get("scale", 0)
    return scale if isinstance(scale, int) and 0 <= scale < 1000 else None


def _int_branch(union: list[Any]) -> int | None:
    index = _branch_for(union, "long")
    return index if index is not None else _branch_for(union, "int")


# Appends branch 1 + the long ``x``: table lookups up to 2**27 (row ids, counts), else a call.
_APPEND_LONG_BRANCH1: Final = (
    "a(b'\\x02' + (_LAST[x << 1] if 0 <= x < 8192 else _MID[(x << 1) & 16383] + _LAST[x >> 13]"
    " if 0 <= x < 134217728 else _long(x)))"
)
_LONG_BRANCH1: Final = "r = " + _APPEND_LONG_BRANCH1[2:-1]


def _emit_value(
    src: _Source, col: int, mode: str, mapping: AvroMapping, union: list[Any], write: ValueWriter
) -> None:
    """Statements appending the Avro form of wire bytes ``d`` (not NULL, not TOAST) to ``a``."""
    convert = mapping.text if mode == "t" else mapping.binary
    tag = f"{mode}{col}"
    ind = 3
    string_index = _branch_for(union, "string")
    bytes_index = _branch_for(union, "bytes")
    int_index = _int_branch(union)
    first = _base_type(union[1], {}) if len(union) > 1 else "null"
    if convert in _AS_TEXT and string_index is not None:
        # Valid UTF-8 is all a str round trip would check; ASCII needs no check at all.
        heads = src.const(f"H{tag}", _length_heads(long_bytes(string_index)))
        prefix = src.const(f"P{tag}", long_bytes(string_index))
        src.emit(ind, "if not d.isascii(): d.decode()")
        src.emit(ind, "n = len(d)")
        src.emit(ind, f"a({heads}[n] if n < 8192 else {prefix} + _long(n)); a(d)")
    elif _is_raw(convert) and bytes_index is not None:
        heads = src.const(f"H{tag}", _length_heads(long_bytes(bytes_index)))
        prefix = src.const(f"P{tag}", long_bytes(bytes_index))
        src.emit(ind, "n = len(d)")
        src.emit(ind, f"a({heads}[n] if n < 8192 else {prefix} + _long(n)); a(d)")
    elif convert is pg_scalars.jsonb_binary and string_index is not None:
        heads = src.const(f"H{tag}", _length_heads(long_bytes(string_index)))
        prefix = src.const(f"P{tag}", long_bytes(string_index))
        src.emit(ind, "if d[:1] != b'\\x01': raise ValueError('unknown jsonb binary version')")
        src.emit(ind, "d = d[1:]")
        src.emit(ind, "if not d.isascii(): d.decode()")
        src.emit(ind, "n = len(d)")
        src.emit(ind, f"a({heads}[n] if n < 8192 else {prefix} + _long(n)); a(d)")
    elif (convert in _INT_TEXT or convert in _INT_BINARY) and int_index is not None:
        prefix = src.const(f"P{tag}", long_bytes(int_index))
        if convert in _INT_TEXT:
            src.emit(ind, "x = int(d)")
        else:
            src.emit(ind, f"x = {_INT_BINARY[convert]}(d)[0]")
        if int_index == 1:  # small non-negative values: one table lookup for the value
            src.emit(ind, _APPEND_LONG_BRANCH1)
        else:
            src.emit(ind, f"a({prefix} + _long(x))")
    elif convert is pg_scalars.bool_text and _branch_for(union, "boolean") == 1:
        table = src.const(f"T{tag}", {b"t": b"\x02\x01", b"f": b"\x02\x00"})
        src.emit(ind, f"a({table}[d])")  # KeyError for anything else: the reference reports it
    elif convert is pg_scalars.bool_binary and _branch_for(union, "boolean") == 1:
        src.emit(ind, "a(b'\\x02\\x00' if d == b'\\x00' else b'\\x02\\x01')")
    elif convert is pg_scalars.float8_binary and _branch_for(union, "double") == 1:
        # Big-endian IEEE double -> Avro's little-endian: the same 8 bytes reversed (a float
        # keeps every bit, NaN payloads included, through struct's unpack/pack).
        src.emit(ind, "if len(d) != 8: raise ValueError('float8 of %d bytes' % len(d))")
        src.emit(ind, "a(b'\\x02' + d[::-1])")
    else:
        conv = src.const(f"C{tag}", convert)
        writer = src.const(f"W{tag}", write)
        # A one-entry cache of the last wire value and its Avro bytes: rows of a transaction
        # often repeat a value (now(), a status, a day), and converters are pure functions of
        # the bytes (the session pins every setting they depend on).
        last = src.const(f"K{tag}", [None, b""])
        src.emit(ind, f"if d == {last}[0]:")
        src.emit(ind + 1, f"a({last}[1])")
        src.emit(ind, "else:")
        ind += 1
        array = _array_fast(mapping, mode, union, lambda data: write(convert(data)))
        scale = _bounded_numeric_text_scale(convert, union) if mode == "t" else None
        if scale is not None:
            # numeric_bounded_text's own fast path, inlined (a call and a dict probe less):
            # PostgreSQL prints exactly `scale` fractional digits; anything else (NaN,
            # Infinity, another form) goes through the converter.
            heads = src.const(f"H{tag}", _length_heads(b"\x02"))
            src.emit(ind, "w, _, f = d.partition(b'.')")
            src.emit(ind, f"if len(f) == {scale} and d not in _NUMERIC_SPECIALS:")
            src.emit(ind + 1, "x = int(w + f)")
            src.emit(ind + 1, "x = x.to_bytes(x.bit_length() // 8 + 1, 'big', signed=True)")
            src.emit(ind + 1, f"r = {heads}[len(x)] + x")
            src.emit(ind, f"else: r = {writer}({conv}(d))")
        elif array is not None:
            src.emit(ind, f"r = {src.const(f'A{tag}', array)}(d)")
        elif first in ("int", "long"):
            # Converters give the first branch as a plain value, the others in branch notation.
            src.emit(ind, f"x = {conv}(d)")
            src.emit(ind, "if x.__class__ is int:")
            src.emit(ind + 1, _LONG_BRANCH1)
            src.emit(ind, f"else: r = {writer}(x)")
        elif first in ("bytes", "string"):
            pytype = "bytes" if first == "bytes" else "str"
            heads = src.const(f"H{tag}", _length_heads(b"\x02"))
            src.emit(ind, f"x = {conv}(d)")
            src.emit(ind, f"if x.__class__ is {pytype}:")
            if pytype == "str":
                src.emit(ind + 1, "x = x.encode()")
            src.emit(ind + 1, "n = len(x)")
            src.emit(ind + 1, f"r = ({heads}[n] if n < 8192 else b'\\x02' + _long(n)) + x")
            src.emit(ind, f"else: r = {writer}(x)")
        else:
            src.emit(ind, f"r = {writer}({conv}(d))")
        src.emit(ind, f"{last}[0] = d")
        src.emit(ind, f"{last}[1] = r")
        src.emit(ind, "a(r)")


def _emit_wire_slice(src: _Source) -> None:
    """A 't'/'b' TupleData value: its 32-bit length after the kind byte, then the bytes (as d)."""
    src.emit(3, "s = pos + 5")
    src.emit(3, "pos = s + _unpack_u32_from(buf, pos + 1)[0]")
    src.emit(3, "d = buf[s:pos]")


def _compile(
    name: str,
    table: str,
    columns: Sequence[tuple[int, str, AvroMapping]],
    named: dict[str, ValueWriter],
    toast: object,
    width: int,
    key: bool,
    fallback: Callable[..., Any],
    fused_key: Sequence[int] = (),
    wire: bool = False,
    copy: CopySplitter | None = None,
) -> Callable[..., Any]:
    """Generate and compile one encoder; ``columns`` are (position, column name, mapping)
    in the record's field order. With ``fused_key`` (the key columns' positions) a row
    encoder also returns the key record's body: the key's fields have the same Avro unions
    as the row's, so their bytes are the row's bytes for those columns.

    With ``wire`` the encoder reads the pgoutput TupleData bytes itself (see
    ``compile_wire_row_key_encoder``): same per-column statements, values sliced from the
    buffer instead of taken from decoded ``Value`` tuples. With ``copy`` (the COPY text
    splitter) it reads one COPY text row: same statements, text values, no unchanged TOAST."""
    src = _Source()
    src.names.update(
        {"_LAST": _LAST, "_MID": _MID, "_TOAST": toast, "_fallback": fallback, "_fail": _fail}
    )
    src.names["_FAILURES"] = CONVERSION_FAILURES
    if wire:
        src.names["_unpack_u16_from"] = _unpack_u16_from
        src.names["_unpack_u32_from"] = _unpack_u32_from
        src.emit(0, f"def {name}(buf, pos):")
        # Anything unexpected (column count, tuple kind, short buffer, a value a fast path
        # refuses): None, and the caller takes the careful decoder + encoder path, which
        # raises the precise DecodeError / ConversionError or encodes the row itself.
        src.emit(1, "try:")
        src.emit(2, f"if _unpack_u16_from(buf, pos)[0] != {width}: return None")
        src.emit(1, "except _FAILURES:")
        src.emit(2, "return None")
        src.emit(1, "pos += 2")
    elif copy is not None:
        src.names["_split"] = copy
        src.emit(0, f"def {name}(line):")
        # A row without a backslash has neither NULL (\\N) nor escapes: its fields are the
        # values' text as they are. Any other row goes through the COPY text rules' one home.
        src.emit(1, "try:")
        src.emit(2, f"fs = _split(line, {width}) if b'\\\\' in line else line.split(b'\\t')")
        src.emit(1, "except _FAILURES:")
        src.emit(2, "return None")
        src.emit(1, f"if len(fs) != {width}: return None")
    else:
        src.emit(0, f"def {name}(values, lsn=None):")
        src.emit(1, f"if len(values) != {width}:")
        src.emit(2, "_fallback(values, lsn)")
        src.emit(2, f"_fail({table!r}, values, lsn)")
    src.emit(1, "parts = []")
    src.emit(1, "a = parts.append")
    if not key and copy is None:
        src.emit(1, "unchanged = []")
    src.emit(1, "try:")
    for position, column, mapping in columns:
        union = nullable(mapping.avro)
        write = value_writer(union, named)
        if position in fused_key:
            src.emit(2, f"s{position} = len(parts)")
        if wire:
            # TupleData: kind byte; 't'/'b' then an unsigned 32-bit length and the bytes.
            # A length past the end shows as an IndexError/struct.error later or as a final
            # position other than the message's end (checked by the caller).
            src.emit(2, "k = buf[pos]")
            src.emit(2, "if k == 116:")
            _emit_wire_slice(src)
            _emit_value(src, position, "t", mapping, union, write)
            src.emit(2, "elif k == 110:")
            src.emit(3, "pos += 1")
            src.emit(3, "a(b'\\x00')")
            src.emit(2, "elif k == 98:")
            _emit_wire_slice(src)
            _emit_value(src, position, "b", mapping, union, write)
            if not (key or position in fused_key):
                src.emit(2, "elif k == 117:")
                src.emit(3, "pos += 1")
                src.emit(3, "a(b'\\x00')  # a placeholder: the column is listed in unchanged_toast")
                src.emit(3, f"unchanged.append({column!r})")
            src.emit(2, "else:")
            src.emit(3, "return None  # an unknown kind, or unchanged TOAST in a key column")
        elif copy is not None:
            src.emit(2, f"d = fs[{position}]")
            src.emit(2, "if d is None:")
            src.emit(3, "a(b'\\x00')")
            src.emit(2, "else:")
            _emit_value(src, position, "t", mapping, union, write)
        else:
            src.emit(2, f"v = values[{position}]")
            src.emit(2, "if v is None:")
            src.emit(3, "a(b'\\x00')")
            src.emit(2, "elif v is _TOAST:")
            if key or position in fused_key:
                src.emit(3, "raise ValueError('unchanged TOAST in a key column')")
            else:
                src.emit(3, "a(b'\\x00')  # a placeholder: the column is listed in unchanged_toast")
                src.emit(3, f"unchanged.append({column!r})")
            src.emit(2, "elif v[1]:")
            src.emit(3, "d = v[0]")
            _emit_value(src, position, "b", mapping, union, write)
            src.emit(2, "else:")
            src.emit(3, "d = v[0]")
            _emit_value(src, position, "t", mapping, union, write)
        if position in fused_key:
            src.emit(2, f"e{position} = len(parts)")
    src.emit(1, "except _FAILURES:")
    if wire or copy is not None:
        src.emit(2, "return None")
    else:
        src.emit(2, "_fallback(values, lsn)  # raises the ConversionError naming the column")
        src.emit(2, f"_fail({table!r}, values, lsn)")
    end = ", pos" if wire else ""
    if copy is not None:
        slices = " + ".join(f"parts[s{p}:e{p}]" for p in fused_key)
        key_body = f"b''.join({slices})" if fused_key else "None"
        src.emit(1, f"return b''.join(parts), {key_body}")
    elif key:
        src.emit(1, f"return b''.join(parts){end}")
    elif fused_key:
        slices = " + ".join(f"parts[s{p}:e{p}]" for p in fused_key)
        src.emit(1, f"return b''.join(parts), unchanged, b''.join({slices}){end}")
    elif wire:
        src.emit(1, "return b''.join(parts), unchanged, None, pos")
    else:
        src.emit(1, "return b''.join(parts), unchanged")
    code = "\n".join(src.lines)
    namespace = dict(src.names)
    exec(compile(code, f"<walbridge row encoder {table}>", "exec"), namespace)
    encoder: Callable[..., Any] = namespace[name]
    encoder.__walbridge_source__ = code  # type: ignore[attr-defined]  # for debugging
    return encoder


# What a broken value can raise here or in a converter (parsers, struct, psycopg, Decimal).
CONVERSION_FAILURES: Final = (
    ValueError,
    TypeError,
    LookupError,
    ArithmeticError,
    struct.error,
    PsycopgError,
)


def _fail(table: str, values: Sequence[Any], lsn: int | None) -> None:
    """The reference converter accepted what the compiled encoder refused: a bug here."""
    raise ConversionError(
        table, "*", "row", b"", False, "compiled row encoder failed on a row the reference "
        "converter accepts (please report)", lsn,
    )  # fmt: skip


def compile_row_encoder(
    table: str,
    columns: Sequence[tuple[str, AvroMapping]],
    toast: object,
    reference: Callable[..., Any],
) -> RowEncoder:
    """The row record encoder of a table: (values, lsn) -> (Avro body, unchanged TOAST names).

    ``columns``: (column name, mapping) per column, in order. ``reference`` is the dict
    converter (it raises the detailed errors).
    """
    named: dict[str, ValueWriter] = {}
    cols = [(i, name, mapping) for i, (name, mapping) in enumerate(columns)]
    encoder: RowEncoder = _compile(
        "encode_row", table, cols, named, toast, len(cols), False, reference
    )
    encoder.wire = _compile(  # type: ignore[attr-defined]
        "encode_row_wire", table, cols, {}, toast, len(cols), False, reference, wire=True
    )
    encoder.copy_factory = lambda split: _compile(  # type: ignore[attr-defined]
        "encode_row_copy", table, cols, {}, toast, len(cols), False, reference, copy=split
    )
    return encoder


def compile_row_key_encoder(
    table: str,
    columns: Sequence[tuple[str, AvroMapping]],
    key_positions: Sequence[int],
    toast: object,
    reference_row: Callable[..., Any],
    reference_key: Callable[..., Any],
) -> RowKeyEncoder:
    """Row and key in one pass: (values, lsn) -> (row body, unchanged TOAST names, key body).

    For the events whose key comes from the same tuple as their row (inserts, deletes, old
    rows); the key's bytes are taken from the row's (same unions, same converters).
    """

    def fallback(values: Sequence[Any], lsn: int | None) -> None:
        reference_row(values, lsn)
        reference_key(values, lsn)

    named: dict[str, ValueWriter] = {}
    cols = [(i, name, mapping) for i, (name, mapping) in enumerate(columns)]
    encoder: RowKeyEncoder = _compile(
        "encode_row_key", table, cols, named, toast, len(cols), False, fallback, key_positions
    )
    encoder.wire = _compile(  # type: ignore[attr-defined]
        "encode_row_key_wire", table, cols, {}, toast, len(cols), False, fallback, key_positions,
        wire=True,
    )  # fmt: skip
    encoder.copy_factory = lambda split: _compile(  # type: ignore[attr-defined]
        "encode_row_key_copy", table, cols, {}, toast, len(cols), False, fallback, key_positions,
        copy=split,
    )  # fmt: skip
    return encoder


def wire_encoder(encoder: Callable[..., Any]) -> WireRowKeyEncoder | None:
    """The TupleData-reading twin of a row (or row + key) encoder made here, else None.

    ``wire(buf, pos)`` encodes the TupleData at ``buf[pos:]`` (a pgoutput Insert/Update/
    Delete payload) as the twin encodes the decoded tuple, byte for byte, and returns
    ``(row body, unchanged TOAST names, key body or None, end offset)``; or None for anything
    unusual (column count, tuple kind, short buffer, a value the fast paths refuse, unchanged
    TOAST in a key column): the caller then decodes and encodes the careful way, which
    raises the precise error. Its ``key body`` is None when the twin encodes no key.
    """
    wire: WireRowKeyEncoder | None = getattr(encoder, "wire", None)
    return wire


def copy_encoder(encoder: Callable[..., Any], split: CopySplitter) -> CopyRowKeyEncoder | None:
    """The COPY-text-reading twin of a row (or row + key) encoder made here, else None;
    compiled on first use (only snapshots need it) and kept on the encoder.

    ``copy(line)`` encodes one row of ``COPY ... TO STDOUT`` text (no trailing newline) as the
    encoder encodes the same row's pgoutput text values, byte for byte, and returns ``(row
    body, key body or None)``; or None for anything unusual (a field count other than the
    table's, an escape or value the fast paths refuse): the caller then takes the careful
    path (split, then the encoder), which raises the precise error. ``split`` is the COPY
    text rule for rows holding a backslash (NULL and escapes)."""
    made: dict[Any, CopyRowKeyEncoder] | None = getattr(encoder, "copy", None)
    if made is None:
        made = {}
        encoder.copy = made  # type: ignore[attr-defined]
    twin = made.get(split)
    if twin is None:
        factory = getattr(encoder, "copy_factory", None)
        if factory is None:
            return None
        twin = made[split] = factory(split)
    return twin


def compile_key_encoder(
    table: str,
    width: int,
    columns: Sequence[tuple[int, str, AvroMapping]],
    toast: object,
    reference: Callable[..., Any],
) -> KeyEncoder:
    """The key record encoder: (full-width values, lsn) -> Avro body of the key columns."""
    named: dict[str, ValueWriter] = {}
    encoder: KeyEncoder = _compile(
        "encode_key", table, columns, named, toast, width, True, reference
    )
    return encoder
