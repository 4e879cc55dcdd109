"""A cold consumer start's Spark session, with and without the jar manifest (issue 41).

Each run is a new Python process, as a restarted consumer is: it builds the consumer's session
(spark_consumer.session.build_session, the Delta and Kafka connector packages) and runs one
Delta write and read, the first things a batch does. "with": the manifest beside the Ivy cache
names the jars, so Ivy never runs; "without": the manifest is moved away first, so Spark
resolves the packages through Ivy (every jar already in the cache: only the resolution, no
download). The two kinds alternate, each run waits for a quiet machine (docs/benchmarks.md), and
the medians count only runs that started below the quiet load.

Run (with the Ivy cache the test and demo commands use, WALBRIDGE_SPARK_IVY_DIR):
  WALBRIDGE_SPARK_IVY_DIR=/var/cache/walbridge/ivy2 \
    .walbridge/venv/bin/python tests/bench/bench_session_start.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_consumer import jar_manifest
from spark_consumer.config import SparkSettings
from spark_consumer.session import ivy_dir, maven_packages
from tests.bench.bench_producer import QUIET_LOAD, load1, wait_quiet

ROOT = Path(__file__).resolve().parents[2]

# The child: the session, then a first Delta write and read; prints its own timings.
CHILD = """
import sys, time
t0 = time.perf_counter()
from spark_consumer.session import build_session
spark = build_session("bench-session-start")
t1 = time.perf_counter()
spark.range(10).write.format("delta").save(sys.argv[1])
assert spark.read.format("delta").load(sys.argv[1]).count() == 10
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
spark.stop()
"""


def one(manifest: Path | None, tmp: Path) -> tuple[float, float, float]:
    """(process start to session, first Delta write and read, whole process) in seconds."""
    n = len(list(tmp.iterdir()))  # a new table each run
    if manifest is not None and manifest.exists():
        manifest.rename(manifest.with_suffix(".bench-away"))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp / f"t{n}")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the session's process failed:\n{proc.stderr[-3000:]}")
    out = proc.stdout.split()
    whole = time.perf_counter() - t0
    return float(out[-2]), float(out[-1]), whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each kind")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    settings = SparkSettings.from_env(os.environ)
    manifest = jar_manifest.manifest_path(ivy_dir(settings), maven_packages(settings))
    print(f"manifest: {manifest}")
    took: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        one(None, Path(tmp))  # untimed: writes the manifest if missing, warms the file cache
        for r in range(args.runs):
            for kind in ("with", "without") if r % 2 == 0 else ("without", "with"):
                before = wait_quiet()
                session, first, whole = one(manifest if kind == "without" else None, Path(tmp))
                if before < QUIET_LOAD:
                    took[kind].append(whole)
                print(
                    f"{kind:>7} run {r}: process {whole:.1f} s (session {session:.1f} s, first "
                    f"Delta write and read {first:.1f} s), load {before:.2f} before, "
                    f"{load1():.2f} after"
                )
    if not all(took.values()):
        raise SystemExit("no quiet run of each kind: no figure")
    med = {k: statistics.median(v) for k, v in took.items()}
    print(
        f"consumer session start, median of {len(took['with'])}/{len(took['without'])} quiet "
        f"runs: with the jar manifest {med['with']:.1f} s, without {med['without']:.1f} s; "
        f"with ÷ without {med['with'] / med['without']:.2f}"
    )


if __name__ == "__main__":
    main()
