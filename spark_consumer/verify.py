"""`verify`: compare each published PostgreSQL table with its Delta table, key by key and column
by column, in memory bounded by a bucket count and a drill budget, not by the table.

Values compare through PostgreSQL's canonical text of each value against the lake value rendered
to that text (`verify_forms`), so edge values (NaN, infinity, BC dates, 24:00, interval months)
compare exactly rather than through a loader's approximation.

How (the way pg_comparator-style tools do it; `verify_checksum` has the formulas):
1. Checksums by bucket. PostgreSQL computes, in one GROUP BY, per bucket of md5(key text) the row
   count and the sum of a 60-bit hash of each row's text; only the buckets come back. Spark
   computes the same on the Delta table: the row text comes from the Python `lake_text` on the
   executors (`mapPartitions`, summed per partition, then `reduceByKey`); only bucket sums reach
   the driver. Both run at once (PostgreSQL on a thread), with progress logged from the lake side.
   Buckets rather than key ranges: the lake has no index to read a key range from, so any range
   query is a full scan there; hashing by key needs one scan per side and no key order.
2. Drill-down. Only buckets whose (count, sum) differ are read on both sides (PostgreSQL: a
   server-side cursor WHERE the bucket expression = ANY(buckets); Spark: a filter on the
   executors) in batches of at most DRILL_BATCH_ROWS rows, and diffed row by row (`diff`). It
   stops once `limit` of each kind are found or DRILL_MAX_ROWS rows were read, and the report says
   so; a bucket alone larger than a batch is named, not read.

Memory on the driver: the bucket sums (at most 2^16 buckets) and one drill batch per side.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession

from schemas import published_columns
from schemas.publication_catalog import PublicationNotFound, publication_columns, server_major
from schemas.published_columns import Attribute, PublicationColumns
from schemas.safe_names import lake_table_path
from schemas.table_list import format_table
from schemas.type_mapping import field_names
from spark_consumer import verify_checksum as checksum
from spark_consumer import verify_forms as forms
from spark_consumer.config import VerifyConfig
from spark_consumer.errors import ConfigError
from spark_consumer.verify_forms import ColumnInfo

Row = dict[str, Any]

log = logging.getLogger("walbridge.consumer")

DRILL_BATCH_ROWS = 50_000  # rows per side held at once while drilling
DRILL_MAX_ROWS = 500_000  # rows per side read in all, per table, before the lists are cut
PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True)
class TableDiff:
    table: str
    missing: tuple[Any, ...]  # keys in PostgreSQL, not in the lake
    extra: tuple[Any, ...]  # keys in the lake, not in PostgreSQL
    different: tuple[tuple[Any, str, Any, Any], ...]  # (key, column, pg value, lake value)
    # What the lists above do not say: they were cut, or buckets differ that were not read, or
    # a bucket's checksum differs while its rows compared equal.
    notes: tuple[str, ...] = field(default=())
    skipped: tuple[str, ...] = field(default=())  # columns not compared, with why

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different or self.notes)


Table = tuple[str, str]  # (schema, table), PostgreSQL's names as they are


def published_tables(conn: psycopg.Connection[Any], publication: str) -> list[Table]:
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (publication,),
    ).fetchall()
    return [(s, t) for s, t in rows]


def _oid(conn: psycopg.Connection[Any], table: Table) -> int:
    """The table's oid from its two names as parameters (a `'s.t'::regclass` text would be
    parsed as SQL: names with quotes, dots or capitals break it)."""
    row = conn.execute(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        table,
    ).fetchone()
    if row is None:
        raise ConfigError(f"table {format_table(*table)} does not exist")
    return int(row[0])


def key_columns(conn: psycopg.Connection[Any], table: Table) -> list[str]:
    """Replica identity columns: the index named by REPLICA IDENTITY, else the primary key."""
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s
          AND (i.indisreplident OR (i.indisprimary AND NOT EXISTS (
               SELECT 1 FROM pg_index j WHERE j.indrelid = i.indrelid AND j.indisreplident)))
        ORDER BY array_position(i.indkey, a.attnum)
        """,
        (_oid(conn, table),),
    ).fetchall()
    return [r[0] for r in rows]


