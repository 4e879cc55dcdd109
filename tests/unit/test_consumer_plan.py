"""Pure planning (reassembly.decide), lake column forms (conversions) and verify's text forms."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from spark_consumer import verify_forms as forms
from spark_consumer.columns import RowField
from spark_consumer.conversions import DEFAULT_CONVERSIONS
from spark_consumer.errors import TransactionError
from spark_consumer.reassembly import MarkerStats, TableStats, decide, plan

pytestmark = pytest.mark.unit


def stats(tx: str, lsn: int, coll: str = "public.a", events: int = 1, **kw: object) -> TableStats:
    return TableStats(
        tx,
        coll,
        f"db.{coll}",
        lsn,
        events,
        kw.pop("records", events),  # type: ignore[arg-type]
        kw.pop("seen", 0),
        **kw,
    )  # type: ignore[arg-type]


def end(tx: str, lsn: int, seen: int = 0, **expected: int) -> MarkerStats:
    return MarkerStats(
        tx, lsn, True, {k.replace("__", "."): v for k, v in expected.items()}, 2, seen
    )


def test_applies_complete_prefix_and_waits_after_first_incomplete() -> None:
    data = [stats("1:100", 100), stats("2:200", 200), stats("3:300", 300)]
    marks = [
        end("1:100", 100, public__a=1),
        end("2:200", 200, public__a=2),
        end("3:300", 300, public__a=1),
    ]
    plan = decide(data, marks, watermark=-1)
    assert (plan.watermark_after, plan.applied_transactions) == (100, 1)
    assert [t.tx_id for t in plan.pending] == ["2:200", "3:300"]
    assert plan.pending[0].missing == ("public.a: 1 of 2 events",)
    assert plan.pending_records == 1 + 2 + 1 + 2  # data records + BEGIN/END of each
    assert [w.collection for w in plan.tables] == ["public.a"]


def test_replayed_transactions_are_ignored_and_nothing_waits() -> None:
    plan = decide([stats("1:100", 100)], [end("1:100", 100, public__a=1)], watermark=100)
    assert (plan.watermark_after, plan.applied_transactions, plan.tables) == (100, 0, ())
    assert plan.pending == () and plan.pending_records == 0


def test_table_work_merges_truncates_toast_and_key_bounds() -> None:
    data = [
        stats("1:100", 100, key_min=5, key_max=9),
        stats(
            "2:200",
            200,
            events=2,
            truncate_order=1,
            truncates=1,
            records=2,
            toast_columns=frozenset({"doc"}),
            key_min=1,
            key_max=3,
        ),
        stats("2:200", 200, coll="public.b", key_min="a", key_max="c"),
    ]
    marks = [end("1:100", 100, public__a=1), end("2:200", 200, public__a=2, public__b=1)]
    a, b = decide(data, marks, watermark=-1).tables
    assert (a.events, a.truncate, a.toast_columns, a.key_min, a.key_max) == (
        3,
        (200, 1),
        frozenset({"doc"}),
        1,
        9,
    )
    assert not a.only_truncates and (b.key_min, b.key_max) == ("a", "c")


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        ({"only_inserts": True}, True),
        ({"only_inserts": False}, False),  # an update, delete, read or truncate somewhere
        ({"only_inserts": True, "records": 2}, False),  # an event arrived twice (producer replay)
    ],
)
def test_insert_only_form_needs_every_applied_event_a_distinct_insert(
    second: dict[str, object], expected: bool
) -> None:
    data = [
        stats("1:100", 100, only_inserts=True),
        stats("2:200", 200, **second),
        stats("3:300", 300, only_inserts=False),
    ]  # pending: must not count
    marks = [end("1:100", 100, public__a=1), end("2:200", 200, public__a=1)]
    (a,) = decide(data, marks, watermark=-1).tables
    assert a.only_distinct_inserts is expected


@pytest.mark.parametrize(("records", "expected"), [(1, False), (2, True)])
def test_a_table_is_marked_when_an_applied_event_arrived_twice(
    records: int, expected: bool
) -> None:
    """The changelog drops copies only then; a waiting transaction's copies do not count."""
    data = [
        stats("1:100", 100),
        stats("2:200", 200, records=records),
        stats("3:300", 300, records=2),
    ]  # pending: must not count
    marks = [end("1:100", 100, public__a=1), end("2:200", 200, public__a=1)]
    (a,) = decide(data, marks, watermark=-1).tables
    assert a.duplicates is expected


