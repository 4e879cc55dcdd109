"""A lost replication slot is never silent (issue 39): the real producer against a slot dropped,
or invalidated by max_slot_wal_keep_size, while it was stopped; then --on-slot-loss resnapshot
converging the topics on the source's rows."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from producer.pgoutput import parse_lsn
from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    create_counter_table,
    insert_batches,
    metric,
    query,
    sql,
    unique,
)
from tests.support.slot_loss import invalidate, slot_row

pytestmark = pytest.mark.integration

_RANGE = re.compile(r"from LSN ([0-9A-F]+/[0-9A-F]+) to ([0-9A-F]+/[0-9A-F]+)")


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("slotloss")
    create_counter_table(pg_dsn, name)
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    src = Source.create(pg_dsn, [table], "sloss")
    yield src
    src.drop()


def _slot(source: Source) -> dict[str, Any] | None:
    return slot_row(source.dsn, source.slot)


def _exit_status(producer: ProducerProcess, timeout: float = 120.0) -> int:
    assert producer.proc is not None
    return producer.proc.wait(timeout)


def _streamed_once(source: Source, producer: ProducerProcess, table: str) -> int:
    """Rows 1-10 streamed and confirmed, the producer stopped cleanly; returns the LSN before."""
    before = source.current_lsn()
    producer.start()
    insert_batches(source.dsn, table, 1, 1, 10)
    source.wait_confirmed(source.current_lsn())
    assert producer.stop() == 0, producer.log()
    return before


def _loss_range(log: str) -> tuple[int, int]:
    found = _RANGE.search(log)
    assert found is not None, log
    return parse_lsn(found.group(1)), parse_lsn(found.group(2))


def test_dropped_slot_stops_with_exit_3_and_creates_nothing(
    kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    before = _streamed_once(source, ProducerProcess(source, kafka_bootstrap, registry_url), table)
    sql(source.dsn, f"SELECT pg_drop_replication_slot('{source.slot}')")
    insert_batches(source.dsn, table, 11, 1, 5)  # the changes a new slot would never see
    after_drop = source.current_lsn()

    restarted = ProducerProcess(source, kafka_bootstrap, registry_url).start(wait_ready=False)
    assert _exit_status(restarted) == 3, restarted.log()
    log = restarted.log()
    assert f"replication slot '{source.slot}' is lost: missing (the slot was dropped)" in log
    start, end = _loss_range(log)
    assert before < start <= after_drop  # from what Kafka holds of the first run ...
    assert end >= after_drop  # ... to the server's position when the loss was found
    assert "--on-slot-loss resnapshot" in log
    assert _slot(source) is None  # never re-created quietly


def _invalidate(source: Source) -> None:
    invalidate(source.dsn, source.slot)


def _apply(records: list[Any]) -> dict[int, dict[str, Any]]:
    """The table a reader holds after every event, in the dedup key's order (a truncate clears
    it), as the lake applies them."""
    rows: dict[int, dict[str, Any]] = {}
    events = sorted(
        (r.value for r in records),
        key=lambda v: (v["source"]["commit_lsn"], v["transaction"]["total_order"]),
    )
    for v in events:
        if v["op"] == "t":
            rows.clear()
        elif v["op"] == "d":
            rows.pop(v["before"]["id"], None)
        else:
            rows[v["after"]["id"]] = v["after"]
    return rows


def test_invalidated_slot_exits_3_then_resnapshot_converges(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    _streamed_once(source, ProducerProcess(source, kafka_bootstrap, registry_url), table)
    # While the producer is down: a delete, an update and inserts it will never stream.
    sql(pg_dsn, f"DELETE FROM {table} WHERE id IN (2, 3)", f"UPDATE {table} SET v = 7 WHERE id = 4")
    insert_batches(pg_dsn, table, 11, 1, 5)
    _invalidate(source)

    stopped = ProducerProcess(source, kafka_bootstrap, registry_url).start(wait_ready=False)
    assert _exit_status(stopped) == 3, stopped.log()
    log = stopped.log()
    assert f"replication slot '{source.slot}' is lost: wal_status lost" in log, log
    start, end = _loss_range(log)
    assert start < end
    lost = _slot(source)
    assert lost is not None and lost["wal_status"] == "lost"  # left for the operator

    recovering = ProducerProcess(
        source, kafka_bootstrap, registry_url, on_slot_loss="resnapshot"
    ).start()
    assert metric(recovering, "walbridge_slot_losses_total") == 1
    new = _slot(source)
    assert new is not None and new["wal_status"] != "lost"
    insert_batches(pg_dsn, table, 100, 1, 3)  # streamed while the snapshot runs
    sql(pg_dsn, f"DELETE FROM {table} WHERE id = 5")
    source.wait_confirmed(source.current_lsn())
    deadline = time.monotonic() + 120
    while metric(recovering, "walbridge_snapshot_tables_queued") or not metric(
        recovering, "walbridge_snapshot_rows_total"
    ):
        assert time.monotonic() < deadline, recovering.log()
        time.sleep(0.5)
    source.wait_confirmed(source.current_lsn())
    assert recovering.stop() == 0, recovering.log()
    assert "is lost: wal_status lost" in recovering.log()

    records = TopicReader(kafka_bootstrap, registry_url).read_to_end(
        [f"{source.prefix}.public.{table}"]
    )
    truncates = [r.value for r in records if r.value["op"] == "t"]
    assert len(truncates) == 1 and truncates[0]["source"]["snapshot"] == "true"
    expected = {
        id_: {"id": id_, "v": v, "pad": pad}
        for id_, v, pad in query(pg_dsn, f"SELECT id, v, pad FROM {table}")
    }
    assert _apply(records) == expected
    assert {2, 3, 5}.isdisjoint(expected)  # deletes in the lost window and after it
    reads = {r.value["after"]["id"] for r in records if r.value["op"] == "r"}
    assert reads >= {1, 4, 11, 12, 13, 14, 15}