COLUMNS_SQL = """
WITH RECURSIVE cols AS (
    SELECT a.attnum, a.attname, a.atttypid AS typid, a.attgenerated FROM pg_attribute a
    WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
), base(attnum, typid, depth) AS (
    SELECT attnum, typid, 0 FROM cols
    UNION ALL
    SELECT b.attnum, t.typbasetype, b.depth + 1 FROM base b JOIN pg_type t ON t.oid = b.typid
    WHERE t.typtype = 'd'
)
SELECT c.attnum::int, c.attname, t.typname, e.typname AS element, c.attgenerated::text
FROM cols c
JOIN LATERAL (SELECT typid FROM base WHERE base.attnum = c.attnum
              ORDER BY depth DESC LIMIT 1) b ON true
JOIN pg_type t ON t.oid = b.typid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
ORDER BY c.attnum
"""

# Without a publication (a direct compare_table call), compare what a publication without a
# column list and with publish_generated_columns = none sends: the ordinary columns.
NO_PUBLICATION = "(no publication given)"


def _publication_columns(
    conn: psycopg.Connection[Any], oid: int, publication: str | None
) -> PublicationColumns:
    if publication is None:
        return PublicationColumns(NO_PUBLICATION, server_major(conn), None, False)
    try:
        return publication_columns(conn, publication, oid)
    except PublicationNotFound as exc:
        raise ConfigError(f"verify: {exc}") from exc


def columns(
    conn: psycopg.Connection[Any], table: Table, publication: str | None = None
) -> tuple[list[ColumnInfo], tuple[str, ...]]:
    """The columns to compare, and the ones skipped with why: exactly the columns the stream
    carries for the table (schemas.published_columns: the publication's column list; stored
    generated columns on PostgreSQL 18 when it publishes them; virtual ones never), so the lake
    rightly has none of the others."""
    oid = _oid(conn, table)
    rows = {r[0]: r[1:] for r in conn.execute(COLUMNS_SQL, (oid,)).fetchall()}
    chosen = published_columns.select(
        format_table(*table),
        (Attribute(attnum, name, gen) for attnum, (name, _, _, gen) in rows.items()),
        _publication_columns(conn, oid, publication),
    )
    # Lake names come from the published columns only, as the producer's Avro schema does.
    lake_names = field_names(chosen.names)
    out = []
    for a, lake in zip(chosen.published, lake_names, strict=True):
        _, base, element, _ = rows[a.attnum]
        # An array's element may itself be a domain; its base name is good enough here.
        out.append(ColumnInfo(a.name, lake, base, element))
    return out, chosen.skipped_text()


def diff(table: str, pg: Mapping[Any, Row], lake: Mapping[Any, Row], limit: int = 20) -> TableDiff:
    missing = tuple(sorted((k for k in pg if k not in lake), key=repr)[:limit])
    extra = tuple(sorted((k for k in lake if k not in pg), key=repr)[:limit])
    different: list[tuple[Any, str, Any, Any]] = []
    for k in sorted(pg.keys() & lake.keys(), key=repr):
        for col, pv in pg[k].items():
            lv = lake[k].get(col)
            if pv != lv:
                different.append((k, col, pv, lv))
        if len(different) >= limit:
            break
    return TableDiff(table, missing, extra, tuple(different))


def _by_key(rows: Iterable[Row], key: list[str]) -> dict[Any, Row]:
    if key:
        return {tuple(r[k] for k in key): r for r in rows}
    # Without a key, compare as multisets: the whole row, numbered among its duplicates.
    out: dict[Any, Row] = {}
    seen: Counter[Any] = Counter()
    for r in rows:
        base = tuple(sorted((k, repr(v)) for k, v in r.items()))
        out[(base, seen[base])] = r
        seen[base] += 1
    return out


