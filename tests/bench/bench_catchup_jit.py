"""Where a cold consumer JVM's CPU goes: the catch-up benchmark, with the JVM's threads sampled.

Runs `bench_consumer_catchup.py` (same arguments) in this process and, every --every seconds,
reads the CPU time of each thread of the Spark JVM from /proc and prints what each kind used in
the interval: HotSpot's C2 and C1 compiler threads, the garbage collector's, Spark's task
threads and the rest (a thread that ended within the interval misses its last moments).
Reading /proc costs the JVM nothing, where a JVM attach tool such as jstat starts a JVM of its
own each time and takes CPU from the run it measures.

    .walbridge/venv/bin/python tests/bench/bench_catchup_jit.py --transactions 300000

Each line `threads t=... {kind: CPU seconds in the interval}` is printed between the
benchmark's own lines; the consumer's interval is between its "producer:" and "consumer:"
lines. `--spark-conf KEY=VALUE` (repeatable) sets a session option before the consumer starts
(the streaming query copies the session's options when it starts), to try one.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import SparkSession

import tests.bench.bench_consumer_catchup as catchup
from tests.bench.proc_usage import threads

# Thread name prefixes as HotSpot and Spark set them (the kernel keeps the first 15 bytes).
_KINDS = (("C2 ", "c2"), ("C1 ", "c1"), ("Executor task", "task"))


def kind(name: str) -> str:
    """The kind of a JVM thread, by the name HotSpot or Spark gave it."""
    for prefix, k in _KINDS:
        if name.startswith(prefix):
            return k
    return "gc" if "GC" in name or name.startswith("G1 ") else "other"


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of `pid`: its kind and CPU seconds so far (user + system)."""
    return {tid: (kind(t.name), t.seconds) for tid, t in threads(pid).items()}


def spent(
    before: dict[int, tuple[str, float]], now: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each kind used between two samples, thread by thread: a new thread counts
    from zero; a thread that ended meanwhile loses only its time since `before`."""
    total: dict[str, float] = {}
    for tid, (k, cpu) in now.items():
        total[k] = total.get(k, 0.0) + cpu - (before[tid][1] if tid in before else 0.0)
    return {k: round(v, 1) for k, v in sorted(total.items())}


def sample(spark: SparkSession, every: float) -> None:
    """Print each kind's CPU seconds every `every` seconds until the JVM is gone."""
    pid: int = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    t0, last = time.perf_counter(), thread_cpu(pid)
    while True:
        time.sleep(every)
        try:
            now = thread_cpu(pid)
        except OSError:
            return  # the JVM is gone
        print(f"threads t={time.perf_counter() - t0:.0f} {spent(last, now)}", flush=True)
        last = now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    args, rest = ap.parse_known_args()
    conf = [kv.split("=", 1) for kv in args.spark_conf]
    if any(len(kv) != 2 for kv in conf):
        raise SystemExit("--spark-conf takes KEY=VALUE")
    build = catchup.build_session

    def build_and_sample(name: str) -> SparkSession:
        spark = build(name)
        for key, value in conf:
            spark.conf.set(key, value)
        threading.Thread(target=sample, args=(spark, args.every), daemon=True).start()
        return spark

    catchup.build_session = build_and_sample  # type: ignore[assignment]
    sys.argv = [sys.argv[0], *rest]
    catchup.main()


if __name__ == "__main__":
    main()
