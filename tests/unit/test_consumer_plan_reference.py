"""`reassembly.plan` against a reference: the same rules written the plainest way, one
transaction at a time with dicts (the planner before it went columnar). Random batches of
transactions (complete, short of events, BEGIN only, no markers at all, replays below the
watermark, truncates, TOAST columns, key bounds of either kind) must plan alike, and so must the
same summary split into several Arrow chunks, as Spark hands it back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings

from spark_consumer.errors import TransactionError
from spark_consumer.reassembly import (
    NAMED_PENDING,
    MarkerStats,
    Plan,
    Summary,
    TableStats,
    TableWork,
    TxSummary,
    plan,
    summary_of,
)
from tests.support.plan_batches import batches

pytestmark = pytest.mark.unit


def reference(data: Sequence[TableStats], markers: Sequence[MarkerStats], watermark: int) -> Plan:
    by_tx: dict[str, dict[str, TableStats]] = {}
    lsn: dict[str, int] = {}
    for s in data:
        if s.commit_lsn > watermark:
            by_tx.setdefault(s.tx_id, {})[s.collection] = s
            lsn[s.tx_id] = s.commit_lsn
    mark = {m.tx_id: m for m in markers if m.commit_lsn > watermark}
    lsn |= {tx: m.commit_lsn for tx, m in mark.items()}

    def counts(tx: str) -> dict[str, int]:
        return {c: s.events for c, s in by_tx.get(tx, {}).items()}

    def complete(tx: str) -> bool:
        seen, m = counts(tx), mark[tx]
        return all(seen.get(c, 0) == m.expected.get(c, 0) for c in set(seen) | set(m.expected))

    order = sorted(lsn, key=lsn.__getitem__)
    applied: list[str] = []
    for tx in order:
        if tx in mark and mark[tx].has_end:
            if not complete(tx):
                break
            applied.append(tx)
    w_after = lsn[applied[-1]] if applied else watermark
    done = set(applied)
    orphans = [tx for tx in order if lsn[tx] <= w_after and tx not in done]
    if orphans:
        raise TransactionError(f"orphans: {orphans}")
    per_table: dict[str, list[TableStats]] = {}
    for tx in applied:
        for c, s in by_tx.get(tx, {}).items():
            per_table.setdefault(c, []).append(s)
    work = []
    for c, stats in sorted(per_table.items()):
        bounds = [s.key_min for s in stats] + [s.key_max for s in stats]
        usable = None not in bounds and len({type(v) for v in bounds}) == 1
        cuts = [(s.commit_lsn, s.truncate_order) for s in stats if s.truncate_order is not None]
        work.append(
            TableWork(
                collection=c,
                topic=stats[0].topic,
                events=sum(s.events for s in stats),
                only_truncates=all(s.truncates == s.records for s in stats),
                truncate=max(cuts) if cuts else None,
                toast_columns=frozenset().union(*(s.toast_columns for s in stats)),
                key_min=min(s.key_min for s in stats) if usable else None,  # type: ignore[type-var]
                key_max=max(s.key_max for s in stats) if usable else None,  # type: ignore[type-var]
                only_distinct_inserts=all(s.only_inserts and not s.duplicates for s in stats),
                duplicates=any(s.duplicates for s in stats),
            )
        )
    pending = []
    for tx in (tx for tx in order if lsn[tx] > w_after):
        seen = by_tx.get(tx, {})
        marker_seen = [mark[tx].first_seen_ms] if tx in mark else []
        first = min([s.first_seen_ms for s in seen.values()] + marker_seen)
        if tx not in mark or not mark[tx].has_end:
            pending.append(TxSummary(tx, lsn[tx], False, ("END marker not seen yet",), first))
            continue
        n, want = counts(tx), mark[tx].expected
        missing = tuple(
            f"{c}: {n.get(c, 0)} of {want.get(c, 0)} events"
            for c in sorted(set(n) | set(want))
            if n.get(c, 0) != want.get(c, 0)
        )
        pending.append(TxSummary(tx, lsn[tx], True, missing, first))
    pending.sort(key=lambda t: (t.first_seen_ms, t.commit_lsn, t.tx_id))
    waiting = {t.tx_id for t in pending}
    records = sum(s.records for tx in waiting for s in by_tx.get(tx, {}).values())
    records += sum(mark[tx].records for tx in waiting if tx in mark)
    last = mark[applied[-1]].commit_ts_ms if applied else None
    oldest = tuple(pending[:NAMED_PENDING])
    return Plan(watermark, w_after, len(applied), tuple(work), oldest, records, last, len(pending))


def outcome(run: Any, *args: Any) -> Plan | str:
    try:
        return run(*args)  # type: ignore[no-any-return]
    except TransactionError:
        return "TransactionError"


def chunked(table: pa.Table, size: int) -> pa.Table:
    if table.num_rows <= size:
        return pa.concat_tables([table.slice(0, 0), table])
    parts = [table.slice(i, size) for i in range(0, table.num_rows, size)]
    return pa.concat_tables(parts)


@settings(max_examples=400, deadline=None)
@given(batches())
def test_plan_decides_as_the_reference(
    batch: tuple[list[TableStats], list[MarkerStats], int],
) -> None:
    data, markers, watermark = batch
    want = outcome(reference, data, markers, watermark)
    summary = summary_of(data, markers)
    assert outcome(plan, summary, watermark) == want
    split = Summary(*(chunked(t, 2) for t in (summary.data, summary.markers, summary.expected)))
    assert outcome(plan, split, watermark) == want
