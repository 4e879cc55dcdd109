"""The lake soak (issue 40): many consumer batches of small TPC-B-shaped transactions into the
same tables, with lake maintenance on and then off, and each figure at the last batch against
batch 100 of the same run.

Each transaction has 5 changes: two account balances (a transfer), the teller's and the
branch's balance, and a history row (keyless: appended). Batches go through the consumer's own
batch function (`BatchProcessor`, so its maintenance runs between batches exactly as in `run`)
as static frames of Kafka-shaped records with the in-process mock registry: the soak is about
the Delta side, and Kafka would only add its own noise.

Figures (at the last batch ÷ at batch 100): batch wall time p50 and p99 (over a window of
batches around each point), the MERGE step's time, a full read of each table with Spark and with
delta-rs, files per table, `_delta_log` bytes; and at the end: bytes written per changed row
(every add action's bytes, compaction included, over the bytes a changed row takes in the
table) and disk bytes per table over the live table.

Run (the real soak, on a quiet machine: hours):
  .walbridge/venv/bin/python tests/bench/bench_lake_soak.py --batches 10000
Tiny (proves the script):
  .walbridge/venv/bin/python tests/bench/bench_lake_soak.py --batches 30 --baseline 10 --window 20 --accounts 1000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import deltalake
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_consumer import lake_state
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.session import build_session
from spark_consumer.writer_schemas import WriterSchemas
from tests.bench import bench_output, plots
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KafkaLog

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}


def _balance_table(name: str) -> TableSpec:
    cols = (ColumnSpec("id", "long", "int8"), ColumnSpec("balance", DEC, "numeric(12,2)"))
    return TableSpec("bank", name, cols, ("id",))


ACCOUNTS, TELLERS, BRANCHES = (_balance_table(n) for n in ("accounts", "tellers", "branches"))
HISTORY = TableSpec(
    "bank",
    "history",
    (
        ColumnSpec("aid", "long", "int8"),
        ColumnSpec("delta", DEC, "numeric(12,2)"),
        ColumnSpec("note", "string", "text"),
    ),
    (),
)
TABLES = (ACCOUNTS, TELLERS, BRANCHES, HISTORY)
WINDOW = 20  # batches around a point for its p50/p99 (fewer in a tiny run)


class Soak:
    def __init__(
        self, spark: SparkSession, root: Path, args: argparse.Namespace, maintenance: bool
    ) -> None:
        url = f"mock://soak-{maintenance}"
        client = registry_client(url)
        self.config = ConsumerConfig(
            kafka_bootstrap="-",
            schema_registry_url=url,
            topic_prefix="soak",
            lake_path=str(root / "lake"),
            checkpoint_path=str(root / "cp"),
            trigger=None,
            available_now=True,
            lake_maintenance_budget=args.budget if maintenance else 0.0,
            lake_consistent_read_retention=args.window,
        )
        self.spark = spark
        self.args = args
        self.processor = BatchProcessor(spark, self.config, WriterSchemas(client))
        self.writer = EventWriter(client, "soak")
        self.log = KafkaLog()
        self.balances: dict[tuple[str, int], Decimal] = {}
        self.xid = 0
        self.changed_rows = 0

    def path(self, spec: TableSpec) -> str:
        return self.config.table_path(spec.schema, spec.table)

    def batch(self, n: int) -> float:
        a = self.args
        records = []
        for _ in range(a.tx_per_batch if n else 1):
            self.xid += 1
            tx = self.writer.transaction(self.xid, 1000 * self.xid)
            if n == 0:  # the opening balances
                for spec, count in ((ACCOUNTS, a.accounts), (TELLERS, 10), (BRANCHES, 1)):
                    for i in range(count):
                        self.balances[(spec.table, i)] = Decimal("100.00")
                        tx.insert(spec, {"id": i, "balance": Decimal("100.00")})
            else:
                x = self.xid * 7919
                src, dst = x % a.accounts, (x // 3 + 1) % a.accounts
                dst = dst if dst != src else (src + 1) % a.accounts
                amount = Decimal(x % 97 + 1)
                for spec, key, d in (
                    (ACCOUNTS, src, -amount),
                    (ACCOUNTS, dst, amount),
                    (TELLERS, x % 10, amount),
                    (BRANCHES, 0, amount),
                ):
                    self.balances[(spec.table, key)] += d
                    tx.update(spec, {"id": key, "balance": self.balances[(spec.table, key)]})
                tx.insert(HISTORY, {"aid": src, "delta": amount, "note": f"transfer {self.xid}"})
                self.changed_rows += 5
            records += tx.records()
        started = time.perf_counter()
        self.processor.apply(self.log.frame(self.spark, records), n)
        return time.perf_counter() - started


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _written_bytes(table: Path) -> int:
    """Bytes of every file and deletion vector the table's log ever added."""
    total = 0
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            add = action.get("add")
            if add:  # compaction's adds included: they are bytes written too
                total += int(add["size"])
                total += int((add.get("deletionVector") or {}).get("sizeInBytes", 0))
    return total


