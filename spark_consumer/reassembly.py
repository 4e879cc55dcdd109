"""Transaction reassembly: which source transactions a batch may apply. Pure; no Spark.

A transaction is complete when its END marker is present and, for every table collection in
the marker's `data_collections`, exactly that many distinct data events (by commit_lsn,
total_order) have arrived. A batch applies the prefix of commit order made of complete
transactions, up to (not including) the first transaction whose END is present but whose
events are not all here yet. Everything later waits.

Why the prefix is safe: the transaction topic has one partition and markers are published
in commit order, so when a batch holds T's END it also holds (or held) the END of every
transaction committed before T. Data events without an END belong to transactions committed
after every END seen, unless the producer broke the contract (reported as an error).

The Spark side (`spark_consumer.transaction_stats`) aggregates a batch into a summary: one row
per (transaction, table), one per transaction's markers and one per table its END names
(`Summary`). For a small batch `plan` decides from it, column by column. A large batch has
Spark reduce it to one row per transaction (`TX_SCHEMA`), from which `cut` finds the applied
prefix, and to one row per table of the applied ones (`WORK_SCHEMA`, `table_works`); `plan`
goes through the same `cut` and `table_works`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_consumer.errors import TransactionError

Point = tuple[int, int]  # (commit_lsn, total_order): the dedup and ordering key


@dataclass(frozen=True, slots=True)
class TableStats:
    """Data events of one transaction on one table: a row of `Summary.data`, built by hand
    (`summary_of`). The batch itself never makes these objects."""

    tx_id: str
    collection: str  # "schema.table"
    topic: str
    commit_lsn: int
    events: int  # distinct total_order values (duplicates from producer replays count once)
    records: int  # Kafka records, duplicates included
    first_seen_ms: int
    truncate_order: int | None = None  # largest total_order of a 't' event
    truncates: int = 0  # Kafka records of 't' events
    toast_columns: frozenset[str] = frozenset()
    key_min: int | str | None = None  # bounds of the first key column, when orderable
    key_max: int | str | None = None
    only_inserts: bool = False  # every event is a 'c' (insert)

    @property
    def duplicates(self) -> bool:
        """Some event arrived more than once (a producer replay inside the batch)."""
        return self.records != self.events


@dataclass(frozen=True, slots=True)
class MarkerStats:
    """The markers (BEGIN/END) of one transaction seen in the batch: a row of
    `Summary.markers` and its `Summary.expected` rows, built by hand (`summary_of`)."""

    tx_id: str
    commit_lsn: int
    has_end: bool
    expected: Mapping[str, int]  # END's data_collections, table collections only
    records: int
    first_seen_ms: int
    commit_ts_ms: int | None = None  # the source commit time (the markers' ts_ms)


@dataclass(frozen=True, slots=True)
class TxSummary:
    """One pending or blocking transaction, for error messages and logs."""

    tx_id: str
    commit_lsn: int
    has_end: bool
    missing: tuple[str, ...]  # "<collection>: <seen> of <expected> events"
    first_seen_ms: int  # when the consumer first read any of its records (epoch ms)


@dataclass(frozen=True, slots=True)
class TableWork:
    """What one table gets from the applied transactions of a batch."""

    collection: str
    topic: str
    events: int
    only_truncates: bool  # nothing but truncates: a table the lake never had needs nothing
    truncate: Point | None  # the latest truncate among them
    toast_columns: frozenset[str]
    key_min: int | str | None  # None: no usable bounds (mixed types or not orderable)
    key_max: int | str | None
    # Every applied event of the table is an insert and none arrived twice: the MERGE may
    # take its insert-only form (merge.py says why that is exact).
    only_distinct_inserts: bool = False
    # Some event arrived more than once (a producer replay): a write that keeps every event
    # (the changelog) must drop the copies.
    duplicates: bool = False


# How many waiting transactions a plan names (oldest first): enough for the error messages and
# the age check. A catch-up batch may leave tens of thousands waiting; an object for each cost
# the driver more than the rest of planning.
NAMED_PENDING = 5


@dataclass(frozen=True, slots=True)
class Plan:
    watermark_before: int  # commit_lsn applied before this batch (-1: nothing yet)
    watermark_after: int  # commit_lsn applied after this batch
    applied_transactions: int
    tables: tuple[TableWork, ...]
    # The oldest waiting transactions (first seen, then commit order), NAMED_PENDING at most.
    pending: tuple[TxSummary, ...] = field(default=())
    pending_records: int = 0
    # Source commit time of the last applied transaction (None: nothing applied)
    commit_ts_ms: int | None = None
    pending_transactions: int = 0  # all of them

    @property
    def oldest_pending(self) -> TxSummary | None:
        return self.pending[0] if self.pending else None


# The planner's input: the batch's summary as Arrow tables, as Spark hands it back
# (transaction_stats.collect). Planning is columnar: a catch-up batch holds tens of thousands
# of transactions over several tables, and a Python object per (transaction, table) cost the
# driver ~1.8 s and ~100 MB per 36k transactions; only the oldest waiting transactions become
# Python objects here.

#: One row per (transaction, table): the table's data events of that transaction.
DATA_SCHEMA = pa.schema(
    [
        ("tx", pa.string()),
        ("coll", pa.string()),  # "schema.table"
        ("topic", pa.string()),
        ("lsn", pa.int64()),  # commit_lsn
        ("events", pa.int64()),  # distinct total_order values (producer replays count once)
        ("records", pa.int64()),  # Kafka records, duplicates included
        ("seen", pa.int64()),  # first seen, epoch ms
        ("t_ord", pa.int64()),  # largest total_order of a 't' event, or null
        ("truncates", pa.int64()),  # Kafka records of 't' events
        ("toast", pa.list_(pa.string())),  # columns left unchanged (TOAST), or null for none
        # Bounds of the first key column when it is an integer (kl_) or a string (ks_);
        # k_null: some event had no usable key value.
        ("kl_min", pa.int64()),
        ("kl_max", pa.int64()),
        ("ks_min", pa.string()),
        ("ks_max", pa.string()),
        ("k_null", pa.bool_()),
        ("only_inserts", pa.bool_()),  # every event is a 'c' (insert)
    ]
)
#: One row per transaction with markers in the batch.
MARKER_SCHEMA = pa.schema(
    [
        ("tx", pa.string()),
        ("lsn", pa.int64()),
        ("has_end", pa.bool_()),
        ("records", pa.int64()),
        ("seen", pa.int64()),
        ("ts", pa.int64()),  # the source commit time (the markers' ts_ms), or null
    ]
)
#: One row per (ended transaction, table collection of its END's data_collections).
EXPECTED_SCHEMA = pa.schema(
    [("tx", pa.string()), ("lsn", pa.int64()), ("coll", pa.string()), ("expected", pa.int64())]
)


@dataclass(frozen=True)
class Summary:
    """A batch's summary in the planner's layout (the schemas above)."""

    data: pa.Table
    markers: pa.Table
    expected: pa.Table


def summary_of(data: Iterable[TableStats], markers: Iterable[MarkerStats]) -> Summary:
    """The columnar summary of stats built one by one (tests, small callers)."""
    data, markers = list(data), list(markers)

    def bound(v: int | str | None, kind: type) -> int | str | None:
        return v if isinstance(v, kind) else None

    rows = {
        "tx": [s.tx_id for s in data],
        "coll": [s.collection for s in data],
        "topic": [s.topic for s in data],
        "lsn": [s.commit_lsn for s in data],
        "events": [s.events for s in data],
        "records": [s.records for s in data],
        "seen": [s.first_seen_ms for s in data],
        "t_ord": [s.truncate_order for s in data],
        "truncates": [s.truncates for s in data],
        "toast": [sorted(s.toast_columns) or None for s in data],
        "kl_min": [bound(s.key_min, int) for s in data],
        "kl_max": [bound(s.key_max, int) for s in data],
        "ks_min": [bound(s.key_min, str) for s in data],
        "ks_max": [bound(s.key_max, str) for s in data],
        "k_null": [s.key_min is None or s.key_max is None for s in data],
        "only_inserts": [s.only_inserts for s in data],
    }
    marks = {
        "tx": [m.tx_id for m in markers],
        "lsn": [m.commit_lsn for m in markers],
        "has_end": [m.has_end for m in markers],
        "records": [m.records for m in markers],
        "seen": [m.first_seen_ms for m in markers],
        "ts": [m.commit_ts_ms for m in markers],
    }
    ended = [(m, c, n) for m in markers if m.has_end for c, n in m.expected.items()]
    expected = {
        "tx": [m.tx_id for m, _, _ in ended],
        "lsn": [m.commit_lsn for m, _, _ in ended],
        "coll": [c for _, c, _ in ended],
        "expected": [n for _, _, n in ended],
    }
    return Summary(
        pa.table(rows, schema=DATA_SCHEMA),
        pa.table(marks, schema=MARKER_SCHEMA),
        pa.table(expected, schema=EXPECTED_SCHEMA),
    )


def decide(data: Iterable[TableStats], markers: Iterable[MarkerStats], watermark: int) -> Plan:
    """`plan` of stats built one by one."""
    return plan(summary_of(data, markers), watermark)


def _after(table: pa.Table, lsn: int) -> pa.Table:
    """The rows above `lsn`; the table itself when all are (a filter copies what it keeps)."""
    low = pc.min(table["lsn"]).as_py()
    if low is not None and low > lsn and table["lsn"].null_count == 0:
        return table
    return table.filter(pc.greater(table["lsn"], lsn))


def _array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _numpy(column: pa.ChunkedArray | pa.Array, fill: object) -> np.ndarray:
    return pc.fill_null(column, fill).to_numpy(zero_copy_only=False)


#: One row per transaction above the watermark: what the cut in commit order needs. Planned on
#: the driver, `plan` derives it from a `Summary`; a large batch has Spark derive it
#: (transaction_stats.py), so only this row per transaction reaches the driver.
TX_SCHEMA = pa.schema(
    [
        ("tx", pa.string()),
        ("lsn", pa.int64()),
        ("seen", pa.int64()),  # first seen (its earliest record), epoch ms
        ("records", pa.int64()),  # Kafka records: data events (repeats included) and markers
        ("has_end", pa.bool_()),
        # The END is here and every table it names has exactly its count of distinct events
        # (and no other table has any).
        ("complete", pa.bool_()),
        ("ts", pa.int64()),  # the source commit time, or null
    ]
)
#: One row per table: its events in the applied transactions (`DATA_SCHEMA` rows, aggregated).
WORK_SCHEMA = pa.schema(
    [
        ("coll", pa.string()),
        ("topic", pa.string()),
        ("events", pa.int64()),
        ("all_t", pa.bool_()),  # every record a truncate
        ("distinct_c", pa.bool_()),  # every event an insert, none arrived twice
        ("dups", pa.bool_()),  # some event arrived more than once
        ("k_null", pa.bool_()),  # some event had no usable key value
        ("long", pa.bool_()),  # every row has integer key bounds
        ("str", pa.bool_()),  # every row has string key bounds
        ("kl_min", pa.int64()),
        ("kl_max", pa.int64()),
        ("ks_min", pa.string()),
        ("ks_max", pa.string()),
        ("t_lsn", pa.int64()),  # the latest truncate (commit_lsn, total_order), or nulls
        ("t_ord", pa.int64()),
        ("toast", pa.list_(pa.string())),  # columns some event left unchanged, or null
    ]
)


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a batch's applied prefix of commit order ends, and what waits after it."""

    watermark_before: int
    watermark_after: int
    applied_transactions: int
    commit_ts_ms: int | None  # of the last applied transaction
    pending_transactions: int
    pending_records: int
    # The oldest waiting transactions (NAMED_PENDING at most); what the ended ones miss is
    # not filled in yet: () until `describe` (which the driver's `plan` runs, and a batch
    # planned in Spark only for an error message).
    oldest: tuple[TxSummary, ...]

    def plan(self, tables: tuple[TableWork, ...], pending: tuple[TxSummary, ...]) -> Plan:
        return Plan(
            self.watermark_before,
            self.watermark_after,
            self.applied_transactions,
            tables,
            pending,
            self.pending_records,
            self.commit_ts_ms,
            self.pending_transactions,
        )


