"""Pure pgoutput decoder (logical replication protocol v1-v3): bytes in, frozen dataclasses out.

No I/O and no catalog lookups: column values stay undecoded (``Value.data`` in the text or
binary wire format); mapping them to Python/Avro values is the schemas package's job.
"""

from producer.pgoutput.decoder import Decoder
from producer.pgoutput.errors import DecodeError, DecodeErrorKind
from producer.pgoutput.lsn import format_lsn, parse_lsn
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
from producer.pgoutput.timestamps import (
    PG_EPOCH,
    pg_timestamp_to_datetime,
    pg_timestamp_to_unix_micros,
)
from producer.pgoutput.tuples import UNCHANGED_TOAST, ColumnValue, TupleData, UnchangedToast, Value

__all__ = [
    "PG_EPOCH",
    "UNCHANGED_TOAST",
    "Begin",
    "BeginPrepare",
    "Column",
    "ColumnValue",
    "Commit",
    "CommitPrepared",
    "DecodeError",
    "DecodeErrorKind",
    "Decoder",
    "Delete",
    "Insert",
    "Message",
    "OldKind",
    "Origin",
    "PgOutputMessage",
    "Prepare",
    "Relation",
    "ReplicaIdentity",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "UnchangedToast",
    "Update",
    "Value",
    "format_lsn",
    "parse_lsn",
    "pg_timestamp_to_datetime",
    "pg_timestamp_to_unix_micros",
]
