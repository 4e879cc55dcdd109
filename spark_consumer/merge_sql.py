"""The guarded MERGE's SQL: the ON condition's key match and key range (so Delta prunes
target files by their statistics), the bounds of a truncate, and the clauses whose conditions
keep a replay from changing anything (a matched row changes only if the source's
(commit_lsn, total_order) is newer) with their assignments (an unchanged TOAST value keeps the
target's). Most are built once per table schema and kept in the processor's `ColumnCache`.

Apart from merge.py, which runs the MERGE and chooses between its forms, because this is only
the text and the parsed Columns: nothing here touches Spark's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_consumer.columns import COMMIT_LSN, LAKE_META, OP, TOAST, TOTAL_ORDER
from spark_consumer.table_changes import TableChanges


def _newer(s: str = "s.", t: str = "t.") -> str:
    return (
        f"({s}{COMMIT_LSN} > {t}{COMMIT_LSN} OR ({s}{COMMIT_LSN} = {t}{COMMIT_LSN}"
        f" AND {s}{TOTAL_ORDER} > {t}{TOTAL_ORDER}))"
    )


def after(point: tuple[int, int]) -> Column:
    lsn, order = point
    return (F.col(COMMIT_LSN) > lsn) | ((F.col(COMMIT_LSN) == lsn) & (F.col(TOTAL_ORDER) > order))


def before_sql(point: tuple[int, int], t: str = "t.") -> str:
    lsn, order = point
    return f"({t}{COMMIT_LSN} < {lsn} OR ({t}{COMMIT_LSN} = {lsn} AND {t}{TOTAL_ORDER} < {order}))"


def key_range(tc: TableChanges, t: str = "t.") -> Column | None:
    """A target-only predicate on the first key column, so Delta skips files by their min/max
    statistics instead of scanning the whole table (keys of a batch are usually clustered:
    new rows and recently changed ones). `t`: the target's alias ("" for a plain read)."""
    if tc.key_min is None or tc.key_max is None:
        return None
    k = F.col(f"{t}`{tc.key[0]}`")
    return (k >= F.lit(tc.key_min)) & (k <= F.lit(tc.key_max))


def key_match(tc: TableChanges) -> Column:
    return tc.cache.get(
        ("key-match", tc.key), lambda: F.expr(" AND ".join(f"t.`{k}` = s.`{k}`" for k in tc.key))
    )


def op_is(tc: TableChanges, op: str) -> Column:
    return tc.cache.get(("op-is", op), lambda: F.col(OP) == op)


def insert_values(tc: TableChanges, target_cols: list[str]) -> dict[str, str | Column]:
    return tc.cache.get(
        ("insert-values", tc.columns, tuple(target_cols)),
        lambda: _expressions(_insert_sql(tc.columns, target_cols)),
    )


def _insert_sql(columns: tuple[str, ...], target_cols: list[str]) -> dict[str, str]:
    # A column the writer no longer has (dropped at the source) gets NULL.
    values = {f"`{c}`": (f"s.`{c}`" if c in columns else "NULL") for c in target_cols}
    values.update({m: f"s.{m}" for m in LAKE_META})
    return values


def _expressions(sql: Mapping[str, str]) -> dict[str, str | Column]:
    """A MERGE clause's assignments as parsed Columns: Delta's builder parses each string
    again on every call (three Py4J round trips each), a Column it passes on as it is."""
    return {name: F.expr(value) for name, value in sql.items()}


@dataclass(frozen=True)
class MergeClauses:
    """The guarded MERGE's conditions and assignments for one table schema."""

    delete_when: Column
    update_when: Column
    insert_when: Column
    sets: dict[str, str | Column]
    inserts: dict[str, str | Column]


def merge_clauses(
    key: tuple[str, ...], columns: tuple[str, ...], target_cols: list[str], toast_cols: list[str]
) -> MergeClauses:
    newer = _newer()

    def value(c: str, matched: bool) -> str:
        if c not in columns:
            return "NULL"  # a column the writer no longer has: dropped at the source
        if c in toast_cols:
            keep = f"t.`{c}`" if matched else "NULL"
            return f"CASE WHEN array_contains(s.{TOAST}, '{c}') AND NOT s.`_has_{c}` THEN {keep} ELSE s.`{c}` END"
        return f"s.`{c}`"

    sets = {f"`{c}`": value(c, True) for c in target_cols if c not in key}
    sets.update({m: f"s.{m}" for m in LAKE_META})
    inserts = {f"`{c}`": value(c, False) for c in target_cols}
    inserts.update({m: f"s.{m}" for m in LAKE_META})
    return MergeClauses(
        delete_when=F.expr(f"s.{OP} = 'd' AND {newer}"),
        update_when=F.expr(f"s.{OP} <> 'd' AND {newer}"),
        insert_when=F.expr(f"s.{OP} <> 'd'"),
        sets=_expressions(sets),
        inserts=_expressions(inserts),
    )