def plan(summary: Summary, watermark: int) -> Plan:
    """Plan one batch from its summary, on the driver. Raises `TransactionError` when the
    producer broke the ordering contract (data events without END although a later
    transaction ended).

    Every step is a vectorized pass, a hash join or a sort over the summary's rows:
    O(rows · log) whatever the transactions' shape."""
    data = _after(summary.data, watermark)  # at or below: already applied (a replay)
    markers = _after(summary.markers, watermark)
    expected = _after(summary.expected, watermark)
    c = cut(_transactions(data, markers, _differs(data, expected)), watermark)
    # Filters copy what they keep: only the columns each step reads.
    applied = data.drop_columns(["tx", "seen"]).filter(
        pc.less_equal(data["lsn"], c.watermark_after)
    )
    tables = table_works(_table_work(applied))
    return c.plan(tables, describe(c.oldest, Summary(data, markers, expected)))


def _differs(data: pa.Table, expected: pa.Table) -> pa.Table:
    """Every (transaction, table) whose count of distinct events differs from its END's."""
    counts = data.select(["tx", "coll", "events"]).join(
        expected.select(["tx", "coll", "expected"]),
        keys=["tx", "coll"],
        join_type="full outer",
        use_threads=False,
    )
    return counts.filter(
        pc.not_equal(pc.fill_null(counts["events"], 0), pc.fill_null(counts["expected"], 0))
    )


