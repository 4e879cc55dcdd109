"""A table's lake layout in a batch: what its per-table options (lake_options.py) change in the
batch's write path, called by merge_runner.py for each touched table.

- Before any write: the columns the options leave out (`columns` / `except_columns`) are
  dropped from the table's changes, so no table of the layout (current state, history,
  changelog) ever holds them. A left-out key column is an error: the MERGE needs it.
- The current-state table: the guarded MERGE (merge.py), or its soft-delete form
  (soft_deletes.py); with `change_data_feed`, Delta's change data feed is on for the table.
- Beside it, in the same batch (on a thread of their own, merge_runner.py): the history table
  (history.py) and the changelog table (changelog.py), each named in the progress row's
  `table_versions`.

Every write here is idempotent for a replay of the batch, as the current-state MERGE is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession

from spark_consumer import changelog, history, lake_options, lake_state, merge, soft_deletes
from spark_consumer.columns import BEFORE, OP, TOAST
from spark_consumer.errors import ApplyError
from spark_consumer.lake_options import TableOptions
from spark_consumer.table_changes import TableChanges

CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


@dataclass(frozen=True)
class Layout:
    """One table's options and where its layout's tables live."""

    opts: TableOptions
    collection: str  # `schema.table`, the progress row's name of the table
    lake_path: str
    schema: str  # the table's name parts (`safe_names.name_part`)
    table: str

    @property
    def plain(self) -> bool:
        return self.opts.plain

    @property
    def extra_tables(self) -> dict[str, str]:
        """The layout's tables besides the current-state one (history, changelog), by their
        `table_versions` name: their paths. A batch that writes the table writes them too, so
        they need the same Delta checkpoints and compaction (batch.py passes them on)."""
        out = {}
        if self.opts.history:
            out[lake_options.history_name(self.collection)] = lake_options.history_path(
                self.lake_path, self.schema, self.table
            )
        if self.opts.changelog:
            out[lake_options.changelog_name(self.collection)] = lake_options.changelog_path(
                self.lake_path, self.schema, self.table
            )
        return out

    def narrow(
        self,
        changes: DataFrame,
        columns: tuple[str, ...],
        key: tuple[str, ...],
        pg_names: Mapping[str, str],
    ) -> tuple[DataFrame, DataFrame, tuple[str, ...], dict[str, str]]:
        """(changes for the current-state and history tables, changes with the event's images
        for the changelog, kept columns, their PostgreSQL names)."""
        kept = self.opts.kept(columns)
        dropped = [c for c in columns if c not in kept]
        left_out_key = [k for k in key if k in dropped]
        if left_out_key:
            raise ApplyError(
                f"table {self.collection}: the lake tables config leaves out key column(s) "
                f"{left_out_key}; the lake needs the key (leave them in)"
            )
        images = [BEFORE] if BEFORE in changes.columns else []  # a changelog's tables only
        narrowed = changes.drop(*dropped)
        return (
            narrowed.drop(*images),
            narrowed,
            kept,
            {c: n for c, n in pg_names.items() if c in kept},
        )

    def apply_current(self, spark: SparkSession, tc: TableChanges) -> merge.Applied:
        """The current-state table's MERGE, in the form the options ask for."""
        if self.opts.change_data_feed:
            tc = replace(tc, properties={**tc.properties, CHANGE_DATA_FEED: "true"})
            if _enable_change_data_feed(spark, tc):  # a commit: what was known is stale
                tc = replace(tc, lake=None, handle=None)
        if self.opts.soft_deletes and tc.key:
            return soft_deletes.apply(spark, tc)
        return merge.apply(spark, tc)

    def write_extras(
        self,
        spark: SparkSession,
        tc: TableChanges,
        with_images: DataFrame,
        recorded: Mapping[str, int],
    ) -> dict[str, int]:
        """History and changelog tables of the batch: their `table_versions` entries."""
        out: dict[str, int] = {}
        if tc.commit_lsns is None:
            raise ApplyError(f"table {self.collection}: no commit range for the layout tables")
        tables = self.extra_tables
        if self.opts.history:
            name = lake_options.history_name(self.collection)
            out[name] = history.write(spark, tables[name], tc, self.opts)
        if self.opts.changelog:
            name = lake_options.changelog_name(self.collection)
            path = tables[name]
            events = with_images.filter(with_images[OP].isin("c", "r", "u", "d", "t"))
            if TOAST not in events.columns:
                raise ApplyError(f"table {self.collection}: changes lack {TOAST}")
            out[name] = changelog.write(
                spark,
                path,
                events,
                self.opts,
                tc.commit_lsns,
                recorded.get(name),
                deduplicate=tc.duplicates,
            )
        return out


def _enable_change_data_feed(spark: SparkSession, tc: TableChanges) -> bool:
    """An existing table gets the feed from its next commit on (a new one at its creation,
    through `TableChanges.properties`); whether this committed a change of property."""
    lake = tc.lake if tc.lake is not None else lake_state.read(spark, tc.path)
    if not lake.exists or lake.properties.get(CHANGE_DATA_FEED, "").lower() == "true":
        return False
    path = tc.path if "://" in tc.path or tc.path.startswith("/") else os.path.abspath(tc.path)
    quoted = "delta.`" + path.replace("`", "``") + "`"
    spark.sql(f"ALTER TABLE {quoted} SET TBLPROPERTIES ('{CHANGE_DATA_FEED}' = 'true')")
    return True
