"""Per-table lake layouts through the real pipeline (issue 43), with PostgreSQL as the oracle:
an audit trigger records every row version with its transaction id, and a statement trigger
every truncate. One table carries every option at once: history (with an ignored column),
changelog, soft deletes, change data feed and an excluded column.

The workload: inserts, several changes to one row in one transaction, a TOAST value left
unchanged by updates, a key change, a delete, an update of only the ignored column, then an
ADD COLUMN, a truncate, and a re-insert of a deleted key. The second half's batch is made to
fail after every table of the layout was written and before its progress row (the window a
kill -9 mid-batch leaves), then runs again: nothing may be added twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_consumer import progress
from spark_consumer.lake_options import parse
from tests.e2e.harness import pipeline
from tests.support.producer_harness import query, sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e

SECRET = "SECRET-5f1e-not-in-the-lake"
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)"  # ~13 kB: TOASTed


def _audit_sql(table: str, s: str, audit: str = "audit") -> list[str]:
    return [
        f"CREATE TABLE {s}.{audit} (seq bigserial PRIMARY KEY, txid bigint, op text, "
        "id int, row jsonb)",
        f"""CREATE FUNCTION {s}.{audit}_row() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF TG_OP = 'DELETE' THEN
            INSERT INTO {s}.{audit} (txid, op, id, row) VALUES (txid_current(), 'd', OLD.id, NULL);
          ELSIF TG_OP = 'TRUNCATE' THEN
            INSERT INTO {s}.{audit} (txid, op, id, row) VALUES (txid_current(), 't', NULL, NULL);
          ELSE
            IF TG_OP = 'UPDATE' AND OLD.id <> NEW.id THEN
              INSERT INTO {s}.{audit} (txid, op, id, row) VALUES (txid_current(), 'd', OLD.id, NULL);
            END IF;
            INSERT INTO {s}.{audit} (txid, op, id, row)
              VALUES (txid_current(), 'w', NEW.id, to_jsonb(NEW));
          END IF;
          RETURN NULL;
        END $$""",
        f"CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.{audit}_row()",
        f"CREATE TRIGGER audit_truncate AFTER TRUNCATE ON {table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {s}.{audit}_row()",
    ]


def _expected_history(
    audit: list[tuple[Any, ...]],
    ignored: set[str],
    columns: tuple[str, ...] = ("v", "note", "extra", "big"),
) -> list[tuple[Any, ...]]:
    """SCD2 versions from the audit: (id, from txid, to txid or None, *columns)."""
    open_: dict[int, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    by_tx: dict[int, list[tuple[Any, ...]]] = {}
    for row in audit:
        by_tx.setdefault(row[1], []).append(row)
    for txid, rows in by_tx.items():  # txids in commit order: the workload is sequential
        state: dict[int, dict[str, Any] | None] = {}
        for _seq, _tx, op, id_, data in rows:
            if op == "t":
                for k in list(open_) + [k for k, v in state.items() if v is not None]:
                    state[k] = None
            elif op == "d":
                state[id_] = None
            else:
                state[id_] = data
        for k, new in state.items():
            cur = open_.get(k)
            if new is None:
                if cur is not None:
                    cur["to"] = txid
                    done.append(open_.pop(k))
                continue
            tracked = [c for c in new if c not in ignored and c != "secret"]
            if cur is not None and all(cur["row"].get(c) == new.get(c) for c in tracked):
                cur["row"] = new  # only ignored columns changed: in place
                continue
            if cur is not None:
                cur["to"] = txid
                done.append(open_.pop(k))
            open_[k] = {"from": txid, "to": None, "row": new}
    out = done + list(open_.values())
    return sorted(
        (v["row"]["id"], v["from"], v["to"], *[v["row"].get(c) for c in columns]) for v in out
    )


def test_every_layout_option_against_the_audit_history(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="walbridge.consumer")
    s = f"e2e_layout_{uuid.uuid4().hex[:8]}"
    table = f"{s}.t"
    # A second table with history alone: its batches take the history's short form (every
    # change opens a version, no earlier version's values needed; history.py).
    plain = f"{s}.u"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {table} (id int PRIMARY KEY, v int, note text, big text, secret text)",
        f"CREATE TABLE {plain} (id int PRIMARY KEY, v int)",
        *_audit_sql(table, s),
        *_audit_sql(plain, s, "audit_u"),
    )
    options = parse(
        f"""
        [tables."{table}"]
        history = true
        changelog = true
        deletes = "soft"
        change_data_feed = true
        except_columns = ["secret"]
        ignore_columns = ["note"]

        [tables."{plain}"]
        history = true
        changelog = true
        """
    )
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [table, plain], "e2elayout"
        ) as p:
            p.start_producer()
            p.sql(
                f"INSERT INTO {table} SELECT g, g, 'n', CASE WHEN g = 1 THEN {BIG} END, "
                f"'{SECRET}' FROM generate_series(1, 5) g",
            )
            p.sql(
                "BEGIN",
                f"UPDATE {table} SET v = v + 10 WHERE id = 1",  # big: unchanged TOAST
                f"UPDATE {table} SET v = 21 WHERE id = 2",
                f"UPDATE {table} SET v = 22, note = 'twice' WHERE id = 2",
                "COMMIT",
            )
            p.sql(f"UPDATE {table} SET id = 30 WHERE id = 1")  # key change, big unchanged
            p.sql(f"DELETE FROM {table} WHERE id = 4")
            p.sql(f"UPDATE {table} SET note = 'only the ignored column' WHERE id = 5")
            p.sql(
                f"INSERT INTO {plain} SELECT g, g FROM generate_series(1, 5) g",
                "BEGIN",
                f"UPDATE {plain} SET v = v + 10 WHERE id = 1",
                f"UPDATE {plain} SET v = 21 WHERE id = 2",
                f"UPDATE {plain} SET v = 22 WHERE id = 2",
                "COMMIT",
                f"UPDATE {plain} SET id = 30 WHERE id = 1",
                f"DELETE FROM {plain} WHERE id = 4",
                f"UPDATE {plain} SET v = 55 WHERE id = 5",
            )
            p.wait_published()
            p.consume_available(lake_tables_config=options)
            first = p.progress()[-1]

            p.sql(f"ALTER TABLE {table} ADD COLUMN extra int")
            p.sql(
                f"INSERT INTO {table} VALUES (6, 6, 'n', NULL, '{SECRET}', 66)",
                f"UPDATE {table} SET v = 300 WHERE id = 30",  # big unchanged again
            )
            p.sql(
                "BEGIN", f"TRUNCATE {table}", f"INSERT INTO {table} (id, v) VALUES (7, 7)", "COMMIT"
            )
            p.sql(f"INSERT INTO {table} (id, v, note) VALUES (4, 44, 'back')")
            p.sql(
                f"INSERT INTO {plain} VALUES (6, 6)",
                f"UPDATE {plain} SET v = 300 WHERE id = 30",
                "BEGIN",
                f"DELETE FROM {plain}",
                f"INSERT INTO {plain} VALUES (7, 7)",
                "COMMIT",
                f"INSERT INTO {plain} VALUES (4, 44)",
            )
            p.wait_published()

            # The batch writes every layout table, then fails before its progress row.
            real_append = progress.append
            monkeypatch.setattr(progress, "append", _fail_once(real_append))
            with pytest.raises(Exception, match="crash before the progress row"):
                p.consume_available(lake_tables_config=options)
            monkeypatch.setattr(progress, "append", real_append)
            p.consume_available(lake_tables_config=options)
            last = p.progress()[-1]

            audit = query(pg_dsn, f"SELECT seq, txid, op, id, row FROM {s}.audit ORDER BY seq")
            _check_history(spark, p.lake, s, audit, last)
            audit_u = query(pg_dsn, f"SELECT seq, txid, op, id, row FROM {s}.audit_u ORDER BY seq")
            _check_history_of_every_change(spark, p.lake, s, audit_u, last)
            # Each history form was taken: the full one for the table with an ignored column
            # and a TOAST value, the short one for the other (the replay included).
            forms = [r.getMessage() for r in caplog.records if r.getMessage().startswith("history")]
            assert f"history of {s}.t: full form" in forms, forms
            assert forms.count(f"history of {s}.u: short form") >= 2, forms
            # The first batch found both history tables empty: appended, not MERGEd.
            assert forms.count(f"history of {s}.t: appended") == 1, forms
            assert forms.count(f"history of {s}.u: appended") == 1, forms
            _check_changelog(spark, p.lake, s, audit, last)
            _check_soft_deletes(p, pg_dsn, table, last)
            _check_change_feed(spark, p.lake, s, first, last)
            _check_no_secret(Path(p.lake))
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")


def _fail_once(real: Any) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("crash before the progress row")

    return fail


def _tx_lsns(spark: SparkSession, lake: str, s: str, table: str = "t") -> dict[int, int]:
    """xid -> commit LSN, from the changelog's transaction ids ("<xid>:<commit_lsn>")."""
    rows = spark.read.format("delta").load(f"{lake}/_walbridge/changelog/{s}/{table}").collect()
    return {int(r["tx_id"].split(":")[0]): r["commit_lsn"] for r in rows}


