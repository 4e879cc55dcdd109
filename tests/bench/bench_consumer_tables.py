"""Per-table fixed cost: one batch touching N tables with a few rows each (issue 16 item 6).

For each N (default 10, 100, 300), on a fresh lake (local[2], mock:// registry, no Kafka):
  - batch 0 "create": one transaction per table inserting --rows rows; every table is new;
  - batch 1 "mixed": one transaction per table: an update and a delete of rows batch 0
    inserted, and --rows - 2 inserts of new keys (the guarded MERGE);
  - batch 2 "inserts": one transaction per table, --rows inserts of new keys (the insert paths).
Each is reported as seconds per table touched, with the batch's per-step times.

The batch's frame has one partition per topic, as the Kafka source's has (hash-partitioned by
topic: about as many partitions, a few of them empty or shared).

Baseline, in the same run: a plain Delta append of --rows rows (a local DataFrame) to each of N
tables of their own that already exist, on the consumer's own thread count
(`merge_threads`): what writing a few rows to N Delta tables costs at the least.

Each batch's frame belongs to a copy of the session without adaptive execution, as the frames a
streaming query hands foreachBatch do.

A warm-up round (N = --warmup tables, untimed) runs first, so the JIT and Spark's code caches
are warm for both sides.

Run:
  .walbridge/venv/bin/python tests/bench/bench_consumer_tables.py --tables 10 100 300
(`--lake-rewrite-below-bytes 0`: the guarded MERGEs write deletion vectors, as before that
setting.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.sql import SparkSession

from spark_consumer.batch import BatchProcessor, BatchReport
from spark_consumer.config import (
    DEFAULT_LAKE_REWRITE_BELOW_BYTES,
    DEFAULT_MERGE_THREADS,
    ConsumerConfig,
)
from spark_consumer.session import build_session
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KafkaLog

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
COLUMNS = (
    ColumnSpec("id", "long", "int8"),
    ColumnSpec("balance", DEC, "numeric(12,2)"),
    ColumnSpec("note", "string", "text"),
)
PREFIX = "bench"


def row(key: int, version: int = 0) -> dict[str, object]:
    return {"id": key, "balance": Decimal(f"{(key + version) % 1000}.25"), "note": f"n{version}"}


def specs(n: int, tag: str) -> list[TableSpec]:
    return [TableSpec(f"s{tag}", f"t{i:03d}", COLUMNS, ("id",)) for i in range(n)]


class Run:
    """One lake, its processor and the transactions of the three batches."""

    def __init__(
        self,
        spark: SparkSession,
        writer: EventWriter,
        client_url: str,
        lake: str,
        rows: int,
        rewrite_below: int,
        threads: int,
    ) -> None:
        self.spark = spark
        self.writer = writer
        self.rows = rows
        self.log = KafkaLog()
        # The batches' frames come from a copy of the session without adaptive execution, as a
        # streaming query's do: Spark runs each query on a copy of the session (cloneSession),
        # with adaptive execution off, and hands foreachBatch frames of that copy.
        jclone = spark._jsparkSession.cloneSession()  # type: ignore[attr-defined]
        self.stream_session = SparkSession(spark.sparkContext, jsparkSession=jclone)
        self.stream_session.conf.set("spark.sql.adaptive.enabled", "false")
        self.xid = 1
        self.cfg = ConsumerConfig(
            kafka_bootstrap="-",
            schema_registry_url=client_url,
            topic_prefix=PREFIX,
            lake_path=f"{lake}/lake",
            checkpoint_path=f"{lake}/cp",
            trigger=None,
            available_now=True,
            lake_rewrite_below_bytes=rewrite_below,
            merge_threads=threads,
        )

    def batch(
        self, proc: BatchProcessor, tables: list[TableSpec], kind: str, batch_id: int
    ) -> tuple[float, BatchReport]:
        records = []
        for t in tables:
            tx = self.writer.transaction(self.xid, self.xid * 10)
            self.xid += 1
            r = self.rows
            if kind == "create":
                for k in range(r):
                    tx.insert(t, row(k))
            elif kind == "mixed":
                tx.update(t, row(0, batch_id))
                tx.delete(t, {"id": 1})
                for k in range(max(0, r - 2)):
                    tx.insert(t, row(1000 + k))
            else:
                for k in range(r):
                    tx.insert(t, row(2000 + k))
            records += tx.records()
        # As the Kafka source gives it: one partition per topic partition (here one per table
        # topic, plus the transaction topic's).
        df = self.log.frame(self.stream_session, records)
        df = df.repartition(len(tables) + 1, "topic").persist()
        df.count()
        t0 = time.perf_counter()
        report = proc.process(df, batch_id)
        seconds = time.perf_counter() - t0
        df.unpersist()
        return seconds, report


def consumer_round(
    spark: SparkSession,
    client: SchemaRegistryClient,
    writer: EventWriter,
    url: str,
    tmp: str,
    n: int,
    rows: int,
    tag: str,
    rewrite_below: int = DEFAULT_LAKE_REWRITE_BELOW_BYTES,
    threads: int = DEFAULT_MERGE_THREADS,
) -> dict[str, tuple[float, BatchReport]]:
    run = Run(spark, writer, url, f"{tmp}/{tag}", rows, rewrite_below, threads)
    proc = BatchProcessor(spark, run.cfg, WriterSchemas(client))
    tables = specs(n, tag)
    out = {}
    for batch_id, kind in enumerate(("create", "mixed", "inserts")):
        out[kind] = run.batch(proc, tables, kind, batch_id)
        total = sum(sum(r.changes_by_table.values()) for r in [out[kind][1]])
        assert len(out[kind][1].changes_by_table) == n, (kind, out[kind][1].changes_by_table)
        assert total == n * rows, (kind, total)
    return out


def plain_appends(spark: SparkSession, where: str, n: int, rows: int, threads: int) -> float:
    """Seconds to append `rows` rows to each of `n` existing Delta tables on `threads` threads."""
    schema = "id long, balance decimal(12,2), note string, _commit_lsn long, _total_order long"
    data = [(k, Decimal("1.25"), "n", 1, k) for k in range(rows)]

    def append(i: int) -> None:
        spark.createDataFrame(data, schema).write.format("delta").mode("append").save(
            f"{where}/t{i:03d}"
        )

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(append, range(n)))  # creates them
        t0 = time.perf_counter()
        list(pool.map(append, range(n)))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, nargs="+", default=[10, 100, 300])
    ap.add_argument("--rows", type=int, default=3, help="rows per table per batch (>= 2)")
    ap.add_argument(
        "--merge-threads",
        type=int,
        default=DEFAULT_MERGE_THREADS,
        help="the consumer's --merge-threads, and the plain appends' threads",
    )
    ap.add_argument("--warmup", type=int, default=10, help="tables of the untimed warm-up round")
    ap.add_argument(
        "--lake-rewrite-below-bytes",
        type=int,
        default=DEFAULT_LAKE_REWRITE_BELOW_BYTES,
        help="the consumer's setting (0: the guarded MERGEs write deletion vectors)",
    )
    args = ap.parse_args()
    spark = build_session("bench-consumer-tables")
    spark.sparkContext.setLogLevel("ERROR")
    url = "mock://bench-tables"
    client = registry_client(url)
    writer = EventWriter(client, PREFIX)
    with tempfile.TemporaryDirectory() as tmp:
        threads = args.merge_threads
        if args.warmup:
            t0 = time.perf_counter()
            consumer_round(
                spark,
                client,
                writer,
                url,
                tmp,
                args.warmup,
                args.rows,
                "warm",
                args.lake_rewrite_below_bytes,
                threads,
            )
            plain_appends(spark, f"{tmp}/plain-warm", args.warmup, args.rows, threads)
            print(f"warm-up ({args.warmup} tables, untimed): {time.perf_counter() - t0:.1f} s")
        for n in args.tables:
            got = consumer_round(
                spark,
                client,
                writer,
                url,
                tmp,
                n,
                args.rows,
                f"n{n}",
                args.lake_rewrite_below_bytes,
                threads,
            )
            plain = plain_appends(spark, f"{tmp}/plain-{n}", n, args.rows, threads)
            for kind, (secs, report) in got.items():
                print(f"  N={n} {kind}: {secs:.1f} s, {secs / n:.3f} s/table; steps {report.steps}")
            per = {k: s / n for k, (s, _r) in got.items()}
            print(
                f"N={n} tables x {args.rows} rows: s/table create {per['create']:.3f}, "
                f"mixed {per['mixed']:.3f}, inserts {per['inserts']:.3f}; plain append "
                f"{plain / n:.3f} s/table ({threads} threads); ratio mixed/plain "
                f"{per['mixed'] / (plain / n):.1f}"
            )
    spark.stop()


if __name__ == "__main__":
    main()
