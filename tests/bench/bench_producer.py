"""Benchmark: the producer's end-to-end rate vs pg_recvlogical on the same WAL, per transaction
shape, exactly-once on and off, median over several runs.

Run (needs the local stack, and a quiet machine: the 1-minute load is printed before each run):

    .walbridge/venv/bin/python tests/bench/bench_producer.py [--shape big|small|tpcb]
        [--changes N] [--runs 5] [--exactly-once on|off|both] [--profile cprofile|py-spy]
        [--ceiling] [--json FILE]

Shapes, on the 8-column table of bench_replication.py (int8, text, numeric(12,2), timestamptz,
jsonb, bool, text[], enum):
  big    transactions of 1,000 changes (half inserts, then half updates); default 1M changes
  small  one-change transactions (half inserts, then half updates); default 250,000
  tpcb   5-change transactions (one insert and four updates, the TPC-B shape); default 500,000
The WAL is written once (a PL/pgSQL procedure commits each transaction), with a pgoutput slot
created before it. Each run copies that slot twice (pg_copy_logical_replication_slot), so both
readers decode the same WAL from the same start:

  pg_recvlogical   proto 1, --endpos=<end>, -f /dev/null (the walsender's ceiling)
  producer         ``python -m producer run`` (a subprocess, real Kafka and registry), timed
                   from start until the slot's confirmed_flush_lsn reaches <end>: every event
                   acknowledged by Kafka (and committed, with exactly-once) and the LSN confirmed

Per run: both times, the ratio producer / pg_recvlogical, the producer's main-thread CPU per
change and process CPU (all threads, librdkafka's included) per transaction, peak RSS, and the
1-minute load before and after. Then the medians per exactly-once mode. Targets (issue 42):
big >= 0.8 with <= 10 us main-thread CPU per change, small >= 0.5, tpcb >= 0.6.
With ``--ceiling`` each run also streams a third copy of the slot through the producer's ceiling
(``producer_ceiling.py``: the producer's own records, pre-encoded, answered per message with its
reader and librdkafka settings), on a quiet machine again: the most a compiled hot path could
buy. With ``--profile`` the producer runs one run under cProfile (exact call counts, but its overhead
doubles the time of small calls) or is sampled by py-spy (``pip install py-spy``; no overhead in
the producer), and the top functions by own time print.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import run_base, write_json
from bench_replication import create_workload, drop_workload, generate, pg_dsn, time_recvlogical
from kafka_readback import committed_since, end_offsets
from plots import series_plot
from producer_ceiling import CeilingRecords, run_ceiling

from producer.pgoutput import parse_lsn
from schemas.topics import table_topic

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
    env: dict[str, str],
    slot: str,
    publication: str,
    prefix: str,
    end_lsn: int,
    profile: str | None,
    root: Path = ROOT,
) -> tuple[float, float, float, float, int]:
    """(seconds to the end LSN, seconds from the first confirmed transaction to it, process
    CPU, main-thread CPU, peak RSS kB). The second figure leaves out the start-up (imports,
    connections, topic and schema set-up: about 1-2 s here), which pg_recvlogical hardly has.
    ``root``: the checkout whose producer runs (compare.py runs other commits' so)."""
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
    if profile and profile.endswith(".prof"):
        command = [sys.executable, "-m", "cProfile", "-o", profile, "-m", "producer", "run"]
    with psycopg.connect(env["WALBRIDGE_PG_DSN"], autocommit=True) as db:
        start_lsn = confirmed(db, slot)
        began = time.perf_counter()
        first = None
        proc = subprocess.Popen(command, cwd=root, env=child_env | {"PYTHONPATH": str(root)})
        sampler = sample(proc.pid, profile) if profile and not profile.endswith(".prof") else None
        while (lsn := confirmed(db, slot)) < end_lsn:
            if first is None and lsn > start_lsn:
                first = time.perf_counter()
            if proc.poll() is not None:
                sys.exit(f"producer exited with {proc.returncode}")
            time.sleep(0.05)
    ended = time.perf_counter()
    cpu, main, rss = proc_stat(proc.pid)
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        sampler.wait(60)
    proc.terminate()
    if proc.wait(120) != 0:
        sys.exit(f"producer exited with {proc.returncode} after SIGTERM")
    return ended - began, ended - (first or began), cpu, main, rss


def sample(pid: int, path: str) -> subprocess.Popen[bytes]:
    """py-spy attached to the producer, writing its raw (collapsed stacks) output at 250 Hz."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    command = [spy, "record", "-r", "250", "-f", "raw", "-o", path, "--pid", str(pid)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL)


SHAPES: Final = {"big": (1000, 1_000_000), "small": (1, 250_000), "tpcb": (5, 500_000)}
TARGETS: Final = {"big": 0.8, "small": 0.5, "tpcb": 0.6}


def generate_shape(db: psycopg.Connection, schema: str, shape: str, changes: int) -> int:
    """Write ``changes`` changes in the shape's transactions; returns the transaction count.
    One-change and 5-change transactions come from a procedure that commits in its loop: a
    round trip per transaction from here would take longer than the benchmark itself."""
    if shape == "big":
        inserts = changes // 2
        generate(db, schema, inserts, 1000)
        update(db, schema, changes - inserts, 1000)
        return -(-inserts // 1000) - (-(changes - inserts) // 1000)
    table, mood = sql.Identifier(schema, "rows"), sql.Identifier(schema, "mood")
    proc = sql.Identifier(schema, "write_shape")
    row = sql.SQL(
        "INSERT INTO {} VALUES (g, 'name-' || g, (g % 100000) / 100.0, now(),"
        " jsonb_build_object('g', g, 'tag', 'bench'), g % 2 = 0, ARRAY['a', g::text],"
        " (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::{})"
    ).format(table, mood)
    bump = sql.SQL("UPDATE {} SET price = price + 1, active = NOT active WHERE id = ").format(table)
    if shape == "small":  # n inserts then n updates, one per transaction
        body = sql.SQL(
            "FOR g IN 1..n LOOP {row}; COMMIT; END LOOP;"
            " FOR g IN 1..n LOOP {bump} g; COMMIT; END LOOP;"
        ).format(row=row, bump=bump)
        transactions = changes
    else:  # tpcb: one insert and four updates of earlier rows per transaction
        body = sql.SQL(
            "FOR g IN 1..n LOOP {row};"
            " {bump} greatest(g - 1, 1); {bump} greatest(g - 2, 1);"
            " {bump} greatest(g - 3, 1); {bump} greatest(g - 4, 1); COMMIT; END LOOP;"
        ).format(row=row, bump=bump)
        transactions = changes // 5
    db.execute(
        sql.SQL(
            "CREATE PROCEDURE {}(n int8) LANGUAGE plpgsql AS $$ DECLARE g int8; BEGIN {} END $$"
        ).format(proc, body)
    )
    db.execute(
        sql.SQL("CALL {}(%s)").format(proc), (changes // 2 if shape == "small" else transactions,)
    )
    return transactions


@dataclass
class Result:
    exactly_once: bool
    load_before: float
    load_after: float
    recv_s: float
    producer_s: float
    steady_s: float
    cpu_s: float
    main_s: float
    rss_kb: int
    ceiling_s: float = 0.0  # 0: no --ceiling run
    ceiling_load_before: float = 0.0

    @property
    def ratio(self) -> float:
        return self.recv_s / self.producer_s

    @property
    def ceiling_ratio(self) -> float:
        return self.recv_s / self.ceiling_s if self.ceiling_s else 0.0


QUIET_LOAD: Final = 1.5  # a figure counts only from a run started below this 1-minute load


def load1() -> float:
    return os.getloadavg()[0]


def wait_quiet(limit_s: float = 180.0) -> float:
    """Wait (up to ``limit_s``) for the 1-minute load to fall below QUIET_LOAD: the previous
    run's own work keeps it up for a minute or so. Returns the load the run starts at; a run
    that starts above QUIET_LOAD is marked as not counting."""
    deadline = time.monotonic() + limit_s
    while (load := load1()) >= QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5)
    if load >= QUIET_LOAD:
        print(f"load {load:.2f} after waiting {limit_s:.0f}s: this run's figures do not count")
    return load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="big")
    parser.add_argument("--changes", type=int, help="default: the shape's")
    parser.add_argument("--runs", type=int, default=5, help="runs per exactly-once mode")
    parser.add_argument("--exactly-once", choices=("on", "off", "both"), default="both")
    parser.add_argument("--profile", choices=("cprofile", "py-spy"))
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="per run also the producer's ceiling: the stream answered with the producer's own"
        " records, pre-encoded (producer_ceiling.py)",
    )
    parser.add_argument("--json", type=Path, help="also write the runs and medians here")
    parser.add_argument(
        "--results-dir",
        type=Path,
        help="default: $WALBRIDGE_BENCH_RESULTS or .walbridge/bench-results",
    )
    args = parser.parse_args()
    tx_size, default_changes = SHAPES[args.shape]
    changes = args.changes or default_changes
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.exactly_once]
    runs = 1 if args.profile else args.runs

    env = stack_env()
    dsn = env.get("WALBRIDGE_PG_DSN") or pg_dsn()
    env["WALBRIDGE_PG_DSN"] = dsn
    tag = uuid.uuid4().hex[:8]
    schema, publication, base = f"bench_{tag}", f"bench_pub_{tag}", f"bench_{tag}_base"
    results: list[Result] = []
    ceiling = None
    if args.ceiling:
        data_topic = table_topic(f"bench{tag}", schema, "rows")
        ceiling = CeilingRecords(env["WALBRIDGE_KAFKA_BOOTSTRAP"], f"bench{tag}", data_topic)
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_workload(db, schema, publication, base)
            began = time.perf_counter()
            transactions = generate_shape(db, schema, args.shape, changes)
            print(
                f"shape {args.shape}: {changes:,} changes in {transactions:,} transactions of "
                f"{tx_size}, written in {time.perf_counter() - began:.1f}s"
            )
            row = db.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            end_lsn = parse_lsn(row[0])
            for run in range(runs):
                for exactly_once in modes:  # interleaved: a drifting load hits both alike
                    suffix = {"cprofile": "prof", "py-spy": "spy.txt"}.get(args.profile or "")
                    profile = f"/tmp/bench_producer_{tag}.{suffix}" if suffix else None
                    result = race(
                        db, env, publication, base, f"{run}{exactly_once:d}", f"bench{tag}",
                        end_lsn, changes, exactly_once=exactly_once, profile=profile,
                        ceiling=ceiling, transactions=transactions,
                        data_topic=table_topic(f"bench{tag}", schema, "rows"),
                    )  # fmt: skip
                    results.append(result)
                    r = result
                    print(
                        f"run {run + 1} exactly-once {'on ' if exactly_once else 'off'}: "
                        f"pg_recvlogical {r.recv_s:6.2f}s, producer {r.producer_s:6.2f}s "
                        f"({changes / r.producer_s:,.0f} changes/s), ratio {r.ratio:.3f}; "
                        f"main thread {r.main_s / changes * 1e6:.1f} us/change, process CPU "
                        f"{r.cpu_s / transactions * 1e6:.1f} us/transaction; peak RSS "
                        f"{r.rss_kb / 1024:.0f} MB; load {r.load_before:.2f} -> {r.load_after:.2f}"
                    )
                    if r.ceiling_s:
                        print(
                            f"  ceiling {r.ceiling_s:6.2f}s, ratio {r.ceiling_ratio:.3f}; the "
                            f"producer reaches {r.ceiling_s / r.producer_s:.2f} of it; load "
                            f"{r.ceiling_load_before:.2f} before"
                        )
                    if profile and profile.endswith(".prof"):
                        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
                    elif profile:
                        print_sampled(Path(profile))
        finally:
            drop_workload(db, schema, publication, [base])
    summary = summarize(args.shape, changes, transactions, results)
    base = run_base(f"bench_producer-{args.shape}", args.results_dir)
    print(f"results: {write_json(base, summary)}, {plot_runs(base, args.shape, results)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def print_sampled(path: Path, top: int = 30) -> None:
    """The functions with the most samples at the top of the stack (own time), and with the
    most anywhere on it (cumulative), from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")[1:]  # the first names the process
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            anywhere[frame] = anywhere.get(frame, 0) + n
    print(f"{path}: {total:,} samples")
    for title, table in (("own", own), ("cumulative", anywhere)):
        print(f"  by {title} samples:")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {n / total:6.1%}  {frame}")


def plot_runs(base: Path, shape: str, results: list[Result]) -> Path:
    """Producer / pg_recvlogical per run, one line per exactly-once mode, with the target: how
    far the runs spread, which a median alone hides."""
    series: dict[str, list[tuple[float, float]]] = {}
    for exactly_once in (True, False):
        ran = [r for r in results if r.exactly_once == exactly_once]
        if ran:
            label = f"exactly-once {'on' if exactly_once else 'off'}"
            series[label] = [(i + 1, r.ratio) for i, r in enumerate(ran)]
    n = max(len(points) for points in series.values())
    series[f"target {TARGETS[shape]}"] = [(1, TARGETS[shape]), (n, TARGETS[shape])]
    return series_plot(
        base.with_name(base.name + "-runs.png"),
        series,
        title=f"producer / pg_recvlogical, shape {shape}, per run",
        xlabel="run",
        ylabel="ratio",
        markers=True,
    )


def race(
    db: psycopg.Connection,
    env: dict[str, str],
    publication: str,
    base: str,
    name: str,
    prefix: str,
    end_lsn: int,
    changes: int,
    *,
    exactly_once: bool,
    profile: str | None = None,
    root: Path = ROOT,
    ceiling: CeilingRecords | None = None,
    transactions: int = 0,
    data_topic: str | None = None,
) -> Result:
    """One run: fresh copies of the ``base`` slot for pg_recvlogical and for the producer of
    ``root`` (so both decode the same WAL from the same start), started on a quiet machine;
    with ``ceiling``, a third copy streamed by the producer's ceiling after it, once the
    machine is quiet again. The copies are dropped afterwards. With ``data_topic`` (the
    table's topic) the run also checks that the producer published exactly one committed
    record per change there: a fast run that lost or doubled events must not count."""
    slots = [f"{base}_r{name}", f"{base}_p{name}"] + ([f"{base}_c{name}"] if ceiling else [])
    for slot in slots:
        db.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (base, slot))
    try:
        bootstrap = env["WALBRIDGE_KAFKA_BOOTSTRAP"]
        published = end_offsets(bootstrap, data_topic) if data_topic else {}
        before = wait_quiet()
        recv = time_recvlogical(env["WALBRIDGE_PG_DSN"], slots[0], publication, end_lsn, changes)
        seconds, steady, cpu, main_cpu, rss = run_producer(
            env | {"WALBRIDGE_EXACTLY_ONCE": "true" if exactly_once else "false"},
            slots[1], publication, prefix, end_lsn, profile, root,
        )  # fmt: skip
        after = load1()
        if data_topic:
            records = committed_since(bootstrap, data_topic, published)
            if records != changes:
                sys.exit(
                    f"producer: {records:,} committed records in {data_topic} for {changes:,} changes"
                )
        ceiling_s = ceiling_before = 0.0
        if ceiling is not None:
            markers, events = ceiling.get()
            ceiling_before = wait_quiet()
            top = run_ceiling(
                env, slots[2], publication, end_lsn, markers, events, exactly_once=exactly_once
            )
            if top.records != changes + 2 * transactions:  # a BEGIN and an END around each
                sys.exit(
                    f"producer ceiling: {top.records:,} records for {changes:,} changes in "
                    f"{transactions:,} transactions (expected {changes + 2 * transactions:,})"
                )
            ceiling_s = top.seconds
    finally:
        for slot in slots:
            drop_slot(db, slot)
    return Result(
        exactly_once, before, after, recv.seconds, seconds, steady, cpu, main_cpu, rss,
        ceiling_s, ceiling_before,
    )  # fmt: skip