def _check_history(
    spark: SparkSession, lake: str, s: str, audit: list[tuple[Any, ...]], last: dict[str, Any]
) -> None:
    lsn = _tx_lsns(spark, lake, s)
    want = [
        (i, lsn[f], None if t is None else lsn[t], v, n, e, b)
        for i, f, t, v, n, e, b in _expected_history(audit, {"note"})
    ]
    version = last["table_versions"][f"history:{s}.t"]
    hist = (
        spark.read.format("delta")
        .option("versionAsOf", version)
        .load(f"{lake}/_walbridge/history/{s}/t")
        .collect()
    )
    got = sorted(
        (
            r["id"],
            r["__valid_from_lsn"],
            r["__valid_to_lsn"],
            r["v"],
            r["note"],
            r["extra"],
            r["big"],
        )
        for r in hist
    )
    assert got == want
    assert all(r["__is_current"] == (r["__valid_to_lsn"] is None) for r in hist)
    assert {r["__op"] for r in hist} <= {"c", "u", "r"}
    big = [r for r in hist if r["id"] == 30]
    assert big and all(r["big"] and len(r["big"]) == 400 * 32 for r in big)


def _check_history_of_every_change(
    spark: SparkSession, lake: str, s: str, audit: list[tuple[Any, ...]], last: dict[str, Any]
) -> None:
    """The table with history alone: the audit's versions, exactly."""
    lsn = _tx_lsns(spark, lake, s, "u")
    want = [
        (i, lsn[f], None if t is None else lsn[t], v)
        for i, f, t, v in _expected_history(audit, set(), ("v",))
    ]
    hist = (
        spark.read.format("delta")
        .option("versionAsOf", last["table_versions"][f"history:{s}.u"])
        .load(f"{lake}/_walbridge/history/{s}/u")
        .collect()
    )
    got = sorted((r["id"], r["__valid_from_lsn"], r["__valid_to_lsn"], r["v"]) for r in hist)
    assert got == want
    assert all(r["__is_current"] == (r["__valid_to_lsn"] is None) for r in hist)


