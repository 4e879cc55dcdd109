"""The aggregation's Arrow rows -> the planner's summary (transaction_stats.summarize), and
the plan made from them: what Spark hands back plans as the hand-built stats do."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from spark_consumer import transaction_stats as ts
from spark_consumer.reassembly import plan

pytestmark = pytest.mark.unit

BIG = 2**63 - 1  # an LSN can use all 64 bits; a float on the way would round it
DCS = pa.list_(pa.struct([("data_collection", pa.string()), ("event_count", pa.int64())]))
# The aggregation's columns and Spark's types for them (transaction_stats._aggregates).
AGG = pa.schema(
    [
        ("kind", pa.string()),
        ("bad", pa.string()),
        ("tx", pa.string()),
        ("coll", pa.string()),
        ("topic", pa.string()),
        ("lsn", pa.int64()),
        ("events", pa.int32()),  # size(collect_set)
        ("records", pa.int64()),
        ("seen", pa.int64()),
        ("t_ord", pa.int64()),
        ("truncates", pa.int64()),
        ("toast", pa.list_(pa.string())),
        ("kl_min", pa.int64()),
        ("kl_max", pa.int64()),
        ("ks_min", pa.string()),
        ("ks_max", pa.string()),
        ("k_null", pa.bool_()),
        ("not_insert", pa.bool_()),
        ("has_end", pa.bool_()),
        ("dcs", DCS),
        ("ts", pa.int64()),
        ("first_part", pa.int32()),
        ("first_off", pa.int64()),
    ]
)


def data(tx: str, lsn: int, coll: str = "s.a", **kw: Any) -> dict[str, Any]:
    row = dict.fromkeys(AGG.names)
    row |= {"kind": "d", "tx": tx, "coll": coll, "topic": f"db.{coll}", "lsn": lsn}
    row |= {"events": 1, "records": 1, "truncates": 0, "k_null": False, "not_insert": True}
    return row | kw


def marker(tx: str, lsn: int, end: bool = True, **kw: Any) -> dict[str, Any]:
    row = dict.fromkeys(AGG.names)
    row |= {"kind": "m", "tx": tx, "topic": "db.transaction", "lsn": lsn, "records": 2}
    row |= {"has_end": end, "dcs": [{"data_collection": "s.a", "event_count": 1}] if end else None}
    return row | kw


def agg(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=AGG)


def test_rows_become_the_planners_tables() -> None:
    summary, bad = ts.summarize(
        agg(
            data("1:5", BIG, seen=7, kl_min=3, kl_max=BIG, toast=["doc"]),
            data("1:5", BIG, coll="s.b", not_insert=False, ks_min="a", ks_max="b"),
            marker(
                "1:5",
                BIG,
                ts=99,
                dcs=[
                    {"data_collection": "s.a", "event_count": 1},
                    {"data_collection": "db.message", "event_count": 4},
                    {"data_collection": "s.b", "event_count": 1},
                ],
            ),
        ),
        "db.message",
        now_ms=1_000,
    )
    assert bad == []
    assert summary.data.to_pylist() == [
        {
            "tx": "1:5",
            "coll": "s.a",
            "topic": "db.s.a",
            "lsn": BIG,
            "events": 1,
            "records": 1,
            "seen": 7,
            "t_ord": None,
            "truncates": 0,
            "toast": ["doc"],
            "kl_min": 3,
            "kl_max": BIG,
            "ks_min": None,
            "ks_max": None,
            "k_null": False,
            "only_inserts": False,
        },
        {
            "tx": "1:5",
            "coll": "s.b",
            "topic": "db.s.b",
            "lsn": BIG,
            "events": 1,
            "records": 1,
            "seen": 1_000,  # read by this batch: seen now
            "t_ord": None,
            "truncates": 0,
            "toast": None,
            "kl_min": None,
            "kl_max": None,
            "ks_min": "a",
            "ks_max": "b",
            "k_null": False,
            "only_inserts": True,
        },
    ]
    assert summary.markers.to_pylist() == [
        {"tx": "1:5", "lsn": BIG, "has_end": True, "records": 2, "seen": 1_000, "ts": 99}
    ]
    # The messages' collection is not a table: its events are never counted.
    assert summary.expected.to_pylist() == [
        {"tx": "1:5", "lsn": BIG, "coll": "s.a", "expected": 1},
        {"tx": "1:5", "lsn": BIG, "coll": "s.b", "expected": 1},
    ]
    p = plan(summary, watermark=-1)
    assert (p.watermark_after, p.applied_transactions, p.commit_ts_ms) == (BIG, 1, 99)
    a, b = p.tables
    assert (a.key_min, a.key_max, a.toast_columns, a.only_distinct_inserts) == (
        3,
        BIG,
        frozenset({"doc"}),
        False,
    )
    assert (b.key_min, b.key_max, b.only_distinct_inserts) == ("a", "b", True)


def test_unusable_groups_are_reported_first_record_first() -> None:
    _, bad = ts.summarize(
        agg(
            data("1:5", 5, bad=ts.NOT_DECODED, records=3, first_part=1, first_off=40),
            data("1:5", 5, bad=ts.NO_TRANSACTION, records=1, first_part=0, first_off=9),
            data("2:6", 6),
        ),
        "db.message",
        now_ms=0,
    )
    assert [(b.partition, b.offset, b.reason, b.count) for b in bad] == [
        (0, 9, ts.NO_TRANSACTION, 1),
        (1, 40, ts.NOT_DECODED, 3),
    ]


def test_an_empty_aggregation_plans_nothing() -> None:
    summary, bad = ts.summarize(agg(), "db.message", now_ms=0)
    p = plan(summary, watermark=10)
    assert bad == [] and (p.watermark_after, p.applied_transactions, p.tables) == (10, 0, ())
    assert p.pending == () and p.pending_records == 0 and p.commit_ts_ms is None


def test_a_begin_without_end_waits() -> None:
    summary, _ = ts.summarize(
        agg(data("1:5", 5, seen=3), marker("1:5", 5, end=False, seen=4)), "m", now_ms=0
    )
    p = plan(summary, watermark=-1)
    assert p.applied_transactions == 0 and p.pending_records == 3
    assert [(t.tx_id, t.has_end, t.first_seen_ms) for t in p.pending] == [("1:5", False, 3)]


def test_spark_chunks_and_null_lists_that_span_values_summarize_alike() -> None:
    rows = [data(f"{i}:{i}", i, coll=c) for i in range(1, 4) for c in ("s.a", "s.b")]
    rows += [
        marker(
            f"{i}:{i}",
            i,
            dcs=[
                {"data_collection": "s.a", "event_count": 1},
                {"data_collection": "s.b", "event_count": 1},
            ],
        )
        for i in range(1, 4)
    ]
    whole = agg(*rows)
    # One chunk per row, as Spark's record batches come, and a BEGIN whose null
    # data_collections still spans values in the list's buffers (Arrow allows it).
    pieces = [whole.slice(i, 1) for i in range(whole.num_rows)]
    begin = agg(marker("4:4", 4, end=False))
    dcs = pa.ListArray.from_arrays(
        pa.array([0, 2], pa.int32()),
        pa.array([{"data_collection": "s.a", "event_count": 9}] * 2, DCS.value_type),
        mask=pa.array([True]),
    )
    begin = begin.set_column(begin.schema.get_field_index("dcs"), "dcs", dcs)
    one, _ = ts.summarize(pa.concat_tables([whole, agg(marker("4:4", 4, end=False))]), "m", 0)
    many, _ = ts.summarize(pa.concat_tables([*pieces, begin]), "m", 0)
    for name in ("data", "markers", "expected"):
        assert getattr(many, name).to_pylist() == getattr(one, name).to_pylist()
    assert len(one.expected) == 6
    p = plan(many, watermark=-1)
    assert (p.applied_transactions, p.watermark_after, [t.tx_id for t in p.pending]) == (
        3,
        3,
        ["4:4"],
    )
