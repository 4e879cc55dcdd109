"""The compiled TupleData -> Avro row encoder (``schemas/_wire_native.c``), planned here.

The generated Python wire encoder (``schemas.row_encoder``) stays the reference and the path
taken where the extension is not built (a machine without a C compiler installs walbridge
all the same: the extension is optional in ``setup.py``) or where it is turned off with
``WALBRIDGE_PURE_PYTHON=1``. The extension does what the Python encoder does, column by
column, with the same decision per column (``value_kind``) and, for every value it does not
handle natively, the same generated statements for that one column as its fallback: so its
bytes are the reference's, which tests/unit/test_wire_native.py checks on every mapped type.

Natively: text-like values (UTF-8 checked), bytes, jsonb, integers, booleans, float8,
numeric(p,s) text up to 18 digits, timestamps in the session's ISO/UTC text, and flat arrays
of text-like elements without quoting; every other type or form (intervals, composites, a
numeric beyond 18 digits, a quoted array item, ...) calls its column's fallback, with its
converter and one-entry cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Final

from schemas.avro_binary import VARINT_LAST as _LAST
from schemas.avro_binary import VARINT_MID as _MID
from schemas.avro_value_writer import ValueWriter, value_writer
from schemas.row_encoder_statements import Source, ValueKind, emit_value, value_kind
from schemas.type_mapping import AvroMapping, nullable

try:
    from schemas import _wire_native
except ImportError:  # not built: no C compiler where it was installed
    _wire_native = None  # type: ignore[assignment, unused-ignore]

__all__ = ["NATIVE_BUILT", "encoder_in_use", "native_enabled", "native_wire_encoder"]

NATIVE_BUILT: Final = _wire_native is not None
# Operation codes of the extension, by value kind. A "converted" kind is OP_CALL (its Python
# statements) unless ``_op`` finds a native operation for it: numeric(p,s) text, timestamps,
# flat text arrays.
_OPS: Final[dict[str, str]] = {
    "text": "OP_TEXT",
    "raw": "OP_RAW",
    "jsonb_binary": "OP_JSONB_BIN",
    "int_text": "OP_INT_TEXT",
    "int2_binary": "OP_INT2_BIN",
    "int4_binary": "OP_INT4_BIN",
    "int8_binary": "OP_INT8_BIN",
    "oid_binary": "OP_OID_BIN",
    "bool_text": "OP_BOOL_TEXT",
    "bool_binary": "OP_BOOL_BIN",
    "float8_binary": "OP_FLOAT8_BIN",
}


def native_enabled() -> bool:
    """Built, and not turned off (``WALBRIDGE_PURE_PYTHON=1``: benchmarks' A/B, debugging)."""
    return NATIVE_BUILT and os.environ.get("WALBRIDGE_PURE_PYTHON", "") != "1"


def encoder_in_use() -> str:
    """For the producer's start-up log: "compiled", or why the Python encoder runs instead."""
    if not NATIVE_BUILT:
        return "python (the compiled extension is not built here: no C compiler at install)"
    if not native_enabled():
        return "python (WALBRIDGE_PURE_PYTHON=1)"
    return "compiled"


def _op(how: ValueKind) -> tuple[int, bytes, int]:
    assert _wire_native is not None
    if how.kind == "converted":
        if how.scale is not None:
            return _wire_native.OP_NUMERIC_TEXT, how.prefix, how.scale
        if how.native == "text_array" and len(how.delimiter) == 1:
            return _wire_native.OP_TEXT_ARRAY, how.prefix, how.delimiter[0]
        if how.native == "timestamptz_text":
            return _wire_native.OP_TIMESTAMPTZ_TEXT, how.prefix, 0
        if how.native == "timestamp_text":
            return _wire_native.OP_TIMESTAMP_TEXT, how.prefix, 0
        return _wire_native.OP_CALL, b"", 0
    return getattr(_wire_native, _OPS[how.kind]), how.prefix, 0


def _column_fallback(
    col: int, mode: str, mapping: AvroMapping, union: list[Any], write: ValueWriter
) -> Callable[[bytes], bytes]:
    """The generated statements for one value of one column, as a function of its bytes."""
    src = Source()
    src.names.update({"_LAST": _LAST, "_MID": _MID})
    src.emit(0, "def value(d):")
    src.emit(1, "parts = []")
    src.emit(1, "a = parts.append")
    emit_value(src, col, mode, mapping, union, write, indent=1)
    src.emit(1, "return b''.join(parts)")
    namespace = dict(src.names)
    exec(compile("\n".join(src.lines), f"<walbridge column {col} {mode}>", "exec"), namespace)
    fallback: Callable[[bytes], bytes] = namespace["value"]
    return fallback


def native_wire_encoder(
    columns: Sequence[tuple[int, str, AvroMapping]],
    fused_key: Sequence[int],
    failures: tuple[type[BaseException], ...],
) -> Callable[[bytes, int], Any] | None:
    """The compiled twin of a generated wire encoder over ``columns`` ((position, name,
    mapping) in position order), or None where the extension is not there or turned off.

    ``fused_key``: the key columns' positions in the key record's order (a row + key encoder:
    it returns the key's bytes too), or empty (a row encoder: its key is None). ``failures``:
    what a column's fallback may raise for a value that the careful path is to handle."""
    if not native_enabled():
        return None
    assert _wire_native is not None
    if [position for position, _, _ in columns] != list(range(len(columns))):
        return None  # TupleData is read in position order
    named: dict[str, ValueWriter] = {}
    specs = []
    for position, name, mapping in columns:
        union = nullable(mapping.avro)
        write = value_writer(union, named)
        plans = []
        for mode in ("t", "b"):
            op, prefix, arg = _op(value_kind(mode, mapping, union))
            plans.append((op, prefix, arg, _column_fallback(position, mode, mapping, union, write)))
        specs.append((name, position in fused_key, plans[0], plans[1]))
    key_order = tuple(fused_key) if fused_key else None
    encoder: Callable[[bytes, int], Any] = _wire_native.TupleEncoder(
        tuple(specs), key_order, failures
    )
    return encoder
