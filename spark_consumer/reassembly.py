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

The Spark side (`spark_consumer.transaction_stats`) aggregates a batch into the small records below,
one per (transaction, table) and one per transaction's markers; `decide` plans from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from spark_consumer.errors import TransactionError

Point = tuple[int, int]  # (commit_lsn, total_order): the dedup and ordering key


# slots: a catch-up batch holds ~185k of these records in the driver; with a __dict__ each
# took 352 bytes, without 136.
@dataclass(frozen=True, slots=True)
class TableStats:
    """Data events of one transaction on one table, as aggregated from the batch."""

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
    """The markers (BEGIN/END) of one transaction seen in the batch."""

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


@dataclass(frozen=True, slots=True)
class Plan:
    watermark_before: int  # commit_lsn applied before this batch (-1: nothing yet)
    watermark_after: int  # commit_lsn applied after this batch
    applied_transactions: int
    tables: tuple[TableWork, ...]
    pending: tuple[TxSummary, ...] = field(default=())  # oldest first
    pending_records: int = 0
    # Source commit time of the last applied transaction (None: nothing applied)
    commit_ts_ms: int | None = None

    @property
    def pending_transactions(self) -> int:
        return len(self.pending)

    @property
    def oldest_pending(self) -> TxSummary | None:
        return self.pending[0] if self.pending else None


def _summary(
    tx_id: str, lsn: int, marker: MarkerStats | None, seen: Mapping[str, TableStats]
) -> TxSummary:
    firsts = [s.first_seen_ms for s in seen.values()] + ([marker.first_seen_ms] if marker else [])
    if marker is None or not marker.has_end:
        return TxSummary(tx_id, lsn, False, ("END marker not seen yet",), min(firsts))
    counts = {c: s.events for c, s in seen.items()}
    missing = tuple(
        f"{c}: {counts.get(c, 0)} of {marker.expected.get(c, 0)} events"
        for c in sorted(set(marker.expected) | set(counts))
        if counts.get(c, 0) != marker.expected.get(c, 0)
    )
    return TxSummary(tx_id, lsn, True, missing, min(firsts))


def _bounds(stats: list[TableStats]) -> tuple[int | str | None, int | str | None]:
    lows = [s.key_min for s in stats]
    highs = [s.key_max for s in stats]
    if any(v is None for v in lows + highs):
        return None, None
    if len({type(v) for v in lows + highs}) != 1:
        return None, None
    return min(lows), max(highs)  # type: ignore[type-var]


def decide(data: Iterable[TableStats], markers: Iterable[MarkerStats], watermark: int) -> Plan:
    """Plan one batch from its aggregates. Raises `TransactionError` when the producer broke
    the ordering contract (data events without END although a later transaction ended)."""
    by_tx: dict[str, dict[str, TableStats]] = {}
    lsn: dict[str, int] = {}
    for s in data:
        if s.commit_lsn <= watermark:
            continue  # already applied (a replay after a crash)
        by_tx.setdefault(s.tx_id, {})[s.collection] = s
        lsn[s.tx_id] = s.commit_lsn
    mark: dict[str, MarkerStats] = {}
    for m in markers:
        if m.commit_lsn <= watermark:
            continue
        mark[m.tx_id] = m
        lsn[m.tx_id] = m.commit_lsn

    def complete(tx: str) -> bool:
        m = mark.get(tx)
        if m is None or not m.has_end:
            return False
        seen = {c: s.events for c, s in by_tx.get(tx, {}).items()}
        return all(seen.get(c, 0) == m.expected.get(c, 0) for c in set(seen) | set(m.expected))

    order = sorted(lsn, key=lambda tx: lsn[tx])
    applied: list[str] = []
    for tx in order:
        marker = mark.get(tx)
        if marker is not None and marker.has_end:
            if not complete(tx):
                break  # the first ended-but-incomplete transaction blocks everything later
            applied.append(tx)
    w_after = lsn[applied[-1]] if applied else watermark
    applied_set = set(applied)  # built once: a set per transaction made planning quadratic
    orphans = [tx for tx in order if lsn[tx] <= w_after and tx not in applied_set]
    if orphans:
        raise TransactionError(
            "data events without an END marker although later transactions ended "
            "(is the transaction topic single-partition, and are markers published?): "
            + "; ".join(f"tx {tx} at commit_lsn {lsn[tx]}" for tx in orphans[:5])
        )

    per_table: dict[str, list[TableStats]] = {}
    for tx in applied:
        for c, s in by_tx.get(tx, {}).items():
            per_table.setdefault(c, []).append(s)
    work = []
    for c, stats in sorted(per_table.items()):
        truncates = [
            (s.commit_lsn, s.truncate_order) for s in stats if s.truncate_order is not None
        ]
        low, high = _bounds(stats)
        work.append(
            TableWork(
                collection=c,
                topic=stats[0].topic,
                events=sum(s.events for s in stats),
                only_truncates=all(s.truncates == s.records for s in stats),
                truncate=max(truncates) if truncates else None,
                toast_columns=frozenset().union(*(s.toast_columns for s in stats)),
                key_min=low,
                key_max=high,
                only_distinct_inserts=all(s.only_inserts and not s.duplicates for s in stats),
            )
        )

    waiting = [tx for tx in order if lsn[tx] > w_after]
    pending = sorted(
        (_summary(tx, lsn[tx], mark.get(tx), by_tx.get(tx, {})) for tx in waiting),
        key=lambda t: (t.first_seen_ms, t.commit_lsn),
    )
    pending_records = sum(
        sum(s.records for s in by_tx.get(tx, {}).values()) + (mark[tx].records if tx in mark else 0)
        for tx in waiting
    )
    last = mark.get(applied[-1]) if applied else None
    return Plan(
        watermark,
        w_after,
        len(applied),
        tuple(work),
        tuple(pending),
        pending_records,
        last.commit_ts_ms if last else None,
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
