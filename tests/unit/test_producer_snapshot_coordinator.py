"""The snapshot coordinator's decisions with a fake reader, catalog and sink: rows to read
again are kept in the resume record until they are published (a restart reads them), and a
table that left the publication while rows were waiting to be read again is dropped with a
log line naming it, not a KeyError."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, ClassVar
from unittest.mock import MagicMock

import pytest

from producer.pgoutput import Column
from producer.snapshot import catalog
from producer.snapshot import coordinator as coordinator_module
from producer.snapshot import publish as publish_module
from producer.snapshot import windows as windows_module
from producer.snapshot.as_of import AsOf
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.coordinator import SnapshotCoordinator
from producer.snapshot.copy_text import spooled_batches, tuple_data
from producer.snapshot.watermarks import (
    WATERMARK_PREFIX,
    Mark,
    ReadSnapshot,
    Window,
    watermark_content,
)
from schemas.relation import build_relation_codec
from schemas.snapshot_state import DONE, TableState, follow
from schemas.type_catalog import TypeCatalog

NAME = "public.t"
TABLE = SnapshotTable(
    16384,
    "public",
    "t",
    "d",
    (Column(1, "id", 23, -1, True), Column(0, "pad", 25, -1, False)),
    ("id",),
)
CODEC = build_relation_codec(TABLE.relation(), TypeCatalog(), "db.public.t")


class FakeReader:
    windows: ClassVar[list[Window]] = []

    gate: ClassVar[Any] = None

    def __init__(self, dsn: str, sizer: Any, gate: Any, workers: Any = None) -> None:
        FakeReader.gate = gate

    def submit(self, window: Window) -> None:
        FakeReader.windows.append(window)

    def stop(self) -> None:
        pass


class FakeSink:
    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.last: list[bytes] = []  # the rows emitted as the table's last
        self.states: list[TableState] = []

    def snapshot_route(self, table: SnapshotTable, lsn: int) -> Any:
        return SimpleNamespace(shape=SimpleNamespace(codec=CODEC, keyed=True))

    def emit_reads(
        self, route: Any, rows: Sequence[tuple[bytes, bytes | None]], last: bool, lsn: int
    ) -> None:
        self.reads.extend(row for row, _key in rows)
        if last:
            self.last.append(rows[-1][0])

    def has_route(self, oid: int) -> bool:
        return True

    def emit_snapshot_truncate(self, route: Any, lsn: int) -> None:
        raise AssertionError("a keyed table")

    def write_state(self, state: TableState) -> None:
        self.states.append(state)


# Tables whose describe() finds them locked (ACCESS EXCLUSIVE), set by a test.
locked: set[str] = set()


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    tables = {NAME}
    locked.clear()

    def describe(
        conn: Any, publication: str, name: str, lock_wait_ms: int | None = None
    ) -> SnapshotTable:
        if name in locked:
            raise catalog.CatalogLocked(f"canceling statement due to lock timeout ({name})")
        if name not in tables:
            raise KeyError(name)
        return TABLE

    monkeypatch.setattr(coordinator_module.catalog, "describe", describe)
    monkeypatch.setattr(coordinator_module.catalog, "estimate_rows", lambda conn, oid: 3)
    monkeypatch.setattr(windows_module, "ChunkReader", FakeReader)
    FakeReader.windows = []
    return tables


from dataclasses import replace  # noqa: E402

from producer.snapshot.workers import CodecSpec  # noqa: E402
from schemas.type_mapping import TIMESTAMPTZ_MICROS  # noqa: E402


def _coordinator(
    sink: FakeSink,
    stream_delay: Callable[[], float | None] = lambda: None,
    auto_new_tables: bool = False,
    workers: int = 0,
) -> SnapshotCoordinator:
    return SnapshotCoordinator(
        workers=workers,
        dsn="",
        publication="p",
        sql=SimpleNamespace(run=lambda f: f(None)),
        sink=sink,
        chunk_rows=100,
        chunk_bytes=1 << 20,
        auto_new_tables=auto_new_tables,
        metrics=MagicMock(),
        stream_delay=stream_delay,
    )


def _key(line: bytes) -> bytes:
    key = CODEC.encode_row_key(tuple_data(line, 2))[2]
    assert key is not None
    return key


def _run_window(
    coord: SnapshotCoordinator,
    lines: list[bytes],
    lsn: int,
    toast: bytes = b"",
    snapshot: str | None = None,
    before: Sequence[int] = (),
    inside: Sequence[int] = (),
) -> Window:
    """The last submitted window reads ``lines`` (in ``snapshot``, pg_snapshot text, if
    given); ``toast``: a key changed in it with an unchanged TOAST value; then its high
    watermark commits at ``lsn``. ``before``/``inside``: xids the stream decodes before the
    low watermark (the last one is the watermark's own) and between the two."""
    window = FakeReader.windows[-1]
    window.lines = lines
    window.bytes_read = sum(map(len, lines))
    window.cursor_after = (lines[-1].split(b"\t")[0].decode(),) if window.keys is None else None
    if snapshot is not None:
        window.read_snapshot = ReadSnapshot.parse(snapshot)
    window.ready.set()
    for xid in before:
        coord.on_begin(xid)
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.LOW).encode(), lsn, True)
    if toast:
        window.saw(toast, unchanged_toast=True)
    for xid in inside:
        coord.on_begin(xid)
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.HIGH).encode(), lsn, True)
    coord.on_commit(lsn)
    coord.on_confirmed(lsn)
    return window


