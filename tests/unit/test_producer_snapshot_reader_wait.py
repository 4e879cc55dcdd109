"""The snapshot reader's wait before reading a chunk again (its earlier read missed a
transaction, see watermarks.RecentTransactions), with a fake SQL connection: it asks
``pg_xact_status`` with backoff until the transaction is no longer in progress, warns once
when that lasts, and gives up quietly when the window is cancelled."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from producer.pgoutput import Column
from producer.snapshot import reader as reader_module
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.reader import ChunkReader
from producer.snapshot.watermarks import Window

pytestmark = pytest.mark.unit

TABLE = SnapshotTable(1, "public", "t", "d", (Column(1, "id", 23, -1, True),), ("id",))


class FakeConnection:
    def __init__(self, answers: list[str | None]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, statement: str, params: tuple[Any, ...]) -> Any:
        self.asked.append((statement, params))
        answer = self.answers.pop(0)
        return SimpleNamespace(fetchone=lambda: None if answer is None else (answer,))


def _wait(conn: FakeConnection, window: Window) -> None:
    ChunkReader._wait_visible(SimpleNamespace(_stopping=False), conn, window)  # type: ignore[arg-type]


def test_waits_with_backoff_until_the_transaction_is_visible_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    slept: list[float] = []
    clock = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += 6.0  # a slow standby: the warning is due on the third wait

    monkeypatch.setattr(reader_module.time, "sleep", sleep)
    monkeypatch.setattr(reader_module.time, "monotonic", lambda: clock[0])
    window = Window(table=TABLE, cursor=None, limit=10, wait_for=(1 << 32) + 700)
    conn = FakeConnection(["in progress"] * 4 + ["committed"])
    with caplog.at_level(logging.WARNING):
        _wait(conn, window)
    assert len(conn.asked) == 5
    assert conn.asked[0][1] == ((1 << 32) + 700,)  # the 64-bit xid
    assert slept == sorted(slept) and slept[1] == 2 * slept[0]
    warnings = [r for r in caplog.records if "waits for a committed transaction" in r.message]
    assert len(warnings) == 1 and warnings[0].xid == (1 << 32) + 700  # type: ignore[attr-defined]


def test_no_wait_without_a_missed_transaction_nor_for_an_unknown_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader_module.time, "sleep", lambda s: pytest.fail("slept"))
    conn = FakeConnection([])
    _wait(conn, Window(table=TABLE, cursor=None, limit=10))
    assert conn.asked == []
    conn = FakeConnection([None])  # pg_xact_status: too old to know
    _wait(conn, Window(table=TABLE, cursor=None, limit=10, wait_for=5))
    assert len(conn.asked) == 1


def test_a_cancelled_window_stops_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module.time, "sleep", lambda s: None)
    window = Window(table=TABLE, cursor=None, limit=10, wait_for=5)
    window.chain.cancelled = True
    with pytest.raises(reader_module._Abandoned):
        _wait(FakeConnection(["in progress"]), window)
