"""A large batch is planned in Spark (transaction_stats.SparkStats), a small one on the driver
(reassembly.plan, itself checked against a plain reference in tests/unit). The same random
aggregations, built in the layout the batch's aggregation has, must plan alike both ways:
the cut, the tables' work, the waiting transactions and what the oldest of them miss, and the
unusable groups."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from spark_consumer.column_cache import ColumnCache
from spark_consumer.errors import TransactionError
from spark_consumer.reassembly import MarkerStats, Plan, TableStats
from spark_consumer.transaction_stats import DriverStats, SparkStats, stats_of
from tests.support.plan_batches import batches
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.integration

MESSAGES = "walbridge.message"
NOW_MS = 1_000
# The aggregation's output (transaction_stats._group_columns + _aggregates).
GROUPS = (
    "kind string, bad string, tx string, coll string, topic string, lsn long, events int, "
    "records long, seen long, t_ord long, truncates long, toast array<string>, kl_min long, "
    "kl_max long, ks_min string, ks_max string, k_null boolean, not_insert boolean, "
    "has_end boolean, dcs array<struct<data_collection:string,event_count:long>>, ts long, "
    "first_part int, first_off long"
)


def data_group(s: TableStats, seen_now: bool) -> tuple[Any, ...]:
    ints = isinstance(s.key_min, int) and isinstance(s.key_max, int)
    strs = isinstance(s.key_min, str) and isinstance(s.key_max, str)
    return (
        "d",
        None,
        s.tx_id,
        s.collection,
        s.topic,
        s.commit_lsn,
        s.events,
        s.records,
        None if seen_now else s.first_seen_ms,  # every record read by this batch
        s.truncate_order,
        s.truncates,
        sorted(s.toast_columns) or None,
        s.key_min if ints else None,
        s.key_max if ints else None,
        s.key_min if strs else None,
        s.key_max if strs else None,
        s.key_min is None or s.key_max is None,
        not s.only_inserts,
        None,
        None,
        None,
        None,
        None,
    )


def marker_group(m: MarkerStats, messages: int) -> tuple[Any, ...]:
    named = [(c, n) for c, n in m.expected.items()]
    if messages:
        named.append((MESSAGES, messages))  # the messages' collection: not a table
    return (
        "m",
        None,
        m.tx_id,
        None,
        "db.transaction",
        m.commit_lsn,
        0,
        m.records,
        m.first_seen_ms,
        None,
        0,
        None,
        None,
        None,
        None,
        None,
        True,
        True,
        m.has_end,
        named if m.has_end else None,
        m.commit_ts_ms,
        None,
        None,
    )


BAD = ("d", "Avro body does not decode", None, None, "db.s.a", None, 0, 3, None, None, 0)
BAD_TAIL = (None, None, None, None, None, True, True, None, None, None, 2, 40)


def outcome(stats: DriverStats | SparkStats, watermark: int) -> Plan | str:
    """The plan, with what its named waiting transactions miss (as an error message says)."""
    try:
        plan = stats.plan(watermark)
    except TransactionError:
        return "TransactionError"
    return replace(plan, pending=stats.describe(plan.pending))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches(), st.data())
def test_spark_plans_as_the_driver(
    spark: SparkSession,
    batch: tuple[list[TableStats], list[MarkerStats], int],
    draw: st.DataObject,
) -> None:
    data, markers, watermark = batch
    if draw.draw(st.booleans()):
        # Every transaction ended and whole: many apply, so the tables' work aggregates
        # several transactions each (truncates, TOAST columns, bounds, inserts).
        markers = [MarkerStats(s.tx_id, s.commit_lsn, True, {}, 2, s.first_seen_ms) for s in data]
        counts: dict[str, dict[str, int]] = {}
        for s in data:
            counts.setdefault(s.tx_id, {})[s.collection] = s.events
        markers = [
            replace(m, expected=counts[m.tx_id]) for m in {m.tx_id: m for m in markers}.values()
        ]
    rows = [data_group(s, draw.draw(st.booleans())) for s in data]
    rows += [marker_group(m, draw.draw(st.sampled_from((0, 0, 1)))) for m in markers]
    if draw.draw(st.booleans()):
        rows.append(BAD + BAD_TAIL)
    groups = spark.createDataFrame(rows, GROUPS)
    cache = ColumnCache()
    driver = stats_of(groups, MESSAGES, NOW_MS, cache)
    in_spark = stats_of(groups, MESSAGES, NOW_MS, cache, in_spark=True)
    try:
        assert isinstance(driver, DriverStats) and isinstance(in_spark, SparkStats)
        assert in_spark.bad == driver.bad
        assert outcome(in_spark, watermark) == outcome(driver, watermark)
    finally:
        for frame in in_spark.frames:
            frame.unpersist()
