"""The pure parts of snapshots: COPY text to pgoutput values, chunk SQL, watermark windows and
the resume records."""

from __future__ import annotations

import io
from collections import Counter

import psycopg
import pytest

from producer.pgoutput import Column, Value
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.chunk_sql import chunk_copy, keys_copy, whole_copy
from producer.snapshot.copy_text import (
    CopyFormatError,
    fields,
    split_lines,
    spooled_batches,
    tuple_data,
    unescape,
)
from producer.snapshot.watermarks import (
    ChunkSizer,
    ImageChange,
    Mark,
    Outcome,
    ReadSnapshot,
    RecentTransactions,
    Window,
    parse_watermark,
    rows_to_drop,
    watermark_content,
)
from schemas.snapshot_state import DONE, RUNNING, TableState, follow, requested


def test_copy_escapes_are_undone_exactly() -> None:
    assert unescape(b"a\\\\b") == b"a\\b"
    assert unescape(b"tab\\there\\nnl\\rcr\\b\\f\\v") == b"tab\there\nnl\rcr\x08\x0c\x0b"
    assert unescape(b"plain") == b"plain"
    # A backslash before anything else stands for that character (COPY's rule).
    assert unescape(b"\\x") == b"x"


def test_fields_and_tuple_data_match_pgoutput_text_values() -> None:
    assert fields(b"1\t\\N\tx\\ty", 3) == [b"1", None, b"x\ty"]
    assert tuple_data(b"1\t\\N\tx\\ty", 3) == (Value(b"1", False), None, Value(b"x\ty", False))
    # The two-character text "\N" inside a value is escaped by COPY, so it is not NULL.
    assert tuple_data(b"\\\\N", 1) == (Value(b"\\N", False),)
    with pytest.raises(CopyFormatError, match="2 fields, expected 3"):
        tuple_data(b"1\t2", 3)


def test_split_lines_needs_whole_rows() -> None:
    assert split_lines(b"") == []
    assert split_lines(b"a\tb\nc\td\n") == [b"a\tb", b"c\td"]
    with pytest.raises(CopyFormatError):
        split_lines(b"a\tb")


def _render(composed: psycopg.sql.Composed) -> str:
    # as_string needs a connection only for literals' encoding; a dummy one is not needed for
    # identifiers and plain literals under psycopg's default adapters.
    return composed.as_string(None)


def test_chunk_sql_quotes_everything_and_walks_the_key() -> None:
    q = _render(chunk_copy('we"ird', "t", ["id", "v x"], ["id", "v x"], None, 101))
    assert q == (
        'COPY (SELECT "id", "v x" FROM "we""ird"."t" ORDER BY "id", "v x" LIMIT 101) TO STDOUT'
    )
    q = _render(chunk_copy("s", "t", ["id", "v"], ["id"], ["42'; DROP TABLE x; --"], 10))
    assert "WHERE (\"id\") > ('42''; DROP TABLE x; --')" in q
    with pytest.raises(ValueError, match="needs key columns"):
        chunk_copy("s", "t", ["a"], [], None, 10)
    with pytest.raises(ValueError, match="does not match key"):
        chunk_copy("s", "t", ["a", "b"], ["a", "b"], ["1"], 10)
    assert _render(whole_copy("s", "t", ["a"])) == 'COPY (SELECT "a" FROM "s"."t") TO STDOUT'
    q = _render(keys_copy("s", "t", ["a", "b"], ["a", "b"], [["1", "x"], ["2", "y"]]))
    assert "WHERE (\"a\", \"b\") IN (('1', 'x'), ('2', 'y'))" in q


def _table(key: tuple[str, ...] = ("id",)) -> SnapshotTable:
    cols = (Column(1, "id", 23, -1, True), Column(0, "v", 25, -1, False))
    return SnapshotTable(16384, "public", "t", "d", cols, key)


def test_watermarks_round_trip_and_foreign_content_is_ignored() -> None:
    w = Window(table=_table(), cursor=None, limit=10)
    assert parse_watermark(watermark_content(w.id, Mark.HIGH).encode()) == (w.id, Mark.HIGH)
    assert parse_watermark(b"not json") is None
    assert parse_watermark(b'{"window": "x", "mark": "sideways"}') is None