def _estimated_rows(conn: psycopg.Connection[Any], table: Table) -> float:
    """pg_class's estimate over the table and its partitions (-1, never analyzed: from the size
    at ~100 bytes a row; also when 0, as older versions say before ANALYZE). For the bucket count
    and the ETA only."""
    row = conn.execute(
        "SELECT sum(CASE WHEN c.reltuples > 0 THEN c.reltuples"
        " ELSE pg_relation_size(c.oid) / 100.0 END)"
        " FROM pg_class c WHERE c.oid = %(oid)s"
        " OR c.oid IN (SELECT relid FROM pg_partition_tree(%(oid)s))",  # empty if not partitioned
        {"oid": _oid(conn, table)},
    ).fetchone()
    return float(row[0] or 0) if row else 0.0


def pg_sums(
    conn: psycopg.Connection[Any],
    table: Table,
    cols: list[ColumnInfo],
    key_index: list[int],
    bits: int,
) -> checksum.Sums:
    rows = conn.execute(checksum.pg_aggregate_sql(table, cols, key_index, bits)).fetchall()
    return {int(b): (int(n), int(h)) for b, n, h in rows}


def _lake_partition_sums(
    cols: list[ColumnInfo], key_index: list[int], bits: int, counter: Any, rows: Iterator[Any]
) -> Iterator[tuple[int, tuple[int, int]]]:
    """On an executor: the bucket sums of one partition (at most 2^bits entries)."""
    acc: dict[int, list[int]] = {}
    n = 0
    for r in rows:
        b, h = checksum.bucket_and_hash(checksum.lake_texts(cols, r.asDict()), key_index, bits)
        entry = acc.get(b)
        if entry is None:
            acc[b] = [1, h]
        else:
            entry[0] += 1
            entry[1] += h
        n += 1
    counter.add(n)
    for b, (count, total) in acc.items():
        yield b, (count, total)


def lake_sums(
    df: DataFrame,
    cols: list[ColumnInfo],
    key_index: list[int],
    bits: int,
    counter: Any,
    group: str | None = None,
) -> checksum.Sums:
    if group is not None:  # this thread's jobs, so that a failure on the other side stops them
        df.sparkSession.sparkContext.setJobGroup(group, "walbridge verify", interruptOnCancel=True)
    sums = df.rdd.mapPartitions(partial(_lake_partition_sums, cols, key_index, bits, counter))
    return dict(sums.reduceByKey(checksum.add_sums).collect())


def _cancel(conn: psycopg.Connection[Any], spark: SparkSession, group: str) -> None:
    spark.sparkContext.cancelJobGroup(group)
    conn.cancel_safe()


def read_pg(
    conn: psycopg.Connection[Any],
    table: Table,
    cols: list[ColumnInfo],
    key: list[str],
    key_index: list[int],
    bits: int,
    buckets: list[int],
) -> dict[Any, Row]:
    """The rows of `buckets`, streamed through a server-side cursor."""
    query = checksum.pg_drill_sql(table, cols, key_index, bits)
    with conn.cursor(name="walbridge_verify_drill") as cur:
        cur.execute(query, (buckets,))
        rows = ({c.name: forms.pg_value(c, v) for c, v in zip(cols, r, strict=True)} for r in cur)
        return _by_key(rows, key)


def _lake_partition_rows(
    cols: list[ColumnInfo],
    key_index: list[int],
    bits: int,
    buckets: frozenset[int],
    rows: Iterator[Any],
) -> Iterator[Row]:
    for r in rows:
        d = r.asDict()
        b, _ = checksum.bucket_and_hash(checksum.lake_texts(cols, d), key_index, bits)
        if b in buckets:
            yield {c.name: forms.lake_text(c, d) for c in cols}


