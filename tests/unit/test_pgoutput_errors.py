"""Malformed payloads raise DecodeError naming the message type, the byte offset and the cause."""

from __future__ import annotations

import pickle

import pytest

from producer.pgoutput import (
    Begin,
    DecodeError,
    DecodeErrorKind,
    Decoder,
    Insert,
    Message,
    Relation,
    StreamAbort,
    Update,
    Value,
)
from tests.support.pgoutput_encoder import encode

pytestmark = pytest.mark.unit

K = DecodeErrorKind

INSERT = encode(Insert(None, 16385, (Value(b"1", False), None, Value(b"abc", False))))
UPDATE_K = encode(Update(None, 16385, "K", (Value(b"1", False),), (Value(b"2", False),)))
BEGIN = encode(Begin(0x100, 5, 9))
RELATION = bytes.fromhex("52 00004001 7000 7400 64 0001 01 696400 00000014 ffffffff")


def decode_error(payload: bytes, decoder: Decoder | None = None) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        (decoder or Decoder()).decode(payload)
    return info.value


@pytest.mark.parametrize(
    ("payload", "message_type", "offset", "kind"),
    [
        (b"", "<empty>", 0, K.SHORT_BUFFER),
        (b"Z", "<tag b'Z'>", 0, K.UNKNOWN_TAG),
        (b"\x00", "<tag b'\\x00'>", 0, K.UNKNOWN_TAG),
        # short buffers: the offset is where the field that did not fit starts
        (BEGIN[:-1], "Begin", 17, K.SHORT_BUFFER),  # xid at 1 + 8 + 8
        (BEGIN[:1], "Begin", 1, K.SHORT_BUFFER),
        (INSERT[:3], "Insert", 1, K.SHORT_BUFFER),  # relation_id
        (INSERT[:5], "Insert", 5, K.SHORT_BUFFER),  # the 'N' marker
        (INSERT[:7], "Insert", 6, K.SHORT_BUFFER),  # column count
        (INSERT[:9], "Insert", 6, K.SHORT_BUFFER),  # 3 columns announced, 1 byte left
        (INSERT[:-1], "Insert", 20, K.SHORT_BUFFER),  # last value cut: its data starts at 20
        (INSERT[:-3], "Insert", 20, K.SHORT_BUFFER),
        (INSERT[:11], "Insert", 9, K.SHORT_BUFFER),  # length of the first value cut
        # trailing bytes
        (BEGIN + b"\x00", "Begin", 21, K.TRAILING_BYTES),
        (INSERT + b"!", "Insert", len(INSERT), K.TRAILING_BYTES),
        (UPDATE_K + b"!!", "Update", len(UPDATE_K), K.TRAILING_BYTES),
        (b"E\x00", "StreamStop", 1, K.TRAILING_BYTES),
        (encode(StreamAbort(1, 2)) + b"\x00" * 8, "StreamAbort", 9, K.TRAILING_BYTES),
        (RELATION + b"\x00", "Relation", len(RELATION), K.TRAILING_BYTES),
        # unknown tuple kind ('x' in place of the NULL marker, third column)
        (INSERT.replace(b"n", b"x"), "Insert", 14, K.UNKNOWN_TUPLE_KIND),
        # markers
        (b"I" + INSERT[1:5] + b"K" + INSERT[6:], "Insert", 5, K.BAD_MARKER),
        (b"U" + UPDATE_K[1:5] + b"X" + UPDATE_K[6:], "Update", 5, K.BAD_MARKER),
        (UPDATE_K.replace(b"N", b"O"), "Update", 14, K.BAD_MARKER),  # second marker is not 'N'
        (UPDATE_K.replace(b"N", b"K"), "Update", 14, K.BAD_MARKER),
        (b"D" + UPDATE_K[1:5] + b"N" + UPDATE_K[6:14], "Delete", 5, K.BAD_MARKER),
        # NUL terminators and UTF-8
        (bytes.fromhex("4f 0000000000000001 6e6f6465"), "Origin", 9, K.MISSING_NUL),
        (bytes.fromhex("52 00004001 7000 74"), "Relation", 7, K.MISSING_NUL),
        (bytes.fromhex("59 00000019 ff00 7400"), "Type", 5, K.INVALID_UTF8),
        (bytes.fromhex("4f 0000000000000001 61c3 2800"), "Origin", 10, K.INVALID_UTF8),
        # field values
        (RELATION.replace(b"\x64\x00\x01", b"\x78\x00\x01"), "Relation", 9, K.BAD_VALUE),
        (bytes.fromhex("52 00004001 7000 7400 64 ffff"), "Relation", 10, K.BAD_VALUE),
        (
            bytes.fromhex("52 00004001 7000 7400 64 0002 01 696400 00000014 ffffffff"),
            "Relation",
            10,
            K.SHORT_BUFFER,
        ),
        (bytes.fromhex("54 ffffffff 00"), "Truncate", 1, K.BAD_VALUE),
        (bytes.fromhex("54 00000002 00 00000001"), "Truncate", 1, K.SHORT_BUFFER),
        (bytes.fromhex("54 00000001 04 00000001"), "Truncate", 5, K.BAD_VALUE),
        (bytes.fromhex("4d 02 0000000000000001 7000 00000000"), "Message", 1, K.BAD_VALUE),
        (bytes.fromhex("4d 00 0000000000000001 7000 ffffffff"), "Message", 12, K.BAD_VALUE),
        (bytes.fromhex("4d 00 0000000000000001 7000 00000005 6162"), "Message", 12, K.SHORT_BUFFER),
        (bytes.fromhex("53 00000001 02"), "StreamStart", 5, K.BAD_VALUE),
        (bytes.fromhex("49 00004001 4e 0001 74 ffffffff"), "Insert", 9, K.BAD_VALUE),  # length -1
        (bytes.fromhex("49 00004001 4e 0001 74 7fffffff 00"), "Insert", 13, K.SHORT_BUFFER),
    ],
)
def test_malformed_payload_names_type_offset_and_cause(
    payload: bytes, message_type: str, offset: int, kind: DecodeErrorKind
) -> None:
    error = decode_error(payload)
    assert (error.message_type, error.offset, error.kind) == (message_type, offset, kind)
    assert message_type in str(error) and f"byte {offset}" in str(error)


