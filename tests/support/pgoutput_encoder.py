"""A tiny pgoutput encoder for tests: message dataclass -> the bytes PostgreSQL would send.

Written straight from the "Logical Replication Message Formats" layouts, independently of
the decoder's code, so that encode -> decode round trips check the decoder against the spec.
``in_stream`` says whether the message sits between Stream Start and Stream Stop (then the
xid field is written for Relation/Type/DML/Truncate/Message; it must not be None).
"""

from __future__ import annotations

import struct

from producer.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
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
    TupleData,
    Type,
    Update,
)


def _cstr(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


def _xid(xid: int | None, in_stream: bool) -> bytes:
    if not in_stream:
        return b""
    if xid is None:
        raise ValueError("a message inside a stream needs an xid")
    return struct.pack("!I", xid)


def encode_tuple(data: TupleData) -> bytes:
    out = [struct.pack("!h", len(data))]
    for item in data:
        if item is None:
            out.append(b"n")
        elif item is UNCHANGED_TOAST:
            out.append(b"u")
        else:
            out.append(b"b" if item.binary else b"t")
            out.append(struct.pack("!i", len(item.data)))
            out.append(item.data)
    return b"".join(out)


def encode(message: PgOutputMessage, in_stream: bool = False) -> bytes:
    """Encode one message; raises ValueError for messages the protocol can't express."""
    m = message
    if isinstance(m, Begin):
        return b"B" + struct.pack("!QqI", m.final_lsn, m.commit_ts, m.xid)
    if isinstance(m, Commit):
        return b"C" + struct.pack("!BQQq", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)
    if isinstance(m, Origin):
        return b"O" + struct.pack("!Q", m.commit_lsn) + _cstr(m.name)
    if isinstance(m, Relation):
        cols = b"".join(
            struct.pack("!B", c.flags)
            + _cstr(c.name)
            + struct.pack("!Ii", c.type_oid, c.type_modifier)
            for c in m.columns
        )
        return (
            b"R"
            + _xid(m.xid, in_stream)
            + struct.pack("!I", m.relation_id)
            + _cstr(m.namespace)
            + _cstr(m.name)
            + m.replica_identity.encode("ascii")
            + struct.pack("!h", len(m.columns))
            + cols
        )
    if isinstance(m, Type):
        return (
            b"Y"
            + _xid(m.xid, in_stream)
            + struct.pack("!I", m.type_oid)
            + _cstr(m.namespace)
            + _cstr(m.name)
        )
    if isinstance(m, Insert):
        return (
            b"I"
            + _xid(m.xid, in_stream)
            + struct.pack("!I", m.relation_id)
            + b"N"
            + encode_tuple(m.new)
        )
    if isinstance(m, Update):
        old = b""
        if m.old_kind is not None:
            if m.old is None:
                raise ValueError("old_kind without old tuple")
            old = m.old_kind.encode("ascii") + encode_tuple(m.old)
        return (
            b"U"
            + _xid(m.xid, in_stream)
            + struct.pack("!I", m.relation_id)
            + old
            + b"N"
            + encode_tuple(m.new)
        )
    if isinstance(m, Delete):
        return (
            b"D"
            + _xid(m.xid, in_stream)
            + struct.pack("!I", m.relation_id)
            + m.old_kind.encode("ascii")
            + encode_tuple(m.old)
        )
    if isinstance(m, Truncate):
        options = (1 if m.cascade else 0) | (2 if m.restart_identity else 0)
        return (
            b"T"
            + _xid(m.xid, in_stream)
            + struct.pack("!iB", len(m.relation_ids), options)
            + b"".join(struct.pack("!I", r) for r in m.relation_ids)
        )
    if isinstance(m, Message):
        return (
            b"M"
            + _xid(m.xid, in_stream)
            + struct.pack("!BQ", 1 if m.transactional else 0, m.lsn)
            + _cstr(m.prefix)
            + struct.pack("!i", len(m.content))
            + m.content
        )
    if isinstance(m, StreamStart):
        return b"S" + struct.pack("!IB", m.xid, 1 if m.first_segment else 0)
    if isinstance(m, StreamStop):
        return b"E"
    if isinstance(m, StreamCommit):
        return b"c" + struct.pack("!IBQQq", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)
    if isinstance(m, StreamAbort):
        head = b"A" + struct.pack("!II", m.xid, m.subxid)
        if m.abort_lsn is None and m.abort_ts is None:
            return head
        if m.abort_lsn is None or m.abort_ts is None:
            raise ValueError("abort_lsn and abort_ts are sent together or not at all")
        return head + struct.pack("!Qq", m.abort_lsn, m.abort_ts)
    if isinstance(m, BeginPrepare):
        return (
            b"b"
            + struct.pack("!QQqI", m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid)
            + _cstr(m.gid)
        )
    if isinstance(m, Prepare | StreamPrepare):
        tag = b"P" if isinstance(m, Prepare) else b"p"
        return (
            tag
            + struct.pack("!BQQqI", m.flags, m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid)
            + _cstr(m.gid)
        )
    if isinstance(m, CommitPrepared):
        return (
            b"K"
            + struct.pack("!BQQqI", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts, m.xid)
            + _cstr(m.gid)
        )
    if isinstance(m, RollbackPrepared):
        return (
            b"r"
            + struct.pack(
                "!BQQqqI",
                m.flags,
                m.prepare_end_lsn,
                m.rollback_end_lsn,
                m.prepare_ts,
                m.rollback_ts,
                m.xid,
            )
            + _cstr(m.gid)
        )
    raise ValueError(f"can't encode {m!r}")
