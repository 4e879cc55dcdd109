"""The torture run (deploy/local/torture): a pgbench-like load through the whole pipeline while
faults drawn from a seed strike again and again, a supervisor restarting what died (as
Kubernetes would), and at the end the checks that nothing was lost, duplicated into the lake or
ever visible half-applied.

Load (Workload): money moves between accounts in two tables (checking, with a TOASTed ``doc``
column, and savings) and every change of money in savings is logged in the keyless ``history``
table in the same transaction; accounts are opened, closed (deletes) and renumbered (key
changes, including of rows whose TOASTed value stays unchanged), docs are rewritten, and now and
then a column is added. The invariant (torture_checks.invariant_violation) holds at every
transaction boundary.

Faults (torture_checks.schedule, one line each in torture_checks.KIND_HELP): kill -9 of the
producer; kill -9 of the consumer's process group while a MERGE writes its files or while the
progress row is written (aimed by watching the lake's directories, see aim_consumer_kill); kill -9
of a Kafka broker (any, the marker topic's leader, or the producer's transaction coordinator); the
registry stopped for longer than the producer's retry interval (with a column added meanwhile, so
the producer needs it); PostgreSQL ``pg_ctl stop -m immediate`` then start; network faults held
for a while on one link through Toxiproxy (latency and jitter, a bandwidth limit, connections
reset, a silent half-open link, a partition; tests/support/network_faults.py and
toxiproxy_stack.torture_links: producer <-> PostgreSQL, registry, Kafka and consumer <-> Kafka,
the brokers reached through proxied listeners of their own); two of these at once. Before it
strikes, a fault waits for the consumer's next batch since the previous fault (a cycle counts
only with one); the report gives per kind the cycles, recovery p50/p99/max, the batches
committed after its faults and their progress snapshots checked.

Checks after the load stops and the lake caught up: ``spark_consumer verify`` equal; the
invariant in every progress snapshot, read with delta-rs; every transaction's events in Kafka
(deduplicated by commit_lsn, total_order) match its END marker. One summary line and a JSON
report.

The services are the local stack's (deploy/local/stack): the harness kills them through their
pid files and brings them back with `stack up <service>` (torture_services.py, with the
supervisor and the aimed consumer kill). The load is torture_workload.py; the checks' pure logic
and the fault schedule are torture_checks.py; the options and the command line
torture_options.py; what is read from the lake (the progress snapshots, each cycle's recovery)
torture_lake.py. This module runs the cycles and the checks.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient, ConfigResource
from psycopg import sql as pgsql

from schemas.topics import table_topic, transaction_topic
from tests.support import lake_reader, toxiproxy_stack
from tests.support import torture_checks as tc
from tests.support.producer_harness import ProducerProcess, Source, TopicReader, query, unique
from tests.support.scratch_stack import free_block, port_free
from tests.support.torture_lake import RecoveryWatcher, check_progress_snapshots
from tests.support.torture_options import CycleResult, Options, parse
from tests.support.torture_services import (
    ROOT,
    ConsumerProcess,
    Stack,
    Supervisor,
    aim_consumer_kill,
    broker_service,
    log,
)
from tests.support.torture_workload import TOTAL, Workload
from tests.support.toxiproxy_server import toxiproxy_server
from tests.support.toxiproxy_stack import TortureLinks

# -- one run -------------------------------------------------------------------------------------


class Run:
    def __init__(self, options: Options, stack_env: dict[str, str]) -> None:
        self.o = options
        self.stack = Stack(stack_env)
        self.t0 = time.monotonic()
        conn = self.stack.connection()
        self.dsn = conn["WALBRIDGE_PG_DSN"]
        self.kafka = conn["WALBRIDGE_KAFKA_BOOTSTRAP"]
        self.registry = conn["WALBRIDGE_SCHEMA_REGISTRY_URL"]
        name = unique(f"torture{options.seed}")
        # Absolute: the consumer fails on a relative lake path that starts with a dot.
        self.work = (options.work_dir or (self.stack.home / "torture" / name)).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.lake = self.work / "lake"
        self.workload = Workload(self.dsn, name, options.seed, options.workers, options.pause_s)
        self.links: TortureLinks | None = None  # the proxies, when a network fault can strike
        self.exits = ExitStack()
        self.rows_after_fault = 0  # progress rows when the previous fault was over
        self.rows_at_load_stop: int | None = None

    # The services as the run found them: the check is that they all run and that the Kafka
    # cluster has the brokers the stack's setting says.
    def check_stack(self) -> None:
        down = [s for s in self.stack.services if self.stack.pid(s) is None]
        if down:
            raise RuntimeError(
                f"not running: {down}; start the stack first (deploy/local/stack up)"
            )
        brokers = AdminClient({"bootstrap.servers": self.kafka}).list_topics(timeout=10).brokers
        if len(brokers) != self.stack.brokers:
            raise RuntimeError(
                f"Kafka has {len(brokers)} broker(s), the stack setting says {self.stack.brokers}"
                " (WALBRIDGE_KAFKA_BROKERS)"
            )

    def consumer_env(self) -> dict[str, str]:
        # The caller's Ivy cache (the test command sets it), so a restarted consumer finds the
        # connector jars' manifest and starts without resolving them.
        keep = ("WALBRIDGE_SPARK_IVY_DIR",)
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_") or k in keep
        }
        return inherited | {
            "WALBRIDGE_KAFKA_BOOTSTRAP": (
                self.links.consumer_kafka_bootstrap if self.links else self.kafka
            ),
            "WALBRIDGE_SCHEMA_REGISTRY_URL": self.registry,
            "WALBRIDGE_TOPIC_PREFIX": self.source.prefix,
            "WALBRIDGE_LAKE_PATH": str(self.lake),
            "WALBRIDGE_CHECKPOINT_PATH": str(self.work / "checkpoint"),
            "WALBRIDGE_TRIGGER": self.o.trigger,
            "WALBRIDGE_CONSUMER_METRICS_PORT": "0",
            "WALBRIDGE_SPARK_DRIVER_MEMORY": "1g",
            "WALBRIDGE_LOG_LEVEL": "INFO",  # the per-batch lines in consumer.log
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def kafka_proxied_base(self) -> int:
        """The first port of the brokers' proxied listeners (deploy/local/stack's
        WALBRIDGE_KAFKA_PROXIED_PORT). Brokers that run without them, or with ports whose
        proxies can't listen, are restarted with new ones first (once per stack)."""
        # Quiet (log_level 2): the restart below would fill the log with its reconnects.
        admin = AdminClient({"bootstrap.servers": self.kafka, "log_level": 2})
        nodes = range(1, self.stack.brokers + 1)
        bases = set()
        for node in nodes:
            # One broker per call: librdkafka refuses two BROKER resources in one.
            resource = ConfigResource(ConfigResource.Type.BROKER, str(node))
            (future,) = admin.describe_configs([resource], request_timeout=30).values()
            advertised = future.result(timeout=60)["advertised.listeners"].value or ""
            found = re.search(r"PROXIED_A://[^,]*:(\d+)", advertised)
            bases.add(None if found is None else int(found.group(1)) - 4 * (node - 1))
        if len(bases) == 1 and (base := bases.pop()) is not None:
            ports = [
                toxiproxy_stack.kafka_proxied_ports(base, n, k)[0] for n in nodes for k in (0, 1)
            ]
            if all(port_free(p) for p in ports):
                self.stack.env["WALBRIDGE_KAFKA_PROXIED_PORT"] = str(base)
                return base
        base = free_block(toxiproxy_stack.KAFKA_PORTS_PER_BROKER * self.stack.brokers)
        self.stack.env["WALBRIDGE_KAFKA_PROXIED_PORT"] = str(base)
        log(f"restarting the broker(s) with proxied listeners from port {base}")
        started = time.monotonic()
        self.stack.run("down", *self.stack.kafka_services)
        self.stack.run("up", *self.stack.kafka_services)
        log(f"broker(s) back with proxied listeners in {time.monotonic() - started:.1f}s")
        return base

    def start_links(self) -> None:
        """Toxiproxy between every client and server (tests/support/toxiproxy_stack.py)."""
        base = self.kafka_proxied_base()
        api = self.exits.enter_context(toxiproxy_server(self.work))
        self.links = self.exits.enter_context(
            toxiproxy_stack.torture_links(api, self.dsn, self.registry, base, self.stack.brokers)
        )
        log(f"network faults through Toxiproxy on {api.host}:{api.port}: {', '.join(tc.LINKS)}")

    def execute(self) -> dict[str, Any]:
        with self.exits:
            return self._execute()

    def _execute(self) -> dict[str, Any]:
        self.check_stack()
        plan = tc.schedule(self.o.seed, self.o.cycles, self.o.seconds_per_cycle, self.o.faults)
        if tc.needs_network(self.o.faults):
            self.start_links()
        self.workload.create()
        self.source = Source.create(self.dsn, self.workload.tables, "torture")
        links = self.links
        self.producer = ProducerProcess(
            self.source,
            links.producer_kafka_bootstrap if links else self.kafka,
            links.producer_registry_url if links else self.registry,
            topic_partitions=3,
            idle_after_s=0.5,
        )
        if links:
            self.producer.env["WALBRIDGE_PG_DSN"] = links.producer_pg_dsn
        self.producer.log_path = self.work / "producer.log"
        self.consumer = ConsumerProcess(self.consumer_env(), self.work / "consumer.log")
        state = {"schema": self.workload.schema, **asdict(self.source), "options": repr(self.o)}
        (self.work / "run.json").write_text(json.dumps(state, indent=2) + "\n")
        log(f"work directory {self.work}; schema {self.workload.schema}")
        self.producer.start()
        self.workload.open_accounts()
        opened = self.current_lsn()
        self.consumer.start()
        self.supervisor = Supervisor(self.stack, self.producer, self.consumer, self.t0)
        self.supervisor.start()
        self.recovery = RecoveryWatcher(self.lake)
        self.recovery.start()
        self.workload.start()
        results: list[CycleResult] = []
        try:
            # The first fault strikes a running pipeline, not a consumer still starting its JVM.
            if self.wait_applied(opened, max(1800.0, self.o.recovery_timeout_s)) is None:
                raise RuntimeError(f"the consumer applied nothing: see {self.consumer.log_path}")
            log(f"pipeline running after {self.elapsed():.0f}s; cycles start")
            for cycle in plan:
                results.append(self.cycle(cycle))
                self.save_cycles(results)
            log("load stops; waiting for the lake to catch up")
            self.workload.stop()
            self.rows_at_load_stop = self.progress_rows()
            catch_up = self.catch_up()
            self.recovery.poll()
            self.save_cycles(results)
        finally:
            self.recovery.stopping.set()
            if self.links is not None:
                self.links.heal()  # a fault left on after a failure must not hold the catch-up
            self.workload.stop()
            self.supervisor.stopping.set()
            self.supervisor.join(120)
            self.consumer.stop()
            if self.producer.proc is not None:
                self.producer.stop()
        return self.check(plan, results, catch_up)

    def save_cycles(self, results: list[CycleResult]) -> None:
        """What happened so far, for `--check-only` on a run that did not finish."""
        with self.recovery.lock:
            text = json.dumps([asdict(r) for r in results], indent=2, default=str)
        (self.work / "cycles.json").write_text(text + "\n")

    def check_only(self) -> dict[str, Any]:
        """The checks alone, on the state a run left in its work directory (run.json)."""
        state = json.loads((self.work / "run.json").read_text())
        self.workload.schema = state["schema"]
        self.source = Source(self.dsn, state["publication"], state["slot"], state["prefix"])
        cycles = self.work / "cycles.json"
        results = (
            [CycleResult(**r) for r in json.loads(cycles.read_text())] if cycles.exists() else []
        )
        plan = tc.schedule(self.o.seed, self.o.cycles, self.o.seconds_per_cycle, self.o.faults)
        return self.check(plan, results, catch_up=None)

    def progress_rows(self) -> int:
        """The progress table's rows now (its log may be mid-write: read again)."""
        for _ in range(20):
            try:
                return lake_reader.progress_row_count(str(self.lake))
            except Exception:
                time.sleep(0.25)
        raise RuntimeError(f"could not read the progress table of {self.lake}")

    def wait_for_batch(self, number: int) -> tuple[int, float]:
        """Before a fault: wait (up to --commit-wait-s) until the consumer committed a batch
        since the previous fault. Returns the progress rows then and how long it waited."""
        started = time.monotonic()
        rows = self.progress_rows()
        if tc.counts(rows, self.rows_after_fault) or self.o.commit_wait_s <= 0:
            return rows, 0.0
        log(f"cycle {number}: no batch since the last fault; waiting for one (up to "
            f"{self.o.commit_wait_s:.0f}s)")  # fmt: skip
        while time.monotonic() - started < self.o.commit_wait_s:
            time.sleep(0.5)
            rows = self.progress_rows()
            if tc.counts(rows, self.rows_after_fault):
                break
        waited = round(time.monotonic() - started, 1)
        log(f"cycle {number}: waited {waited}s for a batch")
        return rows, waited

    def cycle(self, cycle: tc.Cycle) -> CycleResult:
        start = time.monotonic()
        result = CycleResult(cycle.number, [f.label() for f in cycle.faults], cycle.at_s)
        result.kinds = list(tc.cycle_kinds([f.kind.value for f in cycle.faults]))
        log(f"cycle {cycle.number}: {', '.join(result.faults)} at +{cycle.at_s:.1f}s")
        if cycle.schema_change and not any(tc.needs_registry(f) for f in cycle.faults):
            result.schema_change = self.workload.add_column()
        time.sleep(max(0.0, start + cycle.at_s - time.monotonic()))
        rows, result.waited_for_batch_s = self.wait_for_batch(cycle.number)
        result.progress_rows_at_fault = rows
        result.counted = tc.counts(rows, self.rows_after_fault)
        lsn = self.current_lsn()
        struck = time.monotonic()
        details: list[dict[str, Any]] = [{} for _ in cycle.faults]
        errors: list[str] = []

        def strike(i: int, fault: tc.Fault) -> None:
            try:
                details[i] = self.strike(fault, cycle, result)
            except Exception as exc:
                errors.append(f"{fault.label()}: {exc}")

        threads = [threading.Thread(target=strike, args=(i, f)) for i, f in enumerate(cycle.faults)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result.details = details
        result.progress_rows_after_fault = self.rows_after_fault = self.progress_rows()
        if errors:
            result.error = "; ".join(errors)
            log(f"cycle {cycle.number}: {result.error}")
        log(f"cycle {cycle.number}: struck; {details}")
        # Recovery is timed in the background: the next cycle strikes on schedule, whether or
        # not the pipeline has caught up (faults pile onto recoveries, as in production).
        self.recovery.expect(result, lsn, struck)
        time.sleep(max(0.0, start + self.o.seconds_per_cycle - time.monotonic()))
        return result

    def strike(self, fault: tc.Fault, cycle: tc.Cycle, result: CycleResult) -> dict[str, Any]:
        kind = fault.kind
        if kind in tc.NETWORK_FAULTS:
            if self.links is None:
                raise RuntimeError(f"{fault.label()}: the run has no proxies")
            held = time.monotonic()
            detail: dict[str, Any] = {
                "network": tc.NETWORK_FAULTS[kind], "link": fault.link, "held_s": fault.hold_s,
            }  # fmt: skip
            with self.links.fault(tc.NETWORK_FAULTS[kind], fault.link):
                if tc.needs_registry(fault):
                    # A new column while the producer's registry link is cut: it needs it.
                    detail["column"] = result.schema_change = self.workload.add_column()
                time.sleep(max(0.0, held + fault.hold_s - time.monotonic()))
            return detail
        if kind is tc.Kind.PRODUCER_KILL:
            assert self.producer.proc is not None
            if self.producer.proc.poll() is None:
                self.producer.proc.kill()
            return {"killed": "producer"}
        if kind in (tc.Kind.CONSUMER_KILL_MERGE, tc.Kind.CONSUMER_KILL_PROGRESS):
            if kind is tc.Kind.CONSUMER_KILL_MERGE:
                dirs = [
                    self.lake / self.workload.schema / t.split(".")[1] for t in self.workload.tables
                ]
            else:
                dirs = [self.lake / "_walbridge" / "progress"]
            return aim_consumer_kill(self.consumer, dirs, timeout_s=self.o.aim_timeout_s)
        if kind is tc.Kind.BROKER_KILL:
            service = self.broker_for(fault.broker_target)
            self.stack.kill9(service)
            return {"killed": service}
        if kind is tc.Kind.REGISTRY_STOP:
            self.supervisor.held.add("registry")
            try:
                self.stack.run("down", "registry")
                # A new column while the registry is away: the producer must register its schema.
                result.schema_change = self.workload.add_column()
                time.sleep(fault.stop_s)
            finally:
                self.supervisor.held.discard("registry")
            return {"stopped_s": fault.stop_s, "column": result.schema_change}
        self.stack.postgres_crash()
        return {"crashed": "postgres"}

    def broker_for(self, target: str) -> str:
        if self.stack.brokers == 1:
            return "kafka"
        rnd = random.Random(f"{self.o.seed}-{self.elapsed()}")
        if target == "any":
            return rnd.choice(self.stack.kafka_services)
        admin = AdminClient({"bootstrap.servers": self.kafka})
        if target == "marker_topic_leader":
            topic, partition = transaction_topic(self.source.prefix), 0
        else:
            topic = "__transaction_state"
            tx_id = f"walbridge.{self.source.prefix}.{self.source.slot}"
            partition = tc.transaction_state_partition(tx_id)
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        return broker_service(meta.partitions[partition].leader)

    def current_lsn(self) -> int:
        for _ in range(600):
            try:
                return self.source.current_lsn()
            except psycopg.OperationalError:
                time.sleep(0.5)  # PostgreSQL restarting after an earlier fault
        raise RuntimeError("PostgreSQL did not come back in 300 s")

    def wait_applied(self, lsn: int, timeout_s: float) -> float | None:
        """When the lake's progress reached a transaction that committed at or after ``lsn``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                applied = lake_reader.latest_commit_lsn(str(self.lake))
            except Exception:
                applied = None
            if applied is not None and applied >= lsn:
                return time.monotonic()
            time.sleep(0.5)
        return None

    def catch_up(self) -> float | None:
        """After the load stopped: one last transaction, then wait until the lake applied it
        (transactions apply in commit order, so everything before it is in too)."""
        lsn = self.current_lsn()
        with psycopg.connect(self.dsn) as conn, conn.transaction():
            conn.execute(
                pgsql.SQL(
                    "UPDATE {} SET balance = balance WHERE id = (SELECT min(id) FROM {})"
                ).format(self.workload.ident("savings"), self.workload.ident("savings"))
            )
        started = time.monotonic()
        done = self.wait_applied(lsn, self.o.recovery_timeout_s)
        return None if done is None else round(done - started, 1)

    # -- the checks ------------------------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")} | {
            "WALBRIDGE_PG_DSN": self.dsn,
            "WALBRIDGE_LAKE_PATH": str(self.lake),
            "WALBRIDGE_PUBLICATION": self.source.publication,
        }
        done = subprocess.run(
            [sys.executable, "-m", "spark_consumer", "verify"],
            cwd=ROOT, env=env, text=True, capture_output=True, check=False,
        )  # fmt: skip
        (self.work / "verify.log").write_text(done.stdout + done.stderr)
        lost = diverged = 0
        for m in re.finditer(r"(\d+) missing, (\d+) extra, (\d+) different", done.stdout):
            lost += int(m.group(1))
            diverged += int(m.group(2)) + int(m.group(3))
        equal = done.returncode == 0 and len(re.findall(r": equal$", done.stdout, re.M)) == 3
        if not equal and lost == diverged == 0:
            diverged = -1  # verify failed without a diff (a crash): the report shows its log
        return {"equal": equal, "lost": lost, "diverged": diverged, "output": done.stdout[-4000:]}

    def snapshots(self) -> dict[str, Any]:
        return check_progress_snapshots(self.lake, self.workload.schema, TOTAL)

    def kafka_events(self) -> tc.EndCheck:
        reader = TopicReader(self.kafka, self.registry)
        prefix = self.source.prefix
        s = self.workload.schema
        collections = {
            table_topic(prefix, s, t): f"{s}.{t}" for t in ("checking", "savings", "history")
        }
        markers = transaction_topic(prefix)
        ends: list[tc.End] = []

        def events() -> Iterator[tc.Event]:
            """The data events as they are read (not held: the topics need not fit in
            memory); the END markers met on the way are collected into ``ends``, complete
            once this is exhausted, which check_end_counts does before it reads them."""
            for r in reader.each_to_end([*collections, markers], timeout=1800):
                v = r.value
                if r.topic == markers:
                    if v["status"] == "END":
                        ends.append(tc.End(
                            v["id"], v["event_count"],
                            {d["data_collection"]: d["event_count"] for d in v["data_collections"]},
                        ))  # fmt: skip
                    continue
                yield tc.Event(
                    v["transaction"]["id"], v["source"]["commit_lsn"],
                    v["transaction"]["total_order"], collections[r.topic],
                )  # fmt: skip

        return tc.check_end_counts(events(), ends)

    def rows(self) -> int:
        return sum(
            int(query(self.dsn, f'SELECT count(*) FROM "{self.workload.schema}"."{t}"')[0][0])
            for t in ("checking", "savings", "history")
        )

    def check(
        self, plan: list[tc.Cycle], results: list[CycleResult], catch_up: float | None
    ) -> dict[str, Any]:
        log("checking: verify, every progress snapshot, Kafka END counts")
        supervisor: Supervisor | None = getattr(self, "supervisor", None)
        verified = self.verify()
        snapshots = self.snapshots()
        ends = self.kafka_events()
        recoveries = [r.recovery_s for r in results if r.recovery_s is not None]
        at_next = [r.progress_rows_at_fault for r in results[1:]]
        at_next.append(
            self.rows_at_load_stop if self.rows_at_load_stop is not None else snapshots["checked"]
        )
        figures = [
            tc.CycleFigures(
                tuple(r.kinds), r.counted, r.recovery_s, r.progress_rows_at_fault, next_rows
            )
            for r, next_rows in zip(results, at_next, strict=True)
        ]
        counted = sum(1 for r in results if r.counted)
        aims = [d for r in results for d in r.details if "aimed" in d]
        errors = [f"cycle {r.number}: {r.error}" for r in results if r.error]
        errors += [f"cycle {r.number}: never recovered" for r in results if r.recovery_s is None]
        passed = (
            verified["equal"]
            and not snapshots["violations"]
            and ends.problem_count == 0
            and not errors
            and (catch_up is not None or self.o.check_only)
            and snapshots["checked"] > 0
        )
        report: dict[str, Any] = {
            "passed": passed,
            "seed": self.o.seed,
            "cycles": counted,  # the cycles that count (a batch committed since the last fault)
            "cycles_run": len(results),
            "cycles_uncounted": len(results) - counted,
            "seconds_per_cycle": self.o.seconds_per_cycle,
            "faults_chosen": list(self.o.faults),
            "brokers": self.stack.brokers,
            "faults_by_kind": tc.faults_by_kind(plan[: len(results)]),
            "per_kind": tc.per_kind(figures, snapshots["checked_positions"]),
            "transactions": ends.transactions,
            "events": ends.events,
            "rows": self.rows(),
            "duplicates": ends.duplicates,
            "lost": verified["lost"],
            "diverged": verified["diverged"],
            "verify_equal": verified["equal"],
            "snapshots_checked": snapshots["checked"],
            "progress_rows_at_load_stop": self.rows_at_load_stop,
            "table_versions_read": snapshots["table_versions_read"],
            "invariant_violations": len(snapshots["violations"]),
            "end_mismatches": ends.problem_count,
            "longest_recovery_s": max(recoveries) if recoveries else None,
            "catch_up_s": catch_up,
            "aims": {
                "attempts": len(aims),
                "aimed": sum(1 for a in aims if a["aimed"]),
                "before_commit": sum(1 for a in aims if a.get("before_commit")),
            },
            "workload": {
                "committed": self.workload.committed,
                "rolled_back_or_lost": self.workload.retried,
                "columns_added": list(self.workload.notes),
            },
            "restarts": [asdict(r) for r in supervisor.restarts] if supervisor else [],
            "supervisor_errors": supervisor.errors if supervisor else [],
            "check_only": self.o.check_only,
            "errors": errors,
            "problems": {
                "invariant": snapshots["violations"][:20],
                "end_counts": ends.problems,
                "verify": verified["output"] if not verified["equal"] else "",
            },
            "cycle_results": [asdict(r) for r in results],
            "work_dir": str(self.work),
            "elapsed_s": round(self.elapsed(), 1),
        }
        return report


def run(options: Options, stack_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One torture run; returns the report (also written to options.report when set)."""
    torture = Run(options, dict(stack_env if stack_env is not None else os.environ))
    try:
        report = torture.check_only() if options.check_only else torture.execute()
    finally:
        if not options.keep and not options.check_only and hasattr(torture, "source"):
            torture.source.drop()  # the slot holds WAL
    line = tc.summary_line(report)
    report["summary"] = line
    if options.report is not None:
        options.report.parent.mkdir(parents=True, exist_ok=True)
        options.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(line, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    if options.check_only and options.work_dir is None:
        raise SystemExit("--check-only needs --work-dir (the interrupted run's directory)")
    # SIGTERM unwinds like Ctrl-C: the load, the consumer and the producer stop, the slot goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run(options)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
