"""Annotated hex vectors: one per pgoutput message type, outside and inside a stream.

The bytes are written by hand from the "Logical Replication Message Formats" chapter
(field by field, one per line), not produced by the test encoder, so these pin the
decoder to the protocol itself.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from producer.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    Value,
)

pytestmark = pytest.mark.unit


def hexv(annotated: str) -> bytes:
    """Hex digits with '#' comments and any whitespace -> bytes."""
    return bytes.fromhex("".join(line.split("#", 1)[0] for line in annotated.splitlines()))


XID = 0x000002E9  # 745
STREAM_XID = 0x000003E8  # 1000

# Messages that carry an xid only inside a stream, written once with a placeholder line.
STREAMABLE: list[tuple[str, str, PgOutputMessage]] = [
    (
        "relation",
        """
        52                # 'R'
        {xid}
        00004001          # relation_id 16385
        7075626c696300    # namespace 'public\\0'
        7400              # name 't\\0'
        64                # replica_identity 'd'
        0003              # 3 columns
        01 696400 00000014 ffffffff               # key, 'id', int8 (20), typmod -1
        00 6e6f746500 00000019 ffffffff           # 'note', text (25), typmod -1
        00 616d7400 000006a4 000c0006             # 'amt', numeric (1700), typmod (12,2)+4
        """,
        Relation(
            xid=None,
            relation_id=16385,
            namespace="public",
            name="t",
            replica_identity="d",
            columns=(
                Column(flags=1, name="id", type_oid=20, type_modifier=-1, is_key=True),
                Column(flags=0, name="note", type_oid=25, type_modifier=-1, is_key=False),
                Column(flags=0, name="amt", type_oid=1700, type_modifier=0x000C0006, is_key=False),
            ),
        ),
    ),
    (
        "relation in pg_catalog, replica identity full, no columns",
        """
        52 {xid}
        00000001 00 6100  # relation_id 1, namespace '' (pg_catalog), name 'a'
        66                # replica_identity 'f'
        0000              # no columns
        """,
        Relation(None, 1, "", "a", "f", ()),
    ),
    (
        "type (enum)",
        """
        59                # 'Y'
        {xid}
        00004010          # type_oid 16400
        7075626c696300    # namespace 'public'
        6d6f6f6400        # name 'mood'
        """,
        Type(xid=None, type_oid=16400, namespace="public", name="mood"),
    ),
    (
        "insert, text values",
        """
        49                # 'I'
        {xid}
        00004001          # relation_id
        4e                # 'N' new tuple
        0003              # 3 columns
        74 00000001 31    # 't' len 1 '1'
        6e                # 'n' NULL
        74 00000005 31322e3530  # 't' len 5 '12.50'
        """,
        Insert(xid=None, relation_id=16385, new=(Value(b"1", False), None, Value(b"12.50", False))),
    ),
    (
        "insert, binary values and empty text",
        """
        49 {xid} 00004001 4e
        0002
        62 00000008 0000000000000102   # 'b' int8 258
        74 00000000                    # 't' empty string
        """,
        Insert(None, 16385, (Value(b"\x00" * 6 + b"\x01\x02", True), Value(b"", False))),
    ),
    (
        "update, no old tuple",
        """
        55 {xid} 00004001  # 'U', relation_id
        4e 0002 74 00000001 32 75   # 'N': '2', 'u' unchanged TOAST
        """,
        Update(None, 16385, None, None, (Value(b"2", False), UNCHANGED_TOAST)),
    ),
    (
        "update, key changed ('K')",
        """
        55 {xid} 00004001
        4b 0002 74 00000001 31 6e   # 'K': key '1', other columns sent as NULL
        4e 0002 74 00000001 32 74 00000001 78  # 'N': '2', 'x'
        """,
        Update(
            None,
            16385,
            "K",
            (Value(b"1", False), None),
            (Value(b"2", False), Value(b"x", False)),
        ),
    ),
    (
        "update, full old row ('O')",
        """
        55 {xid} 00004001
        4f 0001 74 00000001 61      # 'O': 'a'
        4e 0001 74 00000001 62      # 'N': 'b'
        """,
        Update(None, 16385, "O", (Value(b"a", False),), (Value(b"b", False),)),
    ),
    (
        "delete, key",
        """
        44 {xid} 00004001           # 'D', relation_id
        4b 0002 74 00000001 37 6e   # 'K': '7', NULL
        """,
        Delete(None, 16385, "K", (Value(b"7", False), None)),
    ),
    (
        "delete, full old row",
        """
        44 {xid} 00004001
        4f 0002 74 00000001 37 74 00000002 6869   # 'O': '7', 'hi'
        """,
        Delete(None, 16385, "O", (Value(b"7", False), Value(b"hi", False))),
    ),
    (
        "truncate, cascade + restart identity",
        """
        54 {xid}              # 'T'
        00000002              # 2 relations
        03                    # options: 1 CASCADE | 2 RESTART IDENTITY
        00004001 00004002     # relation ids
        """,
        Truncate(None, (16385, 16386), cascade=True, restart_identity=True),
    ),
    (
        "truncate, plain",
        "54 {xid} 00000001 00 00004001",
        Truncate(None, (16385,), cascade=False, restart_identity=False),
    ),
    (
        "message, transactional",
        """
        4d {xid}              # 'M'
        01                    # flags: transactional
        0000000001a2b3c4      # lsn
        77627800              # prefix 'wbx'
        00000003 616263       # content 'abc'
        """,
        Message(None, True, 0x1A2B3C4, "wbx", b"abc"),
    ),
    (
        "message, non-transactional, empty content",
        "4d {xid} 00 0000000000000010 7000 00000000",
        Message(None, False, 16, "p", b""),
    ),
]


def _with_xid(expected: PgOutputMessage, xid: int) -> PgOutputMessage:
    return replace(expected, xid=xid)  # type: ignore[arg-type]  # every STREAMABLE message has an xid


OUTSIDE: list[tuple[str, bytes, PgOutputMessage]] = [
    (name, hexv(text.replace("{xid}", "")), expected) for name, text, expected in STREAMABLE
]
INSIDE: list[tuple[str, bytes, PgOutputMessage]] = [
    (name, hexv(text.replace("{xid}", f"{STREAM_XID:08x}")), _with_xid(expected, STREAM_XID))
    for name, text, expected in STREAMABLE
]

# Messages whose layout does not depend on the stream.
FIXED: list[tuple[str, bytes, PgOutputMessage]] = [
    (
        "begin",
        hexv("""
        42                    # 'B'
        0000000016b37480      # final_lsn 0/16B37480
        0002b1b4ab5f2a40      # commit_ts (us since 2000-01-01)
        000002e9              # xid 745
        """),
        Begin(final_lsn=0x16B37480, commit_ts=0x0002B1B4AB5F2A40, xid=XID),
    ),
    (
        "commit",
        hexv("""
        43                    # 'C'
        00                    # flags
        0000000016b37480      # commit_lsn
        0000000016b374b0      # end_lsn
        0002b1b4ab5f2a40      # commit_ts
        """),
        Commit(flags=0, commit_lsn=0x16B37480, end_lsn=0x16B374B0, commit_ts=0x0002B1B4AB5F2A40),
    ),
    (
        "origin",
        hexv("""
        4f                    # 'O'
        00000001000000ff      # commit_lsn on the origin 1/FF
        6e6f64655f6100        # name 'node_a'
        """),
        Origin(commit_lsn=0x1_000000FF, name="node_a"),
    ),
    (
        "stream abort (v1-v3 form)",
        hexv("""
        41                    # 'A'
        000003e8              # xid 1000
        000003ea              # subxid 1002
        """),
        StreamAbort(xid=STREAM_XID, subxid=1002, abort_lsn=None, abort_ts=None),
    ),
    (
        "stream abort (v4 parallel form, accepted by length)",
        hexv("""
        41 000003e8 000003e8  # xid = subxid: the whole transaction
        0000000000abcdef      # abort_lsn
        0000000000000064      # abort_ts
        """),
        StreamAbort(xid=STREAM_XID, subxid=STREAM_XID, abort_lsn=0xABCDEF, abort_ts=100),
    ),
    (
        "stream commit",
        hexv("""
        63                    # 'c'
        000003e8              # xid
        00                    # flags
        0000000000001000      # commit_lsn
        0000000000001010      # end_lsn
        ffffffffffffffff      # commit_ts -1 (signed)
        """),
        StreamCommit(xid=STREAM_XID, flags=0, commit_lsn=0x1000, end_lsn=0x1010, commit_ts=-1),
    ),
    (
        "begin prepare",
        hexv("""
        62                    # 'b'
        0000000000002000      # prepare_lsn
        0000000000002030      # end_lsn
        0000000000000007      # prepare_ts
        000002e9              # xid
        67696400              # gid 'gid'
        """),
        BeginPrepare(prepare_lsn=0x2000, end_lsn=0x2030, prepare_ts=7, xid=XID, gid="gid"),
    ),
    (
        "prepare",
        hexv("""
        50 00                 # 'P', flags
        0000000000002000 0000000000002030 0000000000000007   # prepare_lsn, end_lsn, prepare_ts
        000002e9 67696400     # xid, gid 'gid'
        """),
        Prepare(flags=0, prepare_lsn=0x2000, end_lsn=0x2030, prepare_ts=7, xid=XID, gid="gid"),
    ),
    (
        "commit prepared",
        hexv("""
        4b 00                 # 'K', flags
        0000000000003000 0000000000003030 0000000000000009   # commit_lsn, end_lsn, commit_ts
        000002e9 c3a900       # xid, gid 'é' (UTF-8)
        """),
        CommitPrepared(flags=0, commit_lsn=0x3000, end_lsn=0x3030, commit_ts=9, xid=XID, gid="é"),
    ),
    (
        "rollback prepared",
        hexv("""
        72 00                 # 'r', flags
        0000000000002030      # prepare_end_lsn
        0000000000004030      # rollback_end_lsn
        0000000000000007      # prepare_ts
        000000000000000b      # rollback_ts
        000002e9 6700         # xid, gid 'g'
        """),
        RollbackPrepared(
            flags=0,
            prepare_end_lsn=0x2030,
            rollback_end_lsn=0x4030,
            prepare_ts=7,
            rollback_ts=11,
            xid=XID,
            gid="g",
        ),
    ),
    (
        "stream prepare",
        hexv("""
        70 00                 # 'p', flags
        0000000000005000 0000000000005030 000000000000000c   # prepare_lsn, end_lsn, prepare_ts
        000003e8 737000       # xid, gid 'sp'
        """),
        StreamPrepare(
            flags=0, prepare_lsn=0x5000, end_lsn=0x5030, prepare_ts=12, xid=STREAM_XID, gid="sp"
        ),
    ),
]

STREAM_START = hexv("""
    53                        # 'S'
    000003e8                  # xid 1000
    01                        # first segment