def test_rows_to_read_again_are_in_the_resume_record_until_published(published: set[str]) -> None:
    sink = FakeSink()
    coord = _coordinator(sink)
    coord.start({}, [NAME], [NAME])
    coord.tick()
    rows = [b"1\ta", b"2\tb", b"3\tc"]
    _run_window(coord, rows, 100, toast=_key(rows[1]))
    assert len(sink.reads) == 2  # row 2 changed in the window without its TOAST value
    recorded = sink.states[-1]
    assert (recorded.status, recorded.rereads) == (DONE, (("2",),))
    assert not recorded.complete
    # The consumer counts the table as snapshotting until the row is read again.
    assert follow(frozenset(), [(NAME.encode(), recorded.encode())]) == {NAME}
    assert TableState.decode(recorded.encode()) == recorded

    # A restart (kill -9 before the re-read) reads the row again from the record.
    FakeReader.windows = []
    sink2 = FakeSink()
    again = _coordinator(sink2)
    again.start({NAME: recorded}, [NAME], [])
    again.tick()
    assert FakeReader.windows[-1].keys == [("2",)]
    _run_window(again, [b"2\tB"], 200)
    assert len(sink2.reads) == 1
    assert sink2.states[-1].rereads == () and sink2.states[-1].complete
    assert not again.active


def test_the_initial_snapshot_reads_as_of_the_slots_consistent_point(published: set[str]) -> None:
    sink = FakeSink()
    coord = _coordinator(sink)
    coord.start({}, [NAME], [NAME])
    assert sink.states[-1].as_of is None  # recorded before the slot exists
    coord.bound_initial(AsOf(750, 760, (755,)))
    recorded = sink.states[-1]
    assert recorded.as_of == "750:760:755"
    assert TableState.decode(recorded.encode()) == recorded  # a restart keeps the boundary
    coord.tick()
    assert FakeReader.windows[-1].as_of == AsOf(750, 760, (755,))
    rows = [b"1\ta", b"2\tb", b"3\tc"]
    _run_window(coord, rows, 100)
    assert sink.states[-1].as_of == "750:760:755"

    # A snapshot that replaces a lost slot's rows starts with a truncate: never bounded.
    FakeReader.windows = []
    sink2 = FakeSink()
    replacing = _coordinator(sink2)
    replacing.start({}, [NAME], [NAME], replace_all=True)
    replacing.bound_initial(AsOf(750, 760))
    assert all(state.as_of is None for state in sink2.states)


def test_a_table_first_seen_in_the_stream_is_queued_before_its_first_event(
    published: set[str],
) -> None:
    sink = FakeSink()
    coord = _coordinator(sink, auto_new_tables=True)
    coord.start({}, [NAME], [])
    coord.on_first_change(NAME)  # published at start-up: nothing to do
    assert sink.states == []
    coord.on_first_change("public.added")
    assert [(s.table, s.status) for s in sink.states] == [("public.added", "pending")]
    assert coord.describe() == "snapshotting"
    coord.on_first_change("public.added")  # its route rebuilt after a Relation message
    assert len(sink.states) == 1
    manual = _coordinator(FakeSink(), auto_new_tables=False)  # --snapshot never: signals only
    manual.start({}, [NAME], [])
    manual.on_first_change("public.added")
    assert manual.describe() == ""


