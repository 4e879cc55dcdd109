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

The Spark side (`spark_consumer.transaction_stats`) aggregates a batch into a small summary:
one row per (transaction, table), one per transaction's markers and one per table its END
names (`Summary`); `plan` decides from it, column by column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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
# (transaction_stats.collect). Planning is columnar: a catch-up batch holds ~36k transactions
# over several tables, and a Python object per (transaction, table) cost the driver ~1.8 s and
# ~100 MB per batch; only the transactions that wait become Python objects here.

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


def plan(summary: Summary, watermark: int) -> Plan:
    """Plan one batch from its summary. Raises `TransactionError` when the producer broke the
    ordering contract (data events without END although a later transaction ended).

    Every step is a vectorized pass, a hash join or a sort over the summary's rows:
    O(rows · log) whatever the transactions' shape."""
    data = _after(summary.data, watermark)  # at or below: already applied (a replay)
    markers = _after(summary.markers, watermark)
    expected = _after(summary.expected, watermark)

    # Every (transaction, table) whose count of distinct events differs from its END's.
    counts = data.select(["tx", "coll", "events"]).join(
        expected.select(["tx", "coll", "expected"]),
        keys=["tx", "coll"],
        join_type="full outer",
        use_threads=False,
    )
    differs = counts.filter(
        pc.not_equal(pc.fill_null(counts["events"], 0), pc.fill_null(counts["expected"], 0))
    )

    # One row per transaction, in commit order.
    txs = (
        pa.concat_tables([data.select(["tx", "lsn"]), markers.select(["tx", "lsn"])])
        .group_by("tx", use_threads=False)
        .aggregate([("lsn", "max")])
        .rename_columns(["tx", "lsn"])
        .join(
            markers.select(["tx", "has_end", "ts"]),
            keys="tx",
            join_type="left outer",
            use_threads=False,
        )
        .sort_by("lsn")
    )
    lsn = _numpy(txs["lsn"], 0)
    ended = _numpy(txs["has_end"], False)
    complete = ended & ~_numpy(pc.is_in(txs["tx"], value_set=_array(differs["tx"])), False)
    # The prefix of commit order up to the first ended-but-incomplete transaction: complete
    # transactions apply; one with no END yet does not block (it committed later, or the
    # check below finds that the producer broke the contract).
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
    del counts, txs  # a catch-up batch's are tens of MB: not kept through what follows
    # Filters copy what they keep: only the columns each step reads.
    waiting = _after(data.select(["tx", "lsn", "seen", "records"]), w_after)
    waiting_markers = _after(markers, w_after)
    count, oldest = _pending(waiting, waiting_markers, differs)
    return Plan(
        watermark,
        w_after,
        int(applied.sum()),
        _table_work(data.drop_columns(["tx", "seen"]).filter(pc.less_equal(data["lsn"], w_after))),
        oldest,
        int(pc.sum(waiting["records"]).as_py() or 0)
        + int(pc.sum(waiting_markers["records"]).as_py() or 0),
        last_ts,
        count,
    )