def test_window_drops_only_rows_changed_after_the_low_watermark() -> None:
    w = Window(table=_table(), cursor=None, limit=10)
    w.saw(b"k1")  # before the low watermark: the chunk's row is newer; keep it
    assert w.keep(b"k1")
    w.opened = True
    w.saw(b"k2")
    w.saw(b"k3", unchanged_toast=True)
    assert not w.keep(b"k2") and not w.keep(b"k3") and w.keep(b"k1")
    assert w.toast == {b"k3"}
    assert w.outcome() is Outcome.PUBLISHED
    w.truncated = True
    assert w.outcome() is Outcome.TRUNCATED
    w.reshaped = True
    assert w.outcome() is Outcome.REDO


def test_a_window_read_ahead_follows_its_chunk_and_sees_changes_once_open() -> None:
    w = Window(table=_table(), cursor=None, limit=2)
    w.lines, w.bytes_read, w.more, w.cursor_after = [b"1\ta", b"2\tb"], 8, True, ("2",)
    sizer = ChunkSizer(rows=100, max_bytes=40, budget_s=1.0)
    nxt = w.follow(sizer)
    assert nxt is not None
    assert (nxt.cursor, nxt.limit, nxt.prev, nxt.chain) == (("2",), 10, w, w.chain)
    w.ahead = nxt
    w.opened = True
    w.saw(b"k1")  # the next window is not open yet: only the first records it
    nxt.opened = True
    w.saw(b"k2", unchanged_toast=True)  # both are open: both record it
    assert w.changed == {b"k1", b"k2"} and nxt.changed == {b"k2"} and nxt.toast == {b"k2"}
    assert w.chained() == [w, nxt]
    # No next window after the last chunk, for a re-read, or once the chain is cancelled.
    w.more = False
    assert w.follow(sizer) is None
    w.more = True
    w.chain.cancelled = True
    assert w.follow(sizer) is None
    reread = Window(table=_table(), cursor=None, limit=1, keys=[("1",)])
    reread.more = True
    assert reread.follow(sizer) is None


def test_chunks_are_rows_bytes_and_a_time_budget_at_the_measured_rate() -> None:
    sizer = ChunkSizer(rows=20_000, max_bytes=64 << 20, budget_s=0.05)
    assert sizer.limit(None) == ChunkSizer.FIRST_ROWS  # no rate measured yet
    sizer.published(50, 1.0)  # too small to time
    assert sizer.rows_per_s is None
    sizer.published(1000, 0.01)  # 100k rows/s: 5,000 rows in 50 ms
    assert sizer.limit(None) == 5000
    sizer.published(1000, 0.1)  # 10k rows/s now: the rate follows (halfway)
    assert sizer.limit(None) == int(55_000 * 0.05)
    sizer.published(10_000_000, 1.0)
    assert sizer.limit(None) == 20_000  # never more than the rows setting
    assert sizer.limit(1 << 20) == 64  # about max_bytes (64 MiB) at that row size (1 MiB)
    assert ChunkSizer(10, 10, 1.0).limit(100.0) == 1


def test_chunks_grow_past_the_time_budget_while_only_the_snapshot_streams() -> None:
    sizer = ChunkSizer(rows=20_000, max_bytes=64 << 20, budget_s=0.05)
    sizer.published(1000, 0.1)  # 10k rows/s: 500 rows in 50 ms
    assert sizer.limit(None) == 500  # changes may be streaming (nothing seen yet)
    sizer.streamed()
    sizer.high_watermark()
    assert sizer.limit(None) == 500  # a change between the last two high watermarks
    sizer.high_watermark()  # none since: quiet, chunks double with every quiet window
    assert sizer.limit(None) == 1000
    sizer.high_watermark()
    assert sizer.limit(None) == 2000
    for _ in range(10):
        sizer.high_watermark()
    assert sizer.limit(None) == 20_000  # up to the rows bound
    assert sizer.limit(1 << 20) == 64  # and the bytes bound
    sizer.streamed()  # a change: back to the budget at once
    assert sizer.limit(None) == 500
    sizer.high_watermark()  # and for the next window
    assert sizer.limit(None) == 500
    sizer.high_watermark()  # quiet again: doubling from the budget
    assert sizer.limit(None) == 1000


