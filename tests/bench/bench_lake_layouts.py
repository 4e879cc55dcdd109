"""What the lake layouts cost (issue 43): catch-up changes/s on the 5-change TPC-B shape with
a table option on ÷ off, in one run.

One backlog, published once through the whole real pipeline (PostgreSQL, the producer as a
subprocess, Kafka): the opening rows (branches, tellers, accounts) and --transactions TPC-B
transactions (tests/bench/bench_consumer_catchup.py's shape: 2 account updates, a teller's and
a branch's, a row in the keyless history table). Then the consumer applies the same Kafka
records several times in this process, each time into a new lake from the first offset, with
the layouts in turn:

- `plain`: no options (today's behaviour), the baseline;
- `history`: `history = true` on the three keyed tables;
- `changelog`: `changelog = true` on all four tables.

The runs alternate (plain, history, changelog, then again in reverse order, --rounds times),
after untimed warm-up runs on the same JVM (--warm-up-runs), so no layout always meets the
warmest JVM: a young JVM's runs keep getting faster for several runs (on 2026-12-02, after one
warm-up run, plain took 16.5k changes/s in its first round and 25.5k in its second).
Reported: each layout's changes/s (the median over its runs) and the ratios history ÷ plain
(target >= 0.7) and changelog ÷ plain (target >= 0.9) of those medians; beside them, the
ratio of each round's runs, which cancels the machine's drift between rounds.

Run (figures in docs/lake-layouts.md, to be taken on a quiet machine):
  eval "$(deploy/local/stack env)"
  .walbridge/venv/bin/python tests/bench/bench_lake_layouts.py --transactions 100000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_consumer.lake_options import LakeOptions, parse
from spark_consumer.session import build_session
from tests.bench.bench_consumer_catchup import CHANGES_PER_TX, create, fill
from tests.bench.bench_producer import QUIET_LOAD, load1, wait_quiet
from tests.e2e.harness import pipeline
from tests.support.producer_harness import sql

LAYOUTS = ("plain", "history", "changelog")


def layout_options(layout: str, tables: list[str]) -> LakeOptions:
    keyed = [t for t in tables if not t.endswith(".history")]  # pgbench's history: no key
    if layout == "plain":
        return LakeOptions()
    if layout == "history":
        return parse("".join(f'[tables."{t}"]\nhistory = true\n' for t in keyed))
    return parse("".join(f'[tables."{t}"]\nchangelog = true\n' for t in tables))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=100_000)
    ap.add_argument("--accounts", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=4, help="timed runs of each layout")
    ap.add_argument(
        "--warm-up-runs", type=int, default=2, help="untimed plain runs first, on the same JVM"
    )
    ap.add_argument(
        "--lake-maintenance-budget",
        type=float,
        help="the consumer's maintenance budget (default: the consumer's; 0: no maintenance "
        "between batches, to see what it adds to each layout)",
    )
    ap.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help="Kafka records per batch at most (default: the consumer's, which takes the whole "
        "backlog below 1M records in one batch into empty tables; a smaller cap shows the "
        "steady-state batches, whose history MERGEs close open versions)",
    )
    ap.add_argument(
        "--any-load",
        action="store_true",
        help="start each run at once and count it whatever the load (to iterate on a busy "
        "machine: the figures are then indicative only)",
    )
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    dsn = os.environ["WALBRIDGE_PG_DSN"]
    s = f"bench_layouts_{uuid.uuid4().hex[:8]}"
    tables = create(dsn, s)
    spark = build_session("bench-lake-layouts")
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
                "benchlayouts",
            ) as p,
        ):
            p.start_producer()
            fill(dsn, s, args.accounts)
            sql(
                dsn,
                "SET synchronous_commit = off",
                f"CALL {s}.tpcb({args.transactions}, {args.accounts})",
            )
            p.wait_published(3600)
            p.producer.stop()
            changes = args.transactions * CHANGES_PER_TX + args.accounts + 110
            overrides: dict[str, float] = {}
            if args.lake_maintenance_budget is not None:
                overrides["lake_maintenance_budget"] = args.lake_maintenance_budget
            if args.max_offsets_per_trigger is not None:
                overrides["max_offsets_per_trigger"] = args.max_offsets_per_trigger

            def run(layout: str, name: str) -> tuple[float, int]:
                lake = str(Path(tmp) / name / "lake")
                t0 = time.perf_counter()
                proc = p.consume_available(
                    timeout=3600,
                    lake_path=lake,
                    checkpoint_path=str(Path(tmp) / name / "checkpoint"),
                    lake_tables_config=layout_options(layout, tables),
                    **overrides,
                )
                took = time.perf_counter() - t0
                proc.close()
                applied = sum(r.applied_transactions for r in proc.reports)
                if applied < args.transactions:
                    raise SystemExit(f"{layout}: applied {applied} of {args.transactions}")
                return took, len(proc.reports)

            for w in range(args.warm_up_runs):  # untimed: the JVM's first batches
                run("plain", f"warm-up-{w}")
            took: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            loud: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            by_round: dict[int, dict[str, float]] = {}
            for r in range(args.rounds):
                order = LAYOUTS if r % 2 == 0 else tuple(reversed(LAYOUTS))
                for layout in order:
                    # The quiet-machine rule (docs/benchmarks.md), unless --any-load.
                    before = load1() if args.any_load else wait_quiet()
                    secs, batches = run(layout, f"{layout}-{r}")
                    # Only runs started below the quiet load count in the medians.
                    quiet = args.any_load or before < QUIET_LOAD
                    (took if quiet else loud)[layout].append(secs)
                    if quiet:
                        by_round.setdefault(r, {})[layout] = secs
                    print(
                        f"{layout:>9} run {r}: {changes / secs:,.0f} changes/s ({secs:.1f} s, "
                        f"{batches} batches), load {before:.2f} before, {load1():.2f} after"
                    )
            if not all(took.values()):
                raise SystemExit(
                    f"no quiet run of {[k for k, v in took.items() if not v]}: no figure "
                    f"(the load stayed >= {QUIET_LOAD}; {sum(map(len, loud.values()))} runs "
                    "do not count)"
                )
            rate = {k: changes / statistics.median(v) for k, v in took.items()}
            print(
                f"catch-up of {args.transactions:,} TPC-B transactions ({changes:,} changes, "
                f"opening rows included): plain {rate['plain']:,.0f} changes/s, history "
                f"{rate['history']:,.0f}, changelog {rate['changelog']:,.0f}; history ÷ plain "
                f"{rate['history'] / rate['plain']:.2f} (target >= 0.7), changelog ÷ plain "
                f"{rate['changelog'] / rate['plain']:.2f} (target >= 0.9)"
                + (" [--any-load: indicative only]" if args.any_load else "")
            )
            for layout in ("history", "changelog"):
                # A round's layout run ÷ its plain run (time of plain ÷ time of the layout).
                per = [t["plain"] / t[layout] for t in by_round.values() if len(t) == 3]
                if per:
                    print(
                        f"{layout} ÷ plain per round: "
                        + ", ".join(f"{x:.2f}" for x in per)
                        + f"; median {statistics.median(per):.2f}"
                    )
    finally:
        sql(dsn, f"DROP SCHEMA IF EXISTS {s} CASCADE")
        spark.stop()


if __name__ == "__main__":
    main()
