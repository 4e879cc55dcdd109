"""walbridge next to Debezium Server on the same PostgreSQL, WAL, Kafka and registry.

Run (needs the local stack; installs Debezium Server 3.6.3 with deploy/local/debezium-server):

    .walbridge/venv/bin/python tests/bench/bench_debezium.py diff
    .walbridge/venv/bin/python tests/bench/bench_debezium.py throughput [--changes 1000000]
    .walbridge/venv/bin/python tests/bench/bench_debezium.py latency [--rate 1000] [--seconds 20] [--writers 4]

``diff``: one table per replica identity (DEFAULT, FULL) with a column of every type the producer
maps, a TOASTed column, and the same transactions (insert, update leaving the TOASTed value alone,
a key change, delete, truncate), read by walbridge and by Debezium (each its own slot and topic
prefix). Both topics are decoded with the registry and compared event by event, field by field;
the differences are printed as a table (docs/downstream-tools.md, "Envelope differences").

``throughput``: the producer benchmark's workload (tests/bench/bench_producer.py: the 8-column
table, half inserts, half updates, 1000 rows per transaction), written once; a slot created before
the data and two copies of it, so both read the same WAL from the same start. Each runs alone,
timed from its start until its table topic holds every change (the topic's high watermark: acked
by the broker, acks=all). Prints both rates and the ratio.

``latency``: ``--rate`` transactions/s of 5 inserts (``--writers`` connections, synchronous
commits) while both run at once, each into a topic
created with LogAppendTime; latency = broker append time - ``source.ts_ms`` (the commit time,
the same field in both envelopes). Prints p50/p99 for each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_producer import stack_env, update
from bench_replication import create_workload, generate
from debezium_harness import (
    DebeziumProcess,
    drop_slots_and_publication,
    install_debezium,
    read_topic,
    slots_and_publication,
    topic_count,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.support.producer_harness import ProducerProcess, Source  # noqa: E402

# --- diff ----------------------------------------------------------------------------------

# Every type family the producer maps (schemas/type_mapping.py), one column each.
TYPES = """
  id int PRIMARY KEY, c_bool bool, c_int2 int2, c_int4 int4, c_int8 int8, c_oid oid,
  c_float4 float4, c_float8 float8, c_numeric_ps numeric(12,2), c_numeric numeric, c_money money,
  c_char char(3), c_varchar varchar(10), c_text text, c_name name, c_bytea bytea, c_uuid uuid,
  c_json json, c_jsonb jsonb, c_xml xml, c_date date, c_time time, c_timetz timetz,
  c_timestamp timestamp, c_timestamptz timestamptz, c_interval interval, c_inet inet,
  c_cidr cidr, c_macaddr macaddr, c_macaddr8 macaddr8, c_bit bit(4), c_varbit varbit,
  c_tsvector tsvector, c_tsquery tsquery, c_point point, c_line line, c_lseg lseg, c_box box,
  c_path path, c_polygon polygon, c_circle circle, c_int4range int4range, c_numrange numrange,
  c_tstzrange tstzrange, c_daterange daterange, c_pg_lsn pg_lsn, c_hstore hstore,
  c_citext citext, c_enum {s}.mood, c_domain {s}.posint, c_composite {s}.pair,
  c_int4_array int4[], c_text_array text[], c_int4_2d int4[], c_big text
