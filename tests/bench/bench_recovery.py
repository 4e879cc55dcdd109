"""Restart after kill -9, each side (issue 41): from the kill to the side's next output, with
the process restarted at once (as a supervisor or a kubelet without back-off would).

- producer: from kill -9 to the first event in Kafka that the new process produced (read
  `read_committed`; an event counts when its CreateTime, stamped by the producing client, is
  after the kill, so what the dead process had committed just before is not taken for it);
- consumer: from kill -9 of `python -m spark_consumer run` (its whole process group, JVM
  included) to the first progress row of a batch after the last one before the kill.

Each in two modes, in the same run: `idle` (the baseline: nothing written but one one-row
transaction right after the kill, so there is something to publish or apply) and `load` (one-
row transactions at --rate per second the whole time, which is also the torture's write load;
run it against `WALBRIDGE_KAFKA_BROKERS=3 deploy/local/stack up` for the torture's brokers).
Reported per side and mode: trials, p50, p99 and max seconds; the load average before and after
each trial; a JSON result (tests/bench/bench_output.py). Targets: producer p99 < 5 s; consumer
p50 < 30 s and p99 < 60 s with the load running.

`--compare-class-archive`: each consumer trial runs twice, with and without the driver JVM's
class-data archive (spark_consumer/class_archive.py), in alternating order, reported as
`consumer/<mode>/class-archive` and `consumer/<mode>/no-class-archive`.

Run (a quiet machine; about 1 min per consumer trial):
  eval "$(deploy/local/stack env)"
  .walbridge/venv/bin/python tests/bench/bench_recovery.py --trials 10
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import deltalake
import pyarrow as pa
from confluent_kafka import OFFSET_END, Consumer, TopicPartition
from deltalake.exceptions import TableNotFoundError

from schemas.topics import table_topic
from tests.bench import bench_output
from tests.bench.bench_producer import QUIET_LOAD, load1, wait_quiet
from tests.e2e.harness import Pipeline
from tests.support.producer_harness import sql
from tests.support.torture_services import ConsumerProcess

TABLE = "bench_recovery.ticks"
ROOT = Path(__file__).resolve().parents[2]


class Arrivals:
    """The data topic read `read_committed` from its end: when (wall clock) the first record
    produced at or after a given time arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-recovery-{os.getpid()}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        meta = self._consumer.list_topics(topic, timeout=30).topics[topic]
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in meta.partitions])
        self._seen: list[tuple[float, float]] = []  # (CreateTime s, arrival s), wall clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            m = self._consumer.poll(0.05)
            if m is None or m.error():
                continue
            _kind, ts_ms = m.timestamp()
            with self._lock:
                self._seen.append((ts_ms / 1000, time.time()))

    def first_after(self, t: float) -> float | None:
        with self._lock:
            arrivals = [a for created, a in self._seen if created >= t]
        return min(arrivals) if arrivals else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


