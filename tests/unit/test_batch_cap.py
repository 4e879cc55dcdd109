"""Whether Spark's cap on records per batch cut a batch short (spark_consumer/batch_cap.py)."""

from __future__ import annotations

import json
import math
import random

import pytest

from spark_consumer.batch_cap import cut_by_cap, parse_entry, reads_all

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})


def _spark_plan(cap: int, start: dict[str, int], latest: dict[str, int]) -> dict[str, int]:
    """The end offsets Spark's Kafka source plans under maxOffsetsPerTrigger (its rateLimit:
    each partition's share of the cap in proportion to what waits there, rounded down, at
    least 1, never past the latest offset)."""
    sizes = {p: latest[p] - start.get(p, 0) for p in latest if latest[p] - start.get(p, 0) > 0}
    total = sum(sizes.values())
    end = dict(latest)
    for p, size in sizes.items():
        share = cap * (size / total)
        end[p] = min(latest[p], start.get(p, 0) + (math.ceil(share) if share < 1 else int(share)))
    return end


def test_parses_the_kafka_source_line_of_an_entry() -> None:
    text = f'v1\n{META}\n{{"t.a":{{"0":12,"1":7}},"t.snapshot":{{"0":3}}}}'
    assert parse_entry(text) == {"t.a": {"0": 12, "1": 7}, "t.snapshot": {"0": 3}}


@pytest.mark.parametrize(
    "text",
    ["", "v1", f"v1\n{META}", f"{META}\n{META}\n{{}}", f"v1\n{META}\n{{}}\n{{}}", "v1\nx\n[1]"],
)
def test_refuses_what_is_not_an_entry_of_one_source(text: str) -> None:
    with pytest.raises(ValueError):
        parse_entry(text)


def test_no_cap_never_cuts() -> None:
    assert not cut_by_cap({}, {"t": {"0": 10**9}}, 0)


def test_a_batch_of_everything_below_the_cap_is_whole() -> None:
    assert not cut_by_cap({"t": {"0": 10, "1": 10}}, {"t": {"0": 200, "1": 300}}, 500)


def test_rounding_down_every_share_still_counts_as_cut() -> None:
    # The batch of the CI run that failed: 499 offsets over 5 partitions under a cap of 500,
    # and Kafka had more (the data topic's partitions went on to 5,000-odd).
    start = {"d": {"0": 663, "1": 659, "2": 655}, "snap": {"0": 6}, "tx": {"0": 9}}
    end = {"d": {"0": 829, "1": 823, "2": 819}, "snap": {"0": 8}, "tx": {"0": 12}}
    assert cut_by_cap(start, end, 500)


def test_commit_markers_count_though_no_reader_sees_them() -> None:
    # Offsets, not records: a batch of 300 records and 200 commit markers filled the cap.
    assert cut_by_cap({"t": {"0": 0}}, {"t": {"0": 500}}, 500)


def test_every_batch_spark_cuts_short_counts_as_cut() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        parts = rng.randint(1, 12)
        cap = rng.choice([1, 7, 100, 500, 1000])
        start = {str(p): rng.randint(0, 1000) for p in range(parts)}
        latest = {p: o + rng.choice([0, 1, rng.randint(0, 3 * cap)]) for p, o in start.items()}
        end = _spark_plan(cap, start, latest)
        got = cut_by_cap({"t": start}, {"t": end}, cap)
        if end != latest:
            assert got, (cap, start, latest, end)
        advanced = sum(e > start[p] for p, e in end.items())
        if sum(e - start[p] for p, e in end.items()) <= cap - advanced:
            assert not got, (cap, start, latest, end)


def test_a_partition_missing_from_the_start_counts_from_zero() -> None:
    # A new topic: its offsets below where the batch started count too (the safe side).
    assert cut_by_cap({}, {"new": {"0": 600}}, 1000) is False
    assert cut_by_cap({}, {"new": {"0": 1000}}, 1000)


def test_a_cut_batch_read_all_when_nothing_came_since() -> None:
    end = {"t": {"0": 500, "1": 20}}
    assert reads_all(end, {"t": {"0": 500, "1": 20}}, cut=True)
    assert not reads_all(end, {"t": {"0": 500, "1": 21}}, cut=True)


def test_a_batch_the_cap_did_not_cut_read_all_whatever_came_since() -> None:
    assert reads_all({"t": {"0": 5}}, {"t": {"0": 900}}, cut=False)


def test_a_topic_spark_did_not_know_yet_says_no() -> None:
    kafka = {"t": {"0": 5}, "new": {"0": 3}}
    assert not reads_all({"t": {"0": 5}}, kafka, cut=False)
    assert not reads_all({"t": {"0": 5}}, kafka, cut=True)
    # One with nothing in it yet left nothing out.
    assert reads_all({"t": {"0": 5}}, {"t": {"0": 5}, "new": {"0": 0}}, cut=False)