def drop_slot(db: psycopg.Connection, slot: str) -> None:
    db.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )


def summarize(
    shape: str, changes: int, transactions: int, results: list[Result]
) -> dict[str, object]:
    """Print the medians per mode, of the runs that started on a quiet machine (all runs, and
    said so, when none did); the last line is the exactly-once-on ratio (or off's, when only
    off ran), the line bench_pg_versions.py reads."""
    medians: dict[str, dict[str, float]] = {}
    for exactly_once in (False, True):
        ran = [r for r in results if r.exactly_once == exactly_once]
        if not ran:
            continue
        mine = [r for r in ran if r.load_before < QUIET_LOAD]
        if not mine:
            print(f"no run started below load {QUIET_LOAD}: the medians below do not count")
            mine = ran
        mode = "on" if exactly_once else "off"
        medians[mode] = {
            "ratio": statistics.median(r.ratio for r in mine),
            "main_us_per_change": statistics.median(r.main_s / changes * 1e6 for r in mine),
            "cpu_us_per_transaction": statistics.median(r.cpu_s / transactions * 1e6 for r in mine),
            "producer_changes_per_s": statistics.median(changes / r.producer_s for r in mine),
            "max_load_before": max(r.load_before for r in mine),
        }
        with_ceiling = [r for r in mine if r.ceiling_s and r.ceiling_load_before < QUIET_LOAD]
        if with_ceiling:
            medians[mode]["ceiling_ratio"] = statistics.median(
                r.ceiling_ratio for r in with_ceiling
            )
            medians[mode]["producer_of_ceiling"] = statistics.median(
                r.ceiling_s / r.producer_s for r in with_ceiling
            )
        m = medians[mode]
        print(
            f"median of {len(mine)} of {len(ran)} ({shape}, exactly-once {mode}): ratio {m['ratio']:.3f} "
            f"(target >= {TARGETS[shape]}), main thread {m['main_us_per_change']:.1f} us/change, "
            f"process CPU {m['cpu_us_per_transaction']:.1f} us/transaction, "
            f"{m['producer_changes_per_s']:,.0f} changes/s; highest load before a run "
            f"{m['max_load_before']:.2f}"
        )
        if "ceiling_ratio" in m:
            print(
                f"  ceiling (median of {len(with_ceiling)}): ratio {m['ceiling_ratio']:.3f}; the "
                f"producer reaches {m['producer_of_ceiling']:.2f} of it"
            )
    headline = medians.get("on") or medians["off"]
    print(f"ratio producer / pg_recvlogical = {headline['ratio']:.3f}")
    return {
        "benchmark": "bench_producer",
        "shape": shape,
        "changes": changes,
        "transactions": transactions,
        "runs": [asdict(r) | {"ratio": r.ratio} for r in results],
        "medians": medians,
    }


if __name__ == "__main__":
    main()
