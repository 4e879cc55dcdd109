"""A window split into key ranges for the snapshot workers (ranges.py, chunk_sql.range_marks):
the ranges hold the window's rows exactly once, in key order, whatever the sizes."""

from __future__ import annotations

import itertools

import pytest

from producer.snapshot.chunk_sql import block_copy, chunk_copy, range_marks
from producer.snapshot.ranges import KeyRange, block_ranges, range_step, split_ranges


def _marks(
    keys: list[int], after: int | None, limit: int, step: int
) -> list[tuple[int, tuple[str, ...]]]:
    """What range_marks' query returns for a table holding ``keys`` (sorted)."""
    rest = [k for k in keys if after is None or k > after][: limit + 1]
    return [(n, (str(k),)) for n, k in enumerate(rest, start=1) if n % step == 0 or n >= limit]


def _in(r: KeyRange, k: int) -> bool:
    return (r.after is None or k > int(r.after[0])) and (r.upto is None or k <= int(r.upto[0]))


@pytest.mark.parametrize("rows", [0, 1, 7, 100, 101, 1000])
@pytest.mark.parametrize("limit", [1, 10, 100])
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_ranges_cover_the_window_once_in_key_order(rows: int, limit: int, workers: int) -> None:
    keys = [k * 3 for k in range(rows)]  # gaps between keys, as real ones have
    after: int | None = None
    seen: list[int] = []
    for _ in range(rows // limit + 2):  # the table's windows, one after another
        step = range_step(limit, workers, min_rows=1)
        ranges, more = split_ranges(
            None if after is None else (str(after),), _marks(keys, after, limit, step), limit
        )
        assert len(ranges) <= workers + 1  # (the last: what is left of the table, maybe nothing)
        window = [k for r in ranges for k in keys if _in(r, k)]
        expected = [k for k in keys if after is None or k > after][:limit]
        assert window == expected  # exactly once each, in key order
        assert more == (len([k for k in keys if after is None or k > after]) > limit)
        seen.extend(window)
        if not more:
            break
        after = window[-1]
        assert ranges[-1].upto == (str(after),)  # the cursor moves to the last bound
    assert seen == keys


def test_small_windows_use_fewer_workers() -> None:
    assert range_step(20_000, 2) == 10_000
    assert range_step(20_000, 8) == 2_500
    assert range_step(3_000, 8, min_rows=2_000) == 2_000  # two ranges, not eight tiny ones
    assert range_step(500, 8, min_rows=2_000) == 500  # one range: the whole window
    assert range_step(7, 0, min_rows=1) == 7


def test_range_sql_quotes_everything_and_bounds_both_ends() -> None:
    q = chunk_copy("s", "t", ["id", "v"], ["id"], ["1"], None, upto=["9'; --"]).as_string(None)
    assert q == (
        'COPY (SELECT "id", "v" FROM "s"."t" WHERE ("id") > (\'1\') AND ("id") <= (\'9\'\'; --\')'
        ' ORDER BY "id") TO STDOUT'
    )
    q = range_marks("s", 'we"ird', ["a", "b"], ["a", "b"], None, 100, 50).as_string(None)
    assert 'row_number() OVER (ORDER BY "a", "b")' in q
    assert 'FROM "s"."we""ird" ORDER BY "a", "b" LIMIT 101' in q
    assert "walbridge_n % 50 = 0 OR walbridge_n >= 100" in q
    with pytest.raises(ValueError, match="does not match key"):
        chunk_copy("s", "t", ["a", "b"], ["a", "b"], None, None, upto=["1"])


@pytest.mark.parametrize("blocks", [0, 1, 127, 128, 129, 255, 256, 257, 1000, 10_007])
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_block_ranges_cover_every_row_position_once(blocks: int, workers: int) -> None:
    ranges = block_ranges(blocks, workers, min_blocks=128)
    assert 1 <= len(ranges) <= workers
    assert ranges[0].first == 0 and ranges[-1].end is None  # open-ended: rows past the count too
    for before, after in itertools.pairwise(ranges):
        assert before.end == after.first  # no gap, no overlap
    for r in ranges[:-1]:
        assert r.end is not None and r.end - r.first >= 128  # not worth a worker below that
    # Each block (the counted ones and any added after the count) falls in exactly one range.
    for block in range(blocks + 300):
        assert sum(r.first <= block and (r.end is None or block < r.end) for r in ranges) == 1


def test_block_ranges_share_a_big_heap_evenly() -> None:
    ranges = block_ranges(1_000_000, 4)
    assert [r.first for r in ranges] == [0, 250_000, 500_000, 750_000]


def test_block_range_sql_is_a_tid_range_and_quotes_the_names() -> None:
    q = block_copy("s", 'we"ird', ["a", "b c"], 0, 128).as_string(None)
    assert q == (
        'COPY (SELECT "a", "b c" FROM "s"."we""ird" WHERE ctid >= \'(0,0)\'::tid'
        " AND ctid < '(128,0)'::tid) TO STDOUT"
    )
    q = block_copy("s", "t", ["a"], 128, None).as_string(None)
    assert q.endswith("WHERE ctid >= '(128,0)'::tid) TO STDOUT")
    for first, end in ((-1, None), (5, 5), (5, 2)):
        with pytest.raises(ValueError, match="bad block range"):
            block_copy("s", "t", ["a"], first, end)