def snapshot(soak: Soak, n: int) -> dict[str, Any]:
    """The per-table figures at batch n."""
    out: dict[str, Any] = {}
    for spec in TABLES:
        path = Path(soak.path(spec))
        t0 = time.perf_counter()
        # Every column of every row read (a count could be answered from file statistics; a
        # noop write refuses a Delta read's unpinned snapshot).
        df = soak.spark.read.format("delta").load(str(path))
        df.agg(F.sum(F.hash(*df.columns))).collect()
        spark_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        dt = deltalake.DeltaTable(str(path))
        # delta-rs' SQL reader applies deletion vectors (its to_pyarrow_table refuses them).
        rows = pa.table(
            deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()
        ).num_rows
        rs_read = time.perf_counter() - t0
        files = dt.file_uris()
        # An arro3 table (deltalake 1.x): pyarrow reads it through the Arrow C interface.
        live = sum(pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist())
        out[spec.table] = {
            "rows": rows,
            "files": len(files),
            "live_bytes": live,
            "disk_bytes": _dir_bytes(path) - _dir_bytes(path / "_delta_log"),
            "log_bytes": _dir_bytes(path / "_delta_log"),
            "written_bytes": _written_bytes(path),
            "spark_read_s": spark_read,
            "delta_rs_read_s": rs_read,
        }
    out["changed_rows"] = soak.changed_rows
    out["batch"] = n
    return out


def _percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def run(spark: SparkSession, args: argparse.Namespace, maintenance: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="soak-", dir=args.tmp))
    soak = Soak(spark, root, args, maintenance)
    seconds: list[float] = []
    merge_s: list[float] = []
    files: list[tuple[float, float]] = []
    points: dict[str, dict[str, Any]] = {}
    began = last_print = time.monotonic()
    for n in range(args.batches):
        seconds.append(soak.batch(n))
        merge_s.append(soak.processor.reports[-1].steps.get("merge", 0.0))
        files.append((n, snapshot_files(soak)))
        if n == args.baseline or n == args.batches - 1:
            points["base" if n == args.baseline else "end"] = snapshot(soak, n)
        if time.monotonic() - last_print >= 30 or n == args.batches - 1:
            last_print = time.monotonic()
            rate = (n + 1) / (last_print - began)
            recent = seconds[-WINDOW:]
            print(
                f"{'on' if maintenance else 'off'}: batch {n + 1:,}/{args.batches:,}, "
                f"{rate:.2f} batches/s, last {len(recent)} p50 {statistics.median(recent):.2f}s, "
                f"files {files[-1][1]:.0f}, ETA {(args.batches - n - 1) / rate / 60:.0f} min, "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    base, end = points["base"], points["end"]

    def window(values: list[float], at: int) -> list[float]:
        return values[max(1, at - WINDOW // 2) : at + WINDOW // 2 + 1]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    last = args.batches - 1
    result: dict[str, Any] = {
        "maintenance": maintenance,
        "batch_p50_ratio": ratio(
            _percentile(window(seconds, last), 50), _percentile(window(seconds, args.baseline), 50)
        ),
        "batch_p99_ratio": ratio(
            _percentile(window(seconds, last), 99), _percentile(window(seconds, args.baseline), 99)
        ),
        "merge_ratio": ratio(
            statistics.median(window(merge_s, last)),
            statistics.median(window(merge_s, args.baseline)),
        ),
        "compactions": soak.processor.maintenance.compactions,
        "vacuums": soak.processor.maintenance.vacuums,
        "tables": {},
        "series": {"seconds": seconds, "files": files},
    }
    changed = end["changed_rows"] - base["changed_rows"]
    for spec in TABLES:
        b, e = base[spec.table], end[spec.table]
        row_bytes = e["live_bytes"] / max(1, e["rows"])
        result["tables"][spec.table] = {
            "spark_read_ratio": ratio(e["spark_read_s"], b["spark_read_s"]),
            "delta_rs_read_ratio": ratio(e["delta_rs_read_s"], b["delta_rs_read_s"]),
            "files": (b["files"], e["files"]),
            "log_bytes": (b["log_bytes"], e["log_bytes"]),
            # Every table's share of the changed rows is about a fifth of them (5 changes per tx).
            "written_per_changed_row_bytes_ratio": ratio(
                (e["written_bytes"] - b["written_bytes"]) / max(1, changed / 5), row_bytes
            ),
            "disk_over_live": ratio(e["disk_bytes"], e["live_bytes"]),
        }
    return result


def snapshot_files(soak: Soak) -> float:
    return float(lake_state.read(soak.spark, soak.path(ACCOUNTS)).files)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--baseline", type=int, default=100, help="the batch figures compare with")
    ap.add_argument("--tx-per-batch", type=int, default=1)
    ap.add_argument("--accounts", type=int, default=100_000)
    ap.add_argument("--window", type=float, default=3600.0, help="consistent-read retention, s")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--mode", choices=("on", "off", "both"), default="both")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--results-dir", type=Path, default=None)
    args = ap.parse_args()
    if not 0 < args.baseline < args.batches:
        ap.error("--baseline must be a batch after the first and before the last")
    spark = build_session("bench-lake-soak", shuffle_partitions=2)
    spark.sparkContext.setLogLevel("WARN")
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.mode]
    results = {("on" if m else "off"): run(spark, args, m) for m in modes}
    base = bench_output.run_base("bench_lake_soak", args.results_dir)
    plots.series_plot(
        base.with_name(base.name + "-batch-seconds.png"),
        {k: list(enumerate(r["series"]["seconds"])) for k, r in results.items()},
        title="Batch wall time",
        xlabel="batch",
        ylabel="seconds",
    )
    plots.series_plot(
        base.with_name(base.name + "-files.png"),
        {k: r["series"]["files"] for k, r in results.items()},
        title="Files in bank.accounts",
        xlabel="batch",
        ylabel="files",
    )
    for r in results.values():
        del r["series"]
    path = bench_output.write_json(base, {"args": vars(args), "results": results})
    print(json.dumps(results, indent=2, default=str))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
