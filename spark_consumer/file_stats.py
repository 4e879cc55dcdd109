"""Which columns of a new lake table keep Delta file statistics. Pure.

A MERGE prunes the files it joins against by their min/max statistics: a keyed table by the
batch's range of its first key column, a table without a key by the batch's commit_lsn range
(merge.py). Delta collects statistics for the first 32 leaf columns of a table unless told
otherwise (``delta.dataSkippingNumIndexedCols``), so in a wide table whose pruning column comes
later every MERGE joined against the whole table, a cost that grows with the table. Such a
table lists its statistics columns instead (``delta.dataSkippingStatsColumns``): the pruning
column first, then the table's first other columns, as many as Delta's default would keep.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import DataType, StructType

STATS_COLUMNS_PROPERTY: Final = "delta.dataSkippingStatsColumns"
# delta.dataSkippingNumIndexedCols' default: statistics for this many leaf columns, in order.
INDEXED_BY_DEFAULT: Final = 32


def leaves(data_type: DataType) -> int:
    """How many leaf columns Delta counts for a column of this type: a struct's fields, nested
    ones too; any other type (an array or a map too) is one."""
    if isinstance(data_type, StructType):
        return sum(leaves(f.dataType) for f in data_type.fields)
    return 1


def stats_columns(schema: StructType, prune: str) -> str | None:
    """The ``delta.dataSkippingStatsColumns`` value for a new table of ``schema`` whose MERGEs
    prune by column ``prune``; None when Delta's default already covers it."""
    before = 0
    for f in schema.fields:
        if f.name == prune:
            if before < INDEXED_BY_DEFAULT:
                return None
            break
        before += leaves(f.dataType)
    else:
        raise ValueError(f"pruning column {prune!r} is not in the table's schema")
    others = [f.name for f in schema.fields if f.name != prune][: INDEXED_BY_DEFAULT - 1]
    # Lake column names are Avro names ([A-Za-z_][A-Za-z0-9_]*): nothing to quote in the list.
    return ",".join((prune, *others))
