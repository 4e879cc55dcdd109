"""One bounds-checked, big-endian reader over a pgoutput payload.

The reader works on ``bytes`` rather than a ``memoryview``: the decoder converts a
memoryview once, so that every slice it hands out (tuple values, message content) is
already the ``bytes`` object the messages carry (one copy, not two), and so that NUL
terminators are found by ``bytes.find`` in C.
"""

from __future__ import annotations

import struct
from typing import Final

from producer.pgoutput.errors import DecodeError, DecodeErrorKind

# Precompiled network-order (big-endian) layouts, named by exact width and signedness.
U8: Final = struct.Struct("!B")
I16: Final = struct.Struct("!h")
U16: Final = struct.Struct("!H")
I32: Final = struct.Struct("!i")
U32: Final = struct.Struct("!I")
I64: Final = struct.Struct("!q")
U64: Final = struct.Struct("!Q")


class Reader:
    """Sequential reader; every short read raises DecodeError with the offset."""

    __slots__ = ("buf", "message_type", "pos", "size")

    def __init__(self, buf: bytes, message_type: str, pos: int = 0) -> None:
        self.buf = buf
        self.size = len(buf)
        self.message_type = message_type
        self.pos = pos

    def error(self, kind: DecodeErrorKind, detail: str, offset: int | None = None) -> DecodeError:
        return DecodeError(self.message_type, self.pos if offset is None else offset, kind, detail)

    def _take(self, width: int, what: str) -> int:
        """Reserve ``width`` bytes and return their start offset."""
        start = self.pos
        end = start + width
        if end > self.size:
            raise self.error(
                DecodeErrorKind.SHORT_BUFFER,
                f"need {width} byte(s) for {what}, {self.size - start} left",
            )
        self.pos = end
        return start

    def read_u8(self, what: str) -> int:
        return self.buf[self._take(1, what)]

    def read_i16(self, what: str) -> int:
        value: int = I16.unpack_from(self.buf, self._take(2, what))[0]
        return value

    def read_i32(self, what: str) -> int:
        value: int = I32.unpack_from(self.buf, self._take(4, what))[0]
        return value

    def read_u32(self, what: str) -> int:
        value: int = U32.unpack_from(self.buf, self._take(4, what))[0]
        return value

    def read_i64(self, what: str) -> int:
        value: int = I64.unpack_from(self.buf, self._take(8, what))[0]
        return value

    def read_u64(self, what: str) -> int:
        value: int = U64.unpack_from(self.buf, self._take(8, what))[0]
        return value

    def read_bytes(self, length: int, what: str) -> bytes:
        start = self._take(length, what)
        return self.buf[start : self.pos]

    def read_cstring(self, what: str) -> str:
        """A NUL-terminated UTF-8 string (names, prefixes, GIDs)."""
        start = self.pos
        nul = self.buf.find(b"\x00", start)
        if nul < 0:
            raise self.error(DecodeErrorKind.MISSING_NUL, f"{what} has no NUL terminator")
        raw = self.buf[start:nul]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(
                DecodeErrorKind.INVALID_UTF8, f"{what} {raw!r}: {exc.reason}", start + exc.start
            ) from None
        self.pos = nul + 1
        return text

    def read_count(self, what: str, min_item_size: int) -> int:
        """A signed Int32 count that must be >= 0 and fit in what is left of the buffer.

        Checking against the remaining bytes up front keeps hostile counts from
        allocating or looping far beyond the payload.
        """
        start = self.pos
        count = self.read_i32(what)
        self.check_count(count, what, min_item_size, start)
        return count

    def check_count(self, count: int, what: str, min_item_size: int, offset: int) -> None:
        if count < 0:
            raise self.error(DecodeErrorKind.BAD_VALUE, f"negative {what} {count}", offset)
        if count * min_item_size > self.size - self.pos:
            raise self.error(
                DecodeErrorKind.SHORT_BUFFER,
                f"{what} {count} needs at least {count * min_item_size} byte(s), "
                f"{self.size - self.pos} left",
                offset,
            )

    def expect_end(self) -> None:
        if self.pos != self.size:
            raise self.error(
                DecodeErrorKind.TRAILING_BYTES, f"{self.size - self.pos} byte(s) after the message"
            )
