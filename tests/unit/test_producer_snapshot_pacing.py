"""Snapshot pacing (producer/snapshot/pacing.py): the gate a chunk waits at, and the stream's
delay behind the server."""

from __future__ import annotations

import threading

import pytest

from producer.replication.frames import now_pg_micros
from producer.snapshot.pacing import CatchUpGate, SendDelay

pytestmark = pytest.mark.unit


def test_one_chunk_at_a_time_while_changes_stream() -> None:
    now = [100.0]
    gate = CatchUpGate(caught_up_s=0.02, max_hold_s=1.0, clock=lambda: now[0])
    assert not gate.held and gate.wait(0)
    gate.take(streaming=False)  # only the snapshot streams: the reader reads ahead
    assert not gate.held
    gate.take(streaming=True)  # the reader starts a window while changes stream
    assert gate.held and not gate.wait(0)
    gate.update(0.0)  # caught up, but the chunk is not published yet
    assert gate.held
    gate.published(streaming=True)
    gate.update(0.3)  # 300 ms behind
    assert gate.held
    gate.update(0.015)
    assert not gate.held
    gate.take(streaming=True)
    gate.published(streaming=True)
    gate.update(None)  # idle
    assert not gate.held
    gate.take(streaming=True)
    gate.published(streaming=False)  # quiet after all: nothing to wait for
    assert not gate.held
    assert gate.holds == 2


def test_the_gate_gives_way_after_the_longest_hold() -> None:
    now = [100.0]
    gate = CatchUpGate(caught_up_s=0.02, max_hold_s=1.0, clock=lambda: now[0])
    gate.take(streaming=True)
    gate.published(streaming=True)
    now[0] += 0.5
    gate.update(0.3)
    assert gate.held
    now[0] += 0.5  # never caught up: one chunk per max_hold_s still goes through
    gate.update(0.3)
    assert not gate.held
    gate.take(streaming=True)  # a chunk that is never published (its chain was cancelled)
    now[0] += 1.0
    gate.update(0.0)
    assert not gate.held
    gate.take(streaming=True)
    gate.release()  # read again or truncated: nothing published
    assert not gate.held


def test_the_gate_wakes_a_waiting_reader() -> None:
    gate = CatchUpGate()
    gate.take(streaming=True)
    gate.published(streaming=True)
    woke: list[bool] = []
    reader = threading.Thread(target=lambda: woke.append(gate.wait(5.0)))
    reader.start()
    gate.update(0.0)
    reader.join(5.0)
    assert woke == [True]


@pytest.mark.parametrize("clock_offset_s", [-7.0, 0.0, 3.5])
def test_the_send_delay_does_not_depend_on_the_two_clocks(clock_offset_s: float) -> None:
    """``clock_offset_s``: how far the server's clock is ahead of this host's."""
    delay = SendDelay()
    t = 1_800_000_000.0

    def sent(ago_s: float, at: float) -> int:
        return now_pg_micros(at - ago_s + clock_offset_s)

    assert delay.delay_s(sent(0.001, t), t) == 0.0  # caught up: the floor
    assert delay.delay_s(sent(0.301, t + 1), t + 1) == pytest.approx(0.3, abs=1e-3)
    assert delay.delay_s(sent(0.001, t + 2), t + 2) == pytest.approx(0.0, abs=1e-3)
    # The floor is kept across one window roll, so a stream that stays behind for a while
    # still reads as behind.
    assert delay.delay_s(sent(0.201, t + 40), t + 40) == pytest.approx(0.2, abs=1e-3)


def test_the_send_delay_never_goes_negative() -> None:
    delay = SendDelay()
    t = 1_800_000_000.0
    delay.delay_s(now_pg_micros(t - 0.05), t)
    assert delay.delay_s(now_pg_micros(t + 1 - 0.01), t + 1) == 0.0