def test_no_key_bounds_when_some_event_has_none() -> None:
    data = [stats("1:100", 100, key_min=5, key_max=9), stats("2:200", 200)]
    marks = [end("1:100", 100, public__a=1), end("2:200", 200, public__a=1)]
    (a,) = decide(data, marks, watermark=-1).tables
    assert (a.key_min, a.key_max) == (None, None)


def test_events_without_end_before_an_ended_transaction_are_an_error() -> None:
    data = [stats("1:100", 100), stats("2:200", 200)]
    with pytest.raises(TransactionError, match=r"tx 1:100 at commit_lsn 100"):
        decide(data, [end("2:200", 200, public__a=1)], watermark=-1)


def test_events_without_end_after_the_last_end_wait() -> None:
    plan = decide(
        [stats("1:100", 100), stats("2:200", 200, seen=7)],
        [end("1:100", 100, public__a=1)],
        watermark=-1,
    )
    assert plan.watermark_after == 100
    assert [(t.tx_id, t.has_end, t.missing, t.first_seen_ms) for t in plan.pending] == [
        ("2:200", False, ("END marker not seen yet",), 7)
    ]


def test_end_with_no_table_events_applies() -> None:
    plan = decide([], [end("1:100", 100)], watermark=-1)
    assert (plan.watermark_after, plan.applied_transactions) == (100, 1)


DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ARRAY = {
    "type": "record",
    "name": "a",
    "fields": [
        {"name": "dims", "type": {"type": "array", "items": "int"}},
        {"name": "lower_bounds", "type": {"type": "array", "items": "int"}},
        {"name": "elements", "type": {"type": "array", "items": ["null", "int"]}},
    ],
}


@pytest.mark.parametrize(
    ("avro", "lake"),
    [
        (["null", DEC, "string"], ["c", "c__text"]),
        (["null", {"type": "int", "logicalType": "date"}, "string"], ["c", "c__text"]),
        (["null", {"type": "long", "logicalType": "time-micros"}, "string"], ["c"]),
        (["null", "string", "bytes"], ["c", "c__bytes"]),
        (["null", ARRAY], ["c", "c__shape"]),  # contract 1-2: always the record
        (["null", {"type": "array", "items": ["null", "int"]}, ARRAY], ["c", "c__shape"]),
        (["null", "long"], ["c"]),
        (["null", "string"], ["c"]),
    ],
)
def test_lake_columns_per_avro_form(avro: object, lake: list[str]) -> None:
    f = RowField("c", avro, None)
    assert DEFAULT_CONVERSIONS.lake_columns((f,)) == lake
    assert DEFAULT_CONVERSIONS.companions((f,)) == {"c": lake[1:]}


def col(base: str, element: str | None = None) -> forms.ColumnInfo:
    return forms.ColumnInfo("c", "c", base, element)


@pytest.mark.parametrize(
    ("base", "row", "text"),
    [
        ("numeric", {"c": Decimal("10.50")}, "10.50"),
        ("numeric", {"c": Decimal("0E-8")}, "0.00000000"),
        ("numeric", {"c": None, "c__text": "NaN"}, "NaN"),
        ("date", {"c": date(99, 1, 2)}, "0099-01-02"),
        ("date", {"c": None, "c__text": "infinity"}, "infinity"),
        ("timestamp", {"c": datetime(2024, 1, 2, 3, 4, 5, 120000)}, "2024-01-02 03:04:05.12"),
        ("timestamptz", {"c": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}, "2024-01-02 03:04:05+00"),
        ("time", {"c": "24:00:00.000000"}, "24:00:00"),
        ("time", {"c": "01:02:03.500000"}, "01:02:03.5"),
        ("bool", {"c": False}, "false"),
        ("bytea", {"c": b"\x01\xff"}, "\\x01ff"),
        ("int8", {"c": 7}, "7"),
        ("text", {"c": None}, None),
        ("interval", {"c": {"months": 14, "days": -3, "micros": 5}}, "14,-3,5"),
    ],
)
def test_lake_values_render_as_postgres_text(
    base: str, row: dict[str, object], text: str | None
) -> None:
    assert forms.lake_text(col(base), row) == text


