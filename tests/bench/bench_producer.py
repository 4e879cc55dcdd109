"""Benchmark: the producer's end-to-end rate vs pg_recvlogical, in the same run.

Run (needs the local stack; a few minutes for the default 1M changes):

    .walbridge/venv/bin/python tests/bench/bench_producer.py [--changes N] [--tx-size N] [--profile]

Workload: ``--changes`` row changes on the 8-column table of bench_replication.py (int8, text,
numeric(12,2), timestamptz, jsonb, bool, text[], enum): half inserts, half updates, in
transactions of ``--tx-size`` rows. A pgoutput slot is created before the data and copied
(pg_copy_logical_replication_slot), so both readers decode the same WAL from the same start:

  pg_recvlogical   proto 1, --endpos=<end>, -f /dev/null (the walsender's ceiling)
  producer         ``python -m producer run`` (a subprocess, real Kafka and registry), timed
                   from start until the slot's confirmed_flush_lsn reaches <end>: every event
                   acknowledged by Kafka and the LSN confirmed

It prints both rates, their ratio (target >= 0.6), the producer's CPU and peak RSS. With
``--profile`` the producer runs under cProfile and the top functions are printed.
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replication import create_workload, drop_workload, generate, pg_dsn, time_recvlogical

from producer.pgoutput import format_lsn, parse_lsn

ROOT = Path(__file__).resolve().parents[2]


def stack_env() -> dict[str, str]:
    """The local stack's connection settings; a WALBRIDGE_* variable already set in the
    environment wins (bench_pg_versions.py points a bench at another major's server so)."""
    out = subprocess.run(
        [str(ROOT / "deploy/local/stack"), "env"], check=True, text=True, capture_output=True
    ).stdout
    pairs = (line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    stack = {k: v.strip("'") for k, v in pairs if k.startswith("WALBRIDGE_")}
    return stack | {k: v for k, v in os.environ.items() if k.startswith("WALBRIDGE_")}


def update(db: psycopg.Connection, schema: str, changes: int, tx_size: int) -> None:
    statement = sql.SQL(
        "UPDATE {} SET price = price + 1, active = NOT active WHERE id BETWEEN %s AND %s"
    ).format(sql.Identifier(schema, "rows"))
    for start in range(0, changes, tx_size):
        db.execute(statement, (start + 1, min(start + tx_size, changes)))


def confirmed(db: psycopg.Connection, slot: str) -> int:
    row = db.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return parse_lsn(row[0]) if row and row[0] else 0


def _cpu_seconds(stat_path: str) -> float:
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[float, float, int]:
    """(CPU seconds of the process, of its main (Python) thread, peak RSS in kB).

    The process figure includes librdkafka's own threads (compression, network), which can
    run on the other core; the main thread's is what limits the rate when it is CPU-bound.
    """
    cpu = _cpu_seconds(f"/proc/{pid}/stat")
    main = _cpu_seconds(f"/proc/{pid}/task/{pid}/stat")
    hwm = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    return cpu, main, hwm


def run_producer(
    env: dict[str, str], slot: str, publication: str, prefix: str, end_lsn: int, profile: str | None
) -> tuple[float, float, float, float, int]:
    """(seconds to the end LSN, seconds from the first confirmed transaction to it, process
    CPU, main-thread CPU, peak RSS kB). The second figure leaves out the start-up (imports,
    connections, topic and schema set-up: about 1-2 s here), which pg_recvlogical hardly has."""
    child_env = (
        {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")}
        | env
        | {
            "WALBRIDGE_SLOT": slot,
            "WALBRIDGE_PUBLICATION": publication,
            "WALBRIDGE_TOPIC_PREFIX": prefix,
            "WALBRIDGE_METRICS_PORT": "0",
            "WALBRIDGE_HEARTBEAT_INTERVAL_S": "0",
            "WALBRIDGE_LOG_LEVEL": "WARNING",
        }
    )
    command = [sys.executable, "-m", "producer", "run"]
    if profile:
        command = [sys.executable, "-m", "cProfile", "-o", profile, "-m", "producer", "run"]
    with psycopg.connect(env["WALBRIDGE_PG_DSN"], autocommit=True) as db:
        start_lsn = confirmed(db, slot)
        began = time.perf_counter()
        first = None
        proc = subprocess.Popen(command, cwd=ROOT, env=child_env)
        while (lsn := confirmed(db, slot)) < end_lsn:
            if first is None and lsn > start_lsn:
                first = time.perf_counter()
            if proc.poll() is not None:
                sys.exit(f"producer exited with {proc.returncode}")
            time.sleep(0.05)
    ended = time.perf_counter()
    cpu, main, rss = proc_stat(proc.pid)
    proc.terminate()
    if proc.wait(120) != 0:
        sys.exit(f"producer exited with {proc.returncode} after SIGTERM")
    return ended - began, ended - (first or began), cpu, main, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--tx-size", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    env = stack_env()
    dsn = env.get("WALBRIDGE_PG_DSN") or pg_dsn()
    env["WALBRIDGE_PG_DSN"] = dsn
    tag = uuid.uuid4().hex[:8]
    schema, publication = f"bench_{tag}", f"bench_pub_{tag}"
    slots = [f"bench_{tag}_recv", f"bench_{tag}_producer"]
    inserts = args.changes // 2
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_workload(db, schema, publication, slots[0])
            began = time.perf_counter()
            generate(db, schema, inserts, args.tx_size)
            update(db, schema, args.changes - inserts, args.tx_size)
            print(f"generated {args.changes} changes in {time.perf_counter() - began:.1f}s")
            row = db.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            end_lsn = parse_lsn(row[0])
            db.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (slots[0], slots[1]))
            recv = time_recvlogical(dsn, slots[0], publication, end_lsn, args.changes)
            print(f"pg_recvlogical {recv.seconds:7.2f}s {recv.rate:10,.0f} changes/s")
            profile = f"/tmp/bench_producer_{tag}.prof" if args.profile else None
            seconds, steady, cpu, main, rss = run_producer(
                env, slots[1], publication, f"bench{tag}", end_lsn, profile
            )
            rate = args.changes / seconds
            print(
                f"producer       {seconds:7.2f}s {rate:10,.0f} changes/s (acked + confirmed to "
                f"{format_lsn(end_lsn)}); CPU {cpu:.1f}s ({cpu / seconds:.0%} of one core), "
                f"main thread {main:.1f}s = {main / args.changes * 1e6:.1f} us/change "
                f"({main / seconds:.0%}); peak RSS {rss / 1024:.0f} MB"
            )
            print(f"ratio producer / pg_recvlogical = {rate / recv.rate:.3f} (target >= 0.6)")
            print(
                f"after start-up (from the first confirmed transaction, {seconds - steady:.1f}s in):"
                f" {args.changes / steady:,.0f} changes/s, ratio "
                f"{args.changes / steady / recv.rate:.3f}"
            )
            if profile:
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        finally:
            drop_workload(db, schema, publication, slots)


if __name__ == "__main__":
    main()
