"""The producer across a primary failover (issue 39), on a primary and streaming standby of the
local stack, the producer on the multi-host DSN: on 17+ (failover slot, synced to the standby)
it follows the new primary and every row arrives once; on 16, where slots are not synced, it
stops with the slot-loss error instead of starting quietly from the new primary's position."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import Stack
from tests.support.pg_versions import failover_ready, primary_and_standby, server_major
from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    create_counter_table,
    insert_batches,
    query,
    unique,
)
from tests.support.scratch_stack import ScratchStack

pytestmark = pytest.mark.integration


# 15 and 16 must stop (exit 3). 17 and 18 follow the failover: the producer alone here, run on
# request (TEST_FAILOVER_ALL_MAJORS=1); the whole pipeline under load, with the same checks of
# the producer's log, runs in the suite (tests/e2e/test_e2e_failover.py).
_MAJORS = [15, 16, 17, 18] if os.environ.get("TEST_FAILOVER_ALL_MAJORS") else [15, 16]


@pytest.fixture(params=_MAJORS, ids=lambda m: f"pg{m}")
def pair(request: pytest.FixtureRequest, stack: Stack) -> Iterator[ScratchStack]:
    with primary_and_standby(stack, request.param, "pg-failover-producer") as scratch:
        yield scratch


def _wait(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _replayed(standby_dsn: str, table: str, rows: int) -> bool:
    # Rows, not LSNs: the primary's insert position may sit past a page header the standby's
    # replay position never reaches.
    try:
        return bool(query(standby_dsn, f"SELECT count(*) FROM {table}")[0][0] == rows)
    except psycopg.errors.UndefinedTable:
        return False  # not replayed yet


def test_producer_follows_a_failover_or_stops_when_the_slot_is_not_synced(
    pair: ScratchStack, kafka_bootstrap: str, registry_url: str
) -> None:
    env = pair.exports()
    dsn, standby_dsn = env["WALBRIDGE_PG_DSN"], env["WALBRIDGE_PG_STANDBY_DSN"]
    assert "," in dsn  # the multi-host DSN that reaches whichever node is primary
    major = server_major(dsn)
    table = unique("fo")
    create_counter_table(dsn, table)
    source = Source.create(dsn, [table], "fo")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    insert_batches(dsn, table, 1, 5, 2)  # ids 1-10
    source.wait_confirmed(source.current_lsn())
    if major >= 17:
        _wait("the synced slot", lambda: failover_ready(standby_dsn, source.slot), 120)
    # The standby is asynchronous: a failover before it replayed the table would lose it.
    _wait("the standby's replay", lambda: _replayed(standby_dsn, table, 10), 60)
    failover = pair.run("failover")
    assert failover.returncode == 0, failover.stderr
    assert query(dsn, "SELECT pg_is_in_recovery()")[0][0] is False  # the new primary
    insert_batches(dsn, table, 11, 5, 2)  # ids 11-20, on the new primary
    assert producer.proc is not None
    if major < 17:
        assert producer.proc.wait(180) == 3, producer.log()
        log = producer.log()
        assert f"replication slot '{source.slot}' is lost: failover without a synced slot" in log
        assert "timeline moved from 1 to 2" in log
        assert source.confirmed_lsn() is None  # nothing was created on the new primary
        return
    source.wait_confirmed(source.current_lsn(), timeout=180)
    assert producer.proc.poll() is None, producer.log()
    assert producer.stop() == 0, producer.log()
    assert "reconnected on a new timeline" in producer.log()
    assert "synchronized_standby_slots empty" not in producer.log()  # the stack sets it
    records = TopicReader(kafka_bootstrap, registry_url).read_to_end(
        [f"{source.prefix}.public.{table}"]
    )
    ids = sorted(r.key["id"] for r in records)
    assert ids == list(range(1, 21))  # each row once (read_committed, exactly-once)


@pytest.fixture(params=[16], ids=lambda m: f"pg{m}")
def standby_pair(request: pytest.FixtureRequest, stack: Stack) -> Iterator[ScratchStack]:
    """16: the first major that decodes on a standby (the oldest one docs/postgresql-versions.md promises)."""
    with primary_and_standby(stack, request.param, "pg-standby-reader") as scratch:
        yield scratch


def test_producer_streams_from_a_standby_and_refuses_snapshots_there(
    standby_pair: ScratchStack, kafka_bootstrap: str, registry_url: str
) -> None:
    env = standby_pair.exports()
    primary, standby_dsn = env["WALBRIDGE_PG_DSN"], env["WALBRIDGE_PG_STANDBY_DSN"]
    table = unique("sb")
    create_counter_table(primary, table)
    # The publication is made on the primary; a standby can create nothing.
    on_primary = Source.create(primary, [table], "sb")
    source = Source(standby_dsn, on_primary.publication, on_primary.slot, on_primary.prefix)
    _wait("the standby's replay", lambda: _replayed(standby_dsn, table, 0), 60)
    refused = ProducerProcess(source, kafka_bootstrap, registry_url, snapshot="initial")
    refused.start(wait_ready=False)
    assert refused.proc is not None and refused.proc.wait(120) == 2, refused.log()
    assert "reads from a standby" in refused.log() and "--snapshot never" in refused.log()
    producer = ProducerProcess(source, kafka_bootstrap, registry_url)  # --snapshot never
    producer.start(wait_ready=False)
    try:
        # Creating a slot on a standby waits for a running-transactions record from the
        # primary: log one now and then until the producer is ready.
        deadline = time.monotonic() + 120
        while True:
            query(primary, "SELECT pg_log_standby_snapshot()")
            try:
                producer.wait_ready(timeout=2)
                break
            except AssertionError:
                assert time.monotonic() < deadline, producer.log()
        insert_batches(primary, table, 1, 5, 2)  # ids 1-10, written on the primary
        records = TopicReader(kafka_bootstrap, registry_url).read(
            [f"{source.prefix}.public.{table}"], expect=10, timeout=120
        )
        assert sorted(r.key["id"] for r in records) == list(range(1, 11))
        assert query(standby_dsn, "SELECT pg_is_in_recovery()")[0][0] is True
    finally:
        # The pair is made afresh for each run, slot and publication with it.
        assert producer.stop() == 0, producer.log()
