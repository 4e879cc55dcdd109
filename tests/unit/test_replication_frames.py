"""CopyData frames and walsender command text (no services)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest

from producer.replication import ErrorKind, Keepalive, ReplicationError
from producer.replication.commands import create_slot_command, start_replication_command
from producer.replication.frames import (
    encode_standby_status,
    now_pg_micros,
    parse_keepalive,
    split_xlogdata,
)

pytestmark = pytest.mark.unit


def test_split_xlogdata() -> None:
    frame = bytes.fromhex(
        "77"  # 'w'
        "0000000100000010"  # walStart 1/10
        "0000000100000020"  # walEnd 1/20
        "0000000000000001"  # sendTime
        "42"  # payload: 'B' ...
        "0102"
    )
    payload, wal_start, wal_end = split_xlogdata(memoryview(frame))
    assert isinstance(payload, memoryview)
    assert bytes(payload) == b"B\x01\x02"
    assert (wal_start, wal_end) == (0x1_0000_0010, 0x1_0000_0020)


def test_split_xlogdata_short_frame() -> None:
    with pytest.raises(ReplicationError) as info:
        split_xlogdata(memoryview(b"w" + b"\x00" * 23))
    assert info.value.kind is ErrorKind.PROTOCOL


def test_parse_keepalive() -> None:
    frame = bytes.fromhex(
        "6b"  # 'k'
        "00000002000000ff"  # walEnd 2/FF
        "000000000000000a"  # sendTime 10 us
        "01"  # reply requested
    )
    assert parse_keepalive(frame) == Keepalive(0x2_0000_00FF, 10, True)
    assert parse_keepalive(frame[:-1] + b"\x00").reply_requested is False


@pytest.mark.parametrize("size", [0, 17, 19])
def test_parse_keepalive_wrong_size(size: int) -> None:
    with pytest.raises(ReplicationError, match="keepalive frame has"):
        parse_keepalive(b"k" + b"\x00" * (size - 1) if size else b"")


def test_standby_status_reports_confirmed_for_all_positions() -> None:
    frame = encode_standby_status(0x3_0000_0040, 123, reply_requested=True)
    assert frame == (b"r" + struct.pack("!Q", 0x3_0000_0040) * 3 + struct.pack("!q", 123) + b"\x01")
    assert len(frame) == 34
    assert encode_standby_status(0, 1)[-1] == 0


def test_now_pg_micros_uses_2000_epoch() -> None:
    unix = datetime(2000, 1, 1, 0, 0, 1, tzinfo=UTC).timestamp()
    assert now_pg_micros(unix) == 1_000_000


def test_create_slot_command() -> None:
    assert (
        create_slot_command("s_1", export_snapshot=True, two_phase=False)
        == b"CREATE_REPLICATION_SLOT \"s_1\" LOGICAL pgoutput (SNAPSHOT 'export')"
    )
    assert (
        create_slot_command("s_1", export_snapshot=False, two_phase=True)
        == b"CREATE_REPLICATION_SLOT \"s_1\" LOGICAL pgoutput (SNAPSHOT 'nothing', TWO_PHASE)"
    )


def test_create_slot_command_refuses_bad_slot() -> None:
    with pytest.raises(ReplicationError):
        create_slot_command('x" LOGICAL test_decoding --', export_snapshot=False, two_phase=False)


def test_start_replication_command() -> None:
    command = start_replication_command(
        "s", 0x1_0000_00AB, [("proto_version", "2"), ("publication_names", '"a""b"')]
    )
    assert command == (
        b'START_REPLICATION SLOT "s" LOGICAL 1/AB'
        b' ("proto_version" \'2\', "publication_names" \'"a""b"\')'
    )
