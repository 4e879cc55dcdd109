"""A chunk waits for the stream to catch up: while changes stream, a snapshot takes the
pipeline's thread only when the thread has nothing of the stream's left to do.

Publishing a chunk holds the pipeline's thread (encoding and producing its rows) for about the
chunk budget, and changes committed meanwhile queue in the replication connection. With the
next window read ahead and published as soon as its high watermark came through, the thread
went from chunk to chunk without catching up: on this 2-core machine it was busy 97 % of the
time and streamed changes waited about 290 ms (p50) behind chunks, against 10 ms without a
snapshot (`bench_producer_latency.py --snapshot-rows`). Now, after a chunk is published while
changes stream, the reader starts the next window (its low watermark) only once the stream has
caught up: its delay behind the server (`SendDelay`) is back under ``caught_up_s``, or the
stream went idle. A stream that never catches up (more changes than the producer can take)
still lets one chunk through every ``max_hold_s``, so the snapshot always ends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Final

from producer.replication.frames import now_pg_micros


class CatchUpGate:
    """One chunk at a time while changes stream: the reader takes the gate before a window's
    low watermark (``take``), the pipeline's thread marks the chunk published (``published``)
    and opens the gate once the stream caught up (``update``). While only the snapshot streams
    the gate stays open and the reader reads ahead as before."""

    def __init__(
        self,
        caught_up_s: float = 0.02,
        max_hold_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.caught_up_s = caught_up_s
        self.max_hold_s = max_hold_s
        self._clock = clock
        self._open = threading.Event()
        self._open.set()
        self._since = 0.0  # when the gate was taken or the chunk published
        self._in_flight = False  # taken, and its chunk not published yet
        self.holds = 0  # chunks that waited for the stream (tests)

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def wait(self, timeout_s: float) -> bool:
        """The reader's side: True once open (False after ``timeout_s``, to check for a stop)."""
        return self._open.wait(timeout_s)

    def take(self, streaming: bool) -> None:
        """The reader starts a window (the gate is open): while changes stream, the next one
        waits until this one is published and the stream caught up."""
        if streaming:
            self._since = self._clock()
            self._in_flight = True
            self._open.clear()

    def published(self, streaming: bool) -> None:
        """The pipeline's thread published a chunk; while only the snapshot streams nothing
        waits."""
        if not streaming:
            self.release()
        elif self.held:
            self._since = self._clock()
            self._in_flight = False
            self.holds += 1

    def release(self) -> None:
        """A window ended without a chunk to wait for (read again, truncated, cancelled)."""
        self._in_flight = False
        self._open.set()

    def update(self, delay_s: float | None) -> None:
        """The stream's delay behind the server, from the pipeline's thread between
        transactions; None: the stream is idle (nothing waits). A chunk that never comes and a
        stream that never catches up both give way after ``max_hold_s``."""
        if self._open.is_set():
            return
        caught_up = not self._in_flight and (delay_s is None or delay_s <= self.caught_up_s)
        if caught_up or self._clock() - self._since >= self.max_hold_s:
            self.release()


class SendDelay:
    """How far behind the server the stream reads: the server stamps every message with its
    send time (PostgreSQL's clock), so now minus the last message's send time is the time it
    waited, plus the difference between the two hosts' clocks. That offset is taken out as
    the smallest such age seen in the last minute or so (two windows of ``WINDOW_S``): a
    stream that caught up at least once lately reads about zero when caught up, whatever the
    clocks say."""

    WINDOW_S: Final = 30.0

    def __init__(self) -> None:
        self._floor = math.inf  # smallest age in the current window
        self._previous = math.inf  # in the window before
        self._window_end = -math.inf

    def delay_s(self, send_time_us: int, now_unix: float | None = None) -> float:
        now = time.time() if now_unix is None else now_unix
        age = (now_pg_micros(now) - send_time_us) / 1e6
        if now >= self._window_end:
            self._previous, self._floor = self._floor, math.inf
            self._window_end = now + self.WINDOW_S
        self._floor = min(self._floor, age)
        return max(0.0, age - min(self._floor, self._previous))
