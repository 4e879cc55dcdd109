"""Catch-up: the consumer started after the producer published a backlog of TPC-B-like
transactions (issue 16). Through the whole real pipeline: PostgreSQL, the producer as a
subprocess, Kafka, the consumer in this process with its default batch caps.

Load: --transactions transactions of 5 changes over 4 tables, the shape of most OLTP work:
money moved from one account to another (2 updates of `accounts`), the teller's and the
branch's totals updated (1 update each), and a row in the keyless `history` table. They run
inside PostgreSQL (a procedure committing each one) while the producer is stopped, so WAL holds
the whole backlog when it starts.

The opening rows (the accounts, tellers and branches) stream before the backlog and a consumer
in a process of its own applies them, untimed: the timed consumer starts where it left off, on
a JVM whose first batch it is (cold, as after a restart). `--warm-jvm N` instead writes N
transactions of the same shape after the opening rows and applies both in this process first,
untimed: the timed consumer then runs on a JVM that has compiled the batch path already, which
separates the JIT's warm-up from the steady rate.

Reported, all from the same run:
  - producer: changes/s from its start until the slot confirms the backlog (the baseline);
  - consumer: changes/s from its start until the lake has applied the backlog, run as
    --available-now (the backlog in batches of the default caps, --max-offsets-per-trigger,
    then stop) in a session already up, and the ratio consumer ÷ producer (target >= 1);
  - the consumer's seconds per 100k transactions, batch by batch, and the largest and smallest
    ÷ the median (target: flat within ±20 %: every step linear in its work; a last batch of
    less than half the usual transactions, the backlog's remainder, is left out of the ratios);
  - the batches' time per step (framing, decode+summary, merge, pending, ...), summed;
  - a ceiling for any consumer built on Spark, measured after the catch-up on the warm JVM:
    Spark's Kafka source reading the same backlog, `from_avro` decoding every record and a
    plain Delta append of each table's rows (no reassembly, no MERGE), the markers read and
    decoded; its changes/s ÷ the producer's is the most a Spark consumer can reach here;
  - driver peak RSS during the catch-up ÷ its RSS idle just before, for the Python driver and
    the JVM (in local mode the JVM also runs the executors; target < 2), and both RSS as the
    batches end (bounded memory: a plateau however long the backlog).

The figures are also written as JSON, with a plot of the batch times over the run (PNG) beside
it, under --results-dir (tests/bench/bench_output.py says where by default).

Run:
  eval "$(deploy/local/stack env)"
  .walbridge/venv/bin/python tests/bench/bench_consumer_catchup.py --transactions 1000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.avro.functions import from_avro

from schemas.topics import transaction_topic
from spark_consumer.batch import BatchReport
from spark_consumer.config import ConsumerConfig
from spark_consumer.framing import body_col, schema_id_col
from spark_consumer.session import build_session
from spark_consumer.source import start
from spark_consumer.union import union_all
from spark_consumer.writer_schemas import WriterSchemas
from tests.bench.bench_output import results_dir, run_base, write_json
from tests.bench.bench_verify import Peak
from tests.bench.plots import series_plot
from tests.bench.proc_usage import rss_kb
from tests.e2e.harness import pipeline
from tests.support.producer_harness import sql

CHANGES_PER_TX = 5


def create(dsn: str, s: str) -> list[str]:
    tables = [f"{s}.branches", f"{s}.tellers", f"{s}.accounts", f"{s}.history"]
    sql(
        dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {s}.branches (bid int PRIMARY KEY, bbalance bigint NOT NULL)",
        f"CREATE TABLE {s}.tellers (tid int PRIMARY KEY, bid int NOT NULL, "
        "tbalance bigint NOT NULL)",
        f"CREATE TABLE {s}.accounts (aid int PRIMARY KEY, bid int NOT NULL, "
        "abalance bigint NOT NULL, filler char(84))",
        # Keyless, as pgbench's history: every change is an append in the lake.
        f"CREATE TABLE {s}.history (tid int, bid int, aid int, delta int, mtime timestamptz)",
        # One committed transaction per iteration (a procedure may COMMIT): the backlog is
        # written at the database's own speed, without a client round trip per statement.
        f"""CREATE PROCEDURE {s}.tpcb(n int, accounts int) LANGUAGE plpgsql AS $$
        DECLARE a int; a2 int; t int; d int;
        BEGIN
          FOR i IN 1..n LOOP
            a := 1 + floor(random() * accounts)::int;
            a2 := 1 + floor(random() * accounts)::int;
            t := 1 + floor(random() * 100)::int;
            d := floor(random() * 10000)::int - 5000;
            UPDATE {s}.accounts SET abalance = abalance - d WHERE aid = a;
            UPDATE {s}.accounts SET abalance = abalance + d WHERE aid = a2;
            UPDATE {s}.tellers SET tbalance = tbalance + d WHERE tid = t;
            UPDATE {s}.branches SET bbalance = bbalance + d WHERE bid = 1 + (t - 1) / 10;
            INSERT INTO {s}.history VALUES (t, 1 + (t - 1) / 10, a, d, now());
            COMMIT;
          END LOOP;
        END $$""",
    )
    return tables


def fill(dsn: str, s: str, accounts: int) -> None:
    """The opening rows, written once the slot exists so that they stream like the rest."""
    sql(
        dsn,
        f"INSERT INTO {s}.branches SELECT g, 0 FROM generate_series(1, 10) g",
        f"INSERT INTO {s}.tellers SELECT g, 1 + (g - 1) / 10, 0 FROM generate_series(1, 100) g",
        f"INSERT INTO {s}.accounts SELECT g, 1 + (g - 1) % 10, 0, '' "
        f"FROM generate_series(1, {accounts}) g",
    )


def ceiling(spark: SparkSession, config: ConsumerConfig, topics: list[str], out: Path) -> float:
    """Seconds for the least a Spark consumer must do with the backlog: read every record
    through Spark's Kafka source, decode it with `from_avro` under its writer schema, and
    append each table's rows to a Delta table (markers: read and decoded, then counted).
    Topics run side by side on the consumer's MERGE threads, as its tables do."""

    def read(topic: str) -> DataFrame:
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.kafka_bootstrap)
            .option("subscribe", topic)
            .option("kafka.isolation.level", "read_committed")
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )

    # The writer schemas (one per topic here: no schema change in the backlog), before the
    # clock starts: a consumer learns them once.
    vids = {
        r["topic"]: r["vid"]
        for r in union_all([read(t) for t in topics])
        .select("topic", schema_id_col("value").alias("vid"))
        .distinct()
        .collect()
    }
    schemas = WriterSchemas.from_url(config.schema_registry_url, config.registry_config)
    markers = transaction_topic(config.topic_prefix)

    def one(topic: str) -> None:
        env = from_avro(body_col("value"), schemas.text(vids[topic]), {"mode": "PERMISSIVE"})
        decoded = read(topic).select(env.alias("e"))
        if topic == markers:
            decoded.select("e.status", "e.id", "e.commit_lsn", "e.data_collections").count()
        else:
            decoded.select("e.op", "e.source.commit_lsn", "e.after.*").write.format("delta").save(
                str(out / topic)
            )

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, config.merge_threads)) as pool:
        list(pool.map(one, topics))
    return time.perf_counter() - t0


