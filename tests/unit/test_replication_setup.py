"""Refusals decided from server answers, with the answers faked (no services)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from producer.replication import ErrorKind, ReplicationError
from producer.replication.connection import WalsenderConnection
from producer.replication.setup import SlotState, check_slot_usable, check_wal_level

pytestmark = pytest.mark.unit

GOOD = SlotState(
    slot_name="s",
    plugin="pgoutput",
    slot_type="logical",
    database="app",
    active_pid=None,
    confirmed_flush_lsn=0x1_0000_0010,
    two_phase=False,
    wal_status="reserved",
)


class ShowConn:
    slot = "s"

    def __init__(self, wal_level: str) -> None:
        self.wal_level = wal_level
        self.commands: list[bytes] = []

    def command(self, command: bytes) -> list[tuple[str | None, ...]]:
        self.commands.append(command)
        return [(self.wal_level,)]


@pytest.mark.parametrize("level", ["replica", "minimal"])
def test_wal_level_other_than_logical_is_refused(level: str) -> None:
    conn = ShowConn(level)
    with pytest.raises(ReplicationError) as info:
        check_wal_level(conn)  # type: ignore[arg-type]
    assert info.value.kind is ErrorKind.WAL_LEVEL
    assert repr(level) in str(info.value) and "slot 's'" in str(info.value)
    assert conn.commands == [b"SHOW wal_level"]


def test_wal_level_logical_passes() -> None:
    conn: WalsenderConnection = ShowConn("logical")  # type: ignore[assignment]
    check_wal_level(conn)


def test_usable_slot_passes() -> None:
    check_slot_usable(GOOD, dbname="app")
    check_slot_usable(replace(GOOD, wal_status="extended"), dbname="app")


@pytest.mark.parametrize(
    ("change", "kind", "text"),
    [
        ({"active_pid": 4242}, ErrorKind.SLOT_ACTIVE, "pid 4242"),
        ({"plugin": "test_decoding"}, ErrorKind.SLOT_MISMATCH, "'test_decoding'"),
        ({"slot_type": "physical", "plugin": None}, ErrorKind.SLOT_MISMATCH, "physical"),
        ({"database": "other"}, ErrorKind.SLOT_MISMATCH, "'other'"),
        ({"wal_status": "lost"}, ErrorKind.SLOT_LOST, "'lost'"),
        ({"invalidation_reason": "rows_removed"}, ErrorKind.SLOT_LOST, "'rows_removed'"),
        ({"conflicting": True}, ErrorKind.SLOT_LOST, "invalidated"),
    ],
)
def test_unusable_slot_is_refused(change: dict[str, object], kind: ErrorKind, text: str) -> None:
    with pytest.raises(ReplicationError) as info:
        check_slot_usable(replace(GOOD, **change), dbname="app")  # type: ignore[arg-type]
    assert info.value.kind is kind
    assert text in str(info.value)
    assert "slot 's'" in str(info.value) and "lsn 1/10" in str(info.value)