def _transactions(data: pa.Table, markers: pa.Table, differs: pa.Table) -> pa.Table:
    """The summary's rows per transaction, in `TX_SCHEMA`."""
    rows = ["tx", "lsn", "seen", "records"]
    txs = (
        pa.concat_tables([data.select(rows), markers.select(rows)])
        .group_by("tx", use_threads=False)
        .aggregate([("lsn", "max"), ("seen", "min"), ("records", "sum")])
        .rename_columns(["tx", "lsn", "seen", "records"])
        .join(
            markers.select(["tx", "has_end", "ts"]),
            keys="tx",
            join_type="left outer",
            use_threads=False,
        )
    )
    ended = pc.fill_null(txs["has_end"], False)
    short = pc.is_in(txs["tx"], value_set=_array(differs["tx"]))
    complete = pc.and_(ended, pc.invert(pc.fill_null(short, False)))
    return pa.Table.from_arrays(
        [txs["tx"], txs["lsn"], txs["seen"], txs["records"], ended, complete, txs["ts"]],
        schema=TX_SCHEMA,
    )


def cut(txs: pa.Table, watermark: int) -> Cut:
    """The applied prefix of commit order: complete transactions up to (not including) the
    first one whose END is here but whose events are not all; one with no END yet does not
    block (it committed later, or the check below finds that the producer broke the
    contract). `txs`: `TX_SCHEMA` rows; those at or below the watermark are replays."""
    txs = _after(txs, watermark).sort_by("lsn")
    lsn = _numpy(txs["lsn"], 0)
    ended = _numpy(txs["has_end"], False)
    complete = ended & _numpy(txs["complete"], False)
    blocked = ended & ~complete
    first_blocked = int(np.argmax(blocked)) if blocked.any() else len(lsn)
    applied = complete & (np.arange(len(lsn)) < first_blocked)
    w_after = int(lsn[applied].max()) if applied.any() else watermark
    orphans = np.flatnonzero(~applied & (lsn <= w_after))
    if len(orphans):
        raise TransactionError(
            "data events without an END marker although later transactions ended "
            "(is the transaction topic single-partition, and are markers published?): "
            + "; ".join(
                f"tx {txs['tx'][int(i)].as_py()} at commit_lsn {lsn[i]}" for i in orphans[:5]
            )
        )
    last_ts = txs["ts"].filter(pa.array(applied))[-1].as_py() if applied.any() else None
    waiting = txs.filter(pa.array(lsn > w_after))
    return Cut(
        watermark,
        w_after,
        int(applied.sum()),
        last_ts,
        waiting.num_rows,
        int(pc.sum(waiting["records"]).as_py() or 0),
        _oldest(waiting),
    )


