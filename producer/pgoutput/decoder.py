"""Decoder: payload bytes -> message dataclass, tracking only the stream bracket."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

from producer.pgoutput.errors import DecodeError, DecodeErrorKind
from producer.pgoutput.fastpath import FAST_PARSERS
from producer.pgoutput.messages import PgOutputMessage, StreamStart, StreamStop
from producer.pgoutput.parsers import PARSERS, run_careful

# Tag byte -> parse(buf, in_stream): the fast path where there is one, else the careful parser.
_DISPATCH: Final[dict[int, Callable[[bytes, bool], PgOutputMessage]]] = {
    tag: FAST_PARSERS.get(tag, partial(run_careful, tag)) for tag in PARSERS
}


class Decoder:
    """Decodes pgoutput payloads (the bytes inside XLogData, or from the SQL peek functions).

    The only state is whether a Stream Start is open: between Stream Start and Stream Stop,
    Relation, Type, Insert, Update, Delete, Truncate and Message carry an xid on the wire.
    A Stream Start inside an open stream, or a Stream Stop outside one, is rejected.
    Use one Decoder per replication connection, fed in order. A malformed payload raises
    DecodeError and leaves the state as it was.
    """

    __slots__ = ("_stream_xid",)

    def __init__(self) -> None:
        self._stream_xid: int | None = None

    @property
    def stream_xid(self) -> int | None:
        """The xid of the open Stream Start block, or None outside a stream."""
        return self._stream_xid

    def reset(self) -> None:
        """Forget an open stream (a new replication connection starts outside any stream)."""
        self._stream_xid = None

    def decode(self, payload: bytes | memoryview) -> PgOutputMessage:
        # One copy for memoryview/bytearray input, so every slice handed out is plain bytes.
        buf = payload if type(payload) is bytes else bytes(payload)
        try:
            parse = _DISPATCH[buf[0]]
        except IndexError:
            raise DecodeError("<empty>", 0, DecodeErrorKind.SHORT_BUFFER, "empty payload") from None
        except KeyError:
            raise DecodeError(
                f"<tag {buf[:1]!r}>",
                0,
                DecodeErrorKind.UNKNOWN_TAG,
                f"unknown message tag {buf[:1]!r}",
            ) from None
        message = parse(buf, self._stream_xid is not None)
        cls = message.__class__
        if cls is StreamStart or cls is StreamStop:
            self._track_stream(message)
        return message

    def _track_stream(self, message: PgOutputMessage) -> None:
        if isinstance(message, StreamStart):
            if self._stream_xid is not None:
                raise DecodeError(
                    "StreamStart",
                    0,
                    DecodeErrorKind.BAD_STATE,
                    f"Stream Start for xid {message.xid} while the stream of xid "
                    f"{self._stream_xid} is still open",
                )
            self._stream_xid = message.xid
        elif self._stream_xid is None:
            raise DecodeError(
                "StreamStop", 0, DecodeErrorKind.BAD_STATE, "Stream Stop outside a stream"
            )
        else:
            self._stream_xid = None