def test_a_locked_table_stays_queued_without_holding_the_stream(
    published: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL 16+'s pg_publication_tables waits for an ACCESS EXCLUSIVE lock: describe()
    gives up (CatalogLocked), the table stays queued and is opened once the lock is gone."""
    clock = [100.0]
    monkeypatch.setattr(coordinator_module.time, "monotonic", lambda: clock[0])
    coord = _coordinator(FakeSink())
    locked.add(NAME)
    coord.start({}, [NAME], [NAME])
    coord.tick()  # the look-up times out: no window, but the table is still queued
    assert coord.window is None and coord.active and coord.describe() == "snapshotting"
    locked.clear()
    coord.tick()  # too soon: a locked table is tried again only after a pause
    assert coord.window is None
    clock[0] += 1.5
    coord.tick()
    assert coord.window is not None and coord.describe() == f"snapshotting {NAME}"


def test_a_table_that_left_the_publication_drops_its_rereads_with_a_log_line(
    published: set[str], caplog: pytest.LogCaptureFixture
) -> None:
    sink = FakeSink()
    coord = _coordinator(sink)
    coord.start({}, [NAME], [NAME])
    coord.tick()
    rows = [b"1\ta", b"2\tb"]
    published.discard(NAME)  # the table leaves the publication while the chunk is read
    with caplog.at_level(logging.WARNING):
        _run_window(coord, rows, 100, toast=_key(rows[0]))  # no KeyError
    assert any(
        r.getMessage() == "table left the publication; its snapshot is dropped"
        and getattr(r, "table", None) == NAME
        for r in caplog.records
    )
    assert not coord.active and coord.window is None
    assert sink.states[-1].complete  # its record no longer says snapshotting


def test_transactions_other_than_watermarks_tell_the_sizer_changes_stream(
    published: set[str],
) -> None:
    sink = FakeSink()
    coord = _coordinator(sink)
    streamed: list[int] = []
    coord._sizer.streamed = lambda: streamed.append(1)  # type: ignore[method-assign]
    coord.start({}, [NAME], [NAME])
    coord.tick()
    window = FakeReader.windows[-1]
    low = watermark_content(window.id, Mark.LOW).encode()
    coord.on_message(WATERMARK_PREFIX, low, 10, True)
    coord.on_commit(10)  # the watermark's own transaction
    assert streamed == []
    coord.on_commit(20)  # somebody else's
    assert streamed == [1]
    coord.on_message(WATERMARK_PREFIX, b"not ours", 30, True)  # a previous run's watermark
    coord.on_commit(30)
    assert streamed == [1]


KEYLESS = SnapshotTable(16385, "public", "k", "d", (Column(0, "v", 23, -1, False),), ())


def _keyless_window(
    monkeypatch: pytest.MonkeyPatch, sink: FakeSink
) -> tuple[SnapshotCoordinator, Window]:
    """A coordinator whose queue holds the table without a key, and the window it submitted."""
    monkeypatch.setattr(coordinator_module.catalog, "describe", lambda c, p, n, w=None: KEYLESS)
    monkeypatch.setattr(coordinator_module.catalog, "estimate_rows", lambda conn, oid: 4)
    monkeypatch.setattr(windows_module, "ChunkReader", FakeReader)
    FakeReader.windows = []
    coord = _coordinator(sink)
    coord.start({}, ["public.k"], [])
    coord._enqueue("public.k")
    coord.tick()
    return coord, FakeReader.windows[-1]


def test_a_second_low_watermark_of_a_keyless_window_forgets_rows_its_truncate_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read retried after a lost connection commits its low watermark again; the truncate it
    brings (the table may hold rows) drops the rows streamed after the first one from readers,
    so they must not count against the rows read any more."""

    class Sink(FakeSink):
        truncates = 0

        def emit_snapshot_truncate(self, route: Any, lsn: int) -> None:
            self.truncates += 1

    sink = Sink()
    coord, window = _keyless_window(monkeypatch, sink)
    assert window.whole
    low = watermark_content(window.id, Mark.LOW).encode()
    coord.on_message(WATERMARK_PREFIX, low, 10, True)
    window.saw_image(5, None, b"\x02\x02")
    coord.on_message(WATERMARK_PREFIX, low, 20, True)  # the retry's
    assert sink.truncates == 2
    assert window.images == []


def test_the_last_row_is_marked_last_when_the_final_spooled_batch_is_all_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table without a key is published a spooled batch at a time; when every row of the
    final batch is dropped (an insert the read saw, at the heap's end), the row before them
    is still the snapshot's "last" (the contract's source.snapshot)."""
    codec = build_relation_codec(KEYLESS.relation(), TypeCatalog(), "db.public.k")
    # A batch per row (2-byte blocks), so the final batch holds only row 4.
    monkeypatch.setattr(publish_module, "spooled_batches", lambda spool: spooled_batches(spool, 2))

    class Sink(FakeSink):
        def snapshot_route(self, table: SnapshotTable, lsn: int) -> Any:
            return SimpleNamespace(shape=SimpleNamespace(codec=codec, keyed=False))

        def emit_snapshot_truncate(self, route: Any, lsn: int) -> None:
            pass

    sink = Sink()
    coord, window = _keyless_window(monkeypatch, sink)
    window.spool = io.BytesIO(b"1\n2\n3\n4\n")
    window.read_snapshot = ReadSnapshot(100, 100, frozenset())  # saw every xid below 100
    window.bytes_read = 8
    window.ready.set()
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.LOW).encode(), 10, True)
    row4 = codec.encode_row(tuple_data(b"4", 1))[0]
    window.saw_image(50, None, row4)  # inserted (and streamed) before the read: one 4 dropped
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.HIGH).encode(), 20, True)
    rows = [codec.encode_row(tuple_data(v, 1))[0] for v in (b"1", b"2", b"3")]
    assert sink.reads == rows
    assert sink.last == [rows[-1]]


def test_a_chunk_published_while_changes_stream_holds_the_next_until_the_stream_caught_up(
    published: set[str],
) -> None:
    sink = FakeSink()
    delay = [0.5]  # the stream's delay behind the server, as the pipeline would measure it
    coord = _coordinator(sink, stream_delay=lambda: delay[0])
    coord.start({}, [NAME], [NAME])
    coord.tick()
    window = FakeReader.windows[-1]
    gate = FakeReader.gate
    gate.take(streaming=True)  # as the reader does before the window's low watermark
    window.lines = [b"1\ta", b"2\tb"]
    window.bytes_read = 8
    window.more = True
    window.cursor_after = ("2",)
    window.ready.set()
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.LOW).encode(), 10, True)
    coord.on_commit(10)  # the low watermark's transaction
    coord.on_commit(15)  # somebody else's: changes stream
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.HIGH).encode(), 20, True)
    coord.on_commit(20)
    assert len(sink.reads) == 2
    assert gate.held, "the next window must wait for the stream"
    coord.tick()  # 500 ms behind: still held
    assert gate.held
    delay[0] = 0.004  # caught up
    coord.tick()
    assert not gate.held
    gate.take(streaming=True)
    gate.published(streaming=True)
    coord.tick(quiet=True)  # nothing left to read: caught up whatever the delay says
    assert not gate.held


def test_a_chunk_published_while_only_the_snapshot_streams_holds_nothing(
    published: set[str],
) -> None:
    sink = FakeSink()
    coord = _coordinator(sink)
    coord.start({}, [NAME], [NAME])
    coord.tick()
    FakeReader.gate.take(streaming=True)  # changes streamed when the window started
    _run_window(coord, [b"1\ta", b"2\tb"], 100)  # none came before its high watermark
    assert len(sink.reads) == 2
    assert not FakeReader.gate.held


def test_a_chunk_whose_read_missed_a_transaction_shown_before_its_window_is_read_again(
    published: set[str],
) -> None:
    """The stream showed transaction 700 before the low watermark, but the read (taken after
    the watermark's commit) still saw it running: PostgreSQL makes a commit visible a moment
    after its commit record. Publishing the rows read would undo its change downstream, so the
    chunk is read again from the same cursor once 700 is visible, and a read that saw it is
    published."""
    sink = FakeSink()
    coord = _coordinator(sink)
    coord.start({}, [NAME], [NAME])
    coord.tick()
    # 701 is the low watermark's own transaction; 702 streams inside the window.
    window = _run_window(
        coord, [b"1\ta", b"2\tb"], 20, snapshot="700:702:700", before=(700, 701), inside=(702,)
    )
    assert sink.reads == [] and all(state.rows == 0 for state in sink.states)
    assert window.missed == 700
    again = FakeReader.windows[-1]
    assert again is not window and again.cursor is None  # the same range, from the start
    assert again.wait_for == 700  # read once 700 is visible
    coord.tick()
    # The second read saw 700; one running transaction the stream never showed is no race.
    _run_window(coord, [b"1\ta", b"2\tB"], 40, snapshot="650:704:650", before=(703,))
    assert len(sink.reads) == 2 and again.missed is None
    assert sink.states[-1].status == DONE


class TruncatingSink(FakeSink):
    def __init__(self) -> None:
        super().__init__()
        self.truncates: list[int] = []

    def emit_snapshot_truncate(self, route: Any, lsn: int) -> None:
        self.truncates.append(lsn)


def test_a_snapshot_replacing_a_lost_slots_rows_starts_a_keyed_table_with_a_truncate(
    published: set[str],
) -> None:
    sink = TruncatingSink()
    coord = _coordinator(sink)
    done = TableState(NAME, DONE, cursor=("9",), rows=9, chunks=1)
    coord.start({NAME: done}, [NAME], [NAME], replace_all=True)
    queued = sink.states[-1]
    assert (queued.status, queued.cursor, queued.truncate) == ("pending", None, True)
    coord.tick()
    assert FakeReader.windows[-1].cursor is None  # read again from the start
    _run_window(coord, [b"1\ta", b"2\tb"], 100)
    assert sink.truncates == [100]  # at the first chunk's low watermark, before its rows
    assert len(sink.reads) == 2 and sink.states[-1].status == DONE

    # Resumed after its first chunk (a restart): no second truncate.
    FakeReader.windows = []
    resumed = TruncatingSink()
    again = _coordinator(resumed)
    again.start({NAME: replace(queued, status="running", cursor=("2",), chunks=1)}, [NAME], [])
    again.tick()
    _run_window(again, [b"3\tc"], 200)
    assert resumed.truncates == [] and len(resumed.reads) == 1


def test_rows_encoded_by_workers_are_published_as_read_and_another_codec_reads_again(
    published: set[str],
) -> None:
    """With workers, a window carries its rows encoded (by the route's codec when it opened):
    the dedup drops changed keys among them as among lines encoded here, and a window encoded
    with a codec other than the route's at its high watermark is read again, not published."""
    sink = FakeSink()
    coord = _coordinator(sink, workers=2)
    coord.start({}, [NAME], [NAME])
    coord.tick()
    window = FakeReader.windows[-1]
    assert window.spec == CodecSpec.of(CODEC, TIMESTAMPTZ_MICROS)
    rows = [b"1\ta", b"2\tb", b"3\tc"]
    encoded = [CODEC.encode_row_key(tuple_data(line, 2)) for line in rows]
    pairs: list[tuple[bytes, bytes | None]] = [(row, key) for row, _toast, key in encoded]
    window.encoded = list(pairs)
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.LOW).encode(), 50, True)
    window.saw(_key(rows[1]))
    window.saw(_key(rows[0]), unchanged_toast=True)  # read again, by key, from its COPY text
    window.copy_text = [b"1\ta\n2\tb\n", b"3\tc\n"]  # two ranges
    window.bytes_read = 30
    window.cursor_after = ("3",)
    window.ready.set()
    coord.on_message(WATERMARK_PREFIX, watermark_content(window.id, Mark.HIGH).encode(), 60, True)
    coord.on_commit(60)
    coord.on_confirmed(60)
    assert sink.reads == [encoded[2][0]]
    assert sink.last == [encoded[2][0]]
    assert (sink.states[-1].status, sink.states[-1].rereads) == (DONE, (("1",),))

    # Encoded with another codec (the table changed type since the window opened): read again.
    FakeReader.windows = []
    sink2 = FakeSink()
    again = _coordinator(sink2, workers=2)
    again.start({}, [NAME], [NAME])
    again.tick()
    stale = FakeReader.windows[-1]
    stale.spec = replace(stale.spec, timestamptz="zoned-string") if stale.spec else None
    stale.encoded = list(pairs)
    _run_window(again, rows, 100)
    assert sink2.reads == []
    assert len(FakeReader.windows) == 2 and FakeReader.windows[-1].cursor is None
    assert FakeReader.windows[-1].spec == CodecSpec.of(CODEC, TIMESTAMPTZ_MICROS)
