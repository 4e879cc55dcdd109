"""Fast decoding of the messages that make up almost all of a replication stream.

Begin, Commit, Insert, Update and Delete are decoded here with one precompiled
``struct`` unpack per header and the fused TupleData loop, and their frozen dataclasses
are filled through their slot descriptors (a frozen dataclass's generated ``__init__``
goes through ``object.__setattr__`` per field, about 3x slower).

Every function falls back to the careful parser in parsers.py as soon as anything is
off (short header, wrong length, unexpected marker, trailing bytes). The careful parser
then raises the precise DecodeError, so this module never has to describe errors and
cannot change what is accepted.

The Insert/Update/Delete header unpack is repeated in each function on purpose: a shared
helper returning a tuple measured 1-2.5% slower per DML message, and decode throughput is
a stated target (tests/bench/bench_decode.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from producer.pgoutput.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    OldKind,
    PgOutputMessage,
    Update,
)
from producer.pgoutput.parsers import run_careful
from producer.pgoutput.tuples import TupleData, parse_tuple_data

FastParser = Callable[[bytes, bool], PgOutputMessage]

_BEGIN: Final = struct.Struct("!QqI")  # final_lsn, commit_ts, xid
_COMMIT: Final = struct.Struct("!BQQq")  # flags, commit_lsn, end_lsn, commit_ts
_REL_MARKER: Final = struct.Struct("!IB")  # relation_id, tuple marker
_XID_REL_MARKER: Final = struct.Struct("!IIB")  # xid, relation_id, tuple marker (in a stream)
_BEGIN_SIZE: Final = 1 + _BEGIN.size
_COMMIT_SIZE: Final = 1 + _COMMIT.size
_unpack_begin = _BEGIN.unpack_from
_unpack_commit = _COMMIT.unpack_from
_unpack_rel_marker = _REL_MARKER.unpack_from
_unpack_xid_rel_marker = _XID_REL_MARKER.unpack_from
_new = object.__new__

_TAG_BEGIN: Final = ord("B")
_TAG_COMMIT: Final = ord("C")
_TAG_INSERT: Final = ord("I")
_TAG_UPDATE: Final = ord("U")
_TAG_DELETE: Final = ord("D")
_N: Final = ord("N")
_K: Final = ord("K")
_O: Final = ord("O")


def _setter(cls: type, field: str) -> Callable[[object, Any], None]:
    setter: Callable[[object, Any], None] = getattr(cls, field).__set__
    return setter


_begin_final_lsn = _setter(Begin, "final_lsn")
_begin_commit_ts = _setter(Begin, "commit_ts")
_begin_xid = _setter(Begin, "xid")
_commit_flags = _setter(Commit, "flags")
_commit_commit_lsn = _setter(Commit, "commit_lsn")
_commit_end_lsn = _setter(Commit, "end_lsn")
_commit_commit_ts = _setter(Commit, "commit_ts")
_insert_xid = _setter(Insert, "xid")
_insert_relation_id = _setter(Insert, "relation_id")
_insert_new = _setter(Insert, "new")
_update_xid = _setter(Update, "xid")
_update_relation_id = _setter(Update, "relation_id")
_update_old_kind = _setter(Update, "old_kind")
_update_old = _setter(Update, "old")
_update_new = _setter(Update, "new")
_delete_xid = _setter(Delete, "xid")
_delete_relation_id = _setter(Delete, "relation_id")
_delete_old_kind = _setter(Delete, "old_kind")
_delete_old = _setter(Delete, "old")


def parse_begin(buf: bytes, in_stream: bool) -> PgOutputMessage:
    if len(buf) != _BEGIN_SIZE:
        return run_careful(_TAG_BEGIN, buf, in_stream)
    final_lsn, commit_ts, xid = _unpack_begin(buf, 1)
    message = _new(Begin)
    _begin_final_lsn(message, final_lsn)
    _begin_commit_ts(message, commit_ts)
    _begin_xid(message, xid)
    return message


def parse_commit(buf: bytes, in_stream: bool) -> PgOutputMessage:
    if len(buf) != _COMMIT_SIZE:
        return run_careful(_TAG_COMMIT, buf, in_stream)
    flags, commit_lsn, end_lsn, commit_ts = _unpack_commit(buf, 1)
    message = _new(Commit)
    _commit_flags(message, flags)
    _commit_commit_lsn(message, commit_lsn)
    _commit_end_lsn(message, end_lsn)
    _commit_commit_ts(message, commit_ts)
    return message


def parse_insert(buf: bytes, in_stream: bool) -> PgOutputMessage:
    try:
        if in_stream:
            xid, relation_id, marker = _unpack_xid_rel_marker(buf, 1)
            pos = 10
        else:
            xid = None
            relation_id, marker = _unpack_rel_marker(buf, 1)
            pos = 6
    except struct.error:
        return run_careful(_TAG_INSERT, buf, in_stream)
    if marker != _N:
        return run_careful(_TAG_INSERT, buf, in_stream)
    new, pos = parse_tuple_data(buf, pos, "Insert")
    if pos != len(buf):
        return run_careful(_TAG_INSERT, buf, in_stream)
    message = _new(Insert)
    _insert_xid(message, xid)
    _insert_relation_id(message, relation_id)
    _insert_new(message, new)
    return message


def parse_update(buf: bytes, in_stream: bool) -> PgOutputMessage:
    try:
        if in_stream:
            xid, relation_id, marker = _unpack_xid_rel_marker(buf, 1)
            pos = 10
        else:
            xid = None
            relation_id, marker = _unpack_rel_marker(buf, 1)
            pos = 6
    except struct.error:
        return run_careful(_TAG_UPDATE, buf, in_stream)
    old: TupleData | None = None
    old_kind: OldKind | None = None
    if marker != _N:
        if marker == _K:
            old_kind = "K"
        elif marker == _O:
            old_kind = "O"
        else:
            return run_careful(_TAG_UPDATE, buf, in_stream)
        old, pos = parse_tuple_data(buf, pos, "Update")
        if pos >= len(buf) or buf[pos] != _N:
            return run_careful(_TAG_UPDATE, buf, in_stream)
        pos += 1
    new, pos = parse_tuple_data(buf, pos, "Update")
    if pos != len(buf):
        return run_careful(_TAG_UPDATE, buf, in_stream)
    message = _new(Update)
    _update_xid(message, xid)
    _update_relation_id(message, relation_id)
    _update_old_kind(message, old_kind)
    _update_old(message, old)
    _update_new(message, new)
    return message


def parse_delete(buf: bytes, in_stream: bool) -> PgOutputMessage:
    try:
        if in_stream:
            xid, relation_id, marker = _unpack_xid_rel_marker(buf, 1)
            pos = 10
        else:
            xid = None
            relation_id, marker = _unpack_rel_marker(buf, 1)
            pos = 6
    except struct.error:
        return run_careful(_TAG_DELETE, buf, in_stream)
    delete_kind: OldKind
    if marker == _K:
        delete_kind = "K"
    elif marker == _O:
        delete_kind = "O"
    else:
        return run_careful(_TAG_DELETE, buf, in_stream)
    old, pos = parse_tuple_data(buf, pos, "Delete")
    if pos != len(buf):
        return run_careful(_TAG_DELETE, buf, in_stream)
    message = _new(Delete)
    _delete_xid(message, xid)
    _delete_relation_id(message, relation_id)
    _delete_old_kind(message, delete_kind)
    _delete_old(message, old)
    return message


FAST_PARSERS: Final[dict[int, FastParser]] = {
    _TAG_BEGIN: parse_begin,
    _TAG_COMMIT: parse_commit,
    _TAG_INSERT: parse_insert,
    _TAG_UPDATE: parse_update,
    _TAG_DELETE: parse_delete,
}
