"""Benchmark: snapshot rows/s into Kafka (acknowledged) and the producer's peak memory while
it snapshots, each against a baseline measured in the same run.

Run (needs the local stack; ~5 minutes for 5M rows on 2 cores):

    .walbridge/venv/bin/python tests/bench/bench_snapshot.py [--rows 5000000]

The table is the 8-column table of bench_replication.py, filled before any slot exists. The
snapshot is ``python -m producer run --snapshot initial-only`` on a new slot: it reads every
row in key-ordered chunks, publishes them, and exits once Kafka acknowledged all of them, so
its time is rows into Kafka, acknowledged. Baselines, in the same run:

- rows/s: ``COPY (SELECT * FROM table) TO STDOUT`` read to nowhere through psycopg (what
  PostgreSQL and the client library need to hand the rows over at all); target ratio >= 0.6;
- memory: the same producer command on an empty table (its idle peak RSS); target ratio < 2;
- Kafka's ceiling on this machine: the snapshot's own events, read back from its topic (up to
  ``--ceiling-sample`` of them, cycled) and produced again to a new topic with the producer's
  librdkafka settings, one ``produce`` call per pre-encoded event and delivery reports for
  errors only, then flushed: what merely handing that many events to Kafka and having them
  acknowledged costs here, with nothing read from PostgreSQL and nothing encoded. It bounds any
  producer's snapshot rate on this machine, so ceiling / COPY bounds the rows/s ratio.
- CPU: what each phase cost the whole machine (every process, from /proc/stat) per row. A
  snapshot must do at least COPY's work and the ceiling's, on the same cores, so
  cores / (COPY's + the ceiling's CPU per row) bounds its rows/s even if reading and encoding
  cost nothing; printed with its ratio to COPY, beside what would be left per row for reading,
  parsing and encoding at the 0.6 target and what fastavro's C writer takes to encode one event.

The COPY baseline is timed before and after the snapshot and averaged (the machine may be
shared); the producer's CPU time per row and the load average are printed with the figures.
``--keyless`` drops the primary key: the table is then read whole in one COPY, spooled to a
temporary file and published from there in bounded batches (its RSS is the figure to watch).
With ``--profile`` the producer runs under py-spy (its RSS figure is then py-spy's).

The figures are also written as JSON, with a plot of the snapshot's rate over time (PNG) beside
it, under --results-dir (tests/bench/bench_output.py says where by default). The rate comes from
the producer's own ``walbridge_snapshot_rows_total`` (rows published), read from its /metrics
once a second.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import fastavro
import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import results_dir, run_base, write_json
from bench_producer import QUIET_LOAD, stack_env, wait_quiet
from bench_replication import generate
from kafka_readback import read_back
from plots import series_plot
from proc_usage import Busy, measure_background, process_cpu_s, rss_kb, thread_cpu_s

from producer.config import MAX_DEFAULT_SNAPSHOT_WORKERS, load_config
from producer.kafka_sink import producer_settings
from schemas.topics import table_topic

ROOT = Path(__file__).resolve().parents[2]


def create_table(
    db: psycopg.Connection, schema: str, publication: str, keyless: bool = False
) -> None:
    table = sql.Identifier(schema, "rows")
    mood = sql.Identifier(schema, "mood")
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.execute(sql.SQL("CREATE TYPE {} AS ENUM ('sad', 'ok', 'happy')").format(mood))
    db.execute(
        sql.SQL(
            "CREATE TABLE {} (id int8 {}, name text, price numeric(12,2),"
            " created timestamptz, doc jsonb, active bool, tags text[], mood {})"
        ).format(table, sql.SQL("" if keyless else "PRIMARY KEY"), mood)
    )
    db.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(publication), table)
    )


def time_copy(dsn: str, schema: str) -> float:
    query = sql.SQL("COPY (SELECT * FROM {}) TO STDOUT").format(sql.Identifier(schema, "rows"))
    with psycopg.connect(dsn) as db, db.cursor() as cur:
        began = time.perf_counter()
        with cur.copy(query) as copy:
            for _block in copy:
                pass
        return time.perf_counter() - began


def free_port() -> int:
    """A loopback port free now (the OS picks it; another process could take it before use)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def published_rows(port: int) -> float | None:
    """The producer's walbridge_snapshot_rows_total, summed over tables (None: no answer yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return None
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "walbridge_snapshot_rows"
        for sample in family.samples
        if sample.name == "walbridge_snapshot_rows_total"
    )


def rates(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(seconds, rows/s between the previous sample and this one) from (seconds, rows)."""
    return [
        (t, (rows - prev_rows) / (t - prev_t))
        for (prev_t, prev_rows), (t, rows) in itertools.pairwise(samples)
        if t > prev_t
    ]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _children(pid: int) -> list[int]:
    """The process's children (its snapshot workers; the spawn helper too, which is idle)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.extend(int(c) for c in (task / "children").read_text().split())
    return out


def run_snapshot(
    env: dict[str, str],
    schema: str,
    publication: str,
    profile: str | None = None,
    progress: list[tuple[float, float]] | None = None,
    workers: int | None = None,
    split: dict[str, float] | None = None,
) -> tuple[float, float, int, float, str]:
    """(seconds from start to exit, seconds from "snapshot started" to "snapshot done", peak
    RSS kB sampled every 50 ms, CPU seconds of the producer process and its snapshot workers,
    its topic prefix). ``progress``, when given, receives (seconds since start, rows published)
    once a second; ``split``, when given, the CPU seconds of the producer's main thread
    ("main"), of its snapshot workers ("workers", summed) and the largest worker's peak RSS kB
    ("worker_rss_kb"), as last sampled (every 50 ms) before they exited."""
    tag = uuid.uuid4().hex[:8]
    slot = f"benchs_{tag}"
    port = free_port() if progress is not None else 0  # 0: no HTTP server
    child_env = (
        {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")}
        | env
        | {
            "WALBRIDGE_SLOT": slot,
            "WALBRIDGE_PUBLICATION": publication,
            "WALBRIDGE_TOPIC_PREFIX": f"benchs{tag}",
            "WALBRIDGE_METRICS_PORT": str(port),
            "WALBRIDGE_METRICS_HOST": "127.0.0.1",
            "WALBRIDGE_HEARTBEAT_INTERVAL_S": "0",
            "WALBRIDGE_SNAPSHOT": "initial-only",
        }
        | ({} if workers is None else {"WALBRIDGE_SNAPSHOT_WORKERS": str(workers)})
    )
    log = Path(f"/tmp/bench_snapshot_{tag}.log")
    cpu_before = _children_cpu_s()
    began = time.perf_counter()
    with log.open("wb") as out:
        command = [sys.executable, "-m", "producer", "run"]
        if profile:  # py-spy's collapsed stacks (pip install py-spy into the venv)
            spy = str(Path(sys.executable).with_name("py-spy"))
            command = [
                spy,
                "record",
                "--format",
                "raw",
                "-r",
                "50",
                "--idle",
                "--threads",
                "-o",
                profile,
                "--",
                *command,
            ]
        proc = subprocess.Popen(
            command, cwd=ROOT, env=child_env, stdout=out, stderr=subprocess.STDOUT
        )
        peak = 0
        next_sample = began
        main_s, worker_rss = 0.0, 0
        worker_s: dict[int, float] = {}
        while proc.poll() is None:
            peak = max(peak, rss_kb(proc.pid))
            if split is not None:
                try:
                    main_s = max(main_s, thread_cpu_s(proc.pid, proc.pid))
                    for child in _children(proc.pid):
                        worker_s[child] = max(worker_s.get(child, 0.0), process_cpu_s(child))
                        worker_rss = max(worker_rss, rss_kb(child))
                except (FileNotFoundError, ProcessLookupError, ValueError):
                    pass  # exiting
                split.update(main=main_s, workers=sum(worker_s.values()), worker_rss_kb=worker_rss)
            if progress is not None and time.perf_counter() >= next_sample:
                next_sample += 1.0
                rows = published_rows(port)
                if rows is not None:
                    progress.append((time.perf_counter() - began, rows))
            time.sleep(0.05)
    seconds = time.perf_counter() - began
    cpu_s = _children_cpu_s() - cpu_before  # waited for by poll(): counted in RUSAGE_CHILDREN
    try:
        if proc.returncode != 0:
            sys.exit(f"producer exited {proc.returncode}; see {log}")
        text = log.read_text()
        stamps = [
            time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + float(m.group(2))
            for m in re.finditer(
                r'"ts": "(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)[^"]*", [^\n]*"snapshot (?:started|done)"',
                text,
            )
        ]
        snapshot_s = stamps[-1] - stamps[0] if len(stamps) >= 2 else seconds
        return seconds, snapshot_s, peak, cpu_s, f"benchs{tag}"
    finally:
        with psycopg.connect(env["WALBRIDGE_PG_DSN"], autocommit=True) as db:
            db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def kafka_ceiling(
    env: dict[str, str],
    topic: str,
    rows: int,
    events: list[tuple[bytes | None, bytes]],
    background: float,
) -> tuple[float, int, float, float]:
    """(seconds, events sampled, mean event bytes, machine CPU seconds): ``rows`` of ``events``
    (read from ``topic`` beforehand, cycled) produced to a new topic of as many partitions with
    the producer's own librdkafka settings and acknowledged (``flush``; only errors reported).
    The topic's creation and deletion are outside both the time and the CPU (less
    ``background``, as Busy)."""
    bootstrap = env["WALBRIDGE_KAFKA_BOOTSTRAP"]
    if not events:
        sys.exit(f"no events in {topic}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    target = f"{topic}.ceiling"
    admin.create_topics([NewTopic(target, partitions)])[target].result(timeout=30)
    errors: list[str] = []
    settings = producer_settings(load_config([], env))
    producer = Producer(
        {**settings, "delivery.report.only.error": True,
         "on_delivery": lambda error, _message: errors.append(str(error))}
    )  # fmt: skip
    produce, count = producer.produce, len(events)
    try:
        with Busy(background) as cpu:
            began = time.perf_counter()
            for i in range(rows):
                key, value = events[i % count]
                while True:
                    try:
                        produce(target, value, key)
                        break
                    except BufferError:  # the local queue is full: wait for deliveries, retry
                        producer.poll(0.05)
            if producer.flush(300) or errors:
                sys.exit(f"Kafka ceiling: {len(producer)} undelivered, errors {errors[:3]}")
            seconds = time.perf_counter() - began
    finally:
        admin.delete_topics([target])
    mean_bytes = sum(len(v) + len(k or b"") for k, v in events) / count
    return seconds, count, mean_bytes, cpu.seconds


def fastavro_encode_us(registry_url: str, events: list[tuple[bytes | None, bytes]]) -> float:
    """CPU microseconds fastavro's C writer (a dependency of this project) takes to encode one
    of ``events``, the whole envelope, from the values fastavro decodes it to (logical types as
    Decimal and datetime, as a producer would hand them over), without the Confluent header."""
    sample = events[:20_000]
    schema_id = int.from_bytes(sample[0][1][1:5], "big")
    registry = SchemaRegistryClient({"url": registry_url})
    schema = fastavro.parse_schema(json.loads(registry.get_schema(schema_id).schema_str))
    records = [fastavro.schemaless_reader(io.BytesIO(v[5:]), schema, None) for _k, v in sample]
    began = time.process_time()
    for record in records:
        fastavro.schemaless_writer(io.BytesIO(), schema, record)
    return (time.process_time() - began) / len(records) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument(
        "--profile", metavar="FILE", help="record the snapshot with py-spy (collapsed stacks)"
    )
    parser.add_argument(
        "--keyless",
        action="store_true",
        help="the table without a primary key (read whole, spooled to disk, published in batches)",
    )
    parser.add_argument(
        "--chunk-rows", type=int, help="the producer's --snapshot-chunk-rows (default: its own)"
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="the producer's --snapshot-workers for each snapshot, comma-separated (run in "
        "turn, --repeat times: an interleaved comparison); the ratio of each to the first is "
        "printed",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of --workers")
    parser.add_argument(
        "--no-quiet-wait",
        dest="quiet_wait",
        action="store_false",
        help="start each snapshot at once, not after waiting (up to 180 s) for a 1-minute load "
        f"below {QUIET_LOAD}; the medians then count every snapshot",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help=f"where the JSON result and the plot go (default: {results_dir()})",
    )
    parser.add_argument(
        "--ceiling-sample",
        type=int,
        default=1_000_000,
        help="events read back for the Kafka ceiling (cycled up to --rows; bounds its memory)",
    )
    args = parser.parse_args()
    env = stack_env()
    if args.chunk_rows:
        env["WALBRIDGE_SNAPSHOT_CHUNK_ROWS"] = str(args.chunk_rows)
    if args.keyless:
        # The whole table is one high watermark's transaction, under exactly-once one Kafka
        # transaction: allow the broker's default maximum (transaction.max.timeout.ms).
        env["WALBRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS"] = "900000"
    dsn = env["WALBRIDGE_PG_DSN"]
    tag = uuid.uuid4().hex[:8]
    schema, empty = f"benchs_{tag}", f"benchs_empty_{tag}"
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_table(db, schema, f"{schema}_pub", args.keyless)
            create_table(db, empty, f"{empty}_pub", args.keyless)
            background = measure_background()
            print(f"machine at rest: {background:.2f} cores busy (left out of every phase)")
            began = time.perf_counter()
            generate(db, schema, args.rows, 100_000)
            db.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "rows")))
            print(f"generated {args.rows:,} rows in {time.perf_counter() - began:.1f}s")
            # COPY before and after the snapshot: the machine may be shared, so the baseline
            # is the mean of the two around it (both printed).
            with Busy(background) as copy_before_cpu:
                copy_before = time_copy(dsn, schema)
            print(
                f"COPY to nowhere (before): {copy_before:7.1f}s  {args.rows / copy_before:>10,.0f} rows/s"
            )
            load = os.getloadavg()[0]
            counts = [int(w) for w in args.workers.split(",")]
            runs: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
            progress: list[tuple[float, float]] = []
            for round_ in range(args.repeat):
                for n in counts:
                    # Every snapshot but the last round's last has its own topic, left behind.
                    progress = []
                    split: dict[str, float] = {}
                    # The previous snapshot's own work keeps the load up for a minute or so.
                    before = wait_quiet() if args.quiet_wait else os.getloadavg()[0]
                    with Busy(background) as snap_cpu:
                        total_s, snap_s, peak_kb, cpu_s, prefix = run_snapshot(
                            env, schema, f"{schema}_pub", args.profile, progress, n, split
                        )
                    runs[n].append(
                        {"snapshot_s": snap_s, "process_s": total_s, "peak_rss_kb": peak_kb,
                         "cpu_s": cpu_s, "machine_cpu_s": snap_cpu.seconds,
                         "load_before": before, "load_after": os.getloadavg()[0], **split}
                    )  # fmt: skip
                    print(
                        f"snapshot, {n} worker(s), round {round_ + 1}: {snap_s:7.1f}s"
                        f"  {args.rows / snap_s:>10,.0f} rows/s  (process start to exit"
                        f" {total_s:.1f}s; producer CPU {cpu_s / args.rows * 1e6:.1f} us/row:"
                        f" main thread {split.get('main', 0) / args.rows * 1e6:.2f},"
                        f" workers {split.get('workers', 0) / args.rows * 1e6:.2f};"
                        f" peak RSS {peak_kb / 1024:.0f} MB, largest worker"
                        f" {split.get('worker_rss_kb', 0) / 1024:.0f} MB;"
                        f" load {before:.2f} -> {os.getloadavg()[0]:.2f})"
                    )
            with Busy(background) as copy_after_cpu:
                copy_after = time_copy(dsn, schema)
            print(
                f"COPY to nowhere (after):  {copy_after:7.1f}s  {args.rows / copy_after:>10,.0f} rows/s"
            )
            sampled_events = read_back(
                env["WALBRIDGE_KAFKA_BOOTSTRAP"],
                table_topic(prefix, schema, "rows"),
                args.ceiling_sample,
            )
            ceiling_s, sampled, mean_bytes, ceiling_cpu_s = kafka_ceiling(
                env, table_topic(prefix, schema, "rows"), args.rows, sampled_events, background
            )
            print(
                f"Kafka ceiling:            {ceiling_s:7.1f}s  {args.rows / ceiling_s:>10,.0f} rows/s"
                f"  (the snapshot's events, {sampled:,} read back and cycled,"
                f" {mean_bytes:.0f} bytes each with the key)"
            )
            load = (load + os.getloadavg()[0]) / 2
            copy_s = (copy_before + copy_after) / 2
            _, _, idle_kb, _, _ = run_snapshot(env, empty, f"{empty}_pub")

            def counted(n: int) -> list[dict[str, float]]:
                # Only snapshots started on a quiet machine, if any did (said so if none).
                quiet = [r for r in runs[n] if r["load_before"] < QUIET_LOAD]
                if not quiet:
                    print(f"{n} worker(s): no snapshot started below load {QUIET_LOAD}")
                return quiet or runs[n]

            median = {
                n: sorted(r["snapshot_s"] for r in counted(n))[len(counted(n)) // 2] for n in counts
            }
            for n in counts:
                print(
                    f"ratio rows/s snapshot/COPY, {n} worker(s): {copy_s / median[n]:.2f}"
                    f" (median of {len(counted(n))} of {len(runs[n])}; target >= 0.3 at 5M rows)"
                )
            for n in counts[1:]:
                print(
                    f"ratio rows/s {n} workers / {counts[0]}: {median[counts[0]] / median[n]:.2f}"
                    " (target >= 1.6 for 2 / 1)"
                )
            last = runs[counts[-1]][-1]
            snap_s, peak_kb, cpu_s, total_s = (
                last["snapshot_s"], int(last["peak_rss_kb"]), last["cpu_s"], last["process_s"]
            )  # fmt: skip
            # The model, from the last run's CPU per row: the producer's main thread frames and
            # produces every row (serial), its workers read and encode (parallel, one range
            # each), librdkafka's threads and the rest of the process take what is left; each
            # worker's PostgreSQL backend sends rows at about one COPY's rate. On a pod of C
            # cores with min(C, the default cap) workers and a source with cores to spare:
            main_us = last.get("main", 0) / args.rows * 1e6
            worker_us = last.get("workers", 0) / args.rows * 1e6
            process_us = cpu_s / args.rows * 1e6
            copy_rate = args.rows / copy_s
            for pod in (2, 8, 16):
                n = min(pod, MAX_DEFAULT_SNAPSHOT_WORKERS)
                bounds = {
                    "main thread": 1e6 / main_us if main_us else float("inf"),
                    "workers": n * 1e6 / worker_us if worker_us else float("inf"),
                    "producer CPU": pod * 1e6 / process_us,
                    "source backends": n * copy_rate,
                }
                which = min(bounds, key=lambda k: bounds[k])
                print(
                    f"model, {pod} cores, {n} workers: {bounds[which]:,.0f} rows/s (bound by the"
                    f" {which}; main thread {main_us:.2f} us/row, workers {worker_us:.2f} us/row,"
                    f" whole producer {process_us:.2f} us/row, one COPY {copy_rate:,.0f} rows/s;"
                    " single-COPY-relative "
                    f"{bounds[which] / copy_rate:.2f})"
                )
            print(
                f"ratio rows/s Kafka ceiling/COPY: {copy_s / ceiling_s:.2f}"
                f" (the most any producer's snapshot/COPY could be here);"
                f" snapshot/Kafka ceiling: {ceiling_s / snap_s:.2f}"
            )
            print(
                f"peak RSS: {peak_kb / 1024:.0f} MB snapshotting, {idle_kb / 1024:.0f} MB idle;"
                f" ratio {peak_kb / idle_kb:.2f} (target < 2)"
            )
            print(f"load average (1 min) around the snapshot: {load:.1f} on {os.cpu_count()} CPUs")
            # What each phase cost the whole machine per row. A snapshot has to do at least what
            # COPY does (PostgreSQL reads and sends the rows, the client receives them) and what
            # the ceiling does (hand the events to Kafka, which stores and acknowledges them),
            # so with every core busy it can go no faster than cores / (the two costs summed),
            # even with reading and encoding free and perfectly parallel. Cores: those the
            # machine's background work leaves.
            cores = (os.cpu_count() or 1) - background
            per_row = {
                "COPY": (copy_before_cpu.seconds + copy_after_cpu.seconds) / 2,
                "snapshot (producer start to exit)": snap_cpu.seconds,
                "Kafka ceiling": ceiling_cpu_s,
            }
            print(
                "machine CPU per row (all processes): "
                + ", ".join(f"{k} {v / args.rows * 1e6:.2f} us" for k, v in per_row.items())
            )
            floor_us = (per_row["COPY"] + per_row["Kafka ceiling"]) / args.rows * 1e6
            bound = cores * 1e6 / floor_us
            print(
                f"CPU bound on {cores:.2f} cores: COPY + Kafka ceiling = {floor_us:.2f} us of CPU per"
                f" row, so at most {bound:,.0f} rows/s even with reading and encoding free;"
                f" ÷ COPY {bound / (args.rows / copy_s):.2f}"
            )
            # What is left for reading, parsing and encoding at the target, against what
            # encoding costs with the library and what our whole path costs.
            left_us = cores * 1e6 / (0.6 * args.rows / copy_s) - floor_us
            print(
                f"at 0.6 of COPY, {left_us:.2f} us of CPU per row would be left for reading,"
                f" parsing and encoding; fastavro's writer alone takes"
                f" {fastavro_encode_us(env['WALBRIDGE_SCHEMA_REGISTRY_URL'], sampled_events):.2f}"
                f" us per event, the producer's whole path {cpu_s / args.rows * 1e6:.2f} us"
            )
            base = run_base("bench_snapshot", args.results_dir)
            result = {
                "rows": args.rows,
                "keyless": args.keyless,
                "chunk_rows": args.chunk_rows,
                "workers": counts,
                "runs": {str(n): r for n, r in runs.items()},
                "snapshot_s": snap_s,
                "process_s": total_s,
                "copy_s": {"before": copy_before, "after": copy_after},
                "kafka_ceiling_s": ceiling_s,
                "ratio_snapshot_to_copy": {str(n): copy_s / median[n] for n in counts},
                "ratio_ceiling_to_copy": copy_s / ceiling_s,
                "peak_rss_kb": {"snapshot": peak_kb, "idle": idle_kb},
                "producer_cpu_s": cpu_s,
                "machine_cpu_s": per_row,
                "background_cores": background,
                "load_average": load,
                "published_rows": progress,
            }
            plot = series_plot(
                base.with_suffix(".png"),
                {"rows published/s": rates(progress)},
                title=f"Snapshot of {args.rows:,} rows: rate over time",
                xlabel="seconds since the producer started",
                ylabel="rows/s",
            )
            print(f"results: {write_json(base, result)}, {plot}")
        finally:
            for s in (schema, empty):
                db.execute(
                    sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(f"{s}_pub"))
                )
                db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


if __name__ == "__main__":
    main()
