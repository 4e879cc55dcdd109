"""What one table's apply is given: its share of a batch's changes and what the batch knows
of the table (from the batch's summary, the last progress row and the job's own last commit).

Plain data, apart from merge.py so that the modules that build a MERGE's parts
(`merge_target.py`, `merge_sql.py`) and merge_runner.py, which fills one in per table, can all
name it without importing merge.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.sql import DataFrame

from spark_consumer.column_cache import ColumnCache
from spark_consumer.lake_state import LakeTable


@dataclass(frozen=True)
class TableChanges:
    schema: str
    table: str
    path: str
    key: tuple[str, ...]
    columns: tuple[str, ...]  # source columns present in this batch, in order
    changes: DataFrame  # meta columns + source columns, already limited to applicable txs
    # From the batch's summary (so no extra Spark job asks for them):
    truncate: tuple[int, int] | None = None  # latest truncate among the changes
    toast_columns: frozenset[str] = frozenset()  # columns some change left unchanged (TOAST)
    key_min: int | str | None = None  # bounds of the first key column: lets MERGE prune files
    key_max: int | str | None = None
    only_distinct_inserts: bool = False  # every change a 'c', none twice (TableWork says so)
    duplicates: bool = True  # some change arrived twice (TableWork says when none did)
    unique_key: bool = False  # the key is a primary key or unique index at the source
    # The table's Delta version in the last progress row: None when no batch recorded it.
    recorded_version: int | None = None
    # The producer's snapshot of the table is not done: an update keeping an unchanged TOAST
    # value may name a row the snapshot has not delivered yet (its `r` event follows, later
    # in commit order, and replaces the row whole).
    snapshotting: bool = False
    # Lake column -> PostgreSQL column name where they differ: kept as the column's comment.
    pg_names: Mapping[str, str] = field(default_factory=dict)
    # Create the table with deletion vectors (ConsumerConfig.lake_deletion_vectors).
    deletion_vectors: bool = True
    # (after, up to): the commit_lsn range of the batch's applied transactions, the changes'
    # range; None: not known.
    commit_lsns: tuple[int, int] | None = None
    # The table as the batch found it (one read of its log, or the state this job's own last
    # commit left); None: read it here.
    lake: LakeTable | None = None
    # A handle on the table this job opened before (its schema unchanged since): opening one
    # reads the log again and analyses a query over the table.
    handle: DeltaTable | None = None
    # Table properties a new table is created with (lake_layouts.py: the change data feed).
    properties: Mapping[str, str] = field(default_factory=dict)
    # The processor's expressions built once (column_cache.py): a MERGE's clauses are a few
    # Py4J round trips per column, the same for every batch of a table.
    cache: ColumnCache = field(default_factory=ColumnCache)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"
