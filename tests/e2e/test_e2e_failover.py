"""A primary failover under load loses nothing (PostgreSQL 17+: failover slots).

A primary and a streaming standby (`WALBRIDGE_PG_STANDBY=1 deploy/local/stack up`), the
producer on the multi-host DSN, pgbench-like transfers on the same DSN. Once the standby holds
the synced slot, `deploy/local/stack failover` stops the primary at once and promotes the
standby; writers and producer follow the new primary. Afterwards `verify` finds the lake equal
to the new primary, and a read_committed reader finds every event once with exact END counts.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from tests.conftest import Stack
from tests.e2e.harness import pipeline, wait_for
from tests.support.exactly_once import check_exactly_once
from tests.support.pg_versions import failover_ready, primary_and_standby
from tests.support.producer_harness import query, sql
from tests.support.scratch_stack import ScratchStack
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e]

ACCOUNTS = 200


@pytest.fixture(params=[17, 18], ids=lambda m: f"pg{m}")
def pair(request: pytest.FixtureRequest, stack: Stack) -> Iterator[ScratchStack]:
    with primary_and_standby(stack, request.param, "pg-failover") as scratch:
        yield scratch


def _transfers(
    dsn: str, accounts: str, history: str, stop: threading.Event, done: list[int]
) -> None:
    """Transfers that keep the total; on a lost connection (the failover) reconnect and go
    on. A transfer whose commit was cut off may or may not have happened: the test compares
    the lake with whatever the new primary holds."""
    rnd = random.Random(7)
    while not stop.is_set():
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
                while not stop.is_set():
                    a, b = rnd.randrange(ACCOUNTS), rnd.randrange(ACCOUNTS)
                    amount = rnd.randint(1, 100)
                    with conn.transaction():
                        conn.execute(
                            f"UPDATE {accounts} SET balance = balance - %s WHERE id = %s",
                            (amount, a),
                        )
                        conn.execute(
                            f"UPDATE {accounts} SET balance = balance + %s WHERE id = %s",
                            (amount, b),
                        )
                        conn.execute(f"INSERT INTO {history} VALUES (%s, %s, %s)", (a, b, amount))
                    done.append(1)
                    time.sleep(0.01)
        except psycopg.OperationalError:
            time.sleep(0.3)


def test_failover_under_load_loses_nothing(
    pair: ScratchStack,
    spark: SparkSession,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    env = pair.exports()
    dsn, standby_dsn = env["WALBRIDGE_PG_DSN"], env["WALBRIDGE_PG_STANDBY_DSN"]
    s = f"e2e_fo_{uuid.uuid4().hex[:8]}"
    accounts, history = f"{s}.accounts", f"{s}.history"
    sql(
        dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {accounts} (id int PRIMARY KEY, balance bigint NOT NULL)",
        f"INSERT INTO {accounts} SELECT g, 1000 FROM generate_series(0, {ACCOUNTS - 1}) g",
        f"CREATE TABLE {history} (src int, dst int, amount int)",
    )
    stop = threading.Event()
    done: list[int] = []
    writer = threading.Thread(target=_transfers, args=(dsn, accounts, history, stop, done))
    with pipeline(
        spark, dsn, kafka_bootstrap, registry_url, tmp_path, [accounts, history], "e2efo"
    ) as p:
        p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
        p.start_producer()
        writer.start()
        try:
            wait_for("some transfers", lambda: len(done) > 200, timeout=60)
            wait_for(
                "the standby to hold the synced slot",
                lambda: failover_ready(standby_dsn, p.source.slot),
                timeout=120,
            )
            before = len(done)
            failover = pair.run("failover")
            assert failover.returncode == 0, failover.stderr
            # The writers and the producer follow the new primary.
            wait_for("transfers on the new primary", lambda: len(done) > before + 300, timeout=120)
        finally:
            stop.set()
            writer.join(60)
        assert query(dsn, "SELECT pg_is_in_recovery()")[0][0] is False
        p.wait_published(timeout=180)
        p.wait_snapshot_recorded(accounts)
        total = query(dsn, f"SELECT sum(balance) FROM {accounts}")[0][0]
        assert total == ACCOUNTS * 1000
        check_exactly_once(p, [f"{p.prefix}.{accounts}", f"{p.prefix}.{history}"])
        p.consume_available()
        p.assert_equal()
        assert p.producer.proc is not None and p.producer.proc.poll() is None, p.producer.log()
        assert p.producer.stop() == 0, p.producer.log()
        log = p.producer.log_path.read_text(errors="replace")
        assert "reconnected on a new timeline" in log
        assert "synchronized_standby_slots empty" not in log  # the stack sets it
