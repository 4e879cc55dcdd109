"""A batch's MERGEs: each touched table's share of the applied transactions, tables side by
side on threads, in two groups when small tables rewrite files instead of writing deletion
vectors (a session setting); and what this job knows of each lake table between batches (its
state after the job's own last commit, and the handle it used), since it is every table's only
writer.

Apart from batch.py because it is the one step that writes the tables, with state that outlives
a batch; merge.py applies one table, this decides which tables run when and with what they know.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

from pyspark.sql import SparkSession

from spark_consumer import (
    codegen_stable,
    delta_conflicts,
    lake_layouts,
    lake_state,
    merge,
    progress,
    transaction_stats,
)
from spark_consumer.batch_decode import DecodedTable
from spark_consumer.column_cache import ColumnCache
from spark_consumer.columns import COMMIT_LSN, OK
from spark_consumer.config import ConsumerConfig
from spark_consumer.merge_target import check_deletion_vectors, rewrites, rewriting
from spark_consumer.reassembly import Plan, TableWork
from spark_consumer.table_changes import TableChanges


class MergeRunner:
    def __init__(self, spark: SparkSession, config: ConsumerConfig, columns: ColumnCache) -> None:
        self.spark = spark
        self.config = config
        self._columns = columns  # the processor's: expressions built once per process
        # Tables whose deletion-vector mode was checked against the setting (once per process:
        # this job is their only writer). Tables are applied from several threads; a second
        # check of the same table is merely redundant.
        self._mode_checked: set[str] = set()
        # Per lake path: the table as this job's last commit to it left it, and the handle it
        # used (this job is the only writer, so neither changes behind its back). Filled by
        # the first read of a table's log, dropped whole when a batch fails.
        self._lake: dict[str, merge.Applied | lake_state.LakeTable] = {}

    def run(
        self,
        plan: Plan,
        tables: dict[str, DecodedTable],
        before: progress.Progress,
        snapshotting: frozenset[str],
    ) -> tuple[dict[str, int], dict[str, int]]:
        """MERGE each touched table's share of the plan; the Delta version of every table the
        lake knows (the last progress row's where no MERGE ran), and the changes applied by
        table."""
        # Tables are independent Delta logs: their MERGEs run side by side. A MERGE of a few
        # rows is mostly fixed latency (planning, several small jobs, the commit), so on a
        # small machine threads cut a multi-table batch to about its slowest table.
        versions = dict(before.table_versions)
        changes_by_table: dict[str, int] = {}
        for works, rewrite in self._merge_groups(plan.tables, tables):
            # In this order: the pool waits for its MERGEs before the setting is put back.
            with (
                rewriting(self.spark) if rewrite else nullcontext(),
                ThreadPoolExecutor(
                    max_workers=max(1, min(self.config.merge_threads, len(works)))
                ) as pool,
            ):
                futures = {
                    w.collection: pool.submit(
                        self._apply,
                        tables[w.topic],
                        w,
                        plan,
                        before.table_versions,
                        w.collection in snapshotting,
                    )
                    for w in works
                }
                for work in works:
                    written = futures[work.collection].result()
                    if written:
                        versions.update(written)
                        changes_by_table[work.collection] = work.events
        return versions, changes_by_table

    def forget(self) -> None:
        """Drop what is known of every table (a batch failed: a table may have committed after
        its state was kept); the next batch reads each table's log again."""
        self._lake.clear()

    def forget_table(self, path: str) -> None:
        """Drop what is known of one table: another writer (compaction) committed to it."""
        self._lake.pop(path, None)

    def _merge_groups(
        self, works: tuple[TableWork, ...], tables: dict[str, DecodedTable]
    ) -> list[tuple[tuple[TableWork, ...], bool]]:
        """The tables' MERGEs in the order they run, as (tables, rewrite): first those that
        write deletion vectors or never would (a table without them, only inserts, no key),
        then the small tables whose MERGE would write them but rewrites the files it touches
        instead (`merge_target.rewriting`: a session setting, so the two kinds cannot run side
        by side, and a table waits in the second group only when it gains from it)."""
        below = self.config.lake_rewrite_below_bytes
        # Keyless tables are appended to (a truncate is a DELETE, which the setting leaves be);
        # distinct inserts may take the insert-only MERGE, which marks no row.
        may_mark = [w for w in works if tables[w.topic].key and not w.only_distinct_inserts]
        if not (below and self.config.lake_deletion_vectors and may_mark):
            return [(works, False)]
        paths = [
            self.config.table_path(tables[w.topic].info.schema, tables[w.topic].info.table)
            for w in may_mark
        ]
        # The first batch reads each table's log here (on threads, as the MERGEs would).
        with ThreadPoolExecutor(
            max_workers=max(1, min(self.config.merge_threads, len(may_mark)))
        ) as pool:
            lakes = pool.map(self.lake_table, paths)
            small = {
                w.collection
                for w, lake in zip(may_mark, lakes, strict=True)
                if rewrites(lake, below)
            }
        groups = (
            (tuple(w for w in works if w.collection not in small), False),
            (tuple(w for w in works if w.collection in small), True),
        )
        return [(group, rewrite) for group, rewrite in groups if group]

    def _apply(
        self,
        table: DecodedTable,
        work: TableWork,
        plan: Plan,
        recorded: Mapping[str, int],
        snapshotting: bool,
    ) -> dict[str, int]:
        """`_apply_once`, again from a fresh read of the table after a commit conflict (a
        concurrent OPTIMIZE, say): the state kept here is then stale (delta_conflicts.py says
        why doing it again is safe; the layout's own tables are guarded alike)."""
        path = self.config.table_path(table.info.schema, table.info.table)
        return delta_conflicts.retry_on_conflict(
            lambda: self._apply_once(table, work, plan, recorded, snapshotting),
            f"table {work.collection}",
            on_conflict=lambda: self.forget_table(path),
        )

    def _apply_once(
        self,
        table: DecodedTable,
        work: TableWork,
        plan: Plan,
        recorded: Mapping[str, int],
        snapshotting: bool,
    ) -> dict[str, int]:
        """MERGE one table's share of the applied transactions, and write the other tables of
        its layout (lake_layouts.py); their Delta versions by `table_versions` name, or none
        when there was nothing to do (truncates of a table the lake never had).
        `recorded`: the last progress row's versions."""
        info = table.info
        path = self.config.table_path(info.schema, info.table)
        layout = self.layout(table, work.collection)
        key = table.key
        if key is None:
            if work.only_truncates:
                return {}
            key = ()  # no key schema and no table yet: the source table has no replica identity
        known = self._lake.get(path)
        lake = self.lake_table(path)
        if path not in self._mode_checked:
            check_deletion_vectors(
                f"{info.schema}.{info.table}", lake, self.config.lake_deletion_vectors
            )
            self._mode_checked.add(path)
        lo, hi = plan.watermark_before, plan.watermark_after
        changes = table.events.filter(
            codegen_stable.greater(COMMIT_LSN, lo)
            & codegen_stable.at_most(COMMIT_LSN, hi)
            & self._columns.get("usable", transaction_stats.usable)
        ).drop(OK)
        # The columns the options leave out go before any write (lake_layouts.py).
        changes, with_images, columns, pg_names = layout.narrow(
            changes, table.columns, key, table.pg_names
        )
        tc = TableChanges(
            info.schema,
            info.table,
            path,
            key,
            columns,
            changes,
            truncate=work.truncate,
            toast_columns=work.toast_columns & frozenset(columns),
            key_min=work.key_min,
            key_max=work.key_max,
            only_distinct_inserts=work.only_distinct_inserts,
            duplicates=work.duplicates,
            unique_key=table.unique_key,
            recorded_version=recorded.get(work.collection),
            snapshotting=snapshotting,
            pg_names=pg_names,
            deletion_vectors=self.config.lake_deletion_vectors,
            lake=lake,
            handle=known.handle if isinstance(known, merge.Applied) else None,
            commit_lsns=(lo, hi),
            cache=self._columns,
        )
        if layout.plain:
            applied = layout.apply_current(self.spark, tc)
            self._lake[path] = applied
            return {work.collection: applied.version}
        # The layout's tables (history, changelog) read only the batch's changes and their own
        # tables, never the current-state one: written on a thread of their own beside its
        # MERGE, so the table takes the longer of the two, not their sum (the MERGE's planning
        # and commit leave the cores idle for a while). Both come before the progress row.
        with ThreadPoolExecutor(max_workers=1) as beside:
            extras = beside.submit(layout.write_extras, self.spark, tc, with_images, recorded)
            applied = layout.apply_current(self.spark, tc)
            self._lake[path] = applied
            return {work.collection: applied.version, **extras.result()}

    def layout(self, table: DecodedTable, collection: str) -> lake_layouts.Layout:
        """The table's options and its layout's tables (lake_layouts.py)."""
        return lake_layouts.Layout(
            self.config.lake_tables_config.of_collection(collection),
            collection,
            self.config.lake_path,
            table.info.schema,
            table.info.table,
        )

    def lake_table(self, path: str) -> lake_state.LakeTable:
        """The table as this job last left it, or else as one read of its log found it."""
        known = self._lake.get(path)
        if isinstance(known, merge.Applied):
            return known.lake
        if known is None:
            known = self._lake[path] = lake_state.read(self.spark, path)
        return known