class _Stamped(list[BatchReport]):
    """A processor's report list that notes when each report arrives: its batch's end."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []  # time.perf_counter() of each append

    def append(self, report: BatchReport) -> None:
        self.at.append(time.perf_counter())
        super().append(report)


def flatness(reports: _Stamped, t0: float, *, warm: bool) -> str:
    """Each batch's wall time (from the previous batch's end, the first from the query's
    start at t0) per 100k transactions it applied, and the largest and smallest ÷ the median.

    The last batch takes the backlog's remainder, often a few thousand transactions, where a
    batch's fixed costs (a MERGE per table, the progress commit) are all there is: it is left
    out of the ratios when it holds less than half the median batch's transactions. A batch
    that applied nothing (all its transactions cut by the cap) adds its time to the next.
    """
    per_batch: list[tuple[float, int]] = []  # (seconds per 100k transactions, transactions)
    since = t0
    for r, at in zip(reports, reports.at, strict=True):
        if r.applied_transactions:
            per_batch.append(
                ((at - since) * 100_000 / r.applied_transactions, r.applied_transactions)
            )
            since = at
    if not per_batch:
        return "no batch applied a transaction"
    typical = statistics.median(n for _, n in per_batch)
    remainder = len(per_batch) > 1 and per_batch[-1][1] < typical / 2
    counted = per_batch[:-1] if remainder else per_batch
    med = statistics.median(x for x, _ in counted)
    return (
        "seconds per 100k transactions, batch by batch: "
        + ", ".join(f"{x:.1f}" for x, _ in per_batch)
        + f"; max ÷ median {max(x for x, _ in counted) / med:.2f}, min ÷ median "
        + f"{min(x for x, _ in counted) / med:.2f}"
        + (
            f" (the last, {per_batch[-1][1]} transactions of remainder, left out)"
            if remainder
            else ""
        )
        + ("" if warm else "; the first is the JVM's first batch (cold)")
    )


def batch_rows(reports: _Stamped, t0: float) -> list[dict[str, Any]]:
    """Each batch: when it ended (seconds since t0), its wall time since the previous batch's
    end, the batch function's own seconds, what it applied and left waiting, its steps."""
    rows: list[dict[str, Any]] = []
    since = t0
    for r, at in zip(reports, reports.at, strict=True):
        rows.append(
            {
                "batch_id": r.batch_id,
                "ended_s": round(at - t0, 3),
                "wall_s": round(at - since, 3),
                "seconds": round(r.seconds, 3),
                "applied_transactions": r.applied_transactions,
                "pending_records": r.pending_records,
                "steps": {k: round(v, 3) for k, v in r.steps.items()},
            }
        )
        since = at
    return rows