"""
VALUES = """
  {id}, true, 2, 4, 8, 9, 1.5, -2.25, 1234.5, 3.14159265358979, 12.34, 'ab', 'vc', 'text é',
  'nm', '\\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"a": 1}}', '{{"b": [1, 2]}}',
  '<x>1</x>', '2024-02-29', '13:14:15.123456', '13:14:15+02', '2040-08-22 10:00:00.123456',
  '2040-08-22 10:00:00.123456+02', '1 year 2 mons 3 days 04:05:06.7', '192.168.0.1/24',
  '10.0.0.0/8', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05', B'1010', B'101',
  'a fat cat', 'fat & cat', '(1,2)', '{{1,2,3}}', '[(0,0),(1,1)]', '(1,1),(0,0)',
  '((0,0),(1,1))', '((0,0),(1,0),(0,1))', '<(0,0),1>', '[1,5)', '[1.5,2.5]',
  '[2024-01-01 00:00+00,2024-01-02 00:00+00)', '[2024-01-01,2024-02-01)', '16/B374D848',
  'a=>1, b=>NULL', 'CaseLess', 'ok', 7, ROW(1, 'x'), ARRAY[1, NULL, 3], ARRAY['a', 'b c'],
  '[0:1][1:2]={{{{1,2}},{{3,4}}}}', repeat('toast-', 2000)
"""


def diff_tables(dsn: str, schema: str) -> list[str]:
    s = sql.Identifier(schema).as_string(None)
    statements = [
        f"CREATE SCHEMA {s}",
        "CREATE EXTENSION IF NOT EXISTS hstore SCHEMA public",
        "CREATE EXTENSION IF NOT EXISTS citext SCHEMA public",
        f"CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy')",
        f"CREATE DOMAIN {s}.posint AS int4 CHECK (VALUE > 0)",
        f"CREATE TYPE {s}.pair AS (n int, label text)",
    ]
    tables = []
    for identity in ("default", "full"):
        table = f"{s}.t_{identity}"
        statements += [
            f"CREATE TABLE {table} ({TYPES.format(s=s)})",
            f"ALTER TABLE {table} ALTER COLUMN c_big SET STORAGE EXTERNAL",
            f"ALTER TABLE {table} REPLICA IDENTITY {identity.upper()}",
        ]
        tables.append(f"{schema}.t_{identity}")
    with psycopg.connect(dsn, autocommit=True) as db:
        for statement in statements:
            db.execute(statement)
    return tables


def diff_changes(dsn: str, tables: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as db:
        for table in tables:
            t = sql.Identifier(*table.split(".")).as_string(db)
            db.execute(f"INSERT INTO {t} VALUES ({VALUES.format(id=1)}), ({VALUES.format(id=2)})")
            db.execute(f"UPDATE {t} SET c_int4 = 40 WHERE id = 1")  # c_big unchanged (TOAST)
            db.execute(f"UPDATE {t} SET id = 3 WHERE id = 2")  # a key change
            db.execute(f"DELETE FROM {t} WHERE id = 1")
            db.execute(f"TRUNCATE {t}")


def _plain(value: Any) -> Any:
    """JSON-able form of a decoded Avro value, for the printed table."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, dt.datetime | dt.date | dt.time | decimal.Decimal | uuid.UUID):
        return f"{type(value).__name__}({value})"
    return value