def read_lake(
    df: DataFrame,
    cols: list[ColumnInfo],
    key: list[str],
    key_index: list[int],
    bits: int,
    buckets: list[int],
) -> dict[Any, Row]:
    """The lake rows of `buckets` (the filter runs on the executors; at most a drill batch of
    rows comes back, as the buckets' counts say)."""
    select = partial(_lake_partition_rows, cols, key_index, bits, frozenset(buckets))
    return _by_key(df.rdd.mapPartitions(select).collect(), key)


# Canonical text forms on the PostgreSQL side (see verify_forms).
SESSION = (
    "SET DateStyle = 'ISO, MDY'",
    "SET TimeZone = 'UTC'",
    "SET IntervalStyle = 'postgres'",
    "SET extra_float_digits = 1",
)


def _lake_frame(spark: SparkSession, path: str) -> DataFrame | None:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    return spark.read.format("delta").load(path)


def _eta(done: int, total: float, elapsed: float) -> str:
    rate = done / elapsed if elapsed > 0 else 0.0
    if rate <= 0 or total <= done:
        return f"{rate:.0f} rows/s, ETA unknown"
    return f"{rate:.0f} rows/s, ETA {(total - done) / rate:.0f}s"


def _sums_with_progress(
    name: str,
    estimate: float,
    pg_side: Callable[[], checksum.Sums],
    lake_side: Callable[[], checksum.Sums],
    lake_rows: Callable[[], int],
    cancel: Callable[[], None],
) -> tuple[checksum.Sums, checksum.Sums]:
    """Both sides' bucket sums at once, logging the lake side's progress (the slower one: rows
    go through Python there) every PROGRESS_EVERY_S. When one side fails, `cancel` stops the
    other rather than waiting for a full scan whose result no longer matters."""
    started = time.monotonic()
    with ThreadPoolExecutor(2, thread_name_prefix="walbridge-verify") as pool:
        pg: Future[checksum.Sums] = pool.submit(pg_side)
        lake: Future[checksum.Sums] = pool.submit(lake_side)
        while True:
            done, _ = wait((pg, lake), timeout=PROGRESS_EVERY_S, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):
                cancel()
                break
            if len(done) == 2:
                break
            log.info(
                "verify %s: lake %d of ~%.0f rows (%s); PostgreSQL %s",
                name,
                lake_rows(),
                estimate,
                _eta(lake_rows(), estimate, time.monotonic() - started),
                "done" if pg.done() else "running",
            )
        return pg.result(), lake.result()


def compare_table(
    conn: psycopg.Connection[Any],
    spark: SparkSession,
    table: Table,
    lake_path: str,
    publication: str | None = None,
    limit: int = 20,
) -> TableDiff:
    name = format_table(*table)
    key = key_columns(conn, table)
    cols, skipped = columns(conn, table, publication)
    if skipped:
        log.info("verify %s: not compared: %s", name, ", ".join(skipped))
    if not cols:
        raise ConfigError(f"verify: table {name} has no columns to compare")
    key_index = [i for i, c in enumerate(cols) if c.name in key]
    if len(key_index) != len(key):
        raise ConfigError(f"verify: table {name}: key {key} not among its columns")
    estimate = _estimated_rows(conn, table)
    bits = checksum.bucket_bits(estimate)
    df = _lake_frame(spark, lake_path)
    counter = spark.sparkContext.accumulator(0)
    group = f"walbridge-verify-{uuid.uuid4().hex}"
    started = time.monotonic()
    log.info("verify %s: ~%.0f rows, %d buckets", name, estimate, 1 << bits)
    pg, lake = _sums_with_progress(
        name,
        estimate,
        lambda: pg_sums(conn, table, cols, key_index, bits),
        lambda: {} if df is None else lake_sums(df, cols, key_index, bits, counter, group),
        lambda: int(counter.value),
        lambda: _cancel(conn, spark, group),
    )
    pg_rows = sum(n for n, _ in pg.values())
    elapsed = time.monotonic() - started
    differing = checksum.differing_buckets(pg, lake)
    log.info(
        "verify %s: %d rows in PostgreSQL, %d in the lake, %.1fs (%.0f rows/s); %d of %d "
        "bucket(s) differ",
        name,
        pg_rows,
        int(counter.value),
        elapsed,
        pg_rows / elapsed if elapsed > 0 else 0.0,
        len(differing),
        1 << bits,
    )
    if not differing:
        return TableDiff(name, (), (), (), skipped=skipped)
    found = _drill(conn, df, table, cols, key, key_index, bits, differing, pg, lake, limit)
    return replace(found, skipped=skipped)


