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

from schemas.avro_binary import VARINT_LAST as _LAST
from schemas.avro_binary import VARINT_MID as _MID
from schemas.avro_value_writer import UnsupportedSchema, ValueWriter, value_writer
from schemas.errors import ConversionError
from schemas.native_encoder import native_wire_encoder
from schemas.row_encoder_statements import Source, emit_value, emit_wire_slice
from schemas.type_mapping import AvroMapping, nullable

__all__ = [
    "CONVERSION_FAILURES", "CopyRowKeyEncoder", "KeyEncoder", "RowEncoder", "RowKeyEncoder",
    "UnsupportedSchema", "WireRowKeyEncoder", "compile_key_encoder", "compile_row_encoder",
    "compile_row_key_encoder", "copy_encoder", "value_writer", "wire_encoder",
]  # fmt: skip
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


_unpack_u16_from: Final = struct.Struct("!H").unpack_from
_unpack_u32_from: Final = struct.Struct("!I").unpack_from


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
    src = Source()
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
            emit_wire_slice(src)
            emit_value(src, position, "t", mapping, union, write)
            src.emit(2, "elif k == 110:")
            src.emit(3, "pos += 1")
            src.emit(3, "a(b'\\x00')")
            src.emit(2, "elif k == 98:")
            emit_wire_slice(src)
            emit_value(src, position, "b", mapping, union, write)
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
            emit_value(src, position, "t", mapping, union, write)
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
            emit_value(src, position, "b", mapping, union, write)
            src.emit(2, "else:")
            src.emit(3, "d = v[0]")
            emit_value(src, position, "t", mapping, union, write)
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
    encoder.wire_python = _compile(  # type: ignore[attr-defined]
        "encode_row_wire", table, cols, {}, toast, len(cols), False, reference, wire=True
    )
    encoder.wire = (  # type: ignore[attr-defined]
        native_wire_encoder(cols, (), CONVERSION_FAILURES) or encoder.wire_python  # type: ignore[attr-defined]
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
    encoder.wire_python = _compile(  # type: ignore[attr-defined]
        "encode_row_key_wire", table, cols, {}, toast, len(cols), False, fallback, key_positions,
        wire=True,
    )  # fmt: skip
    encoder.wire = (  # type: ignore[attr-defined]
        native_wire_encoder(cols, key_positions, CONVERSION_FAILURES) or encoder.wire_python  # type: ignore[attr-defined]
    )
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
        twin = factory(split)
        # The compiled encoder, where the wire twin is one: backslash-free lines natively,
        # the others through the Python twin just made (the COPY text rules' one home).
        wire = getattr(encoder, "wire", None)
        copy_twin = getattr(wire, "copy_twin", None)
        made[split] = twin = copy_twin(twin) if copy_twin is not None else twin
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