def plot_batches(base: Path, batches: list[dict[str, Any]]) -> Path:
    """Batch times over the run: each batch's wall time, the batch function's own seconds, and
    the wall time per 100k transactions (flat when every step is linear in its work)."""
    per_100k = [
        (b["ended_s"], b["wall_s"] * 100_000 / b["applied_transactions"])
        for b in batches
        if b["applied_transactions"]
    ]
    return series_plot(
        base.with_suffix(".png"),
        {
            "batch wall time (s)": [(b["ended_s"], b["wall_s"]) for b in batches],
            "batch function (s)": [(b["ended_s"], b["seconds"]) for b in batches],
            "wall s per 100k transactions": per_100k,
        },
        title="Consumer catch-up: batch times",
        xlabel="seconds since the consumer started (at each batch's end)",
        ylabel="seconds",
        markers=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=1_000_000)
    ap.add_argument("--accounts", type=int, default=100_000)
    ap.add_argument(
        "--warm-jvm",
        type=int,
        default=0,
        metavar="N",
        help="apply the opening rows and N transactions in this process first (untimed), so "
        "the timed consumer's JVM is warm (default 0: a cold JVM, the opening rows applied in "
        "a process of its own)",
    )
    ap.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=None,
        help="the consumer's batch cap (default: its own default)",
    )
    ap.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help=f"where the JSON result and the plot go (default: {results_dir()})",
    )
    args = ap.parse_args()
    # Each line as it is printed, in order with other writers to the same pipe.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    load_before = os.getloadavg()[0]
    print(f"1-minute load before the run: {load_before:.2f}")
    dsn = os.environ["WALBRIDGE_PG_DSN"]
    s = f"bench_catchup_{uuid.uuid4().hex[:8]}"
    tables = create(dsn, s)
    spark = build_session("bench-consumer-catchup")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            pipeline(
                spark,
                dsn,
                os.environ["WALBRIDGE_KAFKA_BOOTSTRAP"],
                os.environ["WALBRIDGE_SCHEMA_REGISTRY_URL"],
                Path(tmp),
                tables,
                "benchcatchup",
            ) as p,
        ):
            # The first start creates the slot; the opening rows stream then, and a consumer
            # applies them (untimed), in a process of its own unless --warm-jvm. So the timed
            # consumer, like the producer, has only the backlog to do, from where a consumer
            # left off; without --warm-jvm its JVM's first batch is still the first one (cold).
            p.start_producer()
            fill(dsn, s, args.accounts)
            if args.warm_jvm:
                sql(
                    dsn,
                    "SET synchronous_commit = off",
                    f"CALL {s}.tpcb({args.warm_jvm}, {args.accounts})",
                )
            p.wait_published(600)
            p.producer.stop()
            caps = (
                {}
                if args.max_offsets_per_trigger is None
                else {"max_offsets_per_trigger": args.max_offsets_per_trigger}
            )
            if args.warm_jvm:
                warm = p.consume_available(timeout=900, trigger=None, available_now=True, **caps)
                warm.close()
                print(
                    f"JVM warm: the opening rows and {args.warm_jvm} transactions applied in "
                    f"this process first, in {len(warm.reports)} batches",
                    flush=True,
                )
            else:
                opening = p.consumer_process("--available-now", log_name="opening")
                try:
                    status = opening.wait(timeout=900)
                finally:
                    if opening.poll() is None:  # timed out: it must not write on
                        opening.kill()
                        opening.wait()
                if status != 0:
                    raise SystemExit(f"the opening rows' consumer failed:\n{p.log('opening')}")
            t0 = time.perf_counter()
            sql(
                dsn,
                "SET synchronous_commit = off",
                f"CALL {s}.tpcb({args.transactions}, {args.accounts})",
            )
            print(
                f"backlog: {args.transactions} transactions written in "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            changes = args.transactions * CHANGES_PER_TX
            t0 = time.perf_counter()
            p.producer.start()
            p.wait_published(3600)
            producer_s = time.perf_counter() - t0
            p.producer.stop()
            print(
                f"producer: {changes} changes in {producer_s:.1f} s, "
                f"{changes / producer_s:,.0f} changes/s",
                flush=True,
            )

            proc = p.processor(trigger=None, available_now=True, **caps)
            # Each batch's end, to the instant: the processor appends its report as the batch
            # function returns (polling for it would be up to a second late).
            reports = _Stamped()
            proc.reports = reports
            jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]
            # (batches done, RSS MB of the Python driver, of the JVM, the Python driver's peak
            # since the last sample), sampled within a second of a batch's end: bounded memory
            # shows as a plateau, whatever backlog is left.
            after_batch: list[tuple[int, int, int, int]] = []
            with Peak({"python": os.getpid(), "jvm": jvm}) as peak:
                t0 = time.perf_counter()
                query = start(spark, proc.config, proc)
                seen = 0
                try:
                    while query.isActive:
                        query.awaitTermination(1)
                        done = len(reports)
                        if done > seen:
                            after_batch.append(
                                (
                                    done,
                                    rss_kb(os.getpid()) // 1024,
                                    rss_kb(jvm) // 1024,
                                    peak.since("python") // 1024,
                                )
                            )
                        seen = done
                    # awaitTermination returns as the query ends: no poll's delay here.
                    consumer_s = time.perf_counter() - t0
                except StreamingQueryException as e:
                    raise SystemExit(f"the consumer failed: {e}") from e
                finally:
                    proc.close()  # after the timing: it waits for a Delta checkpoint to end
            applied = sum(r.applied_transactions for r in reports)
            if applied != args.transactions:
                raise SystemExit(f"applied {applied} transactions of {args.transactions}")
            print(
                f"consumer: {changes} changes in {consumer_s:.1f} s, "
                f"{changes / consumer_s:,.0f} changes/s over {len(reports)} batches; "
                f"ratio consumer ÷ producer {producer_s / consumer_s:.2f}",
                flush=True,
            )
            print(flatness(reports, t0, warm=args.warm_jvm > 0), flush=True)
            # Where the batches' time went, step by step (BatchReport.steps), summed over
            # the run: what to cut next.
            totals: dict[str, float] = {}
            for r in proc.reports:
                for name, secs in r.steps.items():
                    totals[name] = totals.get(name, 0.0) + secs
            batch_s = sum(r.seconds for r in proc.reports)
            print(
                f"batch time per step, summed over {len(proc.reports)} batches ({batch_s:.0f} s): "
                + ", ".join(f"{n} {v:.0f} s" for n, v in totals.items())
            )
            # Records left waiting are read again by the next batch: Spark spreads the cap by
            # offsets, not transactions (docs/lake.md, "Bounded batches").
            print(
                "per batch (transactions applied / records left waiting / seconds / seconds "
                "per 100k transactions): "
                + ", ".join(
                    f"{r.applied_transactions} / {r.pending_records} / {r.seconds:.1f} / "
                    + (
                        f"{r.seconds * 100_000 / r.applied_transactions:.1f}"
                        if r.applied_transactions
                        else "-"
                    )
                    for r in proc.reports
                )
            )
            print(
                "steps per batch (s): "
                + "; ".join(
                    " ".join(f"{n} {v:.1f}" for n, v in r.steps.items()) for r in proc.reports
                )
            )
            for name in ("python", "jvm"):
                print(
                    f"driver {name} RSS: {peak.before[name] / 1024:.0f} MB idle before, "
                    f"peak {peak.peak[name] / 1024:.0f} MB during the catch-up, ratio "
                    f"{peak.peak[name] / peak.before[name]:.2f}"
                )
            print(
                "RSS within a second of a batch's end, MB (after batch n: Python / JVM / "
                "Python's peak during the batch): "
                + ", ".join(f"{n}: {py} / {j} / {a}" for n, py, j, a in after_batch)
            )
            p.assert_equal()
            print("verify: the lake equals PostgreSQL")
            topics = [f"{proc.config.topic_prefix}.{t}" for t in tables]
            topics.append(transaction_topic(proc.config.topic_prefix))
            ceiling_s = ceiling(spark, proc.config, topics, Path(tmp) / "ceiling")
            print(
                f"Spark ceiling (Kafka read, from_avro, plain Delta append; warm JVM): "
                f"{changes} changes in {ceiling_s:.1f} s, {changes / ceiling_s:,.0f} changes/s; "
                f"ceiling ÷ producer {producer_s / ceiling_s:.2f}, consumer ÷ ceiling "
                f"{ceiling_s / consumer_s:.2f}"
            )
            base = run_base("bench_consumer_catchup", args.results_dir)
            batches = batch_rows(reports, t0)
            result = {
                "transactions": args.transactions,
                "changes": changes,
                "warm_jvm": args.warm_jvm,
                "max_offsets_per_trigger": args.max_offsets_per_trigger,
                "producer_s": producer_s,
                "consumer_s": consumer_s,
                "ceiling_s": ceiling_s,
                "ratio_consumer_to_producer": producer_s / consumer_s,
                "batch_seconds_per_step": totals,
                "rss_kb": {"before": peak.before, "peak": peak.peak},
                "batches": batches,
                "load_before": load_before,
                "load_after": os.getloadavg()[0],
            }
            print(f"1-minute load after the run: {result['load_after']:.2f}")
            print(f"results: {write_json(base, result)}, {plot_batches(base, batches)}")
    finally:
        sql(dsn, f"DROP SCHEMA {s} CASCADE")
        spark.stop()


if __name__ == "__main__":
    main()