def _short(value: Any, width: int = 70) -> str:
    text = json.dumps(_plain(value), ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _events(records: list[tuple[Any, Any, int]]) -> list[dict[str, Any]]:
    return [v for _, v, _ in records if v is not None]  # Debezium's tombstones have no value


def _schema_of(env: dict[str, str], topic: str) -> dict[str, Any]:
    client = SchemaRegistryClient({"url": env["WALBRIDGE_SCHEMA_REGISTRY_URL"]})
    return json.loads(client.get_latest_version(f"{topic}-value").schema.schema_str or "{}")


def _column_types(envelope: dict[str, Any]) -> dict[str, Any]:
    for f in envelope["fields"]:
        if f["name"] == "before":  # where both define the row record
            row = next(b for b in f["type"] if isinstance(b, dict))
            return {
                c["name"]: [b for b in (c["type"] if isinstance(c["type"], list) else [c["type"]])
                            if b != "null"]
                for c in row["fields"]
            }  # fmt: skip
    return {}


def _strip_connect(t: Any) -> Any:
    if isinstance(t, list):
        return [_strip_connect(b) for b in t]
    if isinstance(t, dict):
        keep = {k: v for k, v in t.items() if k in ("type", "logicalType", "items", "values")}
        if t.get("connect.name"):
            keep["connect.name"] = t["connect.name"]
        if "items" in keep:
            keep["items"] = _strip_connect(keep["items"])
        if t.get("type") == "record":
            return {"record": [f["name"] for f in t["fields"]]}
        return keep["type"] if list(keep) == ["type"] else keep  # e.g. {"type": "int"} is "int"
    return t


def run_diff(env: dict[str, str]) -> None:
    install_debezium()
    dsn = env["WALBRIDGE_PG_DSN"]
    tag = uuid.uuid4().hex[:6]
    schema, publication = f"interop_{tag}", f"interop_pub_{tag}"
    slots = [f"interop_{tag}_wb", f"interop_{tag}_dbz"]
    tables = diff_tables(dsn, schema)
    ours, theirs = f"wb{tag}", f"dbz{tag}"
    try:
        with slots_and_publication(dsn, publication, tables, slots):
            diff_changes(dsn, tables)
            source = Source(dsn, publication, slots[0], ours)
            producer = ProducerProcess(
                source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"]
            )
            debezium = DebeziumProcess(env, slots[1], publication, theirs, tables)
            producer.start()
            debezium.start()
            end = source.current_lsn()
            source.wait_confirmed(end, timeout=120)
            producer.stop()
            deadline = time.monotonic() + 180
            consumer = Consumer(
                {"bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"], "group.id": "x"}
            )
            while any(topic_count(f"{theirs}.{t}", consumer) == 0 for t in tables):
                debezium.check()
                if time.monotonic() > deadline:
                    sys.exit(f"Debezium published nothing in 180 s:\n{debezium.log()}")
                time.sleep(1)
            time.sleep(5)  # let it finish the batch
            debezium.stop()
            consumer.close()
            for table in tables:
                compare(env, table, f"{ours}.{table}", f"{theirs}.{table}")
    finally:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def compare(env: dict[str, str], table: str, ours_topic: str, theirs_topic: str) -> None:
    # Ours spread over partitions by key: commit order is (commit_lsn, total_order).
    ours = sorted(
        _events(read_topic(env, ours_topic)),
        key=lambda e: (e["source"]["commit_lsn"], e["transaction"]["total_order"]),
    )
    theirs = _events(read_topic(env, theirs_topic))  # one partition
    print(f"\n## {table}: {len(ours)} walbridge events, {len(theirs)} Debezium events")
    print("ops walbridge:", [e["op"] for e in ours], " Debezium:", [e["op"] for e in theirs])
    ours_types = _column_types(_schema_of(env, ours_topic))
    theirs_types = _column_types(_schema_of(env, theirs_topic))
    print("\n| column | walbridge Avro | Debezium Avro | walbridge value | Debezium value |")
    print("|---|---|---|---|---|")
    first_ours = next(e for e in ours if e["op"] == "c")["after"]
    first_theirs = next(e for e in theirs if e["op"] == "c")["after"]
    for name in ours_types:
        a, b = first_ours.get(name), first_theirs.get(name)
        ta, tb = _strip_connect(ours_types[name]), _strip_connect(theirs_types.get(name))
        if _plain(a) != _plain(b) or ta != tb:
            print(f"| {name} | {_short(ta, 60)} | {_short(tb, 60)} | {_short(a)} | {_short(b)} |")
    print("\n| event field | op | walbridge | Debezium |")
    print("|---|---|---|---|")
    seen: set[tuple[str, str]] = set()
    for a, b in zip(ours, theirs, strict=False):
        for path, va, vb in _walk(a, b):
            if path.startswith(("after.", "before.")) and path.split(".", 1)[1] in ours_types:
                col = path.split(".", 1)[1]
                if _plain(first_ours.get(col)) != _plain(first_theirs.get(col)):
                    continue  # a type difference, listed above
            if _plain(va) != _plain(vb) and (path, a["op"]) not in seen:
                seen.add((path, a["op"]))
                print(f"| {path} | {a['op']}/{b['op']} | {_short(va)} | {_short(vb)} |")


