"""Benchmark: the replication client's read + decode + confirm rate vs pg_recvlogical.

Run (needs the local stack; ~1-2 minutes for the default 1M changes):

    .walbridge/venv/bin/python tests/bench/bench_replication.py [--changes N] [--tx-size N] [--rounds R]

It writes ``--changes`` inserts into an 8-column table (int8, text, numeric(12,2), timestamptz,
jsonb, bool, text[], enum) in transactions of ``--tx-size`` rows, with a pgoutput slot created
before the data. That slot is copied (pg_copy_logical_replication_slot) so every run reads the
same WAL from the same start. Per round it times, wall clock, both of:

  pg_recvlogical  -o proto_version=1 -o publication_names=... --endpos=<end> -f /dev/null
  client          ReplicationClient stream -> Decoder().decode every payload -> confirm each
                  Commit's end_lsn, stopping by pg_recvlogical's --endpos rule

alternating which goes first, then prints both rates (row changes/s), and the ratio of the
client's to pg_recvlogical's median rate. Slots, publication and table are dropped at the end.
The walsender's decoding is the ceiling for both, so a ratio near 1 means the client keeps up.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from proc_usage import TICKS_PER_S, task_stat
from psycopg import sql

from producer.pgoutput import Commit, Decoder, Insert, format_lsn, parse_lsn
from producer.replication import ReplicationClient, ReplicationConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    name: str
    seconds: float
    changes: int
    cpu_seconds: float  # the reader's own CPU (user + system), excluding the walsender
    walsender_cpu: float | None = None  # the serving walsender's CPU, when /proc shows it

    @property
    def rate(self) -> float:
        return self.changes / self.seconds


class WalsenderCpu:
    """Samples the CPU time of the walsender serving ``slot`` (same machine only) in a thread,
    to tell a slow reader apart from a starved walsender on a shared machine."""

    def __init__(self, dsn: str, slot: str) -> None:
        self._dsn, self._slot = dsn, slot
        self._ticks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> WalsenderCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float | None:
        return sum(self._ticks.values()) / TICKS_PER_S if self._ticks else None

    def _sample(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as db:
            while not self._stop.wait(0.05):
                row = db.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (self._slot,),
                ).fetchone()
                if row and row[0]:
                    try:
                        stat = task_stat(Path(f"/proc/{row[0]}/stat").read_text())
                    except OSError:
                        continue  # the walsender just exited, or another machine's
                    self._ticks[row[0]] = stat.ticks


def pg_dsn() -> str:
    if dsn := os.environ.get("WALBRIDGE_PG_DSN"):
        return dsn
    out = subprocess.run(
        [str(ROOT / "deploy/local/stack"), "env"], check=True, text=True, capture_output=True
    ).stdout
    for line in out.splitlines():
        if line.startswith("export WALBRIDGE_PG_DSN="):
            return line.split("=", 1)[1].strip("'")
    sys.exit("no WALBRIDGE_PG_DSN and `deploy/local/stack env` did not print one")


def recvlogical_binary() -> str:
    """The stack's pg_recvlogical (PostgreSQL 18's client tools read every major's stream)."""
    tools = os.environ.get("WALBRIDGE_PG_TOOLS")
    if not tools:
        out = subprocess.run(
            [str(ROOT / "deploy/local/stack"), "env"], check=True, text=True, capture_output=True
        ).stdout
        tools = next(
            (
                line.split("=", 1)[1].strip("'")
                for line in out.splitlines()
                if line.startswith("export WALBRIDGE_PG_TOOLS=")
            ),
            "",
        )
    if tools and (Path(tools) / "pg_recvlogical").exists():
        return str(Path(tools) / "pg_recvlogical")
    found = shutil.which("pg_recvlogical")
    if not found:
        sys.exit("pg_recvlogical not found (deploy/local/stack up installs it)")
    return found


def create_workload(db: psycopg.Connection, schema: str, publication: str, slot: str) -> None:
    """The 8-column table ``<schema>.rows`` (the producer benchmark's table, docs/benchmarks.md), published by
    ``publication``, and a pgoutput ``slot`` created before any data."""
    table = sql.Identifier(schema, "rows")
    mood = sql.Identifier(schema, "mood")
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.execute(sql.SQL("CREATE TYPE {} AS ENUM ('sad', 'ok', 'happy')").format(mood))
    db.execute(
        sql.SQL(
            "CREATE TABLE {} (id int8 PRIMARY KEY, name text, price numeric(12,2),"
            " created timestamptz, doc jsonb, active bool, tags text[], mood {})"
        ).format(table, mood)
    )
    db.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(publication), table)
    )
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def drop_workload(
    db: psycopg.Connection, schema: str, publication: str, slots: Iterable[str]
) -> None:
    """Undo ``create_workload`` and the slot copies: a forgotten slot holds WAL forever."""
    for slot in slots:
        db.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        )
    db.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
    db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def generate(db: psycopg.Connection, schema: str, changes: int, tx_size: int) -> None:
    """``changes`` inserts, ``tx_size`` per transaction (one autocommit statement each)."""
    statement = sql.SQL(
        "INSERT INTO {} SELECT g, 'name-' || g, (g %% 100000) / 100.0, now(),"
        " jsonb_build_object('g', g, 'tag', 'bench'), g %% 2 = 0, ARRAY['a', g::text],"
        " (ARRAY['sad', 'ok', 'happy'])[g %% 3 + 1]::{}"
        " FROM generate_series(%s::int8, %s::int8) g"
    ).format(sql.Identifier(schema, "rows"), sql.Identifier(schema, "mood"))
    for start in range(0, changes, tx_size):
        db.execute(statement, (start + 1, min(start + tx_size, changes)))


