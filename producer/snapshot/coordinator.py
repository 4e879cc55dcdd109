"""Snapshots inside the pipeline's thread: which table is read next, the open window, what a
watermark, a signal, a truncate or a new Relation means for it, and the resume state.

All decisions are taken here, on the thread that reads the stream; the reader thread only
runs the SQL of the window it is handed (``reader``). One window is open at a time, and the
next is handed over as soon as the stream passes the previous one's high watermark, so the
reader works while the stream flows.

This module holds what the pipeline calls and which tables are read: the resume records at
start-up, signals, tables added to the publication, and the periodic checks. The windows
themselves (opening, watermarks, publishing, the resume state they advance) are
``SnapshotWindows`` in windows.py, which ``SnapshotCoordinator`` extends.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import psycopg

from producer.pgoutput import format_lsn
from producer.snapshot import catalog
from producer.snapshot.as_of import AsOf
from producer.snapshot.sink import SnapshotSink
from producer.snapshot.watermarks import SIGNAL_PREFIX, WATERMARK_PREFIX
from producer.snapshot.windows import LOCK_WAIT_MS, SnapshotWindows
from schemas.snapshot_state import DONE, PENDING, RUNNING, TableState, requested
from schemas.type_mapping import TIMESTAMPTZ_MICROS

log = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 10.0
_NEW_TABLES_EVERY_S = 10.0


class SnapshotCoordinator(SnapshotWindows):
    def __init__(
        self,
        *,
        dsn: str,
        publication: str,
        sql: Any,  # producer.sql_session.SqlSession
        sink: SnapshotSink,
        chunk_rows: int,
        chunk_bytes: int,
        auto_new_tables: bool,
        metrics: Any,
        chunk_budget_s: float = 0.05,
        stream_delay: Callable[[], float | None] = lambda: None,
        on_standby: bool = False,
        workers: int = 0,
        timestamptz: str = TIMESTAMPTZ_MICROS,
    ) -> None:
        super().__init__(
            dsn=dsn,
            publication=publication,
            sql=sql,
            sink=sink,
            chunk_rows=chunk_rows,
            chunk_bytes=chunk_bytes,
            chunk_budget_s=chunk_budget_s,
            metrics=metrics,
            workers=workers,
            timestamptz=timestamptz,
        )
        # Reading from a standby: a signal (written on the primary, decoded here) can't be
        # served, as the watermarks can't be written on a read-only server.
        self._on_standby = on_standby
        self._stream_delay = stream_delay  # seconds behind the server; None: not known
        self._auto = auto_new_tables
        self._known: set[str] = set()  # published tables seen so far
        self._next_progress_log = 0.0
        self._next_table_check = 0.0

    # --- start-up ----------------------------------------------------------------------------

    def start(
        self,
        states: dict[str, TableState],
        published: Iterable[str],
        initial: list[str],
        *,
        replace_all: bool = False,
    ) -> None:
        """``states``: the resume records; ``initial``: tables to read now (a new slot).

        ``replace_all``: the new slot replaces a lost one, so readers hold rows whose deletes
        fell in the lost WAL: every table in ``initial`` is read again from its start, whatever
        its record said, and its snapshot begins with a ``t`` event (keyed tables too), so
        readers keep only the rows read and changed since."""
        self.states = dict(states)
        # Read by the run that created the slot, for readers that hold nothing of them yet.
        self._fresh = set() if replace_all else set(initial)
        self._known = set(published) | set(self.states)
        for table in initial:
            if replace_all:
                self.states[table] = requested(table, 0, truncate=True)
                self._sink.write_state(self.states[table])
            elif table not in self.states or self.states[table].status == DONE:
                self.states[table] = requested(table, 0)
                self._sink.write_state(self.states[table])
        for s in sorted(self.states.values(), key=lambda s: s.table):
            if s.rereads:  # a chunk's rows a crash kept from being read again
                self._rereads.append((s.table, list(s.rereads)))
        unfinished = sorted(
            (s for s in self.states.values() if s.status != DONE),
            key=lambda s: (s.status != RUNNING, s.started_ms, s.table),
        )
        for s in unfinished:
            self._enqueue(s.table)

    @property
    def active(self) -> bool:
        """A snapshot is under way or queued."""
        return bool(self._queue) or bool(self._rereads) or self.window is not None

    def describe(self) -> str:
        if self.window is not None:
            return f"snapshotting {self.window.table.collection}"
        return "snapshotting" if self._queue else ""

    def _enqueue(self, table: str) -> None:
        if table not in self._queue:
            self._queue.append(table)
            self._metrics.snapshot_tables_queued.set(len(self._queue))

    def bound_initial(self, as_of: AsOf) -> None:
        """The slot this run created, with its consistent point's snapshot: the initial
        snapshot's tables read only rows unchanged since (``producer.snapshot.as_of``). Their
        records say so before streaming starts, so a restart reads with the same boundary."""
        for name in sorted(self._fresh):
            state = self.states.get(name)
            if state is not None and state.status == PENDING and not state.truncate:
                self.states[name] = replace(state, as_of=as_of.text())
                self._sink.write_state(self.states[name])

    # --- the stream ----------------------------------------------------------------------------

    def on_message(self, prefix: str, content: bytes, lsn: int, in_tx: bool) -> bool:
        """A logical decoding message; True when it was ours (never published)."""
        if prefix == WATERMARK_PREFIX:
            self._on_watermark(content, lsn, in_tx)
            return True
        if prefix == SIGNAL_PREFIX:
            self._on_signal(content, lsn)
            return True
        return prefix.startswith("walbridge.")

    def _on_signal(self, content: bytes, lsn: int) -> None:
        try:
            doc = json.loads(content)
            tables = doc["snapshot"]
            if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
                raise TypeError("'snapshot' must be a list of \"schema.table\" strings")
        except (ValueError, KeyError, TypeError) as exc:
            log.error(
                "signal ignored: not understood",
                extra={
                    "lsn": format_lsn(lsn),
                    "content": content[:200].decode(errors="replace"),
                    "error": str(exc),
                },
            )
            return
        if self._on_standby:
            log.error(
                "snapshot signal ignored: this producer reads from a standby, where snapshot "
                "watermarks can't be written; send it to a producer on the primary",
                extra={"tables": tables, "lsn": format_lsn(lsn)},
            )
            return
        published: Iterable[str]
        try:
            published = self._sql.run(
                lambda conn: catalog.published(conn, self._publication, LOCK_WAIT_MS)
            )
        except catalog.CatalogLocked:
            published = self._known  # a published table is locked: what was published so far
        for table in tables:
            if table not in published:
                log.error(
                    "signal names a table the publication does not send; ignored",
                    extra={
                        "table": table,
                        "lsn": format_lsn(lsn),
                        "publication": self._publication,
                    },
                )
                continue
            previous = self.states.get(table)
            if previous is not None and previous.requested_lsn >= lsn:
                continue  # the same signal, resent after a restart
            if previous is not None and previous.status != DONE and table in self._queue:
                continue  # already under way
            self.states[table] = requested(table, lsn)
            self._sink.write_state(self.states[table])
            log.info("snapshot requested", extra={"table": table, "lsn": format_lsn(lsn)})
            self._enqueue(table)
        self._open_next()

    # --- periodic ------------------------------------------------------------------------------

    def tick(self, quiet: bool = False) -> None:
        """From the pipeline's idle and commit paths: reader failures, progress, new tables,
        and whether the stream caught up after a chunk (``quiet``: nothing left to read)."""
        if self._gate.held:
            self._gate.update(None if quiet else self._stream_delay())
        w = self.window
        if w is not None and w.error is not None and w.ready.is_set():
            raise w.error
        now = time.monotonic()
        if now >= self._next_progress_log:
            self._next_progress_log = now + _PROGRESS_EVERY_S
            self._report_progress()
        if self._auto and now >= self._next_table_check:
            self._next_table_check = now + _NEW_TABLES_EVERY_S
            self._check_new_tables()
        if self.window is None and (self._queue or self._rereads) and now >= self._open_after:
            self._open_next()

    def _report_progress(self) -> None:
        for name, p in self._progress.items():
            eta = p.eta_s()
            self._metrics.snapshot_eta_seconds.labels(name).set(-1 if eta is None else eta)
            log.info(
                "snapshot progress",
                extra={
                    "table": name,
                    "rows": p.rows,
                    "estimated_rows": p.estimate,
                    "rows_per_s": round(p.rate()),
                    "eta_s": None if eta is None else round(eta),
                },
            )

    def _check_new_tables(self) -> None:
        try:
            published = self._sql.run(
                lambda conn: catalog.published(conn, self._publication, LOCK_WAIT_MS)
            )
        except (psycopg.Error, catalog.CatalogLocked) as exc:
            log.warning("could not list the publication's tables", extra={"error": str(exc)})
            return
        for table in sorted(set(published) - self._known):
            self._queue_added(table)

    def on_first_change(self, table: str) -> None:
        """The stream's first change of ``table`` in this session (its route is being built,
        inside the change's transaction). A table added to the publication since start-up is
        queued for its snapshot now, so its record (``snapshotting`` for the consumer) is in
        the same Kafka transaction as, and before, its first event: no reader ever takes its
        streamed rows alone for the whole table. Without it the periodic look-up would find
        the table up to _NEW_TABLES_EVERY_S later, after its first events."""
        if self._auto and table not in self._known:
            self._queue_added(table)

    def _queue_added(self, table: str) -> None:
        self._known.add(table)
        if table in self.states and self.states[table].status != DONE:
            return
        self.states[table] = requested(table, 0)
        self._sink.write_state(self.states[table])
        log.info("table added to the publication; snapshot queued", extra={"table": table})
        self._enqueue(table)