def _check_changelog(
    spark: SparkSession, lake: str, s: str, audit: list[tuple[Any, ...]], last: dict[str, Any]
) -> None:
    version = last["table_versions"][f"changelog:{s}.t"]
    rows = (
        spark.read.format("delta")
        .option("versionAsOf", version)
        .load(f"{lake}/_walbridge/changelog/{s}/t")
        .collect()
    )
    keys = [(r["commit_lsn"], r["total_order"]) for r in rows]
    assert len(keys) == len(set(keys))  # the replayed batch added nothing twice
    # One event per audited row change (a key change is d + c), one per truncate, in the
    # source's order, each with the audited row's content.
    assert len(rows) == len(audit)
    ops = sorted(r["op"] for r in rows)
    assert ops.count("t") == 1 and ops.count("d") == 2
    assert all(r["after"] is None or "secret" not in r["after"].asDict() for r in rows)
    in_order = sorted(rows, key=lambda r: (r["commit_lsn"], r["total_order"]))
    for (seq, txid, op, key, row), event in zip(audit, in_order, strict=True):
        where = f"audit seq {seq}: {op} {key} {row} / changelog {event.asDict(recursive=True)}"
        assert int(event["tx_id"].split(":")[0]) == txid, where
        if op == "t":
            assert event["op"] == "t", where
        elif op == "d":
            assert event["op"] == "d" and event["before"]["id"] == key, where
        else:
            after = event["after"].asDict()
            assert event["op"] in ("c", "u") and after["id"] == key, where
            assert [after.get(c) for c in ("v", "note", "extra")] == [
                row.get(c) for c in ("v", "note", "extra")
            ], where
            # An unchanged TOAST value is named, never written as null or as the sentinel.
            toast = event["unchanged_toast"] or []
            assert after["big"] == row["big"] or ("big" in toast and after["big"] is None), where


def _check_soft_deletes(p: Any, dsn: str, table: str, last: dict[str, Any]) -> None:
    schema, name = table.split(".")
    rows = p.table_rows(schema, name, last["table_versions"][table])
    live = sorted((r["id"], r["v"]) for r in rows if not r["__deleted"])
    assert live == sorted(query(dsn, f"SELECT id, v FROM {table}"))
    flagged = sorted(r["id"] for r in rows if r["__deleted"])
    # Flagged: key 1 (moved to 30) and the keys the truncate removed that the lake held (6 was
    # inserted and truncated within the one batch of the second half: it never was a row).
    assert flagged == [1, 2, 3, 5, 30]
    assert all(r["_op"] in ("d", "t") for r in rows if r["__deleted"])
    assert "secret" not in rows[0]


def _check_change_feed(
    spark: SparkSession, lake: str, s: str, first: dict[str, Any], last: dict[str, Any]
) -> None:
    path = f"{lake}/{s}/t"
    lo, hi = first["table_versions"][f"{s}.t"], last["table_versions"][f"{s}.t"]
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", lo + 1)
        .option("endingVersion", hi)
        .load(path)
        .collect()
    )
    by_type: dict[str, list[int]] = {}
    for r in feed:
        by_type.setdefault(r["_change_type"], []).append(r["id"])
    # Between the two progress rows: 7 inserted, 4 revived (an update of its flagged row), and
    # 2, 3, 5 and 30 flagged by the truncate; once each, though the batch ran twice.
    assert sorted(by_type.get("insert", [])) == [7], json.dumps(by_type)
    pre = sorted(by_type.get("update_preimage", []))
    assert pre == sorted(by_type.get("update_postimage", []))
    assert pre == [2, 3, 4, 5, 30], json.dumps(by_type)
    assert "delete" not in by_type


def _check_no_secret(lake: Path) -> None:
    needle = SECRET.encode()
    # Every file, the pending table's included (pending_redaction.py).
    found = [str(f) for f in lake.rglob("*") if f.is_file() and needle in f.read_bytes()]
    assert found == []