class Writer:
    """One-row transactions at `rate` per second while `on` is set."""

    def __init__(self, dsn: str, rate: float) -> None:
        self.dsn, self.rate = dsn, rate
        self.on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                if self.on.is_set():
                    conn.execute(f"INSERT INTO {TABLE} (v) VALUES (1)")
                    time.sleep(1 / self.rate)
                else:
                    time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _until(what: str, check: Callable[[], float | None], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while (got := check()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)
    return got


def _last_batch(progress: str) -> int:
    try:
        t = deltalake.DeltaTable(progress)
    except TableNotFoundError:  # no batch yet
        return -1
    # The SQL reader applies deletion vectors (expired progress rows), to_pyarrow_table refuses.
    out = deltalake.QueryBuilder().register("p", t).execute("SELECT max(batch_id) AS m FROM p")
    found = pa.table(out.read_all()).column("m").to_pylist()[0]
    return -1 if found is None else int(found)


def producer_trial(p: Pipeline, arrivals: Arrivals, load: bool) -> float:
    kill_at = time.time()
    p.producer.kill()
    p.producer.start(wait_ready=False)
    if not load:
        sql(p.dsn, f"INSERT INTO {TABLE} (v) VALUES (2)")
    got = _until("event from the restarted producer", lambda: arrivals.first_after(kill_at), 120)
    p.producer.wait_ready()
    return got - kill_at


def consumer_trial(p: Pipeline, consumer: ConsumerProcess, load: bool) -> float:
    progress = f"{p.lake}/_walbridge/progress"
    before = _last_batch(progress)
    kill_at = time.time()
    consumer.kill9()
    consumer.start()
    if not load:
        sql(p.dsn, f"INSERT INTO {TABLE} (v) VALUES (2)")
    _until(
        "progress row from the restarted consumer",
        lambda: time.time() if _last_batch(progress) > before else None,
        600,
    )
    return time.time() - kill_at


ARCHIVE_VAR = "WALBRIDGE_SPARK_CLASS_ARCHIVE"
# Name suffix -> the variable's value ("" = the default: the archive if there is one).
ARMS = {"/class-archive": "true", "/no-class-archive": "false"}


def _ensure_class_archive(env: dict[str, str]) -> None:
    """The consumer's archive, written by `warm-up` with the consumer's own settings (its
    home and Ivy directory decide the archive's path) unless it is already there."""
    import subprocess

    from spark_consumer import class_archive, jar_manifest
    from spark_consumer.config import SparkSettings
    from spark_consumer.session import driver_class_archive, ivy_dir, maven_packages

    settings = SparkSettings.from_env(env)
    jars = jar_manifest.recorded_jars(ivy_dir(settings), maven_packages(settings))
    if jars and class_archive.intact(driver_class_archive(settings, env, jars)):
        return
    subprocess.run(
        [sys.executable, "-m", "spark_consumer", "warm-up"], env=env, check=True, cwd=ROOT
    )


def _trial(
    p: Pipeline,
    side: str,
    mode: str,
    consumer: ConsumerProcess,
    writer: Writer,
    arrivals: Arrivals,
    args: argparse.Namespace,
) -> dict[str, float]:
    writer.on.clear()
    before = wait_quiet(args.quiet_wait_s)  # the quiet-machine rule, before the load too
    if mode == "load":
        writer.on.set()
        time.sleep(5)  # the load reaches both sides first
    if side == "producer":
        secs = producer_trial(p, arrivals, mode == "load")
    else:
        secs = consumer_trial(p, consumer, mode == "load")
        time.sleep(5)  # the restarted consumer settles (JIT, first batches)
    return {"s": round(secs, 2), "load_before": before, "load_after": load1()}


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "trials": len(values),
        "p50_s": round(statistics.median(values), 2),
        "p99_s": round(p99, 2),
        "max_s": round(ordered[-1], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="per side and mode")
    ap.add_argument("--rate", type=float, default=200.0, help="transactions/s in `load` mode")
    ap.add_argument("--sides", default="producer,consumer")
    ap.add_argument("--results-dir", type=Path)
    ap.add_argument(
        "--quiet-wait-s",
        type=float,
        default=180.0,
        help="how long each trial waits for a quiet machine (0: to try the script on a busy "
        "one; its trials then do not count)",
    )
    ap.add_argument(
        "--compare-class-archive",
        action="store_true",
        help="consumer trials alternate with and without the driver JVM's class-data archive "
        "(WALBRIDGE_SPARK_CLASS_ARCHIVE; `walbridge-consumer warm-up` first if it is missing)",
    )
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    # The consumer runs in its own process group: a SIGTERM (`timeout`, Ctrl-C's cousin) must
    # reach the `finally` below that stops it, not end this process with the consumer left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dsn = os.environ["WALBRIDGE_PG_DSN"]
    kafka = os.environ["WALBRIDGE_KAFKA_BOOTSTRAP"]
    registry = os.environ["WALBRIDGE_SCHEMA_REGISTRY_URL"]
    sql(
        dsn,
        "CREATE SCHEMA IF NOT EXISTS bench_recovery",
        f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, v int)",
    )
    results: dict[str, Any] = {"rate": args.rate, "trials": {}}
    with tempfile.TemporaryDirectory() as tmp:
        p = Pipeline(None, dsn, kafka, registry, Path(tmp), [TABLE], "benchrec")  # type: ignore[arg-type]
        writer = Writer(dsn, args.rate)
        consumer = ConsumerProcess(
            p.consumer_env(WALBRIDGE_TRIGGER="1 seconds"), Path(tmp) / "consumer.log"
        )
        try:
            p.start_producer()
            sql(dsn, f"INSERT INTO {TABLE} (v) VALUES (0)")  # the topic exists from here on
            p.wait_published()
            arrivals = Arrivals(kafka, table_topic(p.prefix, *TABLE.split(".")))
            sides = args.sides.split(",")
            if "consumer" in sides and args.compare_class_archive:
                _ensure_class_archive(consumer.env)
            if "consumer" in sides:
                consumer.start()
                progress = f"{p.lake}/_walbridge/progress"
                _until("first batch", lambda: 1.0 if _last_batch(progress) >= 0 else None, 600)
            for side in sides:
                for mode in ("idle", "load"):
                    arms = ARMS if side == "consumer" and args.compare_class_archive else {"": ""}
                    names = [f"{side}/{mode}{arm}" for arm in arms]
                    runs_of: dict[str, list[dict[str, float]]] = {n: [] for n in names}
                    for i in range(args.trials):
                        # Alternating order: neither arm always runs first after the load.
                        for name in names if i % 2 == 0 else list(reversed(names)):
                            consumer.env[ARCHIVE_VAR] = arms[name.removeprefix(f"{side}/{mode}")]
                            runs_of[name].append(
                                _trial(p, side, mode, consumer, writer, arrivals, args)
                            )
                            run = runs_of[name][-1]
                            print(
                                f"{name} trial {i}: {run['s']:.2f} s (load "
                                f"{run['load_before']:.2f} before, {run['load_after']:.2f} after)"
                            )
                    for name, runs in runs_of.items():
                        results["trials"][name] = runs
                        # Only trials that started on a quiet machine count.
                        quiet = [
                            r["s"]
                            for r in runs
                            if r["load_before"] < QUIET_LOAD or args.quiet_wait_s == 0
                        ]
                        results[name] = {
                            **(_summary(quiet) if quiet else {"trials": 0}),
                            "loud_trials": len(runs) - len(quiet),
                        }
                        print(f"{name}: {results[name]}")
                    consumer.env.pop(ARCHIVE_VAR, None)
            writer.on.clear()
        finally:
            consumer.stop()
            writer.close()
            p.close()
    path = bench_output.write_json(bench_output.run_base("recovery", args.results_dir), results)
    print(f"recovery: {path}")
    for name in (k for k in results if "/" in k):
        print(f"recovery {name}: {results[name]}")


if __name__ == "__main__":
    main()
