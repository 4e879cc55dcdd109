"""One careful parse function per pgoutput message, behind a dispatch dict keyed by the tag byte.

These follow the protocol's field layouts one read at a time through the bounds-checked
Reader; they are the reference behaviour, including every error. (fastpath.py speeds up the
hottest messages and falls back to these whenever its input is not well formed.)

Each parser starts just after the tag byte. ``in_stream`` says whether the decoder is
between Stream Start and Stream Stop, where Relation/Type/DML/Truncate/Message carry
the xid of the streamed transaction. Trailing bytes are checked by ``run_careful``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeAlias

from producer.pgoutput.errors import DecodeErrorKind
from producer.pgoutput.messages import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    OldKind,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from producer.pgoutput.reader import Reader
from producer.pgoutput.tuples import TupleData, parse_tuple_data

Parser: TypeAlias = Callable[[Reader, bool], PgOutputMessage]

_REPLICA_IDENTITIES: Final[dict[int, ReplicaIdentity]] = {
    ord("d"): "d",
    ord("n"): "n",
    ord("f"): "f",
    ord("i"): "i",
}
_OLD_KINDS: Final[dict[int, OldKind]] = {ord("K"): "K", ord("O"): "O"}
_NEW: Final = ord("N")
_TRUNCATE_CASCADE: Final = 1
_TRUNCATE_RESTART_IDENTITY: Final = 2
_MESSAGE_TRANSACTIONAL: Final = 1
# flags Int8 + name (>= NUL) + type OID Int32 + typmod Int32
_MIN_COLUMN_SIZE: Final = 10


def _stream_xid(r: Reader, in_stream: bool) -> int | None:
    return r.read_u32("xid") if in_stream else None


def _tuple(r: Reader) -> TupleData:
    data, r.pos = parse_tuple_data(r.buf, r.pos, r.message_type)
    return data


def parse_begin(r: Reader, in_stream: bool) -> Begin:
    return Begin(
        final_lsn=r.read_u64("final_lsn"),
        commit_ts=r.read_i64("commit_ts"),
        xid=r.read_u32("xid"),
    )


def parse_commit(r: Reader, in_stream: bool) -> Commit:
    return Commit(
        flags=r.read_u8("flags"),
        commit_lsn=r.read_u64("commit_lsn"),
        end_lsn=r.read_u64("end_lsn"),
        commit_ts=r.read_i64("commit_ts"),
    )


def parse_origin(r: Reader, in_stream: bool) -> Origin:
    return Origin(commit_lsn=r.read_u64("commit_lsn"), name=r.read_cstring("origin name"))


def parse_relation(r: Reader, in_stream: bool) -> Relation:
    xid = _stream_xid(r, in_stream)
    relation_id = r.read_u32("relation_id")
    namespace = r.read_cstring("namespace")
    name = r.read_cstring("relation name")
    at = r.pos
    identity = _REPLICA_IDENTITIES.get(r.read_u8("replica_identity"))
    if identity is None:
        raise r.error(
            DecodeErrorKind.BAD_VALUE,
            f"replica identity {r.buf[at : at + 1]!r} of {namespace}.{name} is not one of d n f i",
            at,
        )
    at = r.pos
    ncolumns = r.read_i16("column count")
    r.check_count(ncolumns, "column count", _MIN_COLUMN_SIZE, at)
    columns = []
    for _ in range(ncolumns):
        flags = r.read_u8("column flags")
        columns.append(
            Column(
                flags=flags,
                name=r.read_cstring("column name"),
                type_oid=r.read_u32("type_oid"),
                type_modifier=r.read_i32("type_modifier"),
                is_key=bool(flags & 1),
            )
        )
    return Relation(
        xid=xid,
        relation_id=relation_id,
        namespace=namespace,
        name=name,
        replica_identity=identity,
        columns=tuple(columns),
    )


def parse_type(r: Reader, in_stream: bool) -> Type:
    return Type(
        xid=_stream_xid(r, in_stream),
        type_oid=r.read_u32("type_oid"),
        namespace=r.read_cstring("namespace"),
        name=r.read_cstring("type name"),
    )


def _expect_new(r: Reader, marker: int, at: int, what: str) -> None:
    if marker != _NEW:
        raise r.error(
            DecodeErrorKind.BAD_MARKER,
            f"{what} is {r.buf[at : at + 1]!r}, expected b'N' (new tuple)",
            at,
        )


def parse_insert(r: Reader, in_stream: bool) -> Insert:
    xid = _stream_xid(r, in_stream)
    relation_id = r.read_u32("relation_id")
    at = r.pos
    _expect_new(r, r.read_u8("tuple marker"), at, "tuple marker")
    return Insert(xid, relation_id, _tuple(r))


def parse_update(r: Reader, in_stream: bool) -> Update:
    xid = _stream_xid(r, in_stream)
    relation_id = r.read_u32("relation_id")
    at = r.pos
    marker = r.read_u8("tuple marker")
    old_kind = _OLD_KINDS.get(marker)
    old: TupleData | None = None
    if old_kind is not None:
        old = _tuple(r)
        at = r.pos
        _expect_new(r, r.read_u8("second tuple marker"), at, "second tuple marker")
    elif marker != _NEW:
        raise r.error(
            DecodeErrorKind.BAD_MARKER,
            f"tuple marker is {r.buf[at : at + 1]!r}, expected b'K', b'O' or b'N'",
            at,
        )
    return Update(xid, relation_id, old_kind, old, _tuple(r))


def parse_delete(r: Reader, in_stream: bool) -> Delete:
    xid = _stream_xid(r, in_stream)
    relation_id = r.read_u32("relation_id")
    at = r.pos
    old_kind = _OLD_KINDS.get(r.read_u8("tuple marker"))
    if old_kind is None:
        raise r.error(
            DecodeErrorKind.BAD_MARKER,
            f"tuple marker is {r.buf[at : at + 1]!r}, expected b'K' or b'O'",
            at,
        )
    return Delete(xid, relation_id, old_kind, _tuple(r))


def parse_truncate(r: Reader, in_stream: bool) -> Truncate:
    xid = _stream_xid(r, in_stream)
    at = r.pos
    count = r.read_i32("relation count")
    options_at = r.pos
    options = r.read_u8("options")
    r.check_count(count, "relation count", 4, at)
    if options & ~(_TRUNCATE_CASCADE | _TRUNCATE_RESTART_IDENTITY):
        raise r.error(
            DecodeErrorKind.BAD_VALUE, f"unknown TRUNCATE option bits {options:#04x}", options_at
        )
    relation_ids = tuple(r.read_u32("relation_id") for _ in range(count))
    return Truncate(
        xid=xid,
        relation_ids=relation_ids,
        cascade=bool(options & _TRUNCATE_CASCADE),
        restart_identity=bool(options & _TRUNCATE_RESTART_IDENTITY),
    )


def parse_message(r: Reader, in_stream: bool) -> Message:
    xid = _stream_xid(r, in_stream)
    at = r.pos
    flags = r.read_u8("flags")
    if flags & ~_MESSAGE_TRANSACTIONAL:
        raise r.error(DecodeErrorKind.BAD_VALUE, f"unknown message flag bits {flags:#04x}", at)
    lsn = r.read_u64("lsn")
    prefix = r.read_cstring("prefix")
    length = r.read_count("content length", 1)
    return Message(
        xid=xid,
        transactional=bool(flags & _MESSAGE_TRANSACTIONAL),
        lsn=lsn,
        prefix=prefix,
        content=r.read_bytes(length, "content"),
    )


def parse_stream_start(r: Reader, in_stream: bool) -> StreamStart:
    xid = r.read_u32("xid")
    at = r.pos
    first_segment = r.read_u8("first_segment")
    if first_segment > 1:
        raise r.error(
            DecodeErrorKind.BAD_VALUE, f"first_segment is {first_segment}, expected 0 or 1", at
        )
    return StreamStart(xid=xid, first_segment=first_segment == 1)


def parse_stream_stop(r: Reader, in_stream: bool) -> StreamStop:
    return StreamStop()


def parse_stream_commit(r: Reader, in_stream: bool) -> StreamCommit:
    return StreamCommit(
        xid=r.read_u32("xid"),
        flags=r.read_u8("flags"),
        commit_lsn=r.read_u64("commit_lsn"),
        end_lsn=r.read_u64("end_lsn"),
        commit_ts=r.read_i64("commit_ts"),
    )


def parse_stream_abort(r: Reader, in_stream: bool) -> StreamAbort:
    xid = r.read_u32("xid")
    subxid = r.read_u32("subxid")
    # v1-v3 end here; v4 with streaming=parallel appends abort_lsn and abort_ts. The decoder
    # is not told the protocol version, but the two forms differ in length (9 vs 25 bytes),
    # so the remaining length decides without ambiguity; anything else is trailing bytes.
    if r.size - r.pos != 16:
        return StreamAbort(xid=xid, subxid=subxid)
    return StreamAbort(
        xid=xid, subxid=subxid, abort_lsn=r.read_u64("abort_lsn"), abort_ts=r.read_i64("abort_ts")
    )


def parse_begin_prepare(r: Reader, in_stream: bool) -> BeginPrepare:
    return BeginPrepare(
        prepare_lsn=r.read_u64("prepare_lsn"),
        end_lsn=r.read_u64("end_lsn"),
        prepare_ts=r.read_i64("prepare_ts"),
        xid=r.read_u32("xid"),
        gid=r.read_cstring("gid"),
    )


def _prepare_fields(r: Reader) -> tuple[int, int, int, int, int, str]:
    """Prepare and Stream Prepare share one layout: flags, prepare_lsn, end_lsn,
    prepare_ts, xid, gid."""
    return (
        r.read_u8("flags"),
        r.read_u64("prepare_lsn"),
        r.read_u64("end_lsn"),
        r.read_i64("prepare_ts"),
        r.read_u32("xid"),
        r.read_cstring("gid"),
    )


def parse_prepare(r: Reader, in_stream: bool) -> Prepare:
    return Prepare(*_prepare_fields(r))


def parse_commit_prepared(r: Reader, in_stream: bool) -> CommitPrepared:
    return CommitPrepared(
        flags=r.read_u8("flags"),
        commit_lsn=r.read_u64("commit_lsn"),
        end_lsn=r.read_u64("end_lsn"),
        commit_ts=r.read_i64("commit_ts"),
        xid=r.read_u32("xid"),
        gid=r.read_cstring("gid"),
    )


def parse_rollback_prepared(r: Reader, in_stream: bool) -> RollbackPrepared:
    return RollbackPrepared(
        flags=r.read_u8("flags"),
        prepare_end_lsn=r.read_u64("prepare_end_lsn"),
        rollback_end_lsn=r.read_u64("rollback_end_lsn"),
        prepare_ts=r.read_i64("prepare_ts"),
        rollback_ts=r.read_i64("rollback_ts"),
        xid=r.read_u32("xid"),
        gid=r.read_cstring("gid"),
    )


def parse_stream_prepare(r: Reader, in_stream: bool) -> StreamPrepare:
    return StreamPrepare(*_prepare_fields(r))


# Tag byte -> (protocol message name, parser). A tag missing here is an error, never skipped.
PARSERS: Final[dict[int, tuple[str, Parser]]] = {
    ord("B"): ("Begin", parse_begin),
    ord("C"): ("Commit", parse_commit),
    ord("O"): ("Origin", parse_origin),
    ord("R"): ("Relation", parse_relation),
    ord("Y"): ("Type", parse_type),
    ord("I"): ("Insert", parse_insert),
    ord("U"): ("Update", parse_update),
    ord("D"): ("Delete", parse_delete),
    ord("T"): ("Truncate", parse_truncate),
    ord("M"): ("Message", parse_message),
    ord("S"): ("StreamStart", parse_stream_start),
    ord("E"): ("StreamStop", parse_stream_stop),
    ord("c"): ("StreamCommit", parse_stream_commit),
    ord("A"): ("StreamAbort", parse_stream_abort),
    ord("b"): ("BeginPrepare", parse_begin_prepare),
    ord("P"): ("Prepare", parse_prepare),
    ord("K"): ("CommitPrepared", parse_commit_prepared),
    ord("r"): ("RollbackPrepared", parse_rollback_prepared),
    ord("p"): ("StreamPrepare", parse_stream_prepare),
}


def run_careful(tag: int, buf: bytes, in_stream: bool) -> PgOutputMessage:
    """Decode ``buf`` (tag byte included, known tag) with the careful parser, checking the end."""
    name, parse = PARSERS[tag]
    reader = Reader(buf, name, 1)
    message = parse(reader, in_stream)
    reader.expect_end()
    return message
