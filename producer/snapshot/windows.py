"""The snapshot's windows, one in flight at a time, in step with the stream: the next window
opened for the table at the head of the queue (or for rows to read again) and handed to the
reader thread, what its low and high watermarks, a truncate or a new Relation mean for it, its
rows published at its high watermark (publish.py), and the table's resume state advanced and
written once Kafka has acknowledged the transaction that carried them.

The mechanism under ``SnapshotCoordinator`` (coordinator.py), which decides which tables are
read (the resume records at start-up, signals, tables added to the publication), runs the
periodic checks and is what the pipeline calls. Apart from it because this half is the method
(why each window is exact: ``watermarks``) put to work, and grows with it; the coordinator's
half grows with the ways of asking for a snapshot. Both run on the thread that reads the
stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from producer.pgoutput import format_lsn
from producer.snapshot import catalog
from producer.snapshot.as_of import AsOf
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.pacing import CatchUpGate
from producer.snapshot.publish import publish_rows
from producer.snapshot.reader import ChunkReader
from producer.snapshot.sink import SnapshotSink
from producer.snapshot.watermarks import (
    ChunkSizer,
    Mark,
    Outcome,
    RecentTransactions,
    Window,
    parse_watermark,
)
from producer.snapshot.workers import CodecSpec, WorkerPool
from schemas.snapshot_state import DONE, PENDING, TableState, requested
from schemas.type_mapping import TIMESTAMPTZ_MICROS

# The snapshot's log lines keep the logger they had before the coordinator was split in two.
log = logging.getLogger("producer.snapshot.coordinator")

# The streaming thread's catalog look-ups wait this long for a locked table (catalog.CatalogLocked),
# and a window that could not be opened for it is tried again this much later.
LOCK_WAIT_MS = 200
_LOCKED_RETRY_S = 1.0


@dataclass
class _Progress:
    estimate: int
    started: float = field(default_factory=time.monotonic)
    rows: int = 0
    dropped: int = 0

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        rate = self.rate()
        if rate <= 0 or self.estimate <= self.rows:
            return None
        return (self.estimate - self.rows) / rate


class SnapshotWindows:
    def __init__(
        self,
        *,
        dsn: str,
        publication: str,
        sql: Any,  # producer.sql_session.SqlSession
        sink: SnapshotSink,
        chunk_rows: int,
        chunk_bytes: int,
        chunk_budget_s: float,
        metrics: Any,
        workers: int = 0,
        timestamptz: str = TIMESTAMPTZ_MICROS,
    ) -> None:
        self._dsn = dsn
        # Snapshot worker processes (workers.py; 0: the reader thread reads, this one encodes).
        self._workers = workers
        self._timestamptz = timestamptz
        self._publication = publication
        self._sql = sql
        self._sink = sink
        self._sizer = ChunkSizer(chunk_rows, chunk_bytes, chunk_budget_s)
        self._gate = CatchUpGate()
        self._row_bytes: dict[str, float] = {}  # average COPY bytes per row, by table
        self._pending_state: TableState | None = None
        # Tables the run that created the slot reads (``SnapshotCoordinator.start``).
        self._fresh: set[str] = set()
        # Rows to read again (their in-window change lacked an unchanged TOAST value), by
        # table; read before anything else.
        self._rereads: list[tuple[str, list[tuple[str, ...]]]] = []
        self._metrics = metrics
        self.states: dict[str, TableState] = {}
        self._queue: list[str] = []  # tables to read, in order
        self._progress: dict[str, _Progress] = {}
        self.window: Window | None = None  # the chunk in flight (checked per streamed event)
        self._recent = RecentTransactions()
        self._wait_for: int | None = None  # for the next window's reader (Window.wait_for)
        self._reader: ChunkReader | None = None
        self._published_in_tx: tuple[Window, int, int] | None = None  # window, rows, lsn
        self._watermark_in_tx = False  # the open transaction is one of our watermarks'
        self._unconfirmed: list[tuple[int, TableState]] = []  # (commit_lsn, state to write)
        self._open_after = 0.0  # a locked table's window is tried again from then on

    @property
    def unconfirmed(self) -> bool:
        """Published chunks whose resume record waits for Kafka's acknowledgement."""
        return bool(self._unconfirmed)

    # --- the next window -----------------------------------------------------------------------

    def _open_next(self) -> None:
        try:
            self._open_next_window()
        except catalog.CatalogLocked as exc:
            # The table stays queued (so /readyz and the progress table say it is being
            # snapshotted); the stream goes on, and tick() tries again.
            self._open_after = time.monotonic() + _LOCKED_RETRY_S
            log.info("snapshot waits for a locked table", extra={"error": str(exc)})

    def _open_next_window(self) -> None:
        if self.window is not None:
            return
        if self._rereads:
            name, keys = self._rereads.pop(0)
            table = self._describe(name)
            if table is None:
                self._open_next()
                return
            self.window = Window(table=table, cursor=None, limit=len(keys), keys=keys)
            self._submit(self.window)
            return
        if not self._queue:
            return
        name = self._queue[0]
        table = self._describe(name)
        if table is None:
            self._open_next()
            return
        state = self.states.get(name) or requested(name, 0)
        self.states[name] = state
        if name not in self._progress:
            estimate = self._sql.run(lambda conn: catalog.estimate_rows(conn, table.oid))
            self._progress[name] = _Progress(estimate=estimate, rows=state.rows)
            self._metrics.snapshot_rows_estimate.labels(name).set(estimate)
            log.info(
                "snapshot started" if state.status == PENDING else "snapshot resumed",
                extra={"table": name, "estimated_rows": estimate, "rows_done": state.rows},
            )
        # A table without a usable key is read whole in one window (its rows can't be told
        # apart by key, so they are matched whole against changes streamed in between).
        limit = 2**62
        if table.chunk_key:
            limit = self._sizer.limit(self._row_bytes.get(name))
        as_of = AsOf.parse(state.as_of) if state.as_of is not None and table.chunk_key else None
        self.window = Window(
            table=table,
            cursor=state.cursor if table.chunk_key else None,
            limit=limit,
            as_of=as_of,
            spec=self._codec_spec(table),
        )
        self._submit(self.window)

    def _codec_spec(self, table: SnapshotTable) -> CodecSpec | None:
        """What the workers encode the table's rows with: its route's codec, as the stream
        (or the catalog) describes it now. Checked again at each high watermark."""
        if not self._workers:
            return None
        route = self._sink.snapshot_route(table, 0)
        return CodecSpec.of(route.shape.codec, self._timestamptz)

    def _describe(self, name: str) -> SnapshotTable | None:
        """The table as the catalog describes it now; None when it left the publication (its
        snapshot is dropped)."""
        try:
            table: SnapshotTable = self._sql.run(
                lambda conn: catalog.describe(conn, self._publication, name, LOCK_WAIT_MS)
            )
        except KeyError:
            self._left_publication(name)
            return None
        return table

    def _submit(self, window: Window) -> None:
        window.wait_for, self._wait_for = self._wait_for, None
        if self._reader is None:
            pool = None
            if self._workers:
                pool = WorkerPool(self._workers, self._metrics.snapshot_worker_ranges)
            self._reader = ChunkReader(self._dsn, self._sizer, self._gate, pool)
        self._reader.submit(window)

    def _left_publication(self, name: str) -> None:
        """A table no longer published has nothing to deliver: its snapshot (chunks and rows
        to read again) is dropped, and its record with it (a later snapshot starts anew)."""
        log.warning("table left the publication; its snapshot is dropped", extra={"table": name})
        if name in self._queue:
            self._queue.remove(name)
            self._metrics.snapshot_tables_queued.set(len(self._queue))
        self._rereads = [(t, keys) for t, keys in self._rereads if t != name]
        self._progress.pop(name, None)
        state = self.states.pop(name, None)
        if state is None or state.complete:
            return
        final = replace(state, status=DONE, rereads=())
        self._unconfirmed = [(lsn, s) for lsn, s in self._unconfirmed if s.table != name]
        pending = self._pending_state
        if self._published_in_tx is not None and pending is not None and pending.table == name:
            self._pending_state = final  # written after the chunk's transaction, as it would be
        else:
            self._sink.write_state(final)

    # --- the stream ----------------------------------------------------------------------------

    def _on_watermark(self, content: bytes, lsn: int, in_tx: bool) -> None:
        """A watermark message (``on_message``): a window opens at its low one, and is published
        at its high one."""
        self._watermark_in_tx = in_tx
        parsed = parse_watermark(content)
        head = self.window
        if parsed is None or head is None:
            return  # a previous run's watermark
        # A window read ahead opens while the one before waits to be published.
        window = next((w for w in head.chained() if w.id == parsed[0]), None)
        if window is None or (parsed[1] is Mark.HIGH and window is not head):
            return  # a previous run's, a cancelled chain's or a retried window's
        if parsed[1] is Mark.LOW:
            window.opened = True
            window.low = self._recent.mark()
            if not window.table.chunk_key and in_tx and self._may_hold_rows(window.table):
                # Readers drop what they hold at this truncate, streamed rows of a first
                # try of the window too (a retried read commits a second low watermark).
                window.images = []
                route = self._sink.snapshot_route(window.table, lsn)
                self._sink.emit_snapshot_truncate(route, lsn)
            elif in_tx and self._replaces_rows(window):
                # A keyed table read anew after a lost slot: its first chunk starts with
                # the truncate (again, if that chunk is read again: harmless, as before
                # its rows). Changes streamed after it apply as usual; rows not read yet
                # are missing downstream until their chunk comes (the table shows in
                # the progress table's snapshotting column until its snapshot is done).
                route = self._sink.snapshot_route(window.table, lsn)
                self._sink.emit_snapshot_truncate(route, lsn)
        elif in_tx:
            self._at_high_watermark(window, lsn)

    def _replaces_rows(self, window: Window) -> bool:
        """The first window of a keyed table whose snapshot replaces what readers hold."""
        if window.keys is not None or window.cursor is not None or not window.table.chunk_key:
            return False
        state = self.states.get(window.table.collection)
        return state is not None and state.truncate and state.chunks == 0

    def on_begin(self, xid: int) -> None:
        """A transaction's Begin (every one, resent ones too): remembered for a while, for
        the windows whose read may have missed it (``RecentTransactions``)."""
        self._recent.begin(xid)

    def _may_hold_rows(self, table: SnapshotTable) -> bool:
        """Whether readers may hold rows of the table already: not when this run created the
        slot and has published nothing of the table (no route yet: routes are built at a
        table's first change)."""
        return table.collection not in self._fresh or self._sink.has_route(table.oid)

    def on_truncate(self, collection: str) -> None:
        head = self.window
        if head is not None and head.table.collection == collection:
            for w in head.chained():
                if w.opened:
                    w.truncated = True

    def on_relation(self, relation: Any) -> None:
        """A Relation message: pgoutput sends one before a table's first change in a session
        and after its shape changed; only a shape other than the one read matters."""
        head = self.window
        if head is None or relation.relation_id != head.table.oid:
            return

        def shape(columns: Iterable[Any]) -> list[tuple[str, int, int]]:
            return [(c.name, c.type_oid, c.type_modifier) for c in columns]

        if shape(relation.columns) != shape(head.table.columns):
            for w in head.chained():
                w.reshaped = True  # the rows read may not match the new shape: read them again

    def _at_high_watermark(self, window: Window, lsn: int) -> None:
        self._sizer.high_watermark()
        window.ready.wait()
        if window.error is not None:
            raise window.error
        name = window.table.collection
        if window.rows:
            self._row_bytes[name] = window.bytes_read / window.rows
        if window.read_snapshot is not None and window.low is not None:
            window.missed = window.low.missed(window.read_snapshot)
        outcome = window.outcome()
        rows = 0
        reread: list[tuple[str, ...]] = []
        if outcome is Outcome.PUBLISHED:
            route = self._sink.snapshot_route(window.table, lsn)
            codec = route.shape.codec
            if tuple(c.name for c in codec.columns) != window.table.column_names:
                outcome = Outcome.REDO  # the stream's shape is not the one read
            elif (
                window.encoded is not None or window.encoded_spools
            ) and window.spec != CodecSpec.of(codec, self._timestamptz):
                outcome = Outcome.REDO  # encoded with another codec than the route's now
            else:
                began = time.perf_counter()
                rows, reread = self._publish(window, route, codec, lsn)
                self._sizer.published(window.rows, time.perf_counter() - began)
                # While changes stream, the next window waits for the stream to catch up.
                self._gate.published(self._sizer.streaming)
        if outcome is not Outcome.PUBLISHED or not rows:
            self._gate.release()  # nothing was published: no reason to wait
        self._published_in_tx = (window, rows, lsn) if outcome is not Outcome.REDO else None
        self.window = None
        if outcome is Outcome.REDO:
            if window.missed is not None:
                log.info(
                    "snapshot chunk read again once a transaction is visible (its read missed "
                    "it, committed before the low watermark)",
                    extra={"table": name, "xid": window.missed, "high_watermark": format_lsn(lsn)},
                )
                self._metrics.snapshot_chunks_reread.labels(name).inc()
                self._wait_for = window.missed
            elif window.keys is None:
                log.info("snapshot chunk read again (table changed shape)", extra={"table": name})
            if window.keys is not None:
                self._rereads.insert(0, (name, window.keys))
        else:
            # The resume record lists the rows still to read again (until they are published).
            pending = self.states[name].rereads
            if window.keys is not None:  # a re-read (or truncated away): no cursor to move
                done = set(window.keys)
                pending = tuple(k for k in pending if k not in done)
                self.states[name] = self.states[name].with_rereads(pending)
                self._pending_state = self.states[name]
            else:
                self._advance(window, rows)
            if reread:
                self._rereads.append((name, reread))
                self.states[name] = self.states[name].with_rereads((*pending, *reread))
                self._pending_state = self.states[name]
        self._take(window, follow=outcome is not Outcome.REDO and not self._rereads)
        self._open_next()

    def _take(self, window: Window, follow: bool) -> None:
        """The window's high watermark is handled: go on with the window read after it, or
        cancel the rest of its chain (the next window then starts from the resume state)."""
        window.lines = []
        window.encoded = None
        window.copy_text = []
        if window.spool is not None:
            window.spool.close()
            window.spool = None
        for spool in window.encoded_spools:
            spool.close()
        window.encoded_spools = []
        window.images = []
        window.prev = None
        nxt = window.ahead
        window.taken.set()
        if nxt is None:
            return
        if follow and window.table.collection in self._queue:
            self.window = nxt
        else:
            window.chain.cancelled = True

    def _publish(
        self, window: Window, route: Any, codec: Any, lsn: int
    ) -> tuple[int, list[tuple[str, ...]]]:
        """Publishes the rows no change in the window touched (publish.py); returns their number
        and the keys of the rows to read again."""
        kept, dropped, keys = publish_rows(window, route, codec, lsn, self._sink.emit_reads)
        if keys:
            log.info(
                "snapshot rows read again (changed with an unchanged TOAST value)",
                extra={"table": window.table.collection, "rows": len(keys)},
            )
        progress = self._progress.get(window.table.collection)
        if progress is not None:  # none for rows read again after the table's snapshot ended
            progress.rows += kept
            progress.dropped += dropped
        self._metrics.snapshot_rows.labels(window.table.collection).inc(kept)
        self._metrics.snapshot_rows_dropped.labels(window.table.collection).inc(dropped)
        return kept, keys

    def _advance(self, window: Window, rows: int) -> None:
        name = window.table.collection
        done = not window.more
        state = self.states[name].advanced(window.cursor_after, rows, done)
        self.states[name] = state
        if done:
            self._queue.remove(name)
            self._metrics.snapshot_tables_queued.set(len(self._queue))
            progress = self._progress.pop(name)
            log.info(
                "snapshot done",
                extra={
                    "table": name,
                    "rows": state.rows,
                    "dropped_by_watermark": progress.dropped,
                    "seconds": round(time.monotonic() - progress.started, 1),
                },
            )
        self._pending_state = state

    def on_commit(self, commit_lsn: int) -> None:
        """A transaction committed. Not a watermark's: changes are streaming (chunks keep to
        the time budget). One that carried a high watermark: its state record waits until
        Kafka has acknowledged the transaction."""
        if self._watermark_in_tx:
            self._watermark_in_tx = False
        else:
            self._sizer.streamed()
        if self._published_in_tx is not None and self._pending_state is not None:
            self._unconfirmed.append((commit_lsn, self._pending_state))
            self._published_in_tx = None

    def on_confirmed(self, lsn: int) -> None:
        while self._unconfirmed and self._unconfirmed[0][0] <= lsn:
            _, state = self._unconfirmed.pop(0)
            self._sink.write_state(state)

    def stop(self) -> None:
        if self.window is not None:
            self.window.chain.cancelled = True
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
