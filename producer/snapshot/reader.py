"""The snapshot reader: a thread with its own SQL connection that reads one chunk at a time
between two watermarks. It decides nothing: the pipeline's thread hands it a Window and
reads the outcome from the stream."""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from producer.errors import SnapshotError
from producer.replication.dsn import WALSENDER_OUTPUT_OPTIONS, redact_dsn, sql_conninfo
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.chunk_sql import (
    RELATION_BLOCKS,
    chunk_copy,
    keys_copy,
    range_marks,
    whole_copy,
)
from producer.snapshot.copy_text import fields, split_lines
from producer.snapshot.pacing import CatchUpGate
from producer.snapshot.ranges import KeyRange, block_ranges, range_step, split_ranges
from producer.snapshot.row_spool import open_spooled
from producer.snapshot.watermarks import (
    WATERMARK_PREFIX,
    ChunkSizer,
    Mark,
    ReadSnapshot,
    Window,
    watermark_content,
)
from producer.snapshot.workers import (
    BlockTask,
    BrokenProcessPool,
    CodecSpec,
    RangeFailed,
    RangeTask,
    WorkerPool,
)

log = logging.getLogger(__name__)

_EMIT = "SELECT pg_logical_emit_message(true, %s, %s)"
# The low watermark's commit waits like the most careful writer's would: commits that precede
# it in the WAL but wait for a synchronous standby are not visible yet, and a read started
# once the watermark returned would miss them (watermarks.RecentTransactions). Standbys
# release waiting commits in WAL order, and an applied position implies a flushed and a
# written one, so when ``remote_apply`` returns, every earlier commit is released too, whatever
# its own mode. Without synchronous standbys it is ``local``. The setting holds for the
# statement's own transaction only.
_EMIT_LOW = (
    "SELECT set_config('synchronous_commit', 'remote_apply', true),"
    " pg_logical_emit_message(true, %s, %s)"
)
# A walsender decodes only WAL flushed to disk. Under synchronous_commit=off a watermark's commit
# reached the stream only at the WAL writer's next flush (up to wal_writer_delay, 200 ms by
# default, per watermark: a quarter of a 1M-row snapshot's time on a cluster set so). ``local``
# flushes the reader's own commits; only the low watermark also waits for standbys (_EMIT_LOW).
_SESSION_OPTIONS = "-c synchronous_commit=local"
_RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0)
_READ_SNAPSHOT = "SELECT pg_current_snapshot()::text"
_EXPORT_SNAPSHOT = "SELECT pg_export_snapshot()"
# 'in progress' until the transaction leaves the process array, that is until it is visible
# (PostgreSQL 15.2, 14.7, 13.10 and later; earlier minor releases could answer 'committed'
# while a commit waited for a synchronous standby: the chunk is then read again until then).
_XACT_STATUS = "SELECT pg_xact_status(%s::text::xid8)"
_VISIBLE_FIRST_WAIT_S = 0.005
_VISIBLE_MAX_WAIT_S = 1.0
_VISIBLE_WARN_AFTER_S = 10.0


class _Abandoned(Exception):
    """The window was cancelled, or the reader stops, while its read waited."""


def reader_conninfo(dsn: str) -> str:
    """A SQL session whose text output matches the walsender's (copy_text says why) and whose
    watermarks reach the stream at once."""
    info = sql_conninfo(dsn, application_name="walbridge_snapshot", connect_timeout=10)
    params = psycopg.conninfo.conninfo_to_dict(info)
    params["client_encoding"] = "UTF8"
    options = f"{params.get('options', '')} {WALSENDER_OUTPUT_OPTIONS} {_SESSION_OPTIONS}"
    params["options"] = options.strip()
    return psycopg.conninfo.make_conninfo("", **params)


