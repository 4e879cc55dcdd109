"""The decoder's error type: every malformed payload ends up here, never elsewhere."""

from __future__ import annotations

import enum


class DecodeErrorKind(enum.Enum):
    """Why a payload was rejected (stable values, handy for metrics and tests)."""

    SHORT_BUFFER = "short buffer"
    TRAILING_BYTES = "trailing bytes"
    UNKNOWN_TAG = "unknown message tag"
    UNKNOWN_TUPLE_KIND = "unknown tuple kind"
    MISSING_NUL = "missing NUL terminator"
    INVALID_UTF8 = "invalid UTF-8"
    BAD_MARKER = "unexpected marker byte"
    BAD_VALUE = "invalid field value"
    BAD_STATE = "message out of protocol order"


class DecodeError(Exception):
    """A pgoutput payload could not be decoded.

    Names the message type (its protocol name, or the raw tag when unknown), the byte
    offset inside the payload where decoding failed, and what was wrong there.
    """

    def __init__(self, message_type: str, offset: int, kind: DecodeErrorKind, detail: str) -> None:
        self.message_type = message_type
        self.offset = offset
        self.kind = kind
        self.detail = detail
        super().__init__(f"{message_type} at byte {offset}: {kind.value}: {detail}")

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, int, DecodeErrorKind, str]]:
        # Keep the error picklable (multiprocessing, pytest-xdist) despite the custom __init__.
        return (type(self), (self.message_type, self.offset, self.kind, self.detail))