""")
STREAM_STOP = hexv("45")  # 'E'


@pytest.mark.parametrize(
    ("name", "payload", "expected"), FIXED + OUTSIDE, ids=lambda v: v if isinstance(v, str) else ""
)
def test_vector_outside_a_stream(name: str, payload: bytes, expected: PgOutputMessage) -> None:
    decoded = Decoder().decode(payload)
    assert decoded == expected
    assert type(decoded) is type(expected)


@pytest.mark.parametrize(
    ("name", "payload", "expected"), INSIDE + FIXED, ids=lambda v: v if isinstance(v, str) else ""
)
def test_vector_inside_a_stream(name: str, payload: bytes, expected: PgOutputMessage) -> None:
    decoder = Decoder()
    assert decoder.decode(STREAM_START) == StreamStart(xid=STREAM_XID, first_segment=True)
    assert decoder.stream_xid == STREAM_XID
    assert decoder.decode(payload) == expected
    assert decoder.decode(STREAM_STOP) == StreamStop()
    assert decoder.stream_xid is None


def test_memoryview_and_bytearray_payloads_decode_like_bytes() -> None:
    _name, payload, expected = OUTSIDE[3]
    for wrapped in (memoryview(payload), bytearray(payload), memoryview(b"xx" + payload)[2:]):
        decoded = Decoder().decode(wrapped)
        assert decoded == expected
        assert isinstance(decoded, Insert)
        assert all(type(v.data) is bytes for v in decoded.new if isinstance(v, Value))


def test_stream_start_later_segment_and_xid_leaves_with_stream_stop() -> None:
    decoder = Decoder()
    assert decoder.decode(hexv("53 00000007 00")) == StreamStart(xid=7, first_segment=False)
    inside = decoder.decode(hexv("49 00000007 00004001 4e 0001 6e"))
    assert inside == Insert(7, 16385, (None,))
    decoder.decode(STREAM_STOP)
    # After Stream Stop the xid field is gone again.
    outside = decoder.decode(hexv("49 00004001 4e 0001 6e"))
    assert outside == Insert(None, 16385, (None,))


def test_value_is_cheap_and_compares_by_value() -> None:
    value = Value(b"x", True)
    assert value.data == b"x" and value.binary is True
    assert value == Value(b"x", True)
    assert value != Value(b"x", False)
    assert hash(value) == hash(Value(b"x", True))
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
