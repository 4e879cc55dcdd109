"""A window's rows split into key ranges, one per snapshot worker; a table without a key's heap
split into block ranges. Pure.

The window is the next ``limit`` rows after the table's cursor; ``chunk_sql.range_marks``
numbers them in key order (in the window's snapshot) and returns the key of every
``step``-th row, and of row ``limit + 1`` when there is one. Those keys are the ranges'
upper bounds (row ``limit`` is one too): each range is ``after < key <= upto``, so the ranges
cover the window's rows exactly once, in key order. A window that reaches the table's end has
a last range with no upper bound (fewer than ``step`` rows). Both queries run in the same
snapshot (the window's, exported to the workers), so the bounds and the rows agree.

A table without a key is read whole, in one window; with workers, by ranges of heap blocks
(``ctid >= '(first,0)' AND ctid < '(end,0)'``, a TID range scan), the last one open-ended, so
the ranges hold every row exactly once whatever the table's size when they are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Key = tuple[str, ...]

# Below this many rows a range is not worth a worker's round trip: small windows (while
# changes stream, chunks are sized to a few ms of publishing) use fewer workers.
MIN_RANGE_ROWS = 1_000


@dataclass(frozen=True)
class KeyRange:
    after: Key | None  # exclusive; None: the table's start
    upto: Key | None  # inclusive; None: the table's end


def range_step(limit: int, workers: int, min_rows: int = MIN_RANGE_ROWS) -> int:
    """Rows per range: the window shared by the workers, at least ``min_rows`` each (and
    never more than the window)."""
    per_worker = -(-limit // max(workers, 1))
    return max(1, min(limit, max(per_worker, min_rows)))


def split_ranges(
    after: Key | None, marks: Sequence[tuple[int, Key]], limit: int
) -> tuple[list[KeyRange], bool]:
    """The ranges of a window from ``range_marks``' rows ``(n, key)``, in order; and whether
    rows follow the window (the table is not done). Without row ``limit + 1`` the last range
    is open-ended: it holds what is left of the table (maybe nothing), fewer than a step."""
    ranges: list[KeyRange] = []
    lower = after
    for n, key in marks:
        if n > limit:
            return ranges, True  # the next window starts after this one's last bound
        ranges.append(KeyRange(lower, key))
        lower = key
    ranges.append(KeyRange(lower, None))
    return ranges, False


# Below this many heap blocks (8 kB each) a block range is not worth a worker's round trip.
MIN_RANGE_BLOCKS = 128


@dataclass(frozen=True)
class BlockRange:
    first: int  # the first heap block, inclusive
    end: int | None  # exclusive; None: to the table's end


def block_ranges(blocks: int, workers: int, min_blocks: int = MIN_RANGE_BLOCKS) -> list[BlockRange]:
    """A heap of ``blocks`` blocks shared by the workers, ``min_blocks`` at least per range but
    the last, which has no end: it holds what the table has past the count too, so the ranges
    cover every possible row position and a row is read once however the count was taken."""
    step = max(min_blocks, -(-blocks // max(workers, 1)), 1)
    firsts = range(0, max(blocks, 1), step)
    return [BlockRange(first, first + step if first != firsts[-1] else None) for first in firsts]