def test_state_records_round_trip_and_advance() -> None:
    s = requested("public.t", 1234)
    assert TableState.decode(s.encode()) == s
    s2 = s.advanced(("42",), 100, done=False)
    assert (s2.status, s2.cursor, s2.rows, s2.chunks) == (RUNNING, ("42",), 100, 1)
    s3 = s2.advanced(None, 5, done=True)
    assert (s3.status, s3.cursor, s3.rows) == (DONE, ("42",), 105)
    assert TableState.decode(s3.encode()) == s3
    with pytest.raises(ValueError, match="unknown format"):
        TableState.decode(b'{"v": 99, "table": "x", "status": "done"}')


def test_the_consumer_follows_unfinished_snapshots_from_the_records() -> None:
    a, b = requested("public.a", 1), requested("public.b", 2)
    records = [(b"public.a", a.encode()), (b"public.b", b.encode())]
    assert follow(frozenset({"public.old"}), records) == {"public.old", "public.a", "public.b"}
    done = a.advanced(("9",), 10, done=True)
    later = [(b"public.a", done.encode()), (b"public.old", None)]  # done; a tombstone
    assert follow(frozenset({"public.old", "public.a", "public.b"}), later) == {"public.b"}


def test_spooled_rows_come_back_in_bounded_batches() -> None:
    rows = [b"%d\tx" % i for i in range(1000)] + [b"long\t" + b"y" * 100]
    spool = io.BytesIO(b"".join(r + b"\n" for r in rows))
    batches = list(spooled_batches(spool, block_size=64))
    assert [r for b in batches for r in b] == rows
    # A batch is what one 64-byte block ended (and the row the block before began), except
    # the long row's (several blocks).
    assert len(batches) > 90  # 6.9 kB of rows
    assert max(len(b"\n".join(b)) for b in batches[:-1]) < 2 * 64
    assert batches[-1] == [rows[-1]]
    assert list(spooled_batches(io.BytesIO(b""))) == []
    with pytest.raises(CopyFormatError, match="newline"):
        list(spooled_batches(io.BytesIO(b"1\tx\n2\ty"), block_size=4))


def test_read_snapshot_tells_seen_transactions_across_xid_epochs() -> None:
    read = ReadSnapshot.parse("100:110:103,105")
    assert read.saw(99) and read.saw(104) and read.saw(109)
    assert not read.saw(103) and not read.saw(105) and not read.saw(110) and not read.saw(200)
    # 64-bit xids in the snapshot, 32-bit ones in the stream (epoch 1 here).
    epoch = 1 << 32
    read = ReadSnapshot.parse(f"{epoch + 5}:{epoch + 8}:{epoch + 6}")
    assert read.saw(4) and read.saw(7) and not read.saw(6) and not read.saw(8)
    assert read.saw(0xFFFFFFF0)  # the previous epoch's, just before the wrap
    assert ReadSnapshot.parse("3:3:").running == frozenset()


def test_recent_transactions_find_a_read_that_missed_one_decoded_before_the_window() -> None:
    recent = RecentTransactions(size=4)
    for xid in (10, 12, 11):
        recent.begin(xid)
    low = recent.mark()  # the low watermark's transaction was 11
    assert low.newest == 12
    recent.begin(13)  # inside the window
    # The read ran after the low watermark's commit, yet 10 was still running for it: the
    # stream showed 10 before the window, so the rows read may predate it.
    assert low.missed(ReadSnapshot.parse("10:14:10,13")) == 10
    # 13 came after the low watermark: the window's own key tracking covers it.
    assert low.missed(ReadSnapshot.parse("13:14:13")) is None
    # Long-running transactions the stream has not shown are no race.
    assert low.missed(ReadSnapshot.parse("5:14:5,7")) is None
    # The newest transaction, not visible yet, is past the read's xmax, not in its list.
    assert low.missed(ReadSnapshot.parse("12:12:")) == 12
    # 64-bit xids in the snapshot, 32-bit ones in the stream.
    epoch = 3 << 32
    assert low.missed(ReadSnapshot.parse(f"{epoch + 10}:{epoch + 14}:{epoch + 10}")) == (epoch + 10)
    assert low.missed(ReadSnapshot.parse(f"{epoch + 12}:{epoch + 12}:")) == epoch + 12