def _table_work(rows: pa.Table) -> tuple[TableWork, ...]:
    """Per table, what the applied transactions' events ask of its MERGE."""
    if rows.num_rows == 0:
        return ()
    flags = rows.select(
        ["coll", "topic", "events", "k_null", "kl_min", "kl_max", "ks_min", "ks_max"]
    )
    flags = flags.append_column("all_t", pc.equal(rows["truncates"], rows["records"]))
    flags = flags.append_column(
        "distinct_c", pc.and_(rows["only_inserts"], pc.equal(rows["events"], rows["records"]))
    )
    flags = flags.append_column("long", pc.is_valid(rows["kl_min"]))
    flags = flags.append_column("str", pc.is_valid(rows["ks_min"]))
    agg = flags.group_by("coll", use_threads=False).aggregate(
        [
            ("topic", "min"),
            ("events", "sum"),
            ("all_t", "all"),
            ("distinct_c", "all"),
            ("k_null", "any"),
            ("long", "all"),
            ("str", "all"),
            ("kl_min", "min"),
            ("kl_max", "max"),
            ("ks_min", "min"),
            ("ks_max", "max"),
        ]
    )
    # Truncates and unchanged-TOAST columns: rows that have them, usually few.
    truncate: dict[str, Point] = {}
    cut = rows.filter(pc.is_valid(rows["t_ord"])).select(["coll", "lsn", "t_ord"])
    for c, at, order in zip(*(cut[n].to_pylist() for n in cut.column_names), strict=True):
        truncate[c] = max(truncate.get(c, (at, order)), (at, order))
    toast: dict[str, set[str]] = {}
    kept = rows.filter(pc.is_valid(rows["toast"]))
    lists = _array(kept["toast"])
    colls = pc.take(_array(kept["coll"]), pc.list_parent_indices(lists))
    for c, name in zip(colls.to_pylist(), pc.list_flatten(lists).to_pylist(), strict=True):
        toast.setdefault(c, set()).add(name)
    work = []
    for r in agg.sort_by("coll").to_pylist():
        c = r["coll"]
        low = high = None
        if not r["k_null_any"] and r["long_all"]:
            low, high = r["kl_min_min"], r["kl_max_max"]
        elif not r["k_null_any"] and r["str_all"]:
            low, high = r["ks_min_min"], r["ks_max_max"]
        work.append(
            TableWork(
                collection=c,
                topic=r["topic_min"],
                events=r["events_sum"],
                only_truncates=bool(r["all_t_all"]),
                truncate=truncate.get(c),
                toast_columns=frozenset(toast.get(c, ())),
                key_min=low,
                key_max=high,
                only_distinct_inserts=bool(r["distinct_c_all"]),
            )
        )
    return tuple(work)


def _pending(
    data: pa.Table, markers: pa.Table, differs: pa.Table
) -> tuple[int, tuple[TxSummary, ...]]:
    """How many transactions wait, and the oldest of them (by first seen, then commit order)."""
    first = (
        pa.concat_tables(
            [data.select(["tx", "lsn", "seen"]), markers.select(["tx", "lsn", "seen"])]
        )
        .group_by("tx", use_threads=False)
        .aggregate([("lsn", "max"), ("seen", "min")])
    )
    if first.num_rows == 0:
        return 0, ()
    order = [("seen_min", "ascending"), ("lsn_max", "ascending"), ("tx", "ascending")]
    oldest = pc.select_k_unstable(first, NAMED_PENDING, sort_keys=order)
    oldest = first.take(oldest).sort_by(order)
    named = _array(oldest["tx"])
    ended = markers.filter(pc.is_in(markers["tx"], value_set=named))
    ended = set(ended.filter(pc.fill_null(ended["has_end"], False))["tx"].to_pylist())
    short: dict[str, list[str]] = {}
    gaps = differs.filter(pc.is_in(differs["tx"], value_set=named)).sort_by("coll")
    for tx, c, seen, wanted in zip(
        *(gaps[n].to_pylist() for n in ("tx", "coll", "events", "expected")), strict=True
    ):
        short.setdefault(tx, []).append(f"{c}: {seen or 0} of {wanted or 0} events")
    return first.num_rows, tuple(
        TxSummary(tx, at, True, tuple(short.get(tx, ())), seen)
        if tx in ended
        else TxSummary(tx, at, False, ("END marker not seen yet",), seen)
        for tx, at, seen in zip(
            *(oldest[n].to_pylist() for n in ("tx", "lsn_max", "seen_min")), strict=True
        )
    )


def check_age(oldest: Iterable[TxSummary], now_ms: int, max_age_s: float) -> None:
    """An incomplete transaction older than the limit stops the job, naming it."""
    stale = [t for t in oldest if (now_ms - t.first_seen_ms) / 1000 > max_age_s]
    if stale:
        raise TransactionError(
            f"transaction(s) incomplete for more than {max_age_s:.0f}s: "
            + "; ".join(
                f"tx {t.tx_id} (commit_lsn {t.commit_lsn}, first seen "
                f"{(now_ms - t.first_seen_ms) / 1000:.0f}s ago): {', '.join(t.missing)}"
                for t in stale[:5]
            )
        )