def _table_work(rows: pa.Table) -> pa.Table:
    """Per table, in `WORK_SCHEMA`: what the applied transactions' events (`DATA_SCHEMA`
    rows) ask of its MERGE."""
    if rows.num_rows == 0:
        return WORK_SCHEMA.empty_table()
    flags = rows.select(
        ["coll", "topic", "events", "k_null", "kl_min", "kl_max", "ks_min", "ks_max"]
    )
    flags = flags.append_column("all_t", pc.equal(rows["truncates"], rows["records"]))
    flags = flags.append_column(
        "distinct_c", pc.and_(rows["only_inserts"], pc.equal(rows["events"], rows["records"]))
    )
    flags = flags.append_column("dups", pc.not_equal(rows["events"], rows["records"]))
    flags = flags.append_column("long", pc.is_valid(rows["kl_min"]))
    flags = flags.append_column("str", pc.is_valid(rows["ks_min"]))
    agg = flags.group_by("coll", use_threads=False).aggregate(
        [(n, how) for n, how in _WORK_AGGREGATES if how]
    )
    # Truncates and unchanged-TOAST columns: rows that have them, usually few.
    truncate: dict[str, Point] = {}
    cuts = rows.filter(pc.is_valid(rows["t_ord"])).select(["coll", "lsn", "t_ord"])
    for c, at, order in zip(*(cuts[n].to_pylist() for n in cuts.column_names), strict=True):
        truncate[c] = max(truncate.get(c, (at, order)), (at, order))
    toast: dict[str, set[str]] = {}
    kept = rows.filter(pc.is_valid(rows["toast"]))
    lists = _array(kept["toast"])
    colls = pc.take(_array(kept["coll"]), pc.list_parent_indices(lists))
    for c, name in zip(colls.to_pylist(), pc.list_flatten(lists).to_pylist(), strict=True):
        toast.setdefault(c, set()).add(name)
    names = _array(agg["coll"]).to_pylist()
    return pa.Table.from_arrays(
        [agg[f"{n}_{how}"] if how else agg[n] for n, how in _WORK_AGGREGATES]
        + [
            pa.array([truncate.get(c, (None, None))[0] for c in names], pa.int64()),
            pa.array([truncate.get(c, (None, None))[1] for c in names], pa.int64()),
            pa.array(
                [sorted(toast[c]) if c in toast else None for c in names],
                WORK_SCHEMA.field("toast").type,
            ),
        ],
        schema=WORK_SCHEMA,
    )