def _drill(
    conn: psycopg.Connection[Any],
    df: DataFrame | None,
    table: Table,
    cols: list[ColumnInfo],
    key: list[str],
    key_index: list[int],
    bits: int,
    differing: list[int],
    pg: checksum.Sums,
    lake: checksum.Sums,
    limit: int,
) -> TableDiff:
    name = format_table(*table)
    batches, too_large = checksum.drill_batches(differing, pg, lake, DRILL_BATCH_ROWS)
    missing: list[Any] = []
    extra: list[Any] = []
    different: list[tuple[Any, str, Any, Any]] = []
    notes: list[str] = []
    read = 0
    for i, batch in enumerate(batches):
        if read >= DRILL_MAX_ROWS or min(len(missing), len(extra), len(different)) >= limit:
            left = sum(len(b) for b in batches[i:])
            notes.append(
                f"stopped after reading {read} row(s) per side: {left} differing bucket(s) "
                "not read, so the lists are not complete"
            )
            break
        pg_rows = read_pg(conn, table, cols, key, key_index, bits, batch)
        lake_rows = {} if df is None else read_lake(df, cols, key, key_index, bits, batch)
        read += max(len(pg_rows), len(lake_rows))
        d = diff(name, pg_rows, lake_rows, limit)
        missing += d.missing[: limit - len(missing)]
        extra += d.extra[: limit - len(extra)]
        different += d.different[: max(0, limit - len(different))]
        if d.equal:
            notes.append(
                f"{len(batch)} bucket(s) differ in checksum but their rows compare equal "
                "(a text form the checksum and the row diff render differently)"
            )
    for b in too_large:
        notes.append(
            f"bucket {b} not read: {pg.get(b, (0, 0))[0]} row(s) in PostgreSQL, "
            f"{lake.get(b, (0, 0))[0]} in the lake (more than {DRILL_BATCH_ROWS} at once)"
        )
    return TableDiff(name, tuple(missing), tuple(extra), tuple(different), tuple(notes))


def run(config: VerifyConfig, spark: SparkSession) -> list[TableDiff]:
    out = []
    with psycopg.connect(config.pg_dsn) as conn:
        tables = published_tables(conn, config.publication)
        if config.tables:
            unknown = sorted(set(config.tables) - set(tables))
            if unknown:
                raise ConfigError(
                    f"WALBRIDGE_TABLES {', '.join(format_table(*t) for t in unknown)} are not "
                    f"in publication {config.publication!r}"
                )
            tables = [t for t in tables if t in config.tables]
        for statement in SESSION:
            conn.execute(statement)
        for table in tables:
            path = lake_table_path(config.lake_path, *table)
            out.append(compare_table(conn, spark, table, path, config.publication))
    return out


def report(diffs: list[TableDiff]) -> str:
    lines = []
    for d in diffs:
        skipped = f" (not compared: {', '.join(d.skipped)})" if d.skipped else ""
        if d.equal:
            lines.append(f"{d.table}: equal{skipped}")
            continue
        lines.append(
            f"{d.table}: {len(d.missing)} missing, {len(d.extra)} extra, "
            f"{len(d.different)} different (first 20 of each){skipped}"
        )
        lines += [f"  missing {k}" for k in d.missing]
        lines += [f"  extra   {k}" for k in d.extra]
        lines += [f"  differs {k} {c}: pg={pv!r} lake={lv!r}" for k, c, pv, lv in d.different]
        lines += [f"  note: {n}" for n in d.notes]
    return "\n".join(lines)
