"""One snapshot chunk between two watermarks (the DBLog method). Pure; no I/O.

The reader commits a low watermark, reads a chunk of rows in key order, then commits a high
watermark; both are logical decoding messages, so they arrive in the replication stream in
commit order with everything else. The chunk's rows show the table at some moment between
the two. While the stream goes from the low to the high watermark, every change of the table
records its key here. At the high watermark, rows whose key changed in between are dropped
(their streamed change is newer than, or the same as, what the chunk read, and it has been
published already); the rest are published inside the high watermark's transaction, so they
take its commit position: later than every change the chunk reflects, earlier than every
change it does not. Nothing pauses: the stream keeps flowing while the chunk is read.

That holds only if the read sees every transaction the stream shows before the low
watermark. PostgreSQL makes a commit visible a little after writing its commit record, so
the pipeline checks the read's snapshot against the transactions the stream showed before
the window, and reads the chunk again, once the one it missed is visible, if it missed one
(``RecentTransactions``).

The reader reads ahead: once a chunk is read (before its high watermark is committed) it
links the next range's window (``ahead``), and reads it as soon as the window before the
chunk just read has been published; so while the pipeline's thread publishes chunk n, chunk
n + 1 is being read, and at most three windows' rows are held. A window opens (its low
watermark) only after the previous one's high watermark, so a change the stream sees while a
window is open is recorded in it and in every later window that is open (``saw``). A chain
the pipeline abandons (the table changed shape, rows to read again first, the table left the
publication) is cancelled as a whole: the reader stops at its next window, and the
watermarks it wrote for it are stale.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import BinaryIO, Final

from producer.snapshot.as_of import AsOf
from producer.snapshot.catalog import SnapshotTable
from producer.snapshot.copy_text import split_lines
from producer.snapshot.workers import CodecSpec

WATERMARK_PREFIX: Final = "walbridge.watermark"
SIGNAL_PREFIX: Final = "walbridge.signal"
INTERNAL_PREFIX: Final = "walbridge."  # never published to the message topic


class Mark(Enum):
    LOW = "low"
    HIGH = "high"


def watermark_content(window_id: str, mark: Mark) -> str:
    return json.dumps({"window": window_id, "mark": mark.value})


def parse_watermark(content: bytes) -> tuple[str, Mark] | None:
    """(window id, mark), or None for content this version did not write."""
    try:
        doc = json.loads(content)
        return str(doc["window"]), Mark(doc["mark"])
    except (ValueError, KeyError, TypeError):
        return None


class Outcome(Enum):
    PUBLISHED = "published"  # the rows went out; the cursor moves past the chunk
    TRUNCATED = "truncated"  # the table was truncated in between: nothing to publish, move on
    # The table's shape changed in between, or the read missed a transaction the stream
    # showed before the low watermark: read the same range again.
    REDO = "redo"


class ChunkSizer:
    """Rows per chunk: at most ``rows``, about ``max_bytes`` at the average row size the last
    chunk showed (TOASTed rows make smaller chunks), and, while changes stream, about
    ``budget_s`` of publishing at the rate the last chunks were published: the stream waits
    while the pipeline's thread publishes a chunk at its high watermark, so this bounds what a
    snapshot adds to streaming latency, whatever the machine's speed or load. Until a rate is
    measured, chunks start at ``FIRST_ROWS``.

    Changes stream from the first transaction other than the snapshot's own watermarks until
    two high watermarks pass without one between them. That is read in stream order, not by
    the clock: a pipeline busy publishing a chunk reads no commits for a while, which says
    nothing about the source. While quiet there is no latency to protect: chunks double with every
    quiet window, from the budget's size up to the rows and bytes bounds, so bigger chunks
    spread each chunk's fixed cost (two watermark commits, a stream round trip) over more rows.
    Doubling, not jumping to the bound: two windows read back to back can have no commit
    between them while changes stream, and a chunk of the full 20,000 rows published then held
    the stream for about 360 ms (the latency benchmark's p99); a wrong guess now costs one chunk
    of twice the budget. Shared with the reader thread (which sizes the windows it reads ahead):
    plain attribute writes, atomic in CPython."""

    FIRST_ROWS: Final = 1000

    def __init__(self, rows: int, max_bytes: int, budget_s: float) -> None:
        self.rows = rows
        self.max_bytes = max_bytes
        self.budget_s = budget_s
        self.rows_per_s: float | None = None
        self.streaming = True  # until a window passes without a change, assume changes flow
        self._quiet_windows = 0  # high watermarks in a row without a change before them
        self._changes = False  # a change since the last high watermark

    def published(self, rows: int, seconds: float) -> None:
        """A chunk of ``rows`` read rows took ``seconds`` to publish."""
        if rows < 100 or seconds <= 0:
            return  # too small to time
        rate = rows / seconds
        previous = self.rows_per_s
        self.rows_per_s = rate if previous is None else (previous + rate) / 2

    def streamed(self) -> None:
        """A transaction other than a watermark's went through the stream: the next window
        is sized to the budget at once. (Waiting for the next high watermark let windows
        sized while quiet, 20,000 rows, go out once changes streamed again: a stall of about
        300 ms at the start of every busy spell, and the sizing a finished snapshot left
        behind applied to the next one.)"""
        self._changes = True
        self.streaming = True
        self._quiet_windows = 0

    def high_watermark(self) -> None:
        """The stream reached a high watermark: were there changes since the previous one?"""
        self.streaming = self._changes
        self._quiet_windows = 0 if self._changes else self._quiet_windows + 1
        self._changes = False

    def limit(self, bytes_per_row: float | None) -> int:
        n = self.rows
        if bytes_per_row:
            n = min(n, int(self.max_bytes / bytes_per_row))
        rate = self.rows_per_s
        budget = self.FIRST_ROWS if rate is None else max(1, int(rate * self.budget_s))
        if not self.streaming:
            budget <<= min(self._quiet_windows, 30)
        return max(1, min(n, budget))


@dataclass(frozen=True)
class ReadSnapshot:
    """Which transactions a read saw: its ``pg_current_snapshot()`` (64-bit xids) told apart
    from a streamed transaction's 32-bit xid. A table without a key can't match read rows to
    changes by key, so each change streamed inside the window counts against the rows read
    only if the read saw it (an insert it saw is in the rows: one equal row is dropped) or
    did not (a delete it did not see left the row in them: one equal row is dropped)."""

    xmin: int
    xmax: int
    running: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> ReadSnapshot:
        """``xmin:xmax:xip,...`` (pg_snapshot's text form)."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def widen(self, xid: int) -> int:
        """A streamed transaction's 32-bit xid (as pgoutput sends it) as the 64-bit xid nearest
        to ``xmax`` (streamed transactions near a read are far less than 2**31 transactions
        away from it)."""
        full = (self.xmax & ~0xFFFFFFFF) | (xid & 0xFFFFFFFF)
        if full > self.xmax + 0x80000000:
            full -= 1 << 32
        elif full < self.xmax - 0x80000000:
            full += 1 << 32
        return full

    def saw(self, xid: int) -> bool:
        """Whether the read saw the committed transaction ``xid`` (32 bits)."""
        full = self.widen(xid)
        return full < self.xmin or (full < self.xmax and full not in self.running)


@dataclass(frozen=True)
class LowMark:
    """What the stream had decoded when it reached a window's low watermark: how many
    transactions, the newest xid, and the numbered xids (the dicts RecentTransactions held
    then, kept by reference: later entries carry larger numbers, and a window keeps what its
    check needs however many transactions pass before its high watermark)."""

    count: int
    newest: int | None
    current: dict[int, int]
    previous: dict[int, int]

    def number(self, xid: int) -> int | None:
        """The number of a transaction decoded by then, by its 32-bit xid (None: not known)."""
        found = self.current.get(xid)
        return self.previous.get(xid) if found is None else found

    def missed(self, read: ReadSnapshot) -> int | None:
        """A transaction decoded before the low watermark that the read did not see: its
        64-bit xid, or None."""
        newest = self.newest
        if newest is not None and not read.saw(newest):
            return read.widen(newest)
        for xid in sorted(read.running):
            number = self.number(xid & 0xFFFFFFFF)
            if number is not None and number <= self.count:
                return xid
        return None


class RecentTransactions:
    """The transactions the stream decoded lately, numbered in the order they came: at a
    window's low watermark the pipeline takes a ``LowMark``, and at its high watermark asks
    whether the window's read missed one of them (``LowMark.missed``).

    Why: the low watermark's place in the stream is its commit record's place in the WAL, but
    PostgreSQL makes a commit visible to other sessions only after writing that record (it
    flushes the WAL, marks the commit log, waits for synchronous standbys if any, then leaves
    the process array). A transaction whose commit record precedes the low watermark can
    therefore be invisible to the read that starts once the watermark's commit returned: a
    backend descheduled for a moment on a busy machine. (Commits waiting for a synchronous
    standby are released before the low watermark's own commit returns: see the reader.) The
    read then lacks a change the stream showed before the window opened, and publishing its
    row at the high watermark would undo that change downstream. The read's snapshot tells
    which transactions it did not see: those it lists as running, and every xid from its
    ``xmax`` on.

    Two generations of at most ``size`` xids each, so memory is bounded and a transaction
    costs a lookup and a dict store; a transaction is remembered for at least ``size`` more
    (the race lasts a few scheduler ticks). A resent transaction (after a reconnect) keeps its
    first number."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.count = 0  # transactions decoded so far (the last one's number)
        self.newest: int | None = None  # the newest 32-bit xid decoded so far
        self._size = size
        self._current: dict[int, int] = {}
        self._previous: dict[int, int] = {}

    def begin(self, xid: int) -> None:
        """The stream decoded a transaction's Begin (its 32-bit xid)."""
        self.count += 1
        current = self._current
        if xid in current or xid in self._previous:
            return  # resent: its first number stands
        current[xid] = self.count
        if len(current) >= self._size:
            self._previous, self._current = current, {}
        newest = self.newest
        # Newer in xid order modulo 2**32 (as PostgreSQL compares xids).
        if newest is None or 0 < ((xid - newest) & 0xFFFFFFFF) < 0x80000000:
            self.newest = xid

    def mark(self) -> LowMark:
        """At a window's low watermark."""
        return LowMark(self.count, self.newest, self._current, self._previous)


@dataclass(frozen=True)
class ImageChange:
    """A change of a table without a key streamed inside its window: the transaction and the
    whole row images (Avro row bodies; None where the change has none)."""

    xid: int
    before: bytes | None
    after: bytes | None


def rows_to_drop(changes: Iterable[ImageChange], read: ReadSnapshot) -> Counter[bytes]:
    """How many read rows equal to each image to drop, so that a reader ends with the table's
    rows (duplicates included) after the window's ``t`` event, its streamed changes (in
    stream order; a delete removes one equal row the reader holds, if any) and the rows
    published at the high watermark.

    At the high watermark the table holds the rows read, plus the inserts the read did not
    see, minus the deletes it did not see (an update is a delete of its old row and an
    insert of its new one). The reader holds what the streamed changes left (``left``: an
    insert adds a row, a delete removes one only if an earlier streamed insert brought it).
    So the rows to publish are the rows read minus ``left - unseen inserts + unseen
    deletes``: with only inserts, one read row dropped per insert the read saw, none for an
    insert it did not see (an equal row that existed before stays)."""
    left: Counter[bytes] = Counter()
    drop: Counter[bytes] = Counter()
    for change in changes:
        seen = read.saw(change.xid)
        if change.before is not None:
            if left[change.before] > 0:
                left[change.before] -= 1
            if not seen:
                drop[change.before] += 1
        if change.after is not None:
            left[change.after] += 1
            if not seen:
                drop[change.after] -= 1
    drop.update(left)
    return +drop  # the positive counts only


@dataclass(eq=False)
class Chain:
    """The windows the reader reads one after the other from one submitted window."""

    cancelled: bool = False


@dataclass(eq=False)
class Window:
    """A chunk in flight. The reader thread fills ``lines``/``more``/``cursor_after`` and sets
    ``ready`` before it commits the high watermark; the pipeline's thread does the rest."""

    table: SnapshotTable
    cursor: tuple[str, ...] | None  # the key after which this chunk starts (None: the start)
    limit: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lines: list[bytes] = field(default_factory=list)  # COPY text rows, in key order
    more: bool = False  # rows exist after this chunk
    cursor_after: tuple[str, ...] | None = None  # the last row's key text
    bytes_read: int = 0
    opened: bool = False  # the stream passed the low watermark
    low: LowMark | None = None  # what the stream had decoded when it did
    # A transaction committed before the low watermark that the read did not see (its xid):
    # the rows read may predate it, so they are read again once it is visible (``wait_for``
    # of the window that reads them again). See RecentTransactions.
    missed: int | None = None
    wait_for: int | None = None
    changed: set[bytes] = field(default_factory=set)  # keys changed since the low watermark
    # Of those, keys whose change kept an unchanged TOAST value PostgreSQL did not send: the
    # streamed change lacks it, so instead of dropping the row it is read again afterwards.
    toast: set[bytes] = field(default_factory=set)
    keys: list[tuple[str, ...]] | None = None  # read these rows again (not a range)
    as_of: AsOf | None = None  # only rows unchanged since the slot's consistent point
    # With snapshot workers: the codec they encode with (the table's route's when the window
    # opened), the (row body, key body) of each row, encoded by them, and the ranges' COPY
    # text, split into ``lines`` only when rows must be read again (``all_lines``).
    spec: CodecSpec | None = None
    encoded: list[tuple[bytes, bytes | None]] | None = None
    copy_text: list[bytes] = field(default_factory=list)
    # Which transactions the read saw. For a table without a key it also says which streamed
    # changes in ``images`` the read saw; its rows are spooled to ``spool`` (not held in
    # ``lines``).
    read_snapshot: ReadSnapshot | None = None
    spool: BinaryIO | None = None
    # Read by the snapshot workers instead, by block ranges: the rows' Avro bodies, one file
    # per range, in ``row_spool``'s batches.
    encoded_spools: list[BinaryIO] = field(default_factory=list)
    images: list[ImageChange] = field(default_factory=list)
    truncated: bool = False
    reshaped: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    chain: Chain = field(default_factory=Chain)
    prev: Window | None = None  # the window read before this one in its chain (until taken)
    ahead: Window | None = None  # the next range, linked by the reader before ``ready``
    taken: threading.Event = field(default_factory=threading.Event)  # its high watermark done

    def saw(self, key: bytes, unchanged_toast: bool = False) -> None:
        """A change of the table's row with this (Avro-encoded) key, after the low watermark
        (recorded in this window and in the open windows read after it)."""
        w: Window | None = self
        while w is not None and w.opened:
            w.changed.add(key)
            if unchanged_toast:
                w.toast.add(key)
            w = w.ahead

    @property
    def rows(self) -> int:
        """Rows read (held in ``lines``, or encoded by the workers)."""
        return len(self.encoded) if self.encoded is not None else len(self.lines)

    def all_lines(self) -> list[bytes]:
        """The rows' COPY text lines, in order (split from ``copy_text`` the first time)."""
        if not self.lines and self.copy_text:
            self.lines = [line for text in self.copy_text for line in split_lines(text)]
        return self.lines

    @property
    def whole(self) -> bool:
        """A table without a key, read whole (its changes are matched by whole row)."""
        return not self.table.chunk_key and self.keys is None

    def saw_image(self, xid: int, before: bytes | None, after: bytes | None) -> None:
        """A change of a table without a key, after the low watermark (its whole rows)."""
        if self.opened:
            self.images.append(ImageChange(xid, before, after))

    def chained(self) -> list[Window]:
        """This window and those linked after it."""
        out: list[Window] = []
        w: Window | None = self
        while w is not None:
            out.append(w)
            w = w.ahead
        return out

    def follow(self, sizer: ChunkSizer) -> Window | None:
        """The next range's window of a chunk just read (None: a re-read, a whole-table read,
        the table's last chunk or a cancelled chain)."""
        if self.keys is not None or not self.more or self.chain.cancelled:
            return None
        per_row = self.bytes_read / self.rows if self.rows else None
        return Window(
            table=self.table,
            cursor=self.cursor_after,
            limit=sizer.limit(per_row),
            as_of=self.as_of,
            spec=self.spec,
            chain=self.chain,
            prev=self,
        )

    def outcome(self) -> Outcome:
        if self.reshaped or self.missed is not None:
            return Outcome.REDO
        if self.truncated:
            return Outcome.TRUNCATED
        return Outcome.PUBLISHED

    def keep(self, key: bytes) -> bool:
        """Whether the chunk's row with this key is published at the high watermark."""
        return key not in self.changed
