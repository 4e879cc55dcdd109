"""CopyData frames of the streaming replication protocol (pure: bytes in, values out).

Server -> client: 'w' XLogData, 'k' Primary keepalive. Client -> server: 'r' Standby Status
Update. Layouts: PostgreSQL "Streaming Replication Protocol", START_REPLICATION.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from producer.replication.errors import ErrorKind, ReplicationError

XLOGDATA_TAG = 0x77  # 'w'
KEEPALIVE_TAG = 0x6B  # 'k'

# 'w' walStart u64, walEnd u64, sendTime i64, then the plugin's payload.
XLOGDATA_HEADER = struct.Struct("!QQq")
XLOGDATA_PAYLOAD_OFFSET = 1 + XLOGDATA_HEADER.size
# 'k' walEnd u64, sendTime i64, replyRequested u8.
KEEPALIVE_BODY = struct.Struct("!QqB")
KEEPALIVE_SIZE = 1 + KEEPALIVE_BODY.size
# 'r' write u64, flush u64, apply u64, sendTime i64, replyRequested u8.
STANDBY_STATUS = struct.Struct("!cQQQqB")

# Seconds between the Unix epoch and PostgreSQL's 2000-01-01 epoch.
_PG_EPOCH_UNIX_SECONDS = 946_684_800


@dataclass(frozen=True)
class Keepalive:
    wal_end: int
    send_time: int  # server clock, microseconds since 2000-01-01 UTC
    reply_requested: bool


def now_pg_micros(unix_seconds: float | None = None) -> int:
    """The current (or given Unix) time as PostgreSQL epoch microseconds."""
    now = time.time() if unix_seconds is None else unix_seconds
    return int((now - _PG_EPOCH_UNIX_SECONDS) * 1_000_000)


def split_xlogdata(frame: memoryview) -> tuple[memoryview, int, int]:
    """A 'w' frame -> (payload, wal_start, wal_end); the payload is a view, not a copy."""
    if len(frame) < XLOGDATA_PAYLOAD_OFFSET:
        raise ReplicationError(
            ErrorKind.PROTOCOL, f"XLogData frame of {len(frame)} bytes is shorter than its header"
        )
    wal_start, wal_end, _send_time = XLOGDATA_HEADER.unpack_from(frame, 1)
    return frame[XLOGDATA_PAYLOAD_OFFSET:], wal_start, wal_end


def parse_keepalive(frame: memoryview | bytes) -> Keepalive:
    if len(frame) != KEEPALIVE_SIZE:
        raise ReplicationError(
            ErrorKind.PROTOCOL,
            f"keepalive frame has {len(frame)} bytes, expected {KEEPALIVE_SIZE}",
        )
    wal_end, send_time, reply = KEEPALIVE_BODY.unpack_from(frame, 1)
    return Keepalive(wal_end, send_time, reply != 0)


def encode_standby_status(
    confirmed_lsn: int, send_time: int, *, reply_requested: bool = False
) -> bytes:
    """'r' with written = flushed = applied = ``confirmed_lsn``.

    A logical slot's confirmed_flush_lsn follows the flush position; reporting the same value
    for all three keeps the server from assuming anything beyond what the producer confirmed.
    0 (InvalidXLogRecPtr) is ignored by the server, so an unconfirmed client moves nothing.
    """
    return STANDBY_STATUS.pack(
        b"r", confirmed_lsn, confirmed_lsn, confirmed_lsn, send_time, 1 if reply_requested else 0
    )
