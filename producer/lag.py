"""The slot's lag and health, measured on its own connection on a daemon thread (never blocks
the stream): lag in bytes and seconds, wal_status, safe_wal_size and retained WAL (so an alert
fires before a slot is lost), and whether it is lost (``loss``, acted on by the pipeline's
thread)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import psycopg

from producer import slot_loss
from producer.metrics import Metrics
from producer.replication.setup import SlotState, observe_slot
from producer.slot_loss import SlotLoss
from producer.sql_session import SqlSession

log = logging.getLogger(__name__)


class LagMonitor:
    """Bytes: ``pg_current_wal_lsn() - confirmed_flush_lsn``. Seconds: now minus the commit time
    of the last confirmed transaction, 0 while nothing is in flight (``anchor_ms`` None)."""

    def __init__(
        self, dsn: str, slot: str, interval_s: float, metrics: Metrics, publication: str = ""
    ) -> None:
        self._session = SqlSession(dsn, "walbridge-lag", attempts=1)
        self._slot = slot
        self._publication = publication
        # The server's WAL position when the publication was found missing (None: it exists).
        self.publication_missing_at: int | None = None
        self._interval = interval_s
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="walbridge-lag", daemon=True)
        self.anchor_ms: int | None = None  # set by the producer loop
        self._confirmed = 0  # the slot's confirmed_flush_lsn at the last look
        # Set once, by this thread, when the slot is found lost; the pipeline's thread checks it
        # between transactions and stops (a plain attribute write is atomic).
        self.loss: SlotLoss | None = None

    def start(self) -> None:
        self._thread.start()

    def _query(self, conn: psycopg.Connection[Any]) -> tuple[SlotState | None, int, bool]:
        state, server_lsn = observe_slot(conn, self._slot)
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)",
            (self._publication,),
        ).fetchone()
        return state, server_lsn, bool(row and row[0]) or not self._publication

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.check()

    def check(self) -> None:
        """One look at the slot: metrics, and ``loss`` when it is lost."""
        anchor = self.anchor_ms
        self._metrics.slot_lag_seconds.set(
            0.0 if anchor is None else max(0.0, time.time() - anchor / 1000)
        )
        try:
            state, server_lsn, publication_exists = self._session.run(self._query)
        except psycopg.Error as exc:
            # A gauge left stale for one period is harmless; the stream has its own retries.
            log.warning("slot lag query failed", extra={"slot": self._slot, "error": str(exc)})
            return
        self._record(state, server_lsn)
        if not publication_exists and self.publication_missing_at is None:
            self.publication_missing_at = server_lsn
        if self.loss is None:
            self.loss = slot_loss.while_running(self._slot, state, self._confirmed, server_lsn)

    def _record(self, state: SlotState | None, server_lsn: int) -> None:
        m = self._metrics
        m.set_wal_status(None if state is None else state.wal_status)
        if state is None:
            return
        if state.confirmed_flush_lsn is not None:
            self._confirmed = state.confirmed_flush_lsn
            m.slot_lag_bytes.set(max(0, server_lsn - state.confirmed_flush_lsn))
        if state.restart_lsn is not None:
            m.slot_retained_wal_bytes.set(max(0, server_lsn - state.restart_lsn))
        m.slot_safe_wal_size_bytes.set(
            math.nan if state.safe_wal_size is None else state.safe_wal_size
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._session.close()