def time_recvlogical(dsn: str, slot: str, publication: str, end_lsn: int, changes: int) -> Run:
    command = [
        recvlogical_binary(),
        f"--dbname={dsn}",
        f"--slot={slot}",
        "--start",
        "--no-loop",
        f"--endpos={format_lsn(end_lsn)}",
        "-o", "proto_version=1",
        "-o", f"publication_names={publication}",
        "-f", "/dev/null",
    ]  # fmt: skip
    cpu_before = _children_cpu()
    with WalsenderCpu(dsn, slot) as walsender:
        began = time.perf_counter()
        subprocess.run(command, check=True)
        seconds = time.perf_counter() - began
    return Run("pg_recvlogical", seconds, changes, _children_cpu() - cpu_before, walsender.seconds)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stream_to(client: ReplicationClient, end_lsn: int) -> Iterator[tuple[memoryview, int]]:
    """(payload, WAL start) of each message of ``client``'s stream up to ``end_lsn``, with the
    same stop rule as pg_recvlogical --endpos: data past the end, or the server reporting
    (keepalive) that it has sent everything up to it."""
    for item in client.stream(idle_after=0.01):
        if item is None:
            if client.server_wal_end >= end_lsn:
                return
            continue
        payload, wal_start, _wal_end = item
        if wal_start > end_lsn:
            return
        yield payload, wal_start


def time_client(dsn: str, slot: str, publication: str, end_lsn: int) -> Run:
    config = ReplicationConfig(
        slot=slot, publication=publication, create_slot=False, create_publication=False
    )
    decoder = Decoder()
    decode = decoder.decode
    inserts = 0
    with WalsenderCpu(dsn, slot) as walsender:
        cpu_before = time.process_time()  # includes the sampler thread's few queries
        began = time.perf_counter()
        with ReplicationClient(dsn, config) as client:
            client.open()
            for payload, _wal_start in stream_to(client, end_lsn):
                message = decode(payload)
                if type(message) is Insert:
                    inserts += 1
                elif type(message) is Commit:
                    client.confirm(message.end_lsn)
        seconds = time.perf_counter() - began
        cpu = time.process_time() - cpu_before
    return Run("client", seconds, inserts, cpu, walsender.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--tx-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="each round runs both readers once")
    args = parser.parse_args()

    dsn = pg_dsn()
    tag = uuid.uuid4().hex[:8]
    schema, publication, base_slot = f"bench_{tag}", f"bench_pub_{tag}", f"bench_{tag}"
    slots = [f"{base_slot}_{i}" for i in range(2 * args.rounds)]
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_workload(db, schema, publication, slots[0])
            began = time.perf_counter()
            generate(db, schema, args.changes, args.tx_size)
            generated = time.perf_counter() - began
            # The insert position, not pg_current_wal_lsn(): with synchronous_commit off the
            # last commits may not be written yet, and the end must lie past all of them.
            row = db.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            end_lsn = parse_lsn(row[0])
            for copy in slots[1:]:
                db.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (slots[0], copy))
            print(
                f"generated {args.changes} changes in {args.changes // args.tx_size} transactions"
                f" in {generated:.1f}s; end LSN {format_lsn(end_lsn)}; load avg {os.getloadavg()}"
            )
            runs: list[Run] = []
            for round_no in range(args.rounds):
                recv_slot, client_slot = slots[2 * round_no], slots[2 * round_no + 1]
                order = ("recv", "client") if round_no % 2 == 0 else ("client", "recv")
                for which in order:
                    if which == "recv":
                        run = time_recvlogical(dsn, recv_slot, publication, end_lsn, args.changes)
                    else:
                        run = time_client(dsn, client_slot, publication, end_lsn)
                        if run.changes != args.changes:
                            sys.exit(
                                f"client decoded {run.changes} inserts, expected {args.changes}"
                            )
                    runs.append(run)
                    print(
                        f"round {round_no + 1} {run.name:15s} {run.seconds:7.2f}s"
                        f" {run.rate:10,.0f} changes/s   reader CPU {run.cpu_seconds:6.2f}s"
                        f" ({run.cpu_seconds / run.seconds:4.0%} of one core)"
                        f"   walsender CPU {run.walsender_cpu or float('nan'):6.2f}s"
                    )
            recv = statistics.median(r.rate for r in runs if r.name == "pg_recvlogical")
            client = statistics.median(r.rate for r in runs if r.name == "client")
            print(f"median pg_recvlogical {recv:10,.0f} changes/s")
            print(f"median client         {client:10,.0f} changes/s (read + decode + confirm)")
            print(f"ratio client / pg_recvlogical = {client / recv:.3f} (target >= 0.9)")
        finally:
            drop_workload(db, schema, publication, slots)


if __name__ == "__main__":
    main()
