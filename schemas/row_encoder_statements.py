"""The per-column statements of the generated row encoders (``schemas.row_encoder``): the
Python source that appends one wire value's Avro bytes, with the inlined fast paths for
text-like values, integers, booleans, float8, jsonb, bounded numerics and arrays of text or
integers, and every other type through its converter and value writer with a one-entry cache.
Only our own column positions and constants go into the source, never data.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from schemas import array_encoder, pg_datetime, pg_scalars
from schemas.avro_binary import long_bytes
from schemas.avro_value_writer import ValueWriter, base_type
from schemas.type_mapping import AvroMapping, Convert, nullable

_pack_float: Final = struct.Struct("<f").pack
_unpack_i16: Final = struct.Struct("!h").unpack
_unpack_i32: Final = struct.Struct("!i").unpack
_unpack_i64: Final = struct.Struct("!q").unpack
_unpack_u32: Final = struct.Struct("!I").unpack
_unpack_f32: Final = struct.Struct("!f").unpack


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
_INT_BINARY_KINDS: Final = {
    pg_scalars.int2_binary: "int2_binary",
    pg_scalars.int4_binary: "int4_binary",
    pg_scalars.int8_binary: "int8_binary",
    pg_scalars.oid_binary: "oid_binary",
}
_INT_BINARY_STRUCTS: Final[dict[Convert, Callable[[bytes], tuple[int]]]] = {
    pg_scalars.int2_binary: _unpack_i16,
    pg_scalars.int4_binary: _unpack_i32,
    pg_scalars.int8_binary: _unpack_i64,
    pg_scalars.oid_binary: _unpack_u32,
}


# Converters the compiled encoder parses itself when their value is the union's long branch.
_TIMESTAMP_TEXT: Final = {
    pg_datetime.timestamptz_text: "timestamptz_text",
    pg_datetime.timestamp_text: "timestamp_text",
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


class Source:
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
    if element is None or len(union) != 3 or base_type(union[1], {}) != "array":
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


@dataclass(frozen=True)
class ValueKind:
    """How one column's wire value becomes Avro: decided once per column and wire format, and
    the one home of that decision for both the generated statements (``emit_value``) and the
    compiled encoder's plan (``schemas.native_encoder``).

    ``kind``: "text" (UTF-8 as it is), "raw" (bytes as they are), "jsonb_binary", "int_text",
    "int2_binary"/"int4_binary"/"int8_binary"/"oid_binary", "bool_text", "bool_binary",
    "float8_binary", or "converted" (the converter, then the value writer). ``prefix``: the
    union branch's bytes where the kind writes it itself. ``scale``: a numeric(p,s) text
    column's scale when its converted form has the inlined decimal path, else None.
    ``native``: for a converted kind, the compiled encoder's own operation where it has one
    ("text_array" with ``delimiter``, "timestamptz_text", "timestamp_text"); the Python
    statements ignore it."""

    kind: str
    prefix: bytes = b""
    scale: int | None = None
    native: str | None = None
    delimiter: bytes = b","


def value_kind(mode: str, mapping: AvroMapping, union: list[Any]) -> ValueKind:
    """The kind of a column's values in ``mode`` ("t" text, "b" binary)."""
    convert = mapping.text if mode == "t" else mapping.binary
    string_index = _branch_for(union, "string")
    bytes_index = _branch_for(union, "bytes")
    int_index = _int_branch(union)
    if convert in _AS_TEXT and string_index is not None:
        return ValueKind("text", long_bytes(string_index))
    if _is_raw(convert) and bytes_index is not None:
        return ValueKind("raw", long_bytes(bytes_index))
    if convert is pg_scalars.jsonb_binary and string_index is not None:
        return ValueKind("jsonb_binary", long_bytes(string_index))
    if convert in _INT_TEXT and int_index is not None:
        return ValueKind("int_text", long_bytes(int_index))
    if convert in _INT_BINARY and int_index is not None:
        return ValueKind(_INT_BINARY_KINDS[convert], long_bytes(int_index))
    if convert is pg_scalars.bool_text and _branch_for(union, "boolean") == 1:
        return ValueKind("bool_text", b"\x02")
    if convert is pg_scalars.bool_binary and _branch_for(union, "boolean") == 1:
        return ValueKind("bool_binary", b"\x02")
    if convert is pg_scalars.float8_binary and _branch_for(union, "double") == 1:
        return ValueKind("float8_binary", b"\x02")
    scale = _bounded_numeric_text_scale(convert, union) if mode == "t" else None
    if scale is not None:
        return ValueKind("converted", b"\x02", scale)
    first = base_type(union[1], {}) if len(union) > 1 else "null"
    if mode == "t" and first == "long" and convert in _TIMESTAMP_TEXT:
        return ValueKind("converted", b"\x02", native=_TIMESTAMP_TEXT[convert])
    element = mapping.element
    if (
        mode == "t"
        and element is not None
        and len(union) == 3
        and first == "array"
        and element.text in _AS_TEXT
        and _branch_for(nullable(element.avro), "string") == 1
    ):
        return ValueKind("converted", b"\x02", native="text_array", delimiter=mapping.delimiter)
    return ValueKind("converted")