class ChunkReader:
    """``submit(window)``: emit the low watermark, read the chunk, mark it ready, emit the high
    watermark; then the chain's next windows (``Window.follow``), each once the window two
    before it is taken (see watermarks: reading ahead). A lost connection is retried with
    backoff (a half-done window's watermarks, if any reached the WAL, are then ignored as
    stale)."""

    def __init__(
        self, dsn: str, sizer: ChunkSizer, gate: CatchUpGate, workers: WorkerPool | None = None
    ) -> None:
        self._conninfo = reader_conninfo(dsn)
        self._workers = workers  # None: this thread reads and the pipeline's thread encodes
        self._redacted = redact_dsn(dsn)
        self._sizer = sizer
        self._gate = gate
        self._stopping = False
        self._requests: queue.Queue[Window | None] = queue.Queue(maxsize=1)
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._loop, name="walbridge-snapshot", daemon=True)
        self._thread.start()

    def submit(self, window: Window) -> None:
        self._requests.put(window)

    def stop(self) -> None:
        self._stopping = True
        self._requests.put(None)
        self._thread.join(timeout=10)
        if self._workers is not None:
            self._workers.stop()
        if self._conn is not None:
            self._conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
        return self._conn

    def _loop(self) -> None:
        while True:
            window: Window | None = self._requests.get()
            while window is not None and not self._stopping:
                if window.chain.cancelled or not self._wait_for_stream(window):
                    break
                try:
                    self._read_with_retries(window)
                except _Abandoned:
                    break  # (ready is set below: nothing waits for a cancelled window)
                except Exception as exc:  # reported to the pipeline's thread, which raises it
                    window.error = SnapshotError(
                        window.table.collection, window.cursor, f"{type(exc).__name__}: {exc}"
                    )
                    window.error.__cause__ = exc
                    window.ahead = None
                finally:
                    window.ready.set()
                window = self._turn(window)
            if self._stopping:
                return

    def _wait_for_stream(self, window: Window) -> bool:
        """Before a window's low watermark: wait until the stream caught up with the last chunk
        (pacing.py); False when the chain was cancelled or the reader stops meanwhile."""
        while not self._gate.wait(0.1):
            if window.chain.cancelled or self._stopping:
                return False
        self._gate.take(self._sizer.streaming)
        return True

    def _turn(self, window: Window) -> Window | None:
        """The chain's next window once its turn comes: the window read before ``window`` is
        taken (so at most the one published, the one waiting and the next are held)."""
        nxt = window.ahead
        before = window.prev
        while nxt is not None and before is not None and not before.taken.wait(0.1):
            if nxt.chain.cancelled or self._stopping:
                return None
        return nxt

    def _read_with_retries(self, window: Window) -> None:
        for attempt, delay in enumerate((*_RETRY_S, None), start=1):
            try:
                if window.ready.is_set():
                    # Failed after the rows were read: only the high watermark is missing (or
                    # was committed and its answer lost; a second one is then ignored).
                    self._emit(window, Mark.HIGH)
                else:
                    self._read(window)
                return
            except psycopg.OperationalError as exc:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if delay is None:
                    raise
                log.warning(
                    "snapshot read failed; retrying",
                    extra={
                        "table": window.table.collection,
                        "attempt": attempt,
                        "error": str(exc),
                        "dsn": self._redacted,
                    },
                )
                time.sleep(delay)
                window.lines.clear()
                window.encoded = None
                window.copy_text = []

    def _emit(self, window: Window, mark: Mark) -> None:
        statement = _EMIT_LOW if mark is Mark.LOW else _EMIT
        content = watermark_content(window.id, mark)
        self._connection().execute(statement, (WATERMARK_PREFIX, content))

    def _read(self, window: Window) -> None:
        conn = self._connection()
        self._wait_visible(conn, window)
        self._emit(window, Mark.LOW)
        if window.whole and self._workers is not None and window.spec is not None:
            self._read_blocks(conn, window, self._workers)
        elif window.whole:
            self._read_whole(conn, window)
        elif self._workers is not None and window.spec is not None and window.keys is None:
            self._read_ranges(conn, window, self._workers)
        else:
            self._read_chunk(conn, window)
        # Linked before the high watermark: the pipeline moves on to it when it gets there.
        window.ahead = window.follow(self._sizer)
        # Ready before the high watermark is committed: the stream can't reach it earlier.
        window.ready.set()
        self._emit(window, Mark.HIGH)

    @contextmanager
    def _read_transaction(
        self, conn: psycopg.Connection[Any], window: Window
    ) -> Iterator[psycopg.Cursor[Any]]:
        """A REPEATABLE READ transaction for the window's read; its snapshot goes to the
        window, where the pipeline checks it against what the stream showed before the low
        watermark (``RecentTransactions``)."""
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction(), conn.cursor() as cur:
            # The first statement takes the transaction's snapshot; the read runs in it.
            row = cur.execute(_READ_SNAPSHOT).fetchone()
            assert row is not None
            window.read_snapshot = ReadSnapshot.parse(row[0])
            yield cur

    def _wait_visible(self, conn: psycopg.Connection[Any], window: Window) -> None:
        """Before the low watermark of a window that reads rows again because an earlier read
        missed a transaction: wait until that transaction is visible (with backoff; a warning
        names it when that lasts, as a commit waiting for an absent synchronous standby
        would), so the new read sees it."""
        xid = window.wait_for
        if xid is None:
            return
        delay, started, warned = _VISIBLE_FIRST_WAIT_S, time.monotonic(), False
        while True:
            row = conn.execute(_XACT_STATUS, (xid,)).fetchone()
            if row is None or row[0] != "in progress":
                return
            if window.chain.cancelled or self._stopping:
                raise _Abandoned
            waited = time.monotonic() - started
            if waited >= _VISIBLE_WARN_AFTER_S and not warned:
                warned = True
                log.warning(
                    "snapshot waits for a committed transaction to become visible (is its commit "
                    "waiting for a synchronous standby?)",
                    extra={"table": window.table.collection, "xid": xid,
                           "waited_s": round(waited, 1)},
                )  # fmt: skip
            time.sleep(delay)
            delay = min(delay * 2, _VISIBLE_MAX_WAIT_S)

    def _read_chunk(self, conn: psycopg.Connection[Any], window: Window) -> None:
        table = window.table
        if window.keys is not None:
            query = keys_copy(
                table.schema, table.name, table.column_names, table.chunk_key, window.keys
            )
        else:
            query = chunk_copy(
                table.schema,
                table.name,
                table.column_names,
                table.chunk_key,
                window.cursor,
                window.limit + 1,  # one more: is there anything after this chunk?
                window.as_of,
            )
        blocks: list[bytes] = []
        with self._read_transaction(conn, window) as cur, cur.copy(query) as copy:
            for block in copy:
                blocks.append(bytes(block))
        data = b"".join(blocks)
        lines = split_lines(data)
        window.more = window.keys is None and len(lines) > window.limit
        if window.more:
            lines.pop()
        window.lines = lines
        window.bytes_read = len(data)
        if lines and window.keys is None:
            window.cursor_after = key_text(table, lines[-1])

    def _read_ranges(
        self, conn: psycopg.Connection[Any], window: Window, workers: WorkerPool
    ) -> None:
        """The window's rows read and encoded by the workers (workers.py), one key range each,
        all in this read transaction's snapshot, which they import: the window is one read
        as before (one snapshot for the high watermark's check), in several processes. The
        transaction stays open until every range is read (an exported snapshot can be
        imported only while its transaction lives)."""
        table = window.table
        spec = window.spec
        assert spec is not None
        step = range_step(window.limit, workers.workers)
        with self._read_transaction(conn, window) as cur:
            row = cur.execute(_EXPORT_SNAPSHOT).fetchone()
            assert row is not None
            snapshot_id: str = row[0]
            query = range_marks(
                table.schema, table.name, table.column_names, table.chunk_key, window.cursor,
                window.limit, step, window.as_of,
            )  # fmt: skip
            marks = [(int(r[0]), tuple(r[1:])) for r in cur.execute(query).fetchall()]
            ranges, more = split_ranges(window.cursor, marks, window.limit)
            tasks = [self._task(snapshot_id, window, spec, r) for r in ranges]
            with _worker_failures():
                results = workers.read(tasks)
        encoded: list[tuple[bytes, bytes | None]] = []
        window.bytes_read = 0
        for result in results:
            encoded.extend(result.encoded)
            window.bytes_read += len(result.data)
            if result.last_key is not None:
                window.cursor_after = result.last_key
        window.lines = []
        window.copy_text = [r.data for r in results]
        window.encoded = encoded
        window.more = more

    def _task(self, snapshot_id: str, window: Window, spec: CodecSpec, r: KeyRange) -> RangeTask:
        t = window.table
        return RangeTask(
            self._conninfo, snapshot_id, t.schema, t.name, t.column_names, t.chunk_key, r,
            window.as_of, spec,
        )  # fmt: skip

    def _read_blocks(
        self, conn: psycopg.Connection[Any], window: Window, workers: WorkerPool
    ) -> None:
        """A table without a key read whole by the workers, a range of its heap blocks each,
        in this read transaction's snapshot (so the window is one read, as ``_read_whole``'s
        is); they spool the encoded rows, which the pipeline publishes from there."""
        table = window.table
        spec = window.spec
        assert spec is not None
        with self._read_transaction(conn, window) as cur:
            row = cur.execute(_EXPORT_SNAPSHOT).fetchone()
            assert row is not None
            snapshot_id: str = row[0]
            row = cur.execute(RELATION_BLOCKS, (table.oid,)).fetchone()
            assert row is not None
            ranges = block_ranges(int(row[0]), workers.workers)
            paths = [workers.spool_path(f"{window.id}-{i}") for i in range(len(ranges))]
            tasks = [
                BlockTask(self._conninfo, snapshot_id, table.schema, table.name,
                          table.column_names, r, spec, path)
                for r, path in zip(ranges, paths, strict=True)
            ]  # fmt: skip
            with _worker_failures():
                results = workers.spool(tasks)
        window.encoded_spools = [open_spooled(r.path) for r in results]
        window.bytes_read = sum(r.bytes_read for r in results)

    def _read_whole(self, conn: psycopg.Connection[Any], window: Window) -> None:
        """A table without a key, in one COPY: its rows go to a temporary file as they come
        (the pipeline publishes them from there in bounded batches), and the read's snapshot
        is kept, which tells the streamed changes it saw from those it did not."""
        table = window.table
        spool = tempfile.TemporaryFile(prefix="walbridge-snapshot-")  # noqa: SIM115 (the window owns it)
        try:
            query = whole_copy(table.schema, table.name, table.column_names)
            with self._read_transaction(conn, window) as cur, cur.copy(query) as copy:
                for block in copy:
                    spool.write(block)
            window.bytes_read = spool.tell()
            spool.flush()
        except BaseException:
            spool.close()
            raise
        window.spool = spool


@contextmanager
def _worker_failures() -> Iterator[None]:
    """A worker's failure as the reader's own would be: a failed connection is retried like
    the reader's (``_read_with_retries``), anything else fails the window."""
    try:
        yield
    except RangeFailed as exc:
        if exc.connection:
            raise psycopg.OperationalError(f"snapshot worker: {exc}") from None
        raise
    except BrokenProcessPool as exc:
        raise RuntimeError("a snapshot worker process died (killed, or out of memory?)") from exc


def key_text(table: SnapshotTable, line: bytes) -> tuple[str, ...]:
    """The chunk key's values of one COPY row, as text (the cursor, or a row to read again)."""
    names = table.column_names
    values = fields(line, len(names))
    by_name = dict(zip(names, values, strict=True))
    out = []
    for k in table.chunk_key:
        v = by_name[k]
        if v is None:  # a key column is NOT NULL; a NULL here means the catalog lied
            raise ValueError(f"{table.collection}: NULL in key column {k!r}")
        out.append(v.decode())
    return tuple(out)
