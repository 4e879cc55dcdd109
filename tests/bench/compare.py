"""Compare the producer's speed on two commits, interleaved on the same WAL: the guard against
the next hot-path regression.

Run (needs the local stack and a quiet machine):

    .walbridge/venv/bin/python tests/bench/compare.py BASE HEAD [--shape small|big|tpcb]
        [--changes N] [--runs 5] [--exactly-once on|off]

BASE and HEAD are any git revisions (``main``, ``HEAD~3``, a sha). Each is checked out once as
a detached worktree under ``$WALBRIDGE_HOME/compare/<sha>`` (kept for the next comparison),
with its compiled row encoder built in place where the commit has one (``setup.py``); both
producers run with this checkout's Python environment. The shape's WAL is written once
(``bench_producer.py``'s workload); each run copies its slot for ``pg_recvlogical`` and for the
producer, and the two commits alternate (BASE first on odd runs, HEAD first on even ones), so
a load that drifts during the comparison hits both alike. Each producer is timed against its
own ``pg_recvlogical`` run just before it.

Prints per run and per commit the ratio producer / ``pg_recvlogical`` and the main thread's CPU
per change, then the medians and HEAD ÷ BASE of each. A HEAD ratio more than 5 % below BASE's
is called a regression (exit status 1), so this can gate a change to the hot path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_producer import (
    ROOT,
    SHAPES,
    generate_shape,
    race,
    stack_env,
)
from bench_replication import create_workload, drop_workload, pg_dsn

from producer.pgoutput import parse_lsn
from schemas.topics import table_topic

REGRESSION: float = 0.95  # HEAD's median ratio below this share of BASE's fails the comparison


def resolve(revision: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=ROOT, check=True, text=True, capture_output=True,
    ).stdout.strip()  # fmt: skip


def checkout(sha: str) -> Path:
    """A detached worktree of ``sha`` (made once, reused by later comparisons)."""
    home = Path(os.environ.get("WALBRIDGE_HOME", ROOT / ".walbridge"))
    path = home / "compare" / sha
    if not (path / "producer").is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--force", str(path), sha],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
    if (path / "setup.py").is_file():
        # The compiled row encoder is a build product, not in git: build it in the worktree
        # (the producer runs from there), or that commit would run the pure-Python encoder.
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=path, check=True, capture_output=True,
        )  # fmt: skip
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--changes", type=int, help="default: the shape's")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exactly-once", choices=("on", "off"), default="on")
    args = parser.parse_args()
    commits = {"BASE": resolve(args.base), "HEAD": resolve(args.head)}
    roots = {label: checkout(sha) for label, sha in commits.items()}
    changes = args.changes or SHAPES[args.shape][1]
    print(f"BASE {args.base} = {commits['BASE'][:12]}, HEAD {args.head} = {commits['HEAD'][:12]}")

    env = stack_env()
    dsn = env.get("WALBRIDGE_PG_DSN") or pg_dsn()
    env["WALBRIDGE_PG_DSN"] = dsn
    tag = uuid.uuid4().hex[:8]
    schema, publication, base = f"cmp_{tag}", f"cmp_pub_{tag}", f"cmp_{tag}_base"
    ratios: dict[str, list[float]] = {"BASE": [], "HEAD": []}
    main_us: dict[str, list[float]] = {"BASE": [], "HEAD": []}
    with psycopg.connect(dsn, autocommit=True) as db:
        try:
            create_workload(db, schema, publication, base)
            transactions = generate_shape(db, schema, args.shape, changes)
            row = db.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            end_lsn = parse_lsn(row[0])
            print(f"shape {args.shape}: {changes:,} changes in {transactions:,} transactions")
            for run in range(args.runs):
                order = ["BASE", "HEAD"] if run % 2 == 0 else ["HEAD", "BASE"]
                for label in order:
                    r = race(
                        db, env, publication, base, f"{run}{label.lower()}",
                        f"cmp{tag}{label.lower()}", end_lsn, changes,
                        exactly_once=args.exactly_once == "on", root=roots[label],
                        data_topic=table_topic(f"cmp{tag}{label.lower()}", schema, "rows"),
                    )  # fmt: skip
                    ratios[label].append(r.ratio)
                    main_us[label].append(r.main_s / changes * 1e6)
                    print(
                        f"run {run + 1} {label}: ratio {r.ratio:.3f}, main thread "
                        f"{main_us[label][-1]:.1f} us/change; load {r.load_before:.2f} -> "
                        f"{r.load_after:.2f}"
                    )
        finally:
            drop_workload(db, schema, publication, [base])
    medians = {label: statistics.median(values) for label, values in ratios.items()}
    cpu = {label: statistics.median(values) for label, values in main_us.items()}
    for label in ("BASE", "HEAD"):
        print(f"median {label}: ratio {medians[label]:.3f}, main thread {cpu[label]:.1f} us/change")
    change = medians["HEAD"] / medians["BASE"]
    print(
        f"HEAD / BASE: ratio x{change:.3f}, main-thread CPU per change "
        f"x{cpu['HEAD'] / cpu['BASE']:.3f}"
    )
    if change < REGRESSION:
        sys.exit(f"regression: HEAD's ratio is {1 - change:.0%} below BASE's")


if __name__ == "__main__":
    main()
