"""One frame from many: the union of a batch's per-table frames."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame


def union_all(frames: Sequence[DataFrame], *, allow_missing: bool = False) -> DataFrame:
    """The union by column name of `frames` (at least one), built as a balanced tree.

    Every union call analyses the whole plan it makes (Spark's DeduplicateRelations walks it),
    so folding N frames one by one costs O(N²) on the driver: a summary over 200 tiny cached
    tables took 10.0 s folded and 5.2 s balanced, mostly analysis. Halving the list at each
    level makes it O(N log N)."""
    if not frames:
        raise ValueError("union_all needs at least one frame")
    level = list(frames)
    while len(level) > 1:
        paired = [
            a.unionByName(b, allowMissingColumns=allow_missing)
            for a, b in zip(level[0::2], level[1::2], strict=False)
        ]
        level = paired + level[len(paired) * 2 :]
    return level[0]
