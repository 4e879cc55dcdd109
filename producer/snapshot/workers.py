"""Snapshot workers: separate processes that read a window's key ranges and Avro-encode them.

Why processes: reading COPY text and encoding it into Avro is CPU work in Python, and one
process (the GIL) does it one row at a time beside the stream. Each worker holds one SQL
connection of its own (opened at its first range, kept across windows), imports the window's
snapshot (``SET TRANSACTION SNAPSHOT`` in a ``REPEATABLE READ`` transaction: the snapshot the
reader session exported after its low watermark), copies its range, and encodes the rows with
a codec it builds from the table's route (``CodecSpec``: the same function on the same
columns, types and topic gives the same bytes).

Why the rows go back to the producer instead of to Kafka from here: the contract puts a
window's ``r`` events inside the high watermark's transaction, after the rows the stream
changed in the window are dropped, in key order, with the table's last row marked ``last``,
in the same exactly-once Kafka transaction as the stream's events around it, and the resume
record written only once that transaction is acknowledged. Only the producer's one
transactional producer can do that; a worker producing its own transaction would publish rows
before the high watermark decided which to drop, and outside the stream's order. So a worker
returns its range's encoded rows, and the producer only frames and produces them.

A table without a key is read whole, in one window: the workers then read ranges of its heap
blocks instead of key ranges, and spool the encoded rows to files (``row_spool``) instead of
returning them, since the window is the whole table: memory stays bounded on both sides.

A worker that fails (or dies) fails the window: the reader reports a ``SnapshotError`` naming
the table and the chunk's cursor, which stops the producer; nothing is skipped, and a restart
resumes from the last recorded chunk.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from producer.snapshot.as_of import AsOf
from producer.snapshot.chunk_sql import block_copy, chunk_copy
from producer.snapshot.copy_text import fields, line_batches, split_lines, tuple_data
from producer.snapshot.ranges import BlockRange, Key, KeyRange
from producer.snapshot.row_spool import SpoolDir, write_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpecColumn:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True)
class CodecSpec:
    """What a worker needs to build the table's codec as the producer did (its route's)."""

    relation_id: int
    namespace: str
    name: str
    columns: tuple[SpecColumn, ...]
    topic: str
    timestamptz: str

    @classmethod
    def of(cls, codec: Any, timestamptz: str) -> CodecSpec:
        schema, _, name = codec.table.partition(".")
        cols = tuple(
            SpecColumn(c.name, c.type_oid, c.type_modifier, c.is_key) for c in codec.columns
        )
        return cls(codec.relation_id, schema, name, cols, codec.topic, timestamptz)


@dataclass(frozen=True)
class RangeTask:
    conninfo: str
    snapshot_id: str  # pg_export_snapshot() of the window's read transaction
    schema: str
    table: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    range: KeyRange
    as_of: AsOf | None
    spec: CodecSpec


@dataclass(frozen=True)
class BlockTask:
    conninfo: str
    snapshot_id: str
    schema: str
    table: str
    columns: tuple[str, ...]
    blocks: BlockRange
    spec: CodecSpec
    path: str  # the file the range's encoded rows go to (``row_spool``)


@dataclass(frozen=True)
class SpooledRange:
    path: str
    rows: int
    bytes_read: int  # of COPY text


@dataclass(frozen=True)
class RangeResult:
    data: bytes  # the range's COPY text (the rows, for keys and rows to read again)
    encoded: list[tuple[bytes, bytes | None]]  # (row body, key body), one per line, in order
    last_key: Key | None  # the range's last row's key text


class RangeFailed(Exception):
    """A worker's failure, as text (a psycopg error does not cross processes intact);
    ``connection``: the connection failed (the reader retries the window)."""

    def __init__(self, message: str, connection: bool) -> None:
        super().__init__(message, connection)
        self.message = message
        self.connection = connection

    def __str__(self) -> str:
        return self.message


# --- inside a worker process -----------------------------------------------------------------

_conn: psycopg.Connection[Any] | None = None
_codecs: dict[CodecSpec, tuple[Any, Any]] = {}


def _init_worker(parent: int) -> None:
    """A worker outlives no producer: killed with -9, the producer can't stop its pool, so
    each worker exits once its parent is gone (its connection closes with it)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="walbridge-parent-watch", daemon=True).start()


def _connection(conninfo: str) -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(conninfo, autocommit=True)
    return _conn


def _codec(conn: psycopg.Connection[Any], spec: CodecSpec) -> tuple[Any, Any]:
    """The table's codec and its compiled COPY text twin (None where it gives up)."""
    cached = _codecs.get(spec)
    if cached is None:
        # Imported here: the parent never needs them for this, a worker does once.
        from producer.pgoutput import Column, Relation
        from schemas.catalog import ensure_types
        from schemas.relation import build_relation_codec
        from schemas.row_encoder import copy_encoder
        from schemas.type_catalog import TypeCatalog

        catalog = TypeCatalog()
        ensure_types(catalog, conn, [c.type_oid for c in spec.columns])
        relation = Relation(
            xid=None,
            relation_id=spec.relation_id,
            namespace=spec.namespace,
            name=spec.name,
            replica_identity="d",
            columns=tuple(
                Column(1 if c.is_key else 0, c.name, c.type_oid, c.type_modifier, c.is_key)
                for c in spec.columns
            ),
        )
        codec = build_relation_codec(relation, catalog, spec.topic, timestamptz=spec.timestamptz)
        encode = codec.encode_row if codec.encode_key is None else codec.encode_row_key
        cached = codec, copy_encoder(encode, fields)
        _codecs[spec] = cached
    return cached


