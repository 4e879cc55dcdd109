"""A backlog of small transactions (the TPC-B shape: a few changes on several tables each), one
table partitioned and one without a key, applied by a consumer that started late, with a small
batch cap so the backlog takes many batches. Every progress row names a state of the lake that
keeps TPC-B's invariant (the same money in accounts, tellers, branches and history), checked
with an independent Delta reader (delta-rs) at the versions the row names; the final lake
equals PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.lake_reader import progress_rows, table_sum
from tests.support.producer_harness import sql
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.secure_stack]

TRANSACTIONS = 2000
ACCOUNTS = 400


def test_backlog_of_small_transactions_applies_in_capped_batches_keeping_the_invariant(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    s = f"e2e_tpcb_{uuid.uuid4().hex[:8]}"
    accounts, tellers, branches, history = (
        f"{s}.{t}" for t in ("accounts", "tellers", "branches", "history")
    )
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {accounts} (aid int PRIMARY KEY, balance bigint, filler text)"
        " PARTITION BY RANGE (aid)",
        *(
            f"CREATE TABLE {accounts}_{i} PARTITION OF {accounts}"
            f" FOR VALUES FROM ({(i - 1) * 100 + 1}) TO ({i * 100 + 1})"
            for i in range(1, 5)
        ),
        f"CREATE TABLE {tellers} (tid int PRIMARY KEY, balance bigint)",
        f"CREATE TABLE {branches} (bid int PRIMARY KEY, balance bigint)",
        f"CREATE TABLE {history} (aid int, delta bigint, at timestamptz)",  # no key
        f"""CREATE PROCEDURE {s}.tpcb(n int) LANGUAGE plpgsql AS $$
        DECLARE a int; d int;
        BEGIN
          FOR i IN 1..n LOOP
            a := 1 + (i * 7919) % {ACCOUNTS};
            d := (i % 11) - 5;
            UPDATE {accounts} SET balance = balance + d WHERE aid = a;
            UPDATE {tellers} SET balance = balance + d WHERE tid = 1 + i % 10;
            UPDATE {branches} SET balance = balance + d WHERE bid = 1 + i % 4;
            INSERT INTO {history} VALUES (a, d, now());
            COMMIT;
          END LOOP;
        END $$""",
    )
    try:
        with pipeline(
            spark,
            pg_dsn,
            kafka_bootstrap,
            registry_url,
            tmp_path,
            [accounts, tellers, branches, history],
            "e2etpcb",
        ) as p:
            p.sql(
                f"ALTER PUBLICATION {p.source.publication} SET (publish_via_partition_root = true)"
            )
            p.start_producer()
            p.sql(
                f"INSERT INTO {accounts} SELECT g, 0, repeat('x', 80)"
                f" FROM generate_series(1, {ACCOUNTS}) g",
                f"INSERT INTO {tellers} SELECT g, 0 FROM generate_series(1, 10) g",
                f"INSERT INTO {branches} SELECT g, 0 FROM generate_series(1, 4) g",
                f"CALL {s}.tpcb({TRANSACTIONS})",
            )
            p.wait_published()

            # ~6 records per transaction (4 changes + BEGIN/END): a cap of 1500 records makes
            # the backlog a dozen or more batches, each cutting transactions at its edge.
            p.consume_available(max_offsets_per_trigger=1500)
            rows = p.progress()
            assert len(rows) >= 8, f"expected many capped batches, got {len(rows)}"
            assert sum(r["applied_transactions"] for r in rows) == TRANSACTIONS + 3  # + the loads
            paths = {
                t: str(tmp_path / "lake" / s / t.split(".")[1])
                for t in (accounts, tellers, branches, history)
            }
            checked = 0
            for row in progress_rows(str(tmp_path / "lake")):
                versions = row["table_versions"]
                if history not in versions:
                    continue  # nothing applied to every table yet (the first batch may cut)
                sums = {
                    "accounts": table_sum(paths[accounts], versions[accounts], "balance"),
                    "tellers": table_sum(paths[tellers], versions[tellers], "balance"),
                    "branches": table_sum(paths[branches], versions[branches], "balance"),
                    "history": table_sum(paths[history], versions[history], "delta"),
                }
                assert len(set(sums.values())) == 1, (row["batch_id"], sums)
                checked += 1
            assert checked >= 5
            p.assert_equal()
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")