def test_arrays_render_dims_and_elements() -> None:
    assert forms.lake_text(col("_int4", "int4"), {"c": [1, None, 3]}) == '[1:3]|["1", null, "3"]'
    shaped = {"c": [1, 2, 3, 4], "c__shape": {"dims": [2, 2], "lower_bounds": [0, 1]}}
    assert forms.lake_text(col("_int4", "int4"), shaped) == '[0:1][1:2]|["1", "2", "3", "4"]'
    assert forms.lake_text(col("_int4", "int4"), {"c": []}) == "|[]"
    assert forms.pg_value(col("_int4", "int4"), '[1:3]|["1", null, "3"]') == (
        '[1:3]|["1", null, "3"]'
    )


def test_floats_compare_as_ieee_values() -> None:
    assert forms.lake_text(col("float4"), {"c": 1.100000023841858}) == forms.pg_value(
        col("float4"), 1.1
    )
    assert forms.lake_text(col("float8"), {"c": float("nan")}) == "NaN"
    assert forms.lake_text(col("float8"), {"c": 0.1}) != forms.pg_value(col("float8"), 0.2)


def test_planning_a_million_small_transactions_is_linear() -> None:
    # The TPC-B shape: many transactions of a few changes on several tables. A per-transaction
    # rebuild of the applied set made this quadratic (38 s for 16k transactions); columnar
    # planning takes about a second for 1M. The summary is built as Spark hands it back
    # (Arrow columns), so this times the batch's own path. The bound is generous: it catches
    # the quadratic class of mistake, not a slow machine.
    import time

    import numpy as np
    import pyarrow as pa

    from spark_consumer.reassembly import DATA_SCHEMA, EXPECTED_SCHEMA, MARKER_SCHEMA, Summary

    n = 1_000_000
    tables = np.array(["public.a", "public.b", "public.c"], dtype=object)
    lsn = np.arange(1, n + 1, dtype=np.int64)
    tx = pa.array([f"{i}:{i}" for i in range(1, n + 1)])
    coll = pa.array(tables[lsn % 3])
    ones, zeros = pa.array(np.ones(n, np.int64)), pa.array(np.zeros(n, np.int64))
    none = pa.nulls(n, pa.int64())
    topic = pa.array(np.char.add("db.", tables[lsn % 3].astype(str)))
    key, no_key = pa.array(lsn), pa.nulls(n, pa.string())
    columns = [tx, coll, topic, pa.array(lsn), ones, ones, zeros, none, zeros]
    columns += [pa.nulls(n, pa.list_(pa.string())), key, key, no_key, no_key]
    columns += [pa.array(np.zeros(n, bool)), pa.array(np.ones(n, bool))]
    data = pa.Table.from_arrays(columns, schema=DATA_SCHEMA)
    ended = pa.array(lsn[:-1])  # the last one has no END yet: it waits
    markers = pa.Table.from_arrays(
        [tx[:-1], ended, pa.array(np.ones(n - 1, bool)), ones[:-1], zeros[:-1], none[:-1]],
        schema=MARKER_SCHEMA,
    )
    expected = pa.Table.from_arrays([tx[:-1], ended, coll[:-1], ones[:-1]], schema=EXPECTED_SCHEMA)
    started = time.perf_counter()
    result = plan(Summary(data, markers, expected), watermark=-1)
    elapsed = time.perf_counter() - started
    assert result.applied_transactions == n - 1
    assert result.watermark_after == n - 1
    assert [t.tx_id for t in result.pending] == [f"{n}:{n}"]
    assert sorted(w.collection for w in result.tables) == list(tables)
    assert sum(w.events for w in result.tables) == n - 1
    assert [(w.key_min, w.key_max) for w in result.tables] == [(3, n - 1), (1, n - 3), (2, n - 2)]
    assert elapsed < 60, f"planning 1M transactions took {elapsed:.1f}s"


def test_plan_carries_the_commit_time_of_the_last_applied_transaction() -> None:
    data = [stats("1:100", 100), stats("2:200", 200)]
    marks = [
        MarkerStats("1:100", 100, True, {"public.a": 1}, 2, 0, 1_111),
        MarkerStats("2:200", 200, False, {}, 1, 0, 2_222),
    ]  # no END yet: waits
    plan = decide(data, marks, watermark=-1)
    assert (plan.watermark_after, plan.commit_ts_ms) == (100, 1_111)
    assert decide([], [], watermark=-1).commit_ts_ms is None
