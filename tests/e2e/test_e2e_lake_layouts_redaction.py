"""A left-out column stays out of the lake where the layouts meet the snapshot and a transaction
bigger than a batch (issue 43): the table's existing rows arrive through the initial snapshot
while one transaction of thousands of changes streams, and the consumer takes the backlog in
small batches, so some batches apply the table while its snapshot is unfinished (the progress
row names it) and the big transaction waits in the pending table over several batches.

The table carries history, a changelog and a left-out column at once. PostgreSQL is the oracle:
the current-state table and the history's open versions equal the source without the column;
every row the stream never touched has exactly one snapshot event and one version; each key's
versions follow one another without gap or overlap; the changelog holds every streamed change
once; and the left-out values are in no file of the lake or the checkpoint.
"""

from __future__ import annotations

import uuid
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_consumer.lake_options import parse
from tests.e2e.harness import pipeline
from tests.support.producer_harness import query, sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e

SECRET = "SSN-4d7c-never-in-the-lake"
EXISTING = 1200  # rows before the slot: the snapshot's, in chunks of CHUNK
CHUNK = 150
INSERTED = 1500  # the big transaction's inserts (ids above EXISTING), besides its updates
BATCH_CAP = 500  # Kafka records per consumer batch: the big transaction spans several
# ~13 kB: a TOASTed value that the big transaction's updates leave unchanged
BIG = "(SELECT string_agg(md5(k::text), '') FROM generate_series(1, 400) k)"


def test_left_out_columns_and_layouts_through_a_snapshot_and_a_big_transaction(
    spark: SparkSession, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    s = f"e2e_redact_{uuid.uuid4().hex[:8]}"
    table = f"{s}.people"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text, ssn text, big text)",
        f"INSERT INTO {table} SELECT g, 'n' || g, '{SECRET}-' || g, "
        f"CASE WHEN g % 100 = 0 THEN {BIG} END FROM generate_series(1, {EXISTING}) g",
    )
    options = parse(
        f"""
        [tables."{table}"]
        history = true
        changelog = true
        except_columns = ["ssn"]
        """
    )
    deleted = list(range(5, EXISTING // 2, 10))  # odd ids: none of them is also updated
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [table], "e2eredact"
        ) as p:
            p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
            p.producer.env["WALBRIDGE_SNAPSHOT_CHUNK_ROWS"] = str(CHUNK)
            p.start_producer()
            # One transaction: every even row updated (its TOASTed value unchanged, its
            # left-out value changed), new rows inserted, some odd rows deleted.
            p.sql(
                "BEGIN",
                f"UPDATE {table} SET name = name || '+', ssn = ssn || '+' WHERE id % 2 = 0",
                f"INSERT INTO {table} SELECT g, 'n' || g, '{SECRET}-' || g, NULL "
                f"FROM generate_series({EXISTING + 1}, {EXISTING + INSERTED}) g",
                f"DELETE FROM {table} WHERE id = ANY(ARRAY{deleted})",
                "COMMIT",
            )
            p.sql(f"UPDATE {table} SET name = 'later' WHERE id = {EXISTING + 1}")
            p.wait_snapshots_read(240)
            p.wait_published()
            p.wait_snapshot_recorded(table)
            p.consume_available(
                timeout=1200, lake_tables_config=options, max_offsets_per_trigger=BATCH_CAP
            )

            rows = p.progress()
            # What the test is about: batches during the snapshot, and the big transaction
            # waiting in the pending table between batches.
            assert any(r["snapshotting"] == [table] for r in rows), rows
            assert rows[-1]["snapshotting"] == []
            assert max(r["pending_transactions"] for r in rows) >= 1, rows
            last = rows[-1]

            source = sorted(query(pg_dsn, f"SELECT id, name, big FROM {table}"))
            current = p.table(table, last["table_versions"][table])
            assert "ssn" not in current[0]
            assert sorted((r["id"], r["name"], r["big"]) for r in current) == source

            history = _read(
                spark, f"{p.lake}/_walbridge/history/{s}/people", last, table, "history"
            )
            _check_history(history, source, deleted)
            changelog = _read(
                spark, f"{p.lake}/_walbridge/changelog/{s}/people", last, table, "changelog"
            )
            _check_changelog(changelog, deleted)

            found = [
                str(f)
                for root in (Path(p.lake), Path(p.checkpoint))
                for f in root.rglob("*")
                if f.is_file() and SECRET.encode() in f.read_bytes()
            ]
            assert found == []
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")


def _untouched(deleted: list[int]) -> list[int]:
    """The existing rows no change of the stream touched: the odd ids not deleted."""
    return [k for k in range(1, EXISTING + 1, 2) if k not in deleted]


def _read(
    spark: SparkSession, path: str, last: dict[str, Any], table: str, kind: str
) -> list[dict[str, Any]]:
    version = last["table_versions"][f"{kind}:{table}"]
    df = spark.read.format("delta").option("versionAsOf", version).load(path)
    return [r.asDict(recursive=True) for r in df.collect()]


def _check_history(
    history: list[dict[str, Any]], source: list[tuple[Any, ...]], deleted: list[int]
) -> None:
    assert "ssn" not in history[0]
    open_ = sorted((r["id"], r["name"], r["big"]) for r in history if r["__is_current"])
    assert open_ == source  # the TOASTed values carried, never null or the sentinel
    by_key: dict[int, list[dict[str, Any]]] = {}
    for r in history:
        by_key.setdefault(r["id"], []).append(r)
    for key, versions in by_key.items():
        versions.sort(key=lambda r: r["__valid_from_lsn"])
        for a, b in pairwise(versions):
            assert a["__valid_to_lsn"] == b["__valid_from_lsn"], (key, versions)
        assert all(r["__is_current"] == (r["__valid_to_lsn"] is None) for r in versions)
        if key in deleted:
            assert versions[-1]["__valid_to_lsn"] is not None, (key, versions)
        if key % 100 == 0 and key <= EXISTING:
            # A TOASTed row updated before its chunk was read has no earlier version: its
            # version holds null until the snapshot's read of the key opens the next one.
            for a, b in pairwise(versions):
                assert a["big"] is not None or (b["__op"] == "r" and b["big"]), (key, versions)
            assert versions[-1]["big"], (key, versions)
    # A row the stream never touched: one version, its snapshot row.
    for key in _untouched(deleted):
        assert [r["__op"] for r in by_key[key]] == ["r"], (key, by_key[key])


def _check_changelog(changelog: list[dict[str, Any]], deleted: list[int]) -> None:
    keys = [(r["commit_lsn"], r["total_order"]) for r in changelog]
    assert len(keys) == len(set(keys))
    for r in changelog:
        for side in ("before", "after"):
            assert r[side] is None or "ssn" not in r[side], r
    streamed = Counter(r["op"] for r in changelog if r["op"] != "r")
    # The big transaction's updates, inserts and deletes, and the one later update.
    assert streamed == {"u": EXISTING // 2 + 1, "c": INSERTED, "d": len(deleted)}, streamed
    snapshot = Counter(r["after"]["id"] for r in changelog if r["op"] == "r")
    assert all(snapshot[k] == 1 for k in _untouched(deleted)), snapshot
    assert set(snapshot) <= set(range(1, EXISTING + 1))