def test_error_detail_names_the_offending_value() -> None:
    error = decode_error(bytes.fromhex("59 00000019 ff00 7400"))
    assert "b'\\xff'" in error.detail
    error = decode_error(RELATION.replace(b"\x64\x00\x01", b"\x78\x00\x01"))
    assert "b'x'" in error.detail and "p.t" in error.detail


def test_nested_stream_start_and_stray_stream_stop_are_rejected_without_changing_state() -> None:
    decoder = Decoder()
    assert decode_error(b"E", decoder).kind is K.BAD_STATE
    assert decoder.stream_xid is None
    decoder.decode(bytes.fromhex("53 00000005 01"))
    error = decode_error(bytes.fromhex("53 00000006 01"), decoder)
    assert error.kind is K.BAD_STATE and "5" in error.detail and "6" in error.detail
    assert decoder.stream_xid == 5
    # a malformed message inside the stream does not close it either
    decode_error(b"I\x00", decoder)
    assert decoder.stream_xid == 5
    decoder.reset()
    assert decoder.stream_xid is None


def test_stream_abort_accepts_exactly_the_v3_and_v4_lengths() -> None:
    v3 = encode(StreamAbort(1, 2))
    assert len(v3) == 9
    assert Decoder().decode(v3) == StreamAbort(1, 2, None, None)
    assert Decoder().decode(v3 + bytes(16)) == StreamAbort(1, 2, 0, 0)
    for extra in (1, 8, 15, 17, 24):
        assert decode_error(v3 + bytes(extra)).kind in (K.TRAILING_BYTES, K.SHORT_BUFFER)


def test_message_content_is_bytes_and_prefix_must_be_utf8() -> None:
    good = encode(Message(None, True, 1, "pfx", b"\xff\x00"))
    assert Decoder().decode(good) == Message(None, True, 1, "pfx", b"\xff\x00")
    assert decode_error(good.replace(b"pfx", b"p\xffx")).kind is K.INVALID_UTF8


def test_relation_in_stream_needs_the_xid() -> None:
    # Outside a stream this is a fine Relation; inside one the first 4 bytes are the xid,
    # so the same payload no longer parses.
    decoder = Decoder()
    assert isinstance(decoder.decode(RELATION), Relation)
    decoder.decode(bytes.fromhex("53 00000005 01"))
    decode_error(RELATION, decoder)


def test_decode_error_pickles() -> None:
    error = decode_error(b"Z")
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.message_type, clone.offset, clone.kind, clone.detail) == (
        error.message_type,
        error.offset,
        error.kind,
        error.detail,
    )
