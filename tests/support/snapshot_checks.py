"""What the snapshot tests (tests/integration/test_producer_snapshot.py) share: a table with
TOASTed rows and a writer changing it, the table's topic replayed as a reader of the contract
would, compared with PostgreSQL row by row, and the snapshot's worker processes found, killed
and checked through the producer's process tree and `pg_stat_activity`."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from schemas import snapshot_state
from tests.support.producer_harness import (
    ProducerProcess,
    Record,
    Source,
    TopicReader,
    query,
    sql,
)

# Incompressible text over TOAST's 2 kB threshold: stored out of line.
_TOASTED = "(SELECT string_agg(md5(g::text || '-' || k::text), '') FROM generate_series(1, 120) k)"


def create_table(dsn: str, table: str, rows: int) -> None:
    sql(
        dsn,
        f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, pad text)",
        f"INSERT INTO {table} SELECT g, 0, CASE WHEN g % 97 = 0 THEN {_TOASTED} "
        f"ELSE 'p' || g END FROM generate_series(1, {rows}) g",
        f"ANALYZE {table}",
    )


class Writer:
    """Updates, deletes, inserts and key changes in small transactions until stopped, at most
    ``per_second`` of them; ``hot`` ids are updated far more often (the rows a chunk is likely
    reading right now).

    Paced, so the work a test checks is bounded by time, not by the machine's speed: unpaced,
    a slow snapshot on a busy machine let the writer (21-row hot updates) put 4.3M events in
    the topic before the snapshot ended, and reading them back outlasted the test's wait."""

    def __init__(
        self, dsn: str, table: str, rows: int, hot: range | None = None, per_second: int = 50
    ) -> None:
        self.dsn, self.table, self.rows, self.hot = dsn, table, rows, hot
        self.gap = 1.0 / per_second
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        rng = random.Random(7)
        t = self.table
        next_id = self.rows + 1
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                due = time.monotonic()
                while not self.stop.wait(max(0.0, due - time.monotonic())):
                    due += self.gap
                    with conn.transaction():
                        for _ in range(5):
                            if self.hot is not None and rng.random() < 0.7:
                                lo = rng.choice(self.hot)
                                conn.execute(
                                    f"UPDATE {t} SET v = v + 1 WHERE id BETWEEN %s AND %s",
                                    (lo, lo + 4),
                                )
                                continue
                            i = rng.randint(1, self.rows)
                            roll = rng.random()
                            if roll < 0.6:
                                conn.execute(f"UPDATE {t} SET v = v + 1 WHERE id = %s", (i,))
                            elif roll < 0.75:
                                conn.execute(f"DELETE FROM {t} WHERE id = %s", (i,))
                            elif roll < 0.9:
                                conn.execute(f"INSERT INTO {t} VALUES (%s, 1, 'new')", (next_id,))
                                next_id += 1
                            else:  # a key change: delete + create downstream
                                conn.execute(f"UPDATE {t} SET id = %s WHERE id = %s", (next_id, i))
                                next_id += 1
                    self.transactions += 1
        except BaseException as exc:
            self.error = exc


def replay(records: list[Record], topic: str) -> dict[int, tuple[int, str | None]]:
    """The table as the events say it is: every event once (dedup key), in commit order."""
    events: dict[tuple[int, int], dict[str, Any]] = {}
    for r in records:
        if r.topic == topic:
            v = r.value
            events[(v["source"]["commit_lsn"], v["transaction"]["total_order"])] = v
    state: dict[int, tuple[int, str | None]] = {}
    deleted: dict[int, tuple[int, str | None]] = {}
    for _, v in sorted(events.items()):
        if v["op"] == "t":
            state.clear()
        elif v["op"] == "d":
            key = v["before"]["id"]
            if key in state:
                deleted[key] = state.pop(key)
        else:
            a = v["after"]
            pad = a["pad"]
            if "pad" in v["unchanged_toast"]:  # not sent: the row's current value stands,
                # or after a key change the replaced row's (named by `before`)
                if v["before"] is not None and v["before"]["id"] != a["id"]:
                    pad = deleted.get(v["before"]["id"], (0, None))[1]
                else:
                    pad = state.get(a["id"], (0, None))[1]
            state[a["id"]] = (a["v"], pad)
    return state


def read_all(bootstrap: str, registry_url: str, topic: str) -> list[Record]:
    """Every record of the topic up to its end now (not "until quiet": a busy machine pauses)."""
    return TopicReader(bootstrap, registry_url).read_to_end([topic])


