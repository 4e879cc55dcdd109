"""The initial snapshot's boundary: only rows as they were at the slot's consistent point.

A new slot's initial snapshot is read in chunks while streaming goes on (the watermark
method), so a chunk reads rows as they are now. A row written after the slot's consistent point
is also in the stream, which publishes its change (``c`` or ``u``); reading it again as an
``r`` would send it twice, and a changelog reader (a Flink SQL count) would count it twice.

When the producer creates the slot it asks for an exported snapshot (``SNAPSHOT 'export'``):
exactly the transactions that committed before the consistent point are visible in it, and
every later one is in the stream. ``pg_current_snapshot()`` inside that snapshot gives its
``xmin:xmax:xip`` (``AsOf``), kept with each table's snapshot record so a restart applies the
same boundary. A chunk then reads only the rows whose current version was written by a
transaction visible in it (``predicate``): those are unchanged since the consistent point, so
their ``r`` is their state then; every other row reached readers through the stream.

Why in SQL and on ``xmin``, not by remembering the keys the stream published: that set grows
with every key written during a long snapshot, while the row's ``xmin`` already says which side
of the boundary its version is on. ``xmin`` is a 32-bit transaction id, so it is compared with
the snapshot modulo 2**32 as PostgreSQL itself does: the snapshot's ids lie within 2**31 of each
other and of every unfrozen row's. Frozen rows (``xmin`` 2, and 1 for bootstrap rows) are older
than any snapshot.

Two exceptions, both in the safe direction (a row sent twice, never one lost):
- A row with a value stored out of line (TOASTed) is read whatever its ``xmin`` says: when a
  later update leaves that value unchanged, pgoutput does not send it, so the streamed event
  lacks it and only the ``r`` holds it. ``pg_column_toast_chunk_id`` (PostgreSQL 17+) tells
  such rows apart; on 15 and 16, which lack it, the producer does not bound the snapshot at all.
- A row written by a subtransaction of a transaction in progress at the consistent point has
  the subtransaction's id as ``xmin``, which ``pg_current_snapshot()`` does not list
  (PostgreSQL's own ``pg_visible_in_snapshot`` has the same limit): it is read too.

Tables without a key are not filtered: their snapshot starts with a ``t`` that drops what
readers hold, streamed rows included, so every row must be read. Nor are snapshots that replace
a lost slot's rows (they start with a ``t`` too), re-reads of given keys, or incremental
snapshots (signalled, or of tables added later): those read the table as it is now, between
watermarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

_XID_SPACE = 1 << 32
_HALF = 1 << 31
_FIRST_NORMAL_XID = 3  # 0 invalid, 1 bootstrap, 2 frozen
MIN_SERVER_VERSION = 170000  # pg_column_toast_chunk_id


@dataclass(frozen=True)
class AsOf:
    """A ``pg_snapshot``: transactions below ``xmin`` are done, from ``xmax`` on not yet
    started, and ``xip`` were in progress; 64-bit ids (``xid8``)."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AsOf:
        """``pg_current_snapshot()::text``: ``xmin:xmax:xip1,xip2,...``."""
        try:
            low, high, ids = text.split(":")
            snapshot = cls(int(low), int(high), tuple(int(x) for x in ids.split(",") if x))
        except ValueError as exc:
            raise ValueError(f"not a pg_snapshot: {text!r}") from exc
        if not snapshot.xmin <= snapshot.xmax or snapshot.xmax - snapshot.xmin >= _HALF:
            raise ValueError(f"not a pg_snapshot: {text!r}")
        if any(not snapshot.xmin <= x < snapshot.xmax for x in snapshot.xip):
            raise ValueError(f"not a pg_snapshot: {text!r} (an in-progress id out of range)")
        return snapshot

    def text(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.xip))}"

    def visible(self, xid32: int) -> bool:
        """Whether a row version with this ``xmin`` was written by a transaction the snapshot
        sees (the reference ``predicate`` is tested against)."""
        if xid32 < _FIRST_NORMAL_XID:
            return True
        distance = (xid32 - self.xmin) % _XID_SPACE
        if distance >= _HALF:  # before xmin
            return True
        return distance < self.xmax - self.xmin and xid32 not in self._xip32

    @property
    def _xip32(self) -> frozenset[int]:
        return frozenset(x % _XID_SPACE for x in self.xip)

    def predicate(self, columns: Sequence[str] = ()) -> sql.Composable:
        """SQL true for rows whose current version the snapshot sees (``visible`` on
        ``xmin``), or with one of ``columns`` stored out of line (read whatever their
        ``xmin``: see the module's docstring)."""
        xid = sql.SQL("xmin::text::int8")
        distance = sql.SQL("(({} - {} + {}) % {})").format(
            xid,
            sql.Literal(self.xmin % _XID_SPACE),
            sql.Literal(_XID_SPACE),
            sql.Literal(_XID_SPACE),
        )
        in_range = sql.SQL("{} < {}").format(distance, sql.Literal(self.xmax - self.xmin))
        if self.xip:
            in_range = sql.SQL("({} AND {} NOT IN ({}))").format(
                in_range,
                xid,
                sql.SQL(", ").join(sql.Literal(x) for x in sorted(self._xip32)),
            )
        toasted = [
            sql.SQL(" OR pg_column_toast_chunk_id({}) IS NOT NULL").format(sql.Identifier(c))
            for c in columns
        ]
        return sql.SQL("({} < {} OR {} >= {} OR {}{})").format(
            xid, sql.Literal(_FIRST_NORMAL_XID), distance, sql.Literal(_HALF), in_range,
            sql.Composed(toasted),
        )  # fmt: skip
