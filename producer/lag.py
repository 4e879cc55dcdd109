"""Slot lag, measured on its own connection on a daemon thread (never blocks the stream)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg

from producer.metrics import Metrics
from producer.sql_session import SqlSession

log = logging.getLogger(__name__)

_QUERY = """
SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::int8
  FROM pg_replication_slots WHERE slot_name = %s
"""


class LagMonitor:
    """Bytes: ``pg_current_wal_lsn() - confirmed_flush_lsn``. Seconds: now minus the commit time
    of the last confirmed transaction, 0 while nothing is in flight (``anchor_ms`` None)."""

    def __init__(self, dsn: str, slot: str, interval_s: float, metrics: Metrics) -> None:
        self._session = SqlSession(dsn, "walbridge-lag", attempts=1)
        self._slot = slot
        self._interval = interval_s
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="walbridge-lag", daemon=True)
        self.anchor_ms: int | None = None  # set by the producer loop

    def start(self) -> None:
        self._thread.start()

    def _query(self, conn: psycopg.Connection[Any]) -> int | None:
        row = conn.execute(_QUERY, (self._slot,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            anchor = self.anchor_ms
            self._metrics.slot_lag_seconds.set(
                0.0 if anchor is None else max(0.0, time.time() - anchor / 1000)
            )
            try:
                lag = self._session.run(self._query)
            except psycopg.Error as exc:
                # A gauge left stale for one period is harmless; the stream has its own retries.
                log.warning("slot lag query failed", extra={"slot": self._slot, "error": str(exc)})
                continue
            if lag is not None:
                self._metrics.slot_lag_bytes.set(lag)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._session.close()
