"""A window split into key ranges for the snapshot workers (ranges.py, chunk_sql.range_marks):
the ranges hold the window's rows exactly once, in key order, whatever the sizes."""

from __future__ import annotations

import pytest

from producer.snapshot.chunk_sql import chunk_copy, range_marks
from producer.snapshot.ranges import KeyRange, range_step, split_ranges


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
