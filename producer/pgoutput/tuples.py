"""TupleData: the column values of Insert/Update/Delete, and the hot path of the decoder."""

from __future__ import annotations

import struct
from typing import Literal, NamedTuple, NoReturn, TypeAlias

from producer.pgoutput.errors import DecodeError, DecodeErrorKind
from producer.pgoutput.reader import I32, U16, U32
from schemas.unchanged_toast import UNCHANGED_TOAST, UnchangedToast


class Value(NamedTuple):
    """A sent column value: text ('t') or binary ('b') wire format, undecoded.

    A NamedTuple because one is built per column per row: it is the cheapest immutable,
    value-comparing type to construct in CPython.
    """

    data: bytes
    binary: bool


# One item per column: None = NULL ('n'), UNCHANGED_TOAST ('u'), or a Value ('t' / 'b').
ColumnValue: TypeAlias = Value | Literal[UnchangedToast.UNCHANGED_TOAST] | None
TupleData: TypeAlias = tuple[ColumnValue, ...]

_unpack_u16 = U16.unpack_from
_unpack_u32 = U32.unpack_from
_unpack_i32 = I32.unpack_from
# Calling tuple.__new__ directly skips the generated Value.__new__ frame (~2x cheaper).
_new_value = tuple.__new__


def parse_tuple_data(buf: bytes, pos: int, message_type: str) -> tuple[TupleData, int]:
    """Parse one TupleData starting at ``pos``; return it and the offset just past it.

    This loop runs once per column of every row, so it is hand-fused rather than built
    on Reader methods, and it defers bounds checks: lengths are read unsigned, so an
    overlong value pushes ``pos`` past the end, where the next read raises (IndexError /
    struct.error) or the final ``pos <= size`` check fails. Any failure re-walks the tuple
    with the careful ``_raise_tuple_error``, which names the offending offset. Nothing can
    loop long: the column count is checked against the bytes left.
    """
    size = len(buf)
    tuple_start = pos
    try:
        ncols: int = _unpack_u16(buf, pos)[0]
        pos += 2
        if ncols > size - pos:  # every column takes at least its kind byte
            _raise_tuple_error(buf, tuple_start, message_type)
        items: list[ColumnValue] = []
        append = items.append
        for _ in range(ncols):
            kind = buf[pos]
            # Literal byte values: LOAD_CONST beats a global lookup in this loop.
            if kind == 116:  # 't'
                start = pos + 5
                pos = start + _unpack_u32(buf, pos + 1)[0]
                append(_new_value(Value, (buf[start:pos], False)))
            elif kind == 110:  # 'n'
                pos += 1
                append(None)
            elif kind == 98:  # 'b'
                start = pos + 5
                pos = start + _unpack_u32(buf, pos + 1)[0]
                append(_new_value(Value, (buf[start:pos], True)))
            elif kind == 117:  # 'u'
                pos += 1
                append(UNCHANGED_TOAST)
            else:
                _raise_tuple_error(buf, tuple_start, message_type)
    except (IndexError, struct.error):
        pass  # ran off the end: diagnosed below
    else:
        if pos <= size:
            return tuple(items), pos
    _raise_tuple_error(buf, tuple_start, message_type)


def _raise_tuple_error(buf: bytes, pos: int, message_type: str) -> NoReturn:
    """Walk a TupleData that failed the fast path, field by field, and raise at the culprit."""
    size = len(buf)

    def fail(kind: DecodeErrorKind, offset: int, detail: str) -> NoReturn:
        raise DecodeError(message_type, offset, kind, detail)

    if pos + 2 > size:
        fail(
            DecodeErrorKind.SHORT_BUFFER,
            pos,
            f"need 2 bytes for the column count, {size - pos} left",
        )
    ncols: int = _unpack_u16(buf, pos)[0]
    if ncols > size - pos - 2:
        fail(
            DecodeErrorKind.SHORT_BUFFER,
            pos,
            f"{ncols} column(s) announced, {size - pos - 2} byte(s) left",
        )
    pos += 2
    for column in range(ncols):
        if pos >= size:
            fail(DecodeErrorKind.SHORT_BUFFER, pos, f"column {column}: missing tuple kind")
        kind = buf[pos]
        if kind in (110, 117):  # 'n', 'u'
            pos += 1
        elif kind in (116, 98):  # 't', 'b'
            if pos + 5 > size:
                fail(
                    DecodeErrorKind.SHORT_BUFFER,
                    pos + 1,
                    f"column {column}: need 4 bytes for the value length, {size - pos - 1} left",
                )
            length: int = _unpack_i32(buf, pos + 1)[0]
            if length < 0:
                fail(
                    DecodeErrorKind.BAD_VALUE, pos + 1, f"column {column}: negative length {length}"
                )
            if pos + 5 + length > size:
                fail(
                    DecodeErrorKind.SHORT_BUFFER,
                    pos + 5,
                    f"column {column}: value of {length} byte(s), {size - pos - 5} left",
                )
            pos += 5 + length
        else:
            fail(
                DecodeErrorKind.UNKNOWN_TUPLE_KIND,
                pos,
                f"column {column}: tuple kind {bytes((kind,))!r} is not one of b'n' b'u' b't' b'b'",
            )
    # Unreachable when called from parse_tuple_data's failure paths; kept as a hard stop.
    fail(DecodeErrorKind.BAD_VALUE, pos, "tuple data rejected by the fast path")
