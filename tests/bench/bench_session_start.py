"""A cold consumer start's Spark session, with and without the jar manifest or the class archive.

Each run is a new Python process, as a restarted consumer is: it builds the consumer's session
(spark_consumer.session.build_session, the Delta and Kafka connector packages) and runs one
Delta write and read, the first things a batch does. "with": the manifest beside the Ivy cache
names the jars, so Ivy never runs; "without": the manifest is moved away first, so Spark
resolves the packages through Ivy (every jar already in the cache: only the resolution, no
download). The two kinds alternate, each run waits for a quiet machine (docs/benchmarks.md), and
the medians count only runs that started below the quiet load.

`--compare class-archive`: with and without the driver JVM's class-data archive
(spark_consumer/class_archive.py) instead, the manifest kept in both: "with" maps the archive
(written first by `walbridge-consumer warm-up` if it is missing), "without" runs with
WALBRIDGE_SPARK_CLASS_ARCHIVE=false. `--quiet-wait-s 0` runs on a busy machine and then counts
every run (an indicative interleaved A/B only).

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
from spark_consumer.session import driver_class_archive, ivy_dir, maven_packages
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


def one(
    manifest: Path | None, tmp: Path, env: dict[str, str] | None = None
) -> tuple[float, float, float]:
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
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise SystemExit(f"the session's process failed:\n{proc.stderr[-3000:]}")
    out = proc.stdout.split()
    whole = time.perf_counter() - t0
    return float(out[-2]), float(out[-1]), whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each kind")
    ap.add_argument(
        "--compare",
        choices=("jar-manifest", "class-archive"),
        default="jar-manifest",
        help="what the runs differ by",
    )
    ap.add_argument(
        "--quiet-wait-s",
        type=float,
        default=None,
        help="how long each run waits for a quiet machine (0: no wait, and every run counts)",
    )
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    settings = SparkSettings.from_env(os.environ)
    manifest = jar_manifest.manifest_path(ivy_dir(settings), maven_packages(settings))
    print(f"manifest: {manifest}")
    recorded = jar_manifest.recorded_jars(ivy_dir(settings), maven_packages(settings))
    archive = driver_class_archive(settings, os.environ, recorded) if recorded else None
    if args.compare == "class-archive" and not (archive and archive.is_file()):
        warm = subprocess.run(
            [sys.executable, "-m", "spark_consumer", "warm-up"], cwd=ROOT, capture_output=True
        )
        if warm.returncode != 0:
            raise SystemExit(f"warm-up failed:\n{warm.stderr.decode()[-3000:]}")
        archive = Path(warm.stdout.decode().split()[-1])
    if args.compare == "class-archive":
        print(f"class archive: {archive}")
    off = {"WALBRIDGE_SPARK_CLASS_ARCHIVE": "false"}
    took: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        one(None, Path(tmp))  # untimed: writes the manifest if missing, warms the file cache
        for r in range(args.runs):
            for kind in ("with", "without") if r % 2 == 0 else ("without", "with"):
                if args.quiet_wait_s == 0:
                    before = load1()
                else:
                    kw = {} if args.quiet_wait_s is None else {"limit_s": args.quiet_wait_s}
                    before = wait_quiet(**kw)
                if args.compare == "class-archive":
                    timings = one(None, Path(tmp), off if kind == "without" else None)
                else:
                    timings = one(manifest if kind == "without" else None, Path(tmp))
                session, first, whole = timings
                if before < QUIET_LOAD or args.quiet_wait_s == 0:
                    took[kind].append(whole)
                print(
                    f"{kind:>7} run {r}: process {whole:.1f} s (session {session:.1f} s, first "
                    f"Delta write and read {first:.1f} s), load {before:.2f} before, "
                    f"{load1():.2f} after"
                )
    if not all(took.values()):
        raise SystemExit("no quiet run of each kind: no figure")
    med = {k: statistics.median(v) for k, v in took.items()}
    what = "the jar manifest" if args.compare == "jar-manifest" else "the class archive"
    print(
        f"consumer session start, median of {len(took['with'])}/{len(took['without'])} "
        f"runs: with {what} {med['with']:.1f} s, without {med['without']:.1f} s; "
        f"with ÷ without {med['with'] / med['without']:.2f}"
    )


if __name__ == "__main__":
    main()