def _walk(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in dict.fromkeys([*a, *b]):
            yield from _walk(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}{k}.")
        return
    yield path.rstrip("."), a, b


# --- throughput ----------------------------------------------------------------------------


def time_until_count(
    env: dict[str, str], topic: str, expected: int, proc: Any, began: float
) -> tuple[float, float]:
    """(seconds from ``began`` until the topic holds ``expected`` records, seconds from its
    first record until then: the rate after start-up)."""
    consumer = Consumer({"bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"], "group.id": "x"})
    first = None
    try:
        while (count := topic_count(topic, consumer)) < expected:
            if first is None and count:
                first = time.perf_counter()
            proc.check()
            time.sleep(0.1)
        ended = time.perf_counter()
        return ended - began, ended - (first or began)
    finally:
        consumer.close()


class _Ours:
    def __init__(self, producer: ProducerProcess) -> None:
        self.producer = producer

    def check(self) -> None:
        assert self.producer.proc is not None
        if self.producer.proc.poll() is not None:
            sys.exit(f"producer exited:\n{self.producer.log()}")


def run_throughput(env: dict[str, str], changes: int, tx_size: int) -> None:
    install_debezium()
    dsn = env["WALBRIDGE_PG_DSN"]
    tag = uuid.uuid4().hex[:6]
    schema, publication = f"benchdbz_{tag}", f"benchdbz_pub_{tag}"
    slots = [f"benchdbz_{tag}_wb", f"benchdbz_{tag}_dbz"]
    table = f"{schema}.rows"
    inserts = changes // 2
    with psycopg.connect(dsn, autocommit=True) as db:
        create_workload(db, schema, publication, slots[0])
        db.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (slots[0], slots[1]))
        began = time.perf_counter()
        generate(db, schema, inserts, tx_size)
        update(db, schema, changes - inserts, tx_size)
        print(f"generated {changes:,} changes in {time.perf_counter() - began:.1f}s")
    try:
        source = Source(dsn, publication, slots[0], f"wb{tag}")
        producer = ProducerProcess(
            source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"],
            log_level="WARNING", heartbeat_interval_s="0",
        )  # fmt: skip
        began = time.perf_counter()
        producer.start(wait_ready=False)
        ours, ours_steady = time_until_count(
            env, f"wb{tag}.{table}", changes, _Ours(producer), began
        )
        producer.stop()
        print(
            f"walbridge {ours:7.1f}s {changes / ours:10,.0f} changes/s; from its first event "
            f"{ours_steady:.1f}s, {changes / ours_steady:,.0f}/s"
        )
        debezium = DebeziumProcess(env, slots[1], publication, f"dbz{tag}", [table])
        began = time.perf_counter()
        debezium.start()
        try:
            theirs, theirs_steady = time_until_count(
                env, f"dbz{tag}.{table}", changes, debezium, began
            )
        finally:
            debezium.stop()
        print(
            f"Debezium  {theirs:7.1f}s {changes / theirs:10,.0f} changes/s; from its first event "
            f"{theirs_steady:.1f}s, {changes / theirs_steady:,.0f}/s"
        )
        print(
            f"ratio walbridge / Debezium = {theirs / ours:.2f} (goal >= 3); "
            f"after start-up {theirs_steady / ours_steady:.2f}"
        )
    finally:
        drop_slots_and_publication(dsn, publication, slots)
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


# --- latency -------------------------------------------------------------------------------


def writer(dsn: str, table: str, rate: float, rows: int, seconds: float, done: list[int]) -> None:
    statement = f"INSERT INTO {table} (v) SELECT g FROM generate_series(1, {rows}) g"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")  # see bench_producer_latency.py
        began = time.perf_counter()
        sent = 0
        while (now := time.perf_counter() - began) < seconds:
            due = int(now * rate) + 1
            while sent < due:
                conn.execute(statement)
                sent += 1
            time.sleep(max(0.0, sent / rate - (time.perf_counter() - began)))
        done.append(sent)