def test_a_low_mark_keeps_what_it_needs_however_many_transactions_follow() -> None:
    recent = RecentTransactions(size=4)
    recent.begin(10)
    low = recent.mark()
    for xid in range(20, 40):  # the ring turns over several times before the high watermark
        recent.begin(xid)
    assert recent.mark().number(10) is None
    assert low.missed(ReadSnapshot.parse("10:40:10")) == 10
    assert low.missed(ReadSnapshot.parse("10:40:25")) is None  # 25 came after the mark


def test_recent_transactions_hold_two_generations_at_most() -> None:
    recent = RecentTransactions(size=4)
    for xid in range(100, 112):
        recent.begin(xid)
    assert recent.count == 12
    # At least ``size`` of the latest are remembered, at most 2 * size.
    assert all(recent.mark().number(x) == x - 99 for x in range(108, 112))
    assert recent.mark().number(100) is None
    assert sum(recent.mark().number(x) is not None for x in range(100, 112)) <= 8
    # A transaction resent after a reconnect keeps its first number: a window that opened
    # after it still counts it as before its low watermark.
    recent.begin(110)
    assert recent.mark().number(110) == 11 and recent.count == 13
    wrapping = RecentTransactions()
    wrapping.begin(0xFFFFFFFF)
    wrapping.begin(2)  # after the wrap: newer
    wrapping.begin(0xFFFFFFF0)  # older
    assert wrapping.newest == 2


def test_rows_of_a_table_without_a_key_are_dropped_once_per_matching_change() -> None:
    read = ReadSnapshot.parse("100:110:105")  # saw 104, not 105 nor 110
    seen, unseen = 104, 110
    dup, other = b"dup", b"other"
    # Two equal rows in the table, one equal insert inside the window: if the read saw it, the
    # read has three and the streamed insert is one of them: drop exactly one.
    assert rows_to_drop([ImageChange(seen, None, dup)], read) == Counter({dup: 1})
    # If the read did not see it, the read has the two that were there: drop none.
    assert rows_to_drop([ImageChange(unseen, None, dup)], read) == Counter()
    assert rows_to_drop([ImageChange(105, None, dup)], read) == Counter()  # running then
    # Two seen inserts of the same row: two dropped.
    assert rows_to_drop([ImageChange(seen, None, dup)] * 2, read) == Counter({dup: 2})
    # A delete the read did not see: the read still has the row; the reader's delete found
    # nothing to delete (it dropped everything at the window's truncate): drop one.
    assert rows_to_drop([ImageChange(unseen, dup, None)], read) == Counter({dup: 1})
    assert rows_to_drop([ImageChange(seen, dup, None)], read) == Counter()
    # Inserted (seen) then deleted (unseen) in the window: the reader's delete took the
    # streamed row; the read holds it: drop one, not two (an equal row from before stays).
    assert rows_to_drop([ImageChange(seen, None, dup), ImageChange(unseen, dup, None)], read) == (
        Counter({dup: 1})
    )
    # An update the read did not see: its old row is in the read, its new one streamed.
    assert rows_to_drop([ImageChange(unseen, dup, other)], read) == Counter({dup: 1})
    # One it saw: the new row is in the read and streamed; the old one is gone from both.
    assert rows_to_drop([ImageChange(seen, dup, other)], read) == Counter({other: 1})


def test_a_window_of_a_table_without_a_key_records_whole_rows_once_open() -> None:
    keyless = SnapshotTable(1, "public", "k", "d", (Column(0, "v", 23, -1, False),), ())
    w = Window(table=keyless, cursor=None, limit=2**62)
    assert w.whole
    w.saw_image(7, None, b"early")  # before the low watermark: not this window's
    w.opened = True
    w.saw_image(8, None, b"row")
    assert w.images == [ImageChange(8, None, b"row")]
    assert not Window(table=_table(), cursor=None, limit=10).whole
