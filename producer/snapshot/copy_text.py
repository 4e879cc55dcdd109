"""COPY ... TO STDOUT text rows -> the column values pgoutput sends for the same row. Pure.

COPY's text format and pgoutput's text tuples both hold each value's output-function text
(under the same DateStyle, IntervalStyle, TimeZone, bytea_output and extra_float_digits: the
reader's session pins them as the walsender's does), so a snapshot row goes through the very
encoders a streamed row does. COPY adds two things: ``\\N`` for NULL and backslash escapes for
backslash and the control characters; both are undone here. psycopg's ``Copy.rows()`` would
load the values into Python objects first, which is exactly what must not happen: the text is
the input of the table's encoders.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import BinaryIO, Final

from producer.pgoutput.tuples import TupleData, Value

NULL: Final = b"\\N"
_ESCAPE: Final = re.compile(rb"\\(.)", re.DOTALL)
_CONTROL: Final = {
    b"b": b"\x08",
    b"f": b"\x0c",
    b"n": b"\n",
    b"r": b"\r",
    b"t": b"\t",
    b"v": b"\x0b",
}
_new_value = tuple.__new__  # Value's generated __new__ is a Python frame; this is not


class CopyFormatError(ValueError):
    """COPY output that does not have the expected shape (a bug or a server mismatch)."""


def _unescape_one(match: re.Match[bytes]) -> bytes:
    char = match.group(1)
    return _CONTROL.get(char, char)


def unescape(field: bytes) -> bytes:
    """One field's text without COPY's backslash escapes (COPY TO writes only these forms:
    ``\\\\`` and the six control-character escapes)."""
    return _ESCAPE.sub(_unescape_one, field) if b"\\" in field else field


def fields(line: bytes, ncols: int) -> list[bytes | None]:
    """One row's values as text (None = NULL)."""
    parts = line.split(b"\t")
    if len(parts) != ncols:
        raise CopyFormatError(f"COPY row has {len(parts)} fields, expected {ncols}: {line[:200]!r}")
    return [None if p == NULL else unescape(p) for p in parts]


def tuple_data(line: bytes, ncols: int) -> TupleData:
    """One row as the TupleData a pgoutput Insert of it would carry (text values)."""
    out: list[Value | None] = []
    append = out.append
    parts = line.split(b"\t")
    if len(parts) != ncols:
        raise CopyFormatError(f"COPY row has {len(parts)} fields, expected {ncols}: {line[:200]!r}")
    for p in parts:
        if p == NULL:
            append(None)
        else:
            append(_new_value(Value, (_ESCAPE.sub(_unescape_one, p) if b"\\" in p else p, False)))
    return tuple(out)


def split_lines(data: bytes) -> list[bytes]:
    """COPY text output (whole rows, each ending in a newline) -> one item per row. A newline
    inside a value is always escaped, so every raw newline ends a row."""
    if not data:
        return []
    if not data.endswith(b"\n"):
        raise CopyFormatError("COPY output does not end with a newline")
    return data[:-1].split(b"\n")


def spooled_batches(spool: BinaryIO, block_size: int = 4 * 1024 * 1024) -> Iterator[list[bytes]]:
    """The rows of COPY text output spooled to a file, from its start, in batches of less
    than two ``block_size`` blocks (a row longer than a block: its own batch): memory stays
    bounded whatever the file's size."""
    spool.seek(0)
    return line_batches(iter(lambda: spool.read(block_size), b""), block_size)


def line_batches(
    blocks: Iterable[bytes], batch_bytes: int = 4 * 1024 * 1024
) -> Iterator[list[bytes]]:
    """COPY text output arriving in blocks of any size (a file's, or the server's CopyData
    messages) -> its rows, in batches of about ``batch_bytes`` (a row longer than that: its own
    batch), whole rows only: memory stays bounded whatever the output's size."""
    pending: list[bytes] = []  # blocks not split yet; the last may end inside a row
    size = 0
    for block in blocks:
        pending.append(block)
        size += len(block)
        if size < batch_bytes:
            continue
        data = b"".join(pending)
        end = data.rfind(b"\n") + 1
        if not end:  # one row longer than a batch, not ended yet
            pending, size = [data], len(data)
            continue
        yield split_lines(data[:end])
        rest = data[end:]
        pending, size = ([rest], len(rest)) if rest else ([], 0)
    tail = b"".join(pending)
    if tail:
        yield split_lines(tail)  # (raises unless it ends a row)
