"""Events of the real producer for each op under each replica identity, key changes, unchanged
TOAST, truncate, logical messages and transaction markers; PostgreSQL is the oracle for xids
and LSNs. One producer process serves the whole module (each test uses its own tables)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.producer_harness import (
    ProducerProcess,
    Record,
    Source,
    TopicReader,
    sql,
    unique,
)

pytestmark = pytest.mark.integration

IDENTITIES = ("default", "full", "index", "nothing")
TAG = unique("ev")
T = {ri: f"{TAG}_{ri}" for ri in IDENTITIES} | {
    name: f"{TAG}_{name}" for name in ("toast", "toastfull", "tr1", "tr2", "m1", "m2", "m3", "msg")
}


@pytest.fixture(scope="module")
def env(pg_dsn: str, kafka_bootstrap: str, registry_url: str) -> Iterator[dict[str, Any]]:
    statements = []
    for ri in IDENTITIES:
        statements.append(
            f"CREATE TABLE {T[ri]} (id int PRIMARY KEY, code text NOT NULL, val text)"
        )
    statements += [
        f"CREATE UNIQUE INDEX {T['index']}_code ON {T['index']} (code)",
        f"ALTER TABLE {T['default']} REPLICA IDENTITY DEFAULT",
        f"ALTER TABLE {T['full']} REPLICA IDENTITY FULL",
        f"ALTER TABLE {T['index']} REPLICA IDENTITY USING INDEX {T['index']}_code",
        f"ALTER TABLE {T['nothing']} REPLICA IDENTITY NOTHING",
        f"CREATE TABLE {T['toast']} (id int PRIMARY KEY, small int, big text)",
        f"ALTER TABLE {T['toast']} ALTER COLUMN big SET STORAGE EXTERNAL",
        f"CREATE TABLE {T['toastfull']} (id int PRIMARY KEY, small int, big text)",
        f"ALTER TABLE {T['toastfull']} ALTER COLUMN big SET STORAGE EXTERNAL",
        f"ALTER TABLE {T['toastfull']} REPLICA IDENTITY FULL",
    ]
    for name in ("tr1", "tr2", "m1", "m2", "m3", "msg"):
        statements.append(f"CREATE TABLE {T[name]} (id int PRIMARY KEY, v int)")
    sql(pg_dsn, *statements)
    tables = [T[n] for n in T]
    source = Source.create(pg_dsn, tables, "ev")
    # NOTHING can only publish inserts (PostgreSQL refuses updates/deletes otherwise).
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    try:
        yield {"dsn": pg_dsn, "source": source, "producer": producer,
               "reader": TopicReader(kafka_bootstrap, registry_url)}  # fmt: skip
    finally:
        code = producer.stop()
        source.drop()
        sql(pg_dsn, *(f"DROP TABLE IF EXISTS {t}" for t in tables))
        assert code == 0, producer.log()


def topic(env: dict[str, Any], table: str) -> str:
    return f"{env['source'].prefix}.public.{table}"


def in_commit_order(records: list[Record]) -> list[Record]:
    """Topics have 3 partitions: order across keys is only defined by the dedup key."""
    return sorted(
        records,
        key=lambda r: (r.value["source"]["commit_lsn"], r.value["transaction"]["total_order"]),
    )


def summary(records: list[Record]) -> list[tuple[Any, ...]]:
    return [
        (r.value["op"], r.key, r.value["before"], r.value["after"])
        for r in in_commit_order(records)
    ]


def row(id_: int | None, code: str | None, val: str | None) -> dict[str, Any]:
    return {"id": id_, "code": code, "val": val}


EXPECTED: dict[str, list[tuple[Any, ...]]] = {
    "default": [
        ("c", {"id": 1}, None, row(1, "a", "v1")),
        ("u", {"id": 1}, None, row(1, "a", "v2")),
        ("d", {"id": 1}, row(1, None, None), None),
        ("c", {"id": 2}, row(1, None, None), row(2, "a", "v2")),  # before: the row it replaces
        ("u", {"id": 2}, None, row(2, "b", "v2")),
        ("d", {"id": 2}, row(2, None, None), None),
    ],
    "full": [  # keyed by the primary key; before = the whole old row
        ("c", {"id": 1}, None, row(1, "a", "v1")),
        ("u", {"id": 1}, row(1, "a", "v1"), row(1, "a", "v2")),
        ("d", {"id": 1}, row(1, "a", "v2"), None),
        ("c", {"id": 2}, row(1, "a", "v2"), row(2, "a", "v2")),
        ("u", {"id": 2}, row(2, "a", "v2"), row(2, "b", "v2")),
        ("d", {"id": 2}, row(2, "b", "v2"), None),
    ],
    "index": [  # keyed by code: the id change is a plain update, the code change splits
        ("c", {"code": "a"}, None, row(1, "a", "v1")),
        ("u", {"code": "a"}, None, row(1, "a", "v2")),
        ("u", {"code": "a"}, None, row(2, "a", "v2")),
        ("d", {"code": "a"}, row(None, "a", None), None),
        ("c", {"code": "b"}, row(None, "a", None), row(2, "b", "v2")),
        ("d", {"code": "b"}, row(None, "b", None), None),
    ],
}


@pytest.mark.parametrize("identity", ["default", "full", "index"])
def test_ops_under_replica_identity(env: dict[str, Any], identity: str) -> None:
    t = T[identity]
    dsn = env["dsn"]
    sql(
        dsn,
        f"INSERT INTO {t} VALUES (1, 'a', 'v1')",
        f"UPDATE {t} SET val = 'v2' WHERE id = 1",
        f"UPDATE {t} SET id = 2 WHERE id = 1",
        f"UPDATE {t} SET code = 'b' WHERE id = 2",
        f"DELETE FROM {t} WHERE id = 2",
    )
    records = env["reader"].read([topic(env, t)], expect=len(EXPECTED[identity]))
    assert summary(records) == EXPECTED[identity]
    for r in records:
        assert r.value["source"]["table"] == t and r.value["source"]["schema"] == "public"
        assert r.value["unchanged_toast"] == []


def test_nothing_identity_inserts_have_null_key(env: dict[str, Any]) -> None:
    t = T["nothing"]
    sql(env["dsn"], f"INSERT INTO {t} VALUES (1, 'a', 'v1'), (2, 'b', NULL)")
    records = env["reader"].read([topic(env, t)], expect=2)
    assert summary(records) == [
        ("c", None, None, row(1, "a", "v1")),
        ("c", None, None, row(2, "b", None)),
    ]
    assert "no replica identity" in env["producer"].log()


def test_source_and_transaction_fields_match_postgres(env: dict[str, Any]) -> None:
    t = T["tr1"]
    with __import__("psycopg").connect(env["dsn"]) as conn:
        xid = conn.execute("SELECT txid_current()").fetchone()[0]
        conn.execute(f"INSERT INTO {t} VALUES (1, 1), (2, 2)")
        conn.execute(f"UPDATE {t} SET v = 3 WHERE id = 1")
    after_lsn = env["source"].current_lsn()
    records = in_commit_order(env["reader"].read([topic(env, t)], expect=3))
    assert [r.value["op"] for r in records] == ["c", "c", "u"]
    commit_lsns = {r.value["source"]["commit_lsn"] for r in records}
    assert len(commit_lsns) == 1
    commit_lsn = commit_lsns.pop()
    assert 0 < commit_lsn < after_lsn
    lsns = [r.value["source"]["lsn"] for r in records]
    assert lsns == sorted(lsns) and len(set(lsns)) == 3 and lsns[-1] <= commit_lsn
    for i, r in enumerate(records, start=1):
        assert r.value["source"]["txId"] == xid
        assert r.value["source"]["ts_ms"] > 1_600_000_000_000
        assert r.value["transaction"] == {
            "id": f"{xid}:{commit_lsn}", "total_order": i, "data_collection_order": i,
        }  # fmt: skip
    env["source"].wait_confirmed(after_lsn)


def test_unchanged_toast_is_listed_and_null(env: dict[str, Any]) -> None:
    t = T["toast"]
    big = "".join(f"{i:05d}" for i in range(3000))  # 15 kB, stored out of line
    dsn = env["dsn"]
    sql(
        dsn,
        f"INSERT INTO {t} VALUES (1, 1, '{big}')",
        f"UPDATE {t} SET small = 2 WHERE id = 1",
        f"UPDATE {t} SET id = 2 WHERE id = 1",  # a key change that leaves the TOASTed value alone
    )
    records = in_commit_order(env["reader"].read([topic(env, t)], expect=4))
    assert [r.value["op"] for r in records] == ["c", "u", "d", "c"]
    assert records[0].value["after"] == {"id": 1, "small": 1, "big": big}
    assert records[0].value["unchanged_toast"] == []
    assert records[1].value["after"] == {"id": 1, "small": 2, "big": None}
    assert records[1].value["unchanged_toast"] == ["big"]
    # The create names the row it replaces, where a consumer finds the value not resent.
    moved = records[3].value
    assert moved["before"] == {"id": 1, "small": None, "big": None}
    assert moved["after"] == {"id": 2, "small": 2, "big": None}
    assert moved["unchanged_toast"] == ["big"]


def test_full_identity_after_carries_the_unchanged_toast_value(env: dict[str, Any]) -> None:
    """REPLICA IDENTITY FULL: PostgreSQL sends the old row whole, so the value it leaves out of
    the new tuple is copied into `after` (and not listed): a reader that ignores
    unchanged_toast (Flink's debezium-avro-confluent) gets the right row."""
    t = T["toastfull"]
    big = "".join(f"{i:05d}" for i in range(3000))  # 15 kB, stored out of line
    dsn = env["dsn"]
    sql(
        dsn,
        f"INSERT INTO {t} VALUES (1, 1, '{big}')",
        f"UPDATE {t} SET small = 2 WHERE id = 1",
        f"UPDATE {t} SET id = 2 WHERE id = 1",
        f"UPDATE {t} SET big = 'short now' WHERE id = 2",
        f"DELETE FROM {t} WHERE id = 2",
    )
    records = in_commit_order(env["reader"].read([topic(env, t)], expect=6))
    assert [r.value["op"] for r in records] == ["c", "u", "d", "c", "u", "d"]
    # PostgreSQL itself left the TOASTed value out of the new tuple of updates 1 and 2:
    # what the producer decoded is checked in test_replication_pgoutput; here the envelope.
    assert records[1].value["before"] == {"id": 1, "small": 1, "big": big}
    assert records[1].value["after"] == {"id": 1, "small": 2, "big": big}
    assert records[1].value["unchanged_toast"] == []
    assert records[2].value["before"] == {"id": 1, "small": 2, "big": big}
    moved = records[3].value
    assert moved["before"] == {"id": 1, "small": 2, "big": big}
    assert moved["after"] == {"id": 2, "small": 2, "big": big}
    assert moved["unchanged_toast"] == []
    assert records[4].value["after"] == {"id": 2, "small": 2, "big": "short now"}
    assert records[5].value["before"] == {"id": 2, "small": 2, "big": "short now"}
    assert all(r.value["unchanged_toast"] == [] for r in records)


def markers(env: dict[str, Any], tx_id: str) -> list[dict[str, Any]]:
    records = env["reader"].read([f"{env['source'].prefix}.transaction"], quiet=2.0)
    return [r.value for r in records if r.value["id"] == tx_id]


def test_truncate_one_event_per_table_counted(env: dict[str, Any]) -> None:
    t1, t2 = T["tr2"], T["m3"]
    dsn = env["dsn"]
    sql(dsn, f"INSERT INTO {t1} VALUES (1, 1)", f"TRUNCATE {t1}, {t2}")
    got = env["reader"].read([topic(env, t1), topic(env, t2)], expect=3)
    truncates = [r for r in got if r.value["op"] == "t"]
    assert sorted(r.value["source"]["table"] for r in truncates) == sorted([t1, t2])
    for r in truncates:
        assert r.key is None and r.value["before"] is None and r.value["after"] is None
    tx_id = truncates[0].value["transaction"]["id"]
    assert {r.value["transaction"]["id"] for r in truncates} == {tx_id}
    assert sorted(r.value["transaction"]["total_order"] for r in truncates) == [1, 2]
    end = [m for m in markers(env, tx_id) if m["status"] == "END"]
    assert len(end) == 1 and end[0]["event_count"] == 2


def test_logical_messages(env: dict[str, Any]) -> None:
    t = T["msg"]
    prefix = unique("app")
    with __import__("psycopg").connect(env["dsn"]) as conn:
        conn.execute(f"INSERT INTO {t} VALUES (1, 1)")
        conn.execute("SELECT pg_logical_emit_message(true, %s, 'in-tx'::bytea)", (prefix,))
    sql(env["dsn"], f"SELECT pg_logical_emit_message(false, '{prefix}', 'loose')")
    msgs = [
        r for r in env["reader"].read([f"{env['source'].prefix}.message"], quiet=2.0)
        if r.value["message"]["prefix"] == prefix
    ]  # fmt: skip
    assert [(r.key, r.value["op"], r.value["message"]["content"]) for r in msgs] == [
        ({"prefix": prefix}, "m", b"in-tx"),
        ({"prefix": prefix}, "m", b"loose"),
    ]
    in_tx, loose = msgs
    assert loose.value["transaction"] is None
    tx_id = in_tx.value["transaction"]["id"]
    assert in_tx.value["transaction"]["total_order"] == 2
    end = [m for m in markers(env, tx_id) if m["status"] == "END"]
    assert len(end) == 1
    assert end[0]["event_count"] == 2
    assert sorted((d["data_collection"], d["event_count"]) for d in end[0]["data_collections"]) == [
        (f"{env['source'].prefix}.message", 1),
        (f"public.{t}", 1),
    ]


def test_markers_exact_for_three_tables(env: dict[str, Any]) -> None:
    dsn = env["dsn"]
    a, b, c = T["m1"], T["m2"], T["msg"]
    with __import__("psycopg").connect(dsn) as conn:
        conn.execute(f"INSERT INTO {a} SELECT g, g FROM generate_series(1, 5) g")
        conn.execute(f"INSERT INTO {b} SELECT g, g FROM generate_series(1, 3) g")
        conn.execute(f"INSERT INTO {c} SELECT g, g FROM generate_series(100, 101) g")
        conn.execute(f"UPDATE {a} SET v = 0 WHERE id = 1")
    events = env["reader"].read([topic(env, x) for x in (a, b)], expect=9)
    tx_id = events[0].value["transaction"]["id"]
    c_events = [
        r for r in env["reader"].read([topic(env, c)], quiet=2.0)
        if r.value["transaction"] and r.value["transaction"]["id"] == tx_id
    ]  # fmt: skip
    all_events = events + c_events
    assert len(all_events) == 11
    assert {r.value["transaction"]["id"] for r in all_events} == {tx_id}
    assert sorted(r.value["transaction"]["total_order"] for r in all_events) == list(range(1, 12))
    per_table = Counter(r.value["source"]["table"] for r in all_events)
    assert per_table == {a: 6, b: 3, c: 2}
    for table, n in per_table.items():
        orders = sorted(
            r.value["transaction"]["data_collection_order"]
            for r in all_events if r.value["source"]["table"] == table
        )  # fmt: skip
        assert orders == list(range(1, n + 1))
    partitions = {r.partition for r in events}
    assert len(partitions) > 1  # the 3-partition topics really spread the keys
    found = markers(env, tx_id)
    assert [m["status"] for m in found] == ["BEGIN", "END"]
    end = found[1]
    assert end["event_count"] == 11
    assert sorted(
        (d["data_collection"], d["event_count"]) for d in end["data_collections"]
    ) == sorted([(f"public.{a}", 6), (f"public.{b}", 3), (f"public.{c}", 2)])
    assert (
        found[0]["commit_lsn"] == end["commit_lsn"] == all_events[0].value["source"]["commit_lsn"]
    )


def test_empty_transactions_get_no_markers_but_are_confirmed(env: dict[str, Any]) -> None:
    other = unique("unpublished")
    dsn = env["dsn"]
    sql(dsn, f"CREATE TABLE {other} (id int)", f"INSERT INTO {other} VALUES (1)")
    lsn = env["source"].current_lsn()
    env["source"].wait_confirmed(lsn)
    sql(dsn, f"DROP TABLE {other}")
    status, body = env["producer"].http("/metrics")
    assert status == 200 and "walbridge_events_total" in body
    assert env["producer"].http("/healthz")[0] == 200