def source_rows(dsn: str, table: str) -> dict[int, tuple[int, str | None]]:
    return {i: (v, pad) for i, v, pad in query(dsn, f"SELECT id, v, pad FROM {table}")}


def wait_snapshots_done(
    producer: ProducerProcess, table: str, timeout: float = 300.0, runs: int = 1
) -> None:
    """Until the snapshot of ``table`` (named as the producer's log names it, `schema.table`)
    is done (``runs``: the how-manieth "snapshot done" line of the table in the log) and
    nothing else is being snapshotted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [
            line
            for line in producer.log_path.read_text().splitlines()
            if '"snapshot done"' in line and f'"{table}"' in line
        ]
        status, body = producer.http("/readyz")
        if len(done) >= runs and status == 200 and "snapshotting" not in body:
            return
        time.sleep(0.5)
    raise AssertionError(f"snapshot {runs} of {table} not done after {timeout}s:\n{producer.log()}")


def snapshot_workers(pid: int) -> list[int]:
    """The producer's snapshot worker processes (multiprocessing's spawned children; not its
    resource tracker)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children.extend(int(c) for c in (task / "children").read_text().split())
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def assert_worker_sessions(pid: int, workers: int) -> list[int]:
    """The producer runs ``workers`` snapshot workers, each with one SQL session at most (its
    TCP connections, from /proc: other producers may share the server, so pg_stat_activity
    can't tell whose a session is); returns their pids."""
    pids = snapshot_workers(pid)
    assert len(pids) == workers, pids
    connections = 0
    for p in pids:
        tcp = set()
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/{p}/net/{table}").read_text().splitlines()[1:]:
                tcp.add(line.split()[9])  # the socket's inode
        held = [
            fd for fd in Path(f"/proc/{p}/fd").iterdir()
            if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in tcp
        ]  # fmt: skip
        # A worker connects at its first range (one may have had none yet).
        assert len(held) <= 1, f"worker {p} holds {len(held)} TCP connections"
        connections += len(held)
    assert connections >= 1, "no worker has read a range"
    return pids


def wait_gone(pids: list[int], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{p}").exists() for p in pids):
        assert time.monotonic() < deadline, f"snapshot workers outlived the producer: {pids}"
        time.sleep(0.2)


def assert_read_by_workers(producer: ProducerProcess, workers: int) -> None:
    """The producer read its chunks with this many snapshot worker processes
    (producer/snapshot/workers.py), each window split between them."""
    started = [
        json.loads(line)
        for line in producer.log_path.read_text().splitlines()
        if "snapshot workers starting" in line
    ]
    assert started and all(s["workers"] == workers for s in started), producer.log()


def assert_same(records: list[Record], topic: str, dsn: str, table: str) -> None:
    lake, pg = replay(records, topic), source_rows(dsn, table)
    missing = sorted(set(pg) - set(lake))[:10]
    extra = sorted(set(lake) - set(pg))[:10]
    differ = [k for k in pg if k in lake and lake[k] != pg[k]][:10]
    assert not (missing or extra or differ), f"missing {missing} extra {extra} differ {differ}"


def wait_past_first_chunks(
    source: Source, bootstrap: str, table: str, producer: ProducerProcess, rows: int = 4000
) -> None:
    """Until Kafka holds a resume record of ``table`` past ``rows``, the snapshot not done. The
    record is written after its chunk's transaction is acknowledged, so a kill before that
    rightly starts the table over, which says nothing about resuming."""
    name, deadline = f"public.{table}", time.monotonic() + 120
    conf = {"bootstrap.servers": bootstrap}
    while (
        state := snapshot_state.load(conf, f"{source.prefix}.snapshot").get(name)
    ) is None or state.rows < rows:
        assert time.monotonic() < deadline, producer.log()
        time.sleep(0.05)
    assert state.status != snapshot_state.DONE, "the snapshot ended before the kill"


def assert_resumed(producer: ProducerProcess, rows: int = 4000) -> None:
    """The restarted producer resumed from a chunk past ``rows``, not from the table's start."""
    log = producer.log_path.read_text().splitlines()
    resumed = [json.loads(line) for line in log if "snapshot resumed" in line]
    assert resumed and resumed[0]["rows_done"] >= rows, producer.log()


def assert_topic_equals_source(
    source: Source, bootstrap: str, registry_url: str, dsn: str, table: str
) -> None:
    source.wait_confirmed(source.current_lsn())
    topic = f"{source.prefix}.public.{table}"
    assert_same(read_all(bootstrap, registry_url, topic), topic, dsn, table)
