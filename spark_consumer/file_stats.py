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


def stats_columns(schema: StructType, prune: str, *more: str) -> str | None:
    """The ``delta.dataSkippingStatsColumns`` value for a new table of ``schema`` whose MERGEs
    prune by column ``prune`` (and ``more``); None when Delta's default already covers them."""
    wanted = (prune, *more)
    names = [f.name for f in schema.fields]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise ValueError(f"pruning column(s) {missing} not in the table's schema")
    before = 0
    indexed = set()
    for f in schema.fields:
        before += leaves(f.dataType)
        if before > INDEXED_BY_DEFAULT:
            break
        indexed.add(f.name)
    if all(c in indexed for c in wanted):
        return None
    others = [n for n in names if n not in wanted][: INDEXED_BY_DEFAULT - len(wanted)]
    # Lake column names are Avro names ([A-Za-z_][A-Za-z0-9_]*): nothing to quote in the list.
    return ",".join((*wanted, *others))