def run_latency(env: dict[str, str], rate: float, rows: int, seconds: float, writers: int) -> None:
    install_debezium()
    dsn = env["WALBRIDGE_PG_DSN"]
    tag = uuid.uuid4().hex[:6]
    table = f"public.benchdbzl_{tag}"
    publication = f"benchdbzl_pub_{tag}"
    slots = [f"benchdbzl_{tag}_wb", f"benchdbzl_{tag}_dbz"]
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int, at timestamptz)")
    topics = {"walbridge": f"wb{tag}.{table}", "Debezium": f"dbz{tag}.{table}"}
    admin = AdminClient({"bootstrap.servers": env["WALBRIDGE_KAFKA_BOOTSTRAP"]})
    for topic in topics.values():
        new = NewTopic(topic, 3, -1, config={"message.timestamp.type": "LogAppendTime"})
        admin.create_topics([new])[topic].result()
    with slots_and_publication(dsn, publication, [table], slots):
        source = Source(dsn, publication, slots[0], f"wb{tag}")
        producer = ProducerProcess(
            source, env["WALBRIDGE_KAFKA_BOOTSTRAP"], env["WALBRIDGE_SCHEMA_REGISTRY_URL"],
            log_level="WARNING",
        )  # fmt: skip
        debezium = DebeziumProcess(env, slots[1], publication, f"dbz{tag}", [table])
        producer.start()
        debezium.start()
        try:
            # Debezium has started streaming once a first transaction reaches its topic.
            with psycopg.connect(dsn, autocommit=True) as db:
                db.execute(f"INSERT INTO {table} (v) VALUES (0)")
            time_until_count(env, topics["Debezium"], 1, debezium, time.perf_counter())
            done: list[int] = []
            threads = [
                threading.Thread(
                    target=writer, args=(dsn, table, rate / writers, rows, seconds, done)
                )
                for _ in range(writers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            expected = sum(done) * rows + 1
            for topic in topics.values():
                proc = debezium if topic == topics["Debezium"] else _Ours(producer)
                time_until_count(env, topic, expected, proc, time.perf_counter())
        finally:
            producer.stop()
            debezium.stop()
    print(
        f"{sum(done):,} transactions of {rows} rows in {seconds:.0f}s "
        f"({sum(done) / seconds:,.0f} tx/s, target {rate:,.0f}); both running at once"
    )
    for name, topic in topics.items():
        latencies = sorted(
            appended - value["source"]["ts_ms"]
            for _, value, appended in read_topic(env, topic)
            if value is not None and value["after"]["v"] != 0  # not the start-up probe
        )
        q = statistics.quantiles(latencies, n=100)
        print(
            f"{name:9} commit -> Kafka append: p50 {q[49]:.0f} ms, p99 {q[98]:.0f} ms, "
            f"max {latencies[-1]:.0f} ms ({len(latencies):,} events)"
        )
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"DROP TABLE {table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("diff")
    tp = sub.add_parser("throughput")
    tp.add_argument("--changes", type=int, default=1_000_000)
    tp.add_argument("--tx-size", type=int, default=1000)
    lat = sub.add_parser("latency")
    lat.add_argument("--rate", type=float, default=1000.0)
    lat.add_argument("--rows", type=int, default=5)
    lat.add_argument("--seconds", type=float, default=20.0)
    lat.add_argument("--writers", type=int, default=4, help="connections committing in parallel")
    args = parser.parse_args()
    env = stack_env()
    if args.what == "diff":
        run_diff(env)
    elif args.what == "throughput":
        run_throughput(env, args.changes, args.tx_size)
    else:
        run_latency(env, args.rate, args.rows, args.seconds, args.writers)


if __name__ == "__main__":
    main()