@contextlib.contextmanager
def _failures(conninfo: str) -> Iterator[None]:
    """psycopg's errors as ``RangeFailed`` (a psycopg error does not cross processes intact);
    a failed connection is closed, for the next task to open a new one."""
    try:
        yield
    except psycopg.OperationalError as exc:
        if _conn is not None:
            _conn.close()
        raise RangeFailed(f"{type(exc).__name__}: {exc}", connection=True) from None
    except psycopg.Error as exc:
        raise RangeFailed(f"{type(exc).__name__}: {exc}", connection=False) from None


def _in_snapshot(cur: psycopg.Cursor[Any], snapshot_id: str) -> None:
    """The transaction reads in the window's snapshot (exported by the reader)."""
    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    cur.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_id)))


def read_range(task: RangeTask) -> RangeResult:
    """One range in the window's snapshot, copied and encoded (the producer's path: the
    compiled COPY text twin, the careful one where it gives up)."""
    with _failures(task.conninfo):
        conn = _connection(task.conninfo)
        codec, fast = _codec(conn, task.spec)
        query = chunk_copy(
            task.schema, task.table, task.columns, task.key, task.range.after, None,
            task.as_of, task.range.upto,
        )  # fmt: skip
        blocks: list[bytes] = []
        with conn.transaction(), conn.cursor() as cur:
            _in_snapshot(cur, task.snapshot_id)
            with cur.copy(query) as copy:
                for block in copy:
                    blocks.append(bytes(block))
    data = b"".join(blocks)
    lines = split_lines(data)
    encoded = _encode_all(lines, codec, fast, len(task.columns))
    last = _key_text(task, lines[-1]) if lines else None
    return RangeResult(data, encoded, last)


def read_blocks(task: BlockTask) -> SpooledRange:
    """A table without a key's block range in the window's snapshot, copied and encoded a
    batch at a time into its spool file."""
    rows = size = 0

    def counted(copy: Any) -> Iterator[bytes]:
        nonlocal size
        for block in copy:
            size += len(block)
            yield bytes(block)

    with _failures(task.conninfo), open(task.path, "wb") as out:
        conn = _connection(task.conninfo)
        codec, fast = _codec(conn, task.spec)
        ncols = len(task.columns)
        r = task.blocks
        query = block_copy(task.schema, task.table, task.columns, r.first, r.end)
        with conn.transaction(), conn.cursor() as cur:
            _in_snapshot(cur, task.snapshot_id)
            with cur.copy(query) as copy:
                for lines in line_batches(counted(copy)):
                    write_rows(out, [p[0] for p in _encode_all(lines, codec, fast, ncols)])
                    rows += len(lines)
    return SpooledRange(task.path, rows, size)


def _encode_all(
    lines: list[bytes], codec: Any, fast: Any, ncols: int
) -> list[tuple[bytes, bytes | None]]:
    """COPY lines -> (row body, key body) each: the compiled twin, the careful path where it
    gives up (which raises the precise error for a value it can't encode)."""
    encoded: list[tuple[bytes, bytes | None]] = []
    append = encoded.append
    careful = codec.encode_row_key
    for line in lines:
        pair = fast(line) if fast is not None else None
        if pair is None:
            row, _toast, key = careful(tuple_data(line, ncols), 0)
            pair = row, key
        append(pair)
    return encoded


def _key_text(task: RangeTask, line: bytes) -> Key:
    by_name = dict(zip(task.columns, fields(line, len(task.columns)), strict=True))
    out = []
    for k in task.key:
        v = by_name[k]
        if v is None:
            raise ValueError(f"{task.schema}.{task.table}: NULL in key column {k!r}")
        out.append(v.decode())
    return tuple(out)


# --- in the producer -------------------------------------------------------------------------


class WorkerPool:
    """``workers`` processes (started with ``spawn``: the producer has threads, and a forked
    copy of a threaded process may hold their locks), started at the first window. At most
    ``workers`` ranges are in flight, one per process, so each holds one range's rows."""

    def __init__(self, workers: int, ranges_read: Any = None) -> None:
        self.workers = workers
        self._ranges_read = ranges_read  # a Prometheus counter by (table, kind), or None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._spools: SpoolDir | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            log.info("snapshot workers starting", extra={"workers": self.workers})
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
        return self._pool

    def read(self, tasks: Sequence[RangeTask]) -> list[RangeResult]:
        """The ranges' rows, in order; raises ``RangeFailed`` (the first failure), or
        ``BrokenProcessPool`` when a worker died."""
        results: list[RangeResult] = self._run(read_range, tasks)
        self._count(tasks, "key")
        return results

    def spool_path(self, name: str) -> str:
        """Where a block range's encoded rows are to go (this producer's spool directory)."""
        if self._spools is None:
            self._spools = SpoolDir()
        return self._spools.file(name)

    def spool(self, tasks: Sequence[BlockTask]) -> list[SpooledRange]:
        """The block ranges' rows, encoded into their files; as ``read`` on failure, with the
        files of every task removed."""
        try:
            results: list[SpooledRange] = self._run(read_blocks, tasks)
        except BaseException:
            for t in tasks:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(t.path)
            raise
        self._count(tasks, "block")
        return results

    def _count(self, tasks: Sequence[RangeTask | BlockTask], kind: str) -> None:
        if self._ranges_read is not None and tasks:
            self._ranges_read.labels(f"{tasks[0].schema}.{tasks[0].table}", kind).inc(len(tasks))

    def _run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        futures = [self._executor().submit(fn, t) for t in tasks]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            concurrent.futures.wait(futures)
            raise

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._spools is not None:
            self._spools.close()
            self._spools = None


__all__ = [
    "BlockTask",
    "BrokenProcessPool",
    "CodecSpec",
    "RangeFailed",
    "RangeTask",
    "SpooledRange",
    "WorkerPool",
]
