"""The pgoutput messages (protocol v1-v3, plus v4's longer Stream Abort), one frozen dataclass each.

Class names and field names follow PostgreSQL's "Logical Replication Message Formats".
LSNs are ints, timestamps are int microseconds since 2000-01-01 UTC (see timestamps.py),
xids and OIDs are unsigned ints. ``xid`` on Relation/Type/Insert/Update/Delete/Truncate/
Message is the streamed transaction's xid between Stream Start and Stream Stop, else None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from producer.pgoutput.tuples import TupleData

ReplicaIdentity: TypeAlias = Literal["d", "n", "f", "i"]
"""pg_class.relreplident: default (primary key), nothing, full, index."""

OldKind: TypeAlias = Literal["K", "O"]
"""'K': only the replica-identity (key) columns of the old row; 'O': the full old row."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    flags: int
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool  # flags bit 1: the column is part of the replica identity (a real field, so asdict/fields show it)


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None
    relation_id: int
    namespace: str  # '' for pg_catalog
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    xid: int | None
    type_oid: int
    namespace: str  # '' for pg_catalog
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    xid: int | None
    relation_id: int
    old_kind: OldKind | None  # None: the server sent no old row (key unchanged, not FULL)
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    xid: int | None
    relation_id: int
    old_kind: OldKind
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int  # equals xid when the whole top-level transaction aborted
    abort_lsn: int | None = None  # only sent with protocol v4 streaming=parallel (PG 16+)
    abort_ts: int | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


PgOutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