def emit_value(
    src: Source,
    col: int,
    mode: str,
    mapping: AvroMapping,
    union: list[Any],
    write: ValueWriter,
    indent: int = 3,
) -> None:
    """Statements appending the Avro form of wire bytes ``d`` (not NULL, not TOAST) to ``a``."""
    convert = mapping.text if mode == "t" else mapping.binary
    tag = f"{mode}{col}"
    ind = indent
    how = value_kind(mode, mapping, union)
    kind = how.kind
    first = base_type(union[1], {}) if len(union) > 1 else "null"
    if kind in ("text", "raw", "jsonb_binary"):
        heads = src.const(f"H{tag}", _length_heads(how.prefix))
        prefix = src.const(f"P{tag}", how.prefix)
        if kind == "jsonb_binary":
            src.emit(ind, "if d[:1] != b'\\x01': raise ValueError('unknown jsonb binary version')")
            src.emit(ind, "d = d[1:]")
        if kind != "raw":
            # Valid UTF-8 is all a str round trip would check; ASCII needs no check at all.
            src.emit(ind, "if not d.isascii(): d.decode()")
        src.emit(ind, "n = len(d)")
        src.emit(ind, f"a({heads}[n] if n < 8192 else {prefix} + _long(n)); a(d)")
    elif kind == "int_text" or kind in _INT_BINARY_KINDS.values():
        prefix = src.const(f"P{tag}", how.prefix)
        if kind == "int_text":
            src.emit(ind, "x = int(d)")
        else:
            src.emit(ind, f"x = {_INT_BINARY[convert]}(d)[0]")
        if how.prefix == b"\x02":  # small non-negative values: one table lookup for the value
            src.emit(ind, _APPEND_LONG_BRANCH1)
        else:
            src.emit(ind, f"a({prefix} + _long(x))")
    elif kind == "bool_text":
        table = src.const(f"T{tag}", {b"t": b"\x02\x01", b"f": b"\x02\x00"})
        src.emit(ind, f"a({table}[d])")  # KeyError for anything else: the reference reports it
    elif kind == "bool_binary":
        src.emit(ind, "a(b'\\x02\\x00' if d == b'\\x00' else b'\\x02\\x01')")
    elif kind == "float8_binary":
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
        scale = how.scale
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


def emit_wire_slice(src: Source) -> None:
    """A 't'/'b' TupleData value: its 32-bit length after the kind byte, then the bytes (as d)."""
    src.emit(3, "s = pos + 5")
    src.emit(3, "pos = s + _unpack_u32_from(buf, pos + 1)[0]")
    src.emit(3, "d = buf[s:pos]")