# WORK_SCHEMA's columns up to the truncate, and the Arrow aggregate each comes from.
_WORK_AGGREGATES = (
    ("coll", ""),
    ("topic", "min"),
    ("events", "sum"),
    ("all_t", "all"),
    ("distinct_c", "all"),
    ("dups", "any"),
    ("k_null", "any"),
    ("long", "all"),
    ("str", "all"),
    ("kl_min", "min"),
    ("kl_max", "max"),
    ("ks_min", "min"),
    ("ks_max", "max"),
)


def table_works(rows: pa.Table) -> tuple[TableWork, ...]:
    """`WORK_SCHEMA` rows as the MERGEs' inputs, by collection."""
    work = []
    for r in rows.sort_by("coll").to_pylist():
        low = high = None
        if not r["k_null"] and r["long"]:
            low, high = r["kl_min"], r["kl_max"]
        elif not r["k_null"] and r["str"]:
            low, high = r["ks_min"], r["ks_max"]
        work.append(
            TableWork(
                collection=r["coll"],
                topic=r["topic"],
                events=r["events"],
                only_truncates=bool(r["all_t"]),
                truncate=None if r["t_ord"] is None else (r["t_lsn"], r["t_ord"]),
                toast_columns=frozenset(r["toast"] or ()),
                key_min=low,
                key_max=high,
                only_distinct_inserts=bool(r["distinct_c"]),
                duplicates=bool(r["dups"]),
            )
        )
    return tuple(work)


def _oldest(waiting: pa.Table) -> tuple[TxSummary, ...]:
    """The oldest waiting transactions (by first seen, then commit order), without what the
    ended ones miss."""
    if waiting.num_rows == 0:
        return ()
    order = [("seen", "ascending"), ("lsn", "ascending"), ("tx", "ascending")]
    oldest = waiting.take(pc.select_k_unstable(waiting, NAMED_PENDING, sort_keys=order))
    return tuple(
        TxSummary(tx, at, True, (), seen)
        if ended
        else TxSummary(tx, at, False, ("END marker not seen yet",), seen)
        for tx, at, ended, seen in zip(
            *(oldest.sort_by(order)[n].to_pylist() for n in ("tx", "lsn", "has_end", "seen")),
            strict=True,
        )
    )


def describe(pending: tuple[TxSummary, ...], summary: Summary) -> tuple[TxSummary, ...]:
    """`pending` with, for each ended transaction, the tables short of events (or with more
    than its END counts) and their counts, from the summary's rows of those transactions."""
    names = pa.array([t.tx_id for t in pending if t.has_end], pa.string())
    if len(names) == 0:
        return pending
    data = summary.data.filter(pc.is_in(summary.data["tx"], value_set=names))
    expected = summary.expected.filter(pc.is_in(summary.expected["tx"], value_set=names))
    gaps = _differs(data, expected).sort_by("coll")
    short: dict[str, list[str]] = {}
    for tx, c, seen, wanted in zip(
        *(gaps[n].to_pylist() for n in ("tx", "coll", "events", "expected")), strict=True
    ):
        short.setdefault(tx, []).append(f"{c}: {seen or 0} of {wanted or 0} events")
    return tuple(
        replace(t, missing=tuple(short.get(t.tx_id, ()))) if t.has_end else t for t in pending
    )


def stale(oldest: Iterable[TxSummary], now_ms: int, max_age_s: float) -> list[TxSummary]:
    """The transactions among `oldest` incomplete for longer than the limit."""
    return [t for t in oldest if (now_ms - t.first_seen_ms) / 1000 > max_age_s]


def check_age(oldest: Iterable[TxSummary], now_ms: int, max_age_s: float) -> None:
    """An incomplete transaction older than the limit stops the job, naming it."""
    old = stale(oldest, now_ms, max_age_s)
    if old:
        raise TransactionError(
            f"transaction(s) incomplete for more than {max_age_s:.0f}s: "
            + "; ".join(
                f"tx {t.tx_id} (commit_lsn {t.commit_lsn}, first seen "
                f"{(now_ms - t.first_seen_ms) / 1000:.0f}s ago): {', '.join(t.missing)}"
                for t in old[:5]
            )
        )
