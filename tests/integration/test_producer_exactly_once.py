"""Exactly-once into Kafka, on the real stack: whatever is killed when, a read_committed reader
sees every source transaction's events once, END counts exact, and replaying the events
rebuilds the source tables.

The kill test covers the window exactly-once exists for: a producer that dies right after a
Kafka commit and before the slot confirms it (``WALBRIDGE_FAULT_EXIT_AFTER_KAFKA_COMMITS``),
so PostgreSQL resends transactions Kafka already holds; and big source transactions that
span several Kafka transactions (a small ``kafka_transaction_max_events``), killed part-way.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.producer_harness import (
    ProducerProcess,
    Record,
    Source,
    TopicReader,
    query,
    sql,
    unique,
)

pytestmark = pytest.mark.integration

SEED = 20261125
CHANGES = 200_000


@pytest.fixture
def tables(pg_dsn: str) -> Iterator[dict[str, str]]:
    names = {kind: unique(f"eo_{kind}") for kind in ("acct", "item", "hist")}
    sql(
        pg_dsn,
        f"CREATE TABLE {names['acct']} (id int PRIMARY KEY, balance bigint NOT NULL)",
        f"CREATE TABLE {names['item']} (id int PRIMARY KEY, v int NOT NULL, note text)",
        # keyless: every column is the row's identity; inserts only
        f"CREATE TABLE {names['hist']} (acct int NOT NULL, delta bigint NOT NULL, tx int)",
        f"INSERT INTO {names['acct']} SELECT g, 1000 FROM generate_series(1, 500) g",
    )
    yield names
    sql(pg_dsn, *(f"DROP TABLE IF EXISTS {t}" for t in names.values()))


@pytest.fixture
def source(pg_dsn: str, tables: dict[str, str]) -> Iterator[Source]:
    src = Source.create(pg_dsn, tables.values(), "eo")
    yield src
    src.drop()


def workload(dsn: str, names: dict[str, str], changes: int, rng: random.Random) -> int:
    """pgbench-like transfers (5 changes), single-row item changes (1), and now and then a
    1000-change and a 20,000-change transaction, until ``changes`` row changes; returns the
    number of transactions."""
    acct, item, hist = names["acct"], names["item"], names["hist"]
    done = txs = 0
    next_item = 1
    with psycopg.connect(dsn) as conn:
        while done < changes:
            shape = rng.random()
            with conn.transaction():
                if shape < 0.55:  # a transfer: 2 updates, 2 history rows, 1 item upsert
                    a, b = rng.sample(range(1, 501), 2)
                    amount = rng.randint(1, 50)
                    conn.execute(
                        f"UPDATE {acct} SET balance = balance - %s WHERE id = %s", (amount, a)
                    )
                    conn.execute(
                        f"UPDATE {acct} SET balance = balance + %s WHERE id = %s", (amount, b)
                    )
                    conn.execute(
                        f"INSERT INTO {hist} VALUES (%s, %s, %s), (%s, %s, %s)",
                        (a, -amount, txs, b, amount, txs),
                    )
                    conn.execute(f"INSERT INTO {item} VALUES (%s, 0, 't')", (next_item,))
                    next_item += 1
                    done += 5
                elif shape < 0.9:  # one change: update, delete or key change of an item
                    target = rng.randint(1, max(1, next_item - 1))
                    kind = rng.random()
                    if kind < 0.5:
                        conn.execute(f"UPDATE {item} SET v = v + 1 WHERE id = %s", (target,))
                    elif kind < 0.8:
                        conn.execute(f"DELETE FROM {item} WHERE id = %s", (target,))
                    else:
                        conn.execute(
                            f"UPDATE {item} SET id = %s WHERE id = %s", (-next_item, target)
                        )
                        next_item += 1
                    done += 1
                else:
                    rows = 20_000 if shape > 0.9985 else 1000
                    conn.execute(
                        f"INSERT INTO {item} SELECT g, 1, repeat('x', 50) "
                        "FROM generate_series(%s::int, %s::int) g",
                        (next_item, next_item + rows - 1),
                    )
                    next_item += rows
                    done += rows
            txs += 1
    return txs


def read_committed(bootstrap: str, registry: str, topics: list[str]) -> list[Record]:
    return TopicReader(bootstrap, registry).read_to_end(topics)


def check_exactly_once(
    dsn: str, source: Source, names: dict[str, str], bootstrap: str, registry: str
) -> tuple[int, int]:
    """No duplicate, END counts exact, replay equal to the tables; (transactions, events)."""
    topics = {kind: f"{source.prefix}.public.{t}" for kind, t in names.items()}
    data = read_committed(bootstrap, registry, list(topics.values()))
    markers = read_committed(bootstrap, registry, [f"{source.prefix}.transaction"])

    seen: set[tuple[int, int]] = set()
    per_tx: Counter[str] = Counter()
    per_tx_table: dict[str, Counter[str]] = defaultdict(Counter)
    for r in data:
        v = r.value
        dedup = (v["source"]["commit_lsn"], v["transaction"]["total_order"])
        assert dedup not in seen, f"duplicate event {dedup} in {r.topic}@{r.partition}:{r.offset}"
        seen.add(dedup)
        per_tx[v["transaction"]["id"]] += 1
        per_tx_table[v["transaction"]["id"]][f"public.{v['source']['table']}"] += 1

    begins: Counter[str] = Counter()
    ends: dict[str, dict[str, Any]] = {}
    for m in markers:
        tx_id = m.value["id"]
        if m.value["status"] == "BEGIN":
            begins[tx_id] += 1
        else:
            assert tx_id not in ends, f"END of {tx_id} twice"
            ends[tx_id] = m.value
    assert set(begins) == set(ends) == set(per_tx), "BEGIN/END without events or vice versa"
    assert all(n == 1 for n in begins.values()), "a BEGIN marker twice"
    for tx_id, end in ends.items():
        assert end["event_count"] == per_tx[tx_id], f"{tx_id}: END says {end['event_count']}"
        counts = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert counts == dict(per_tx_table[tx_id]), tx_id

    ordered = sorted(
        data, key=lambda r: (r.value["source"]["commit_lsn"], r.value["transaction"]["total_order"])
    )
    # The accounts were inserted before the slot existed (snapshots are off here): start from them.
    accounts = {i: {"id": i, "balance": 1000} for i in range(1, 501)}
    keyed: dict[str, dict[int, dict[str, Any]]] = {topics["acct"]: accounts, topics["item"]: {}}
    history: Counter[tuple[Any, ...]] = Counter()
    for r in ordered:
        v = r.value
        if r.topic == topics["hist"]:
            assert v["op"] == "c"
            history[tuple(v["after"].values())] += 1
            continue
        rows = keyed[r.topic]
        if v["before"] is not None:
            rows.pop(v["before"]["id"], None)
        if v["op"] == "d":
            rows.pop(r.key["id"], None)
        else:
            rows[v["after"]["id"]] = v["after"]
    for kind in ("acct", "item"):
        table = names[kind]
        cols = "id, balance" if kind == "acct" else "id, v, note"
        expected = {row[0]: row for row in query(dsn, f"SELECT {cols} FROM {table}")}
        got = {k: tuple(v.values()) for k, v in keyed[topics[kind]].items()}
        assert got == expected, f"{table}: replay differs from PostgreSQL"
    pg_history = Counter(query(dsn, f"SELECT acct, delta, tx FROM {names['hist']}"))
    assert history == pg_history, "history (keyless) differs"
    total = query(dsn, f"SELECT sum(balance) FROM {names['acct']}")[0][0]
    assert total == 500 * 1000  # the transfers' invariant
    return len(ends), len(seen)


def test_kill_9_at_random_moments_is_exactly_once(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, tables: dict[str, str]
) -> None:
    rng = random.Random(SEED)
    settings = {"kafka_transaction_max_events": 3000}  # big transactions span several
    done = threading.Event()
    result: dict[str, int] = {}

    def load() -> None:
        try:
            result["txs"] = workload(pg_dsn, tables, CHANGES, random.Random(SEED + 1))
        finally:
            done.set()

    first = ProducerProcess(source, kafka_bootstrap, registry_url, **settings).start()
    writer = threading.Thread(target=load, daemon=True)
    writer.start()
    producer = first
    kills = fault_exits = 0
    while not done.is_set() or kills + fault_exits < 10:
        if rng.random() < 0.4:
            # Dies right after its next few Kafka commits, before confirming: the slot lags.
            producer.stop()  # the running one (clean stop), then one set to crash
            faulty = ProducerProcess(
                source, kafka_bootstrap, registry_url, **settings,
                fault_exit_after_kafka_commits=rng.randint(1, 8),
            ).start(wait_ready=False)  # fmt: skip
            assert faulty.proc is not None
            try:
                code = faulty.proc.wait(60)
            except subprocess.TimeoutExpired:  # no traffic left to commit: kill it instead
                faulty.kill()
                code = 137
            assert code == 137, faulty.log()
            fault_exits += 1
        else:
            time.sleep(rng.uniform(0.3, 2.5))
            producer.kill()
            kills += 1
        producer = ProducerProcess(source, kafka_bootstrap, registry_url, **settings).start()
    writer.join(600)
    assert not writer.is_alive() and "txs" in result
    source.wait_confirmed(source.current_lsn(), timeout=300)
    assert producer.stop() == 0, producer.log()
    assert kills >= 5 and fault_exits >= 3, (kills, fault_exits)

    # And for certain: a 20,000-change transaction, the producer gone right after its second
    # Kafka transaction (6,000 of its events committed, the slot not confirmed).
    faulty = ProducerProcess(
        source, kafka_bootstrap, registry_url, **settings, fault_exit_after_kafka_commits=2
    ).start()
    big = 50_000_000
    sql(
        pg_dsn,
        f"INSERT INTO {tables['item']} SELECT g, 2, 'big' "
        f"FROM generate_series({big}, {big + 19_999}) g",
    )
    assert faulty.proc is not None and faulty.proc.wait(120) == 137, faulty.log()
    result["txs"] += 1
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, **settings).start()
    source.wait_confirmed(source.current_lsn(), timeout=300)
    assert producer.stop() == 0, producer.log()

    log = producer.log_path.read_text(errors="replace")
    # The windows were exercised: restarts resumed from Kafka's record, some part-way through
    # a big transaction.
    assert log.count("exactly-once resume point read from Kafka") >= 10
    assert "resuming a transaction part-way" in log

    transactions, events = check_exactly_once(pg_dsn, source, tables, kafka_bootstrap, registry_url)
    assert transactions == result["txs"]
    assert events >= CHANGES


def test_second_producer_fences_the_first(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, tables: dict[str, str]
) -> None:
    first = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    writer = threading.Thread(
        target=workload, args=(pg_dsn, tables, 20_000, random.Random(SEED + 2)), daemon=True
    )
    writer.start()
    time.sleep(1.0)
    # Same slot and prefix, so the same transactional id: its start fences the first, which
    # stops at its next commit; the second waits for the slot and takes over.
    second = ProducerProcess(source, kafka_bootstrap, registry_url)
    second.log_path = second.log_path.with_name(f"{source.prefix}-second.log")
    second.start(wait_ready=False)
    assert first.proc is not None
    assert first.proc.wait(120) == 1, first.log()
    assert "fenced" in first.log().lower()
    second.wait_ready(timeout=120)
    writer.join(300)
    assert not writer.is_alive()
    source.wait_confirmed(source.current_lsn(), timeout=300)
    assert second.stop() == 0, second.log()
    check_exactly_once(pg_dsn, source, tables, kafka_bootstrap, registry_url)
