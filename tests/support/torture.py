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

Faults (torture_checks.schedule): kill -9 of the producer; kill -9 of the consumer's process
group while a MERGE writes its files or while the progress row is written (aimed by watching the
lake's directories, see ConsumerAim); kill -9 of a Kafka broker (any, the marker topic's leader,
or the producer's transaction coordinator); the registry stopped for longer than the producer's
retry interval (with a column added meanwhile, so the producer needs it); PostgreSQL
``pg_ctl stop -m immediate`` then start; two of these at once.

Checks after the load stops and the lake caught up: ``spark_consumer verify`` equal; the
invariant in every progress snapshot, read with delta-rs; every transaction's events in Kafka
(deduplicated by commit_lsn, total_order) match its END marker. One summary line and a JSON
report.

The services are the local stack's (deploy/local/stack): the harness kills them through their
pid files and brings them back with `stack up <service>`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql as pgsql

from schemas.topics import table_topic, transaction_topic
from tests.support import lake_reader
from tests.support import torture_checks as tc
from tests.support.producer_harness import ProducerProcess, Source, TopicReader, query, unique

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"
PG_CTL = "/usr/lib/postgresql/15/bin/pg_ctl"

ACCOUNTS = 40  # per table at the opening
OPENING = 100_000  # cents per account
TOTAL = 2 * ACCOUNTS * OPENING
DOC_CHARS = 4_000  # over the TOAST threshold (~2 kB), stored EXTERNAL: always out of line


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} torture: {message}", file=sys.stderr, flush=True)


# -- the stack's services ----------------------------------------------------------------------


class Stack:
    """Kill and restart the local stack's services (its pid files, `stack up <service>`)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env  # the environment `stack` runs with (WALBRIDGE_HOME, ports, brokers)
        self.home = Path(env.get("WALBRIDGE_HOME", ROOT / ".walbridge"))
        self.brokers = int(env.get("WALBRIDGE_KAFKA_BROKERS", "1"))
        self.lock = threading.Lock()  # one `stack` command at a time

    @property
    def kafka_services(self) -> list[str]:
        return ["kafka"] + [f"kafka-{i}" for i in range(2, self.brokers + 1)]

    @property
    def services(self) -> list[str]:
        return ["postgres", *self.kafka_services, "registry"]

    def run(self, *args: str) -> str:
        with self.lock:
            done = subprocess.run(
                [str(STACK), *args], env=self.env, text=True, capture_output=True, check=False
            )
        if done.returncode != 0:
            raise RuntimeError(f"stack {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def connection(self) -> dict[str, str]:
        return dict(re.findall(r"^export (\w+)='([^']*)'$", self.run("env"), re.MULTILINE))

    def pid(self, service: str) -> int | None:
        """The service's running process (None: not running; a zombie is not running)."""
        try:
            pid = int((self.home / "run" / f"{service}.pid").read_text().split()[0])
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError, IndexError):
            return None
        state = stat.rsplit(")", 1)[-1].split()[0]  # after "(comm)", which may hold spaces
        return None if state in ("Z", "X") else pid

    def kill9(self, service: str, timeout: float = 60.0) -> None:
        pid = self.pid(service)
        if pid is None:
            raise RuntimeError(f"{service} is not running: nothing to kill")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.pid(service) == pid:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{service} (pid {pid}) still running {timeout:.0f}s after kill -9"
                )
            time.sleep(0.05)

    def postgres_crash(self) -> None:
        """pg_ctl stop -m immediate: no shutdown checkpoint, recovery replays WAL at start."""
        cmd = [PG_CTL, "-D", str(self.home / "postgres" / "data"), "-m", "immediate", "stop"]
        if os.geteuid() == 0:  # pg_ctl refuses to run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True)


def broker_service(node_id: int) -> str:
    return "kafka" if node_id == 1 else f"kafka-{node_id}"


# -- the load ----------------------------------------------------------------------------------


class Workload:
    """Worker threads running pgbench-like transactions that keep the invariant."""

    def __init__(self, dsn: str, schema: str, seed: int, workers: int, pause_s: float) -> None:
        self.dsn = dsn
        self.schema = schema
        self.seed = seed
        self.workers = workers
        self.pause_s = pause_s
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.committed = 0
        self.retried = 0  # transactions rolled back or lost with the connection, then skipped
        self.notes: list[str] = []  # columns added during the run
        self.lock = threading.Lock()

    def ident(self, table: str) -> pgsql.Identifier:
        return pgsql.Identifier(self.schema, table)

    @property
    def tables(self) -> list[str]:
        return [f"{self.schema}.{t}" for t in ("checking", "savings", "history")]

    def create(self) -> None:
        s = pgsql.Identifier(self.schema)
        statements = [
            pgsql.SQL("CREATE SCHEMA {}").format(s),
            pgsql.SQL("CREATE SEQUENCE {} START 100000").format(self.ident("ids")),
            pgsql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, balance bigint NOT NULL, doc text)"
            ).format(self.ident("checking")),
            # EXTERNAL: out of line and uncompressed, so every doc is a TOAST pointer.
            pgsql.SQL("ALTER TABLE {} ALTER doc SET STORAGE EXTERNAL").format(
                self.ident("checking")
            ),
            pgsql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, balance bigint NOT NULL)").format(
                self.ident("savings")
            ),
            # No key: inserts only (a keyless table publishes no updates or deletes).
            pgsql.SQL(
                "CREATE TABLE {} (account text NOT NULL, delta bigint NOT NULL, at timestamptz)"
            ).format(self.ident("history")),
        ]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def open_accounts(self) -> None:
        """Opening balances, all in one transaction (before it, every table is empty)."""
        rnd = random.Random(self.seed)
        with psycopg.connect(self.dsn) as conn, conn.transaction():
            for i in range(ACCOUNTS):
                conn.execute(
                    pgsql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(self.ident("checking")),
                    (i, OPENING, doc(rnd)),
                )
                conn.execute(
                    pgsql.SQL("INSERT INTO {} VALUES (%s, %s)").format(self.ident("savings")),
                    (i, OPENING),
                )
                conn.execute(
                    pgsql.SQL("INSERT INTO {} VALUES (%s, %s, now())").format(
                        self.ident("history")
                    ),
                    (f"s{i}", OPENING),
                )

    def add_column(self) -> str:
        """ALTER TABLE checking ADD COLUMN note_<n> (nullable, no default: rows keep NULL on
        both sides until a later doc rewrite fills it)."""
        name = f"note_{len(self.notes) + 1}"
        for _ in range(600):  # PostgreSQL may be restarting after an earlier fault
            try:
                self._add_column(name)
                break
            except psycopg.OperationalError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"could not add column {name}: PostgreSQL unreachable for 300 s")
        with self.lock:
            self.notes.append(name)
        return name

    def _add_column(self, name: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
                    self.ident("checking"), pgsql.Identifier(name)
                )
            )
            # One change that uses it at once: the producer needs the new schema registered.
            conn.execute(
                pgsql.SQL("UPDATE {} SET {} = 'added' WHERE id = (SELECT min(id) FROM {})").format(
                    self.ident("checking"), pgsql.Identifier(name), self.ident("checking")
                )
            )

    def start(self) -> None:
        self.stop_event.clear()
        self.threads = [
            threading.Thread(target=self._worker, args=(self.seed * 1000 + i,), daemon=True)
            for i in range(self.workers)
        ]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(120)

    def _worker(self, seed: int) -> None:
        rnd = random.Random(seed)
        conn: psycopg.Connection[Any] | None = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, connect_timeout=5)
                with conn.transaction():
                    self._one(conn, rnd)
                with self.lock:
                    self.committed += 1
            except (psycopg.OperationalError, psycopg.errors.AdminShutdown):
                # PostgreSQL went away (a crash fault): the outcome of an in-flight commit is
                # unknown and does not matter here (the invariant holds either way).
                with self.lock:
                    self.retried += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stop_event.wait(0.5)
                continue
            except _Skip:
                with self.lock:
                    self.retried += 1
            self.stop_event.wait(self.pause_s)
        if conn is not None:
            conn.close()

    def _pick(self, conn: psycopg.Connection[Any], table: str) -> int:
        """A random row, locked; SKIP LOCKED so workers never wait on each other (no deadlock)."""
        row = conn.execute(
            pgsql.SQL("SELECT id FROM {} ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED").format(
                self.ident(table)
            )
        ).fetchone()
        if row is None:
            raise _Skip()
        return int(row[0])

    def _log(self, conn: psycopg.Connection[Any], account: int, delta: int) -> None:
        conn.execute(
            pgsql.SQL("INSERT INTO {} VALUES (%s, %s, now())").format(self.ident("history")),
            (f"s{account}", delta),
        )

    def _add(self, conn: psycopg.Connection[Any], table: str, account: int, delta: int) -> None:
        cur = conn.execute(
            pgsql.SQL("UPDATE {} SET balance = balance + %s WHERE id = %s").format(
                self.ident(table)
            ),
            (delta, account),
        )
        if cur.rowcount != 1:
            raise _Skip()

    def _one(self, conn: psycopg.Connection[Any], rnd: random.Random) -> None:
        """One transaction of a random kind; checking rows are always locked first."""
        kind = rnd.choices(
            ["transfer", "renumber", "close", "open", "doc", "close_checking"],
            weights=[60, 10, 6, 6, 12, 6],
        )[0]
        c = self._pick(conn, "checking")
        if kind == "transfer":
            s = self._pick(conn, "savings")
            amount = rnd.randint(-5000, 5000)
            self._add(conn, "checking", c, -amount)
            self._add(conn, "savings", s, amount)
            self._log(conn, s, amount)
        elif kind == "renumber":  # key changes; the checking row's doc stays TOASTed, unchanged
            table = rnd.choice(["checking", "savings"])
            old = c if table == "checking" else self._pick(conn, "savings")
            conn.execute(
                pgsql.SQL("UPDATE {} SET id = nextval(%s) WHERE id = %s").format(self.ident(table)),
                (f"{self.schema}.ids", old),
            )
        elif kind == "close":  # a savings account closes into a checking account (a delete)
            s = self._pick(conn, "savings")
            row = conn.execute(
                pgsql.SQL("DELETE FROM {} WHERE id = %s RETURNING balance").format(
                    self.ident("savings")
                ),
                (s,),
            ).fetchone()
            assert row is not None
            self._add(conn, "checking", c, int(row[0]))
            self._log(conn, s, -int(row[0]))
        elif kind == "open":
            new = conn.execute(pgsql.SQL("SELECT nextval({})").format(pgsql.Literal(
                f"{self.schema}.ids"))).fetchone()  # fmt: skip
            assert new is not None
            amount = rnd.randint(1, 20_000)
            self._add(conn, "checking", c, -amount)
            conn.execute(
                pgsql.SQL("INSERT INTO {} VALUES (%s, %s)").format(self.ident("savings")),
                (new[0], amount),
            )
            self._log(conn, int(new[0]), amount)
        elif kind == "doc":  # a new TOASTed value (and the newest added column, when any)
            with self.lock:
                note = self.notes[-1] if self.notes else None
            sets: list[pgsql.Composable] = [pgsql.SQL("doc = %s")]
            params: list[Any] = [doc(rnd)]
            if note is not None:
                sets.append(pgsql.SQL("{} = %s").format(pgsql.Identifier(note)))
                params.append(f"n{rnd.randint(0, 999)}")
            conn.execute(
                pgsql.SQL("UPDATE {} SET {} WHERE id = %s").format(
                    self.ident("checking"), pgsql.SQL(", ").join(sets)
                ),
                (*params, c),
            )
        else:  # close_checking: a TOASTed row deleted, its money to another, a new one opened
            other = self._pick(conn, "checking")
            row = conn.execute(
                pgsql.SQL("DELETE FROM {} WHERE id = %s RETURNING balance").format(
                    self.ident("checking")
                ),
                (c,),
            ).fetchone()
            assert row is not None
            self._add(conn, "checking", other, int(row[0]))
            conn.execute(
                pgsql.SQL("INSERT INTO {} (id, balance, doc) VALUES (nextval(%s), 0, %s)").format(
                    self.ident("checking")
                ),
                (f"{self.schema}.ids", doc(rnd)),
            )


class _Skip(Exception):
    """Nothing to lock right now (another worker holds it): roll back, try another."""


def doc(rnd: random.Random) -> str:
    return "".join(rnd.choices(string.ascii_letters + string.digits, k=DOC_CHARS))


# -- the consumer as a process group -------------------------------------------------------------


class ConsumerProcess:
    """`python -m spark_consumer run` in its own session, so kill -9 takes its JVM along (a
    container's processes die together)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spark_consumer", "run"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.kill9()


# -- the supervisor ------------------------------------------------------------------------------


@dataclass
class Restart:
    what: str
    at: float  # seconds since the run started
    seconds: float  # how long the restart took


class Supervisor(threading.Thread):
    """Restarts whatever died, every half second: the stack's services (unless a fault holds
    one down on purpose), the producer and the consumer (with a short crash-loop backoff)."""

    def __init__(
        self, stack: Stack, producer: ProducerProcess, consumer: ConsumerProcess, t0: float
    ) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.producer = producer
        self.consumer = consumer
        self.t0 = t0
        self.held: set[str] = set()
        self.restarts: list[Restart] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self._backoff: dict[str, tuple[float, float]] = {}  # what -> (next try, delay)

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                self.tick()
            except Exception as exc:
                self.errors.append(f"{time.monotonic() - self.t0:.1f}s: {exc}")
                log(f"supervisor: {exc}")

    def _due(self, what: str) -> bool:
        return time.monotonic() >= self._backoff.get(what, (0.0, 0.0))[0]

    def _restarted(self, what: str, started: float, healthy: bool) -> None:
        _, delay = self._backoff.get(what, (0.0, 0.5))
        # Crash-loop backoff like Kubernetes' (shorter): doubles to 8 s, reset once a process
        # stays up (checked on its next death: a death soon after the last start doubles it).
        delay = 0.5 if healthy else min(8.0, delay * 2)
        self._backoff[what] = (time.monotonic() + delay, delay)
        self.restarts.append(
            Restart(what, round(started - self.t0, 1), round(time.monotonic() - started, 1))
        )

    def tick(self) -> None:
        for service in self.stack.services:
            if service in self.held or self.stack.pid(service) is not None:
                continue
            if not self._due(service):
                continue
            started = time.monotonic()
            log(f"supervisor: {service} is down; starting it")
            try:
                self.stack.run("up", service)
            except RuntimeError:
                # `stack up` gave up (e.g. the restarted broker hit a port its killed
                # predecessor still held): try again after a backoff, not in a tight loop.
                self._restarted(service, started, healthy=False)
                raise
            self._restarted(service, started, healthy=True)
        now = time.monotonic()
        for what, proc, restart in (
            ("producer", self.producer.proc, lambda: self.producer.start(wait_ready=False)),
            ("consumer", self.consumer.proc, self.consumer.start),
        ):
            if proc is None or proc.poll() is None or not self._due(what):
                continue
            last = max((r.at for r in self.restarts if r.what == what), default=-1e9)
            healthy = (now - self.t0) - last > 30
            log(f"supervisor: {what} exited ({proc.returncode}); restarting it")
            restart()
            self._restarted(what, now, healthy)


# -- aiming at the consumer's moments ------------------------------------------------------------


def _parquet(directory: Path) -> set[str]:
    try:
        return {e.name for e in os.scandir(directory) if e.name.endswith(".parquet")}
    except FileNotFoundError:
        return set()


def _committed(directory: Path, name: str) -> bool:
    log_dir = directory / "_delta_log"
    try:
        files = sorted(log_dir.glob("*.json"))[-5:]
    except FileNotFoundError:
        return False
    return any(name in f.read_text(errors="replace") for f in files)


def aim_consumer_kill(
    consumer: ConsumerProcess, directories: list[Path], timeout_s: float
) -> dict[str, Any]:
    """kill -9 the consumer the moment a new data file appears in one of ``directories``: a
    Delta write (MERGE into a lake table, or the progress row's append) has written its files
    and not yet committed them. Polls every 5 ms; afterwards tells whether the kill landed
    before the commit (the file is in none of the table's newest log entries) or just after."""
    deadline = time.monotonic() + timeout_s
    while not consumer.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    base = {d: _parquet(d) for d in directories}
    while time.monotonic() < deadline:
        for d in directories:
            new = _parquet(d) - base[d]
            if new:
                seen = time.monotonic()
                consumer.kill9()
                latency_ms = (time.monotonic() - seen) * 1000
                name = sorted(new)[0]
                return {
                    "aimed": True,
                    "directory": d.name,
                    "kill_latency_ms": round(latency_ms, 1),
                    "before_commit": not _committed(d, name),
                }
        time.sleep(0.005)
    consumer.kill9()
    return {"aimed": False}


def check_progress_snapshots(lake: Path, schema: str, total: int) -> dict[str, Any]:
    """The invariant in every lake state a progress row names (each table VERSION AS OF the
    row's table_versions), read with delta-rs. A (table, version) is summed once."""
    paths = {t: str(lake / schema / t) for t in ("checking", "savings", "history")}
    cache: dict[tuple[str, int], tuple[int, int]] = {}

    def money(table: str, versions: dict[str, int]) -> tuple[int, int]:
        """(sum, rows) of the table in this state."""
        version = versions.get(f"{schema}.{table}")
        if version is None:
            return 0, 0  # not in the lake yet at this point
        key = (table, version)
        if key not in cache:
            column = "delta" if table == "history" else "balance"
            cache[key] = lake_reader.table_totals(paths[table], version, column)
        return cache[key]

    violations: list[str] = []
    if not (lake / "_walbridge" / "progress" / "_delta_log").is_dir():
        return {"checked": 0, "table_versions_read": 0, "violations": ["no progress table"]}
    rows = lake_reader.progress_rows(str(lake))
    for row in rows:
        v = row["table_versions"]
        (checking, c_rows), (savings, s_rows), (history, h_rows) = (
            money(t, v) for t in ("checking", "savings", "history")
        )
        sums = tc.Sums(checking, savings, history, c_rows + s_rows + h_rows)
        problem = tc.invariant_violation(sums, total)
        if problem is not None:
            violations.append(f"batch {row['batch_id']} {v}: {problem}")
    return {"checked": len(rows), "table_versions_read": len(cache), "violations": violations}


class RecoveryWatcher(threading.Thread):
    """Times each cycle's recovery: from the fault until the lake's progress reached a
    transaction that committed after the fault struck (at or after the WAL position then)."""

    def __init__(self, lake: Path) -> None:
        super().__init__(daemon=True)
        self.lake = lake
        self.waiting: list[tuple[CycleResult, int, float]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def expect(self, result: CycleResult, lsn: int, struck: float) -> None:
        with self.lock:
            self.waiting.append((result, lsn, struck))

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            self.poll()

    def poll(self) -> None:
        try:
            applied = lake_reader.latest_commit_lsn(str(self.lake))
        except Exception:  # a log entry being written: read again next time
            return
        if applied is None:
            return
        now = time.monotonic()
        with self.lock:
            for result, _lsn, struck in [w for w in self.waiting if w[1] <= applied]:
                result.recovery_s = round(now - struck, 1)
                log(f"cycle {result.number}: recovered in {result.recovery_s}s")
            self.waiting = [w for w in self.waiting if w[1] > applied]


# -- one run -------------------------------------------------------------------------------------


@dataclass
class Options:
    cycles: int
    seconds_per_cycle: float
    seed: int
    report: Path | None = None
    faults: tuple[str, ...] = tc.CHOICES
    workers: int = 2
    pause_s: float = 0.25
    trigger: str = "3 seconds"
    recovery_timeout_s: float = 600.0
    aim_timeout_s: float = 90.0
    work_dir: Path | None = None
    keep: bool = False
    check_only: bool = False  # only the checks, on what a run left in work_dir


@dataclass
class CycleResult:
    number: int
    faults: list[str]
    at_s: float
    schema_change: str | None = None
    details: list[dict[str, Any]] = field(default_factory=list)
    recovery_s: float | None = None
    error: str | None = None


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
        return {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")} | {
            "WALBRIDGE_KAFKA_BOOTSTRAP": self.kafka,
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

    def execute(self) -> dict[str, Any]:
        self.check_stack()
        plan = tc.schedule(self.o.seed, self.o.cycles, self.o.seconds_per_cycle, self.o.faults)
        self.workload.create()
        self.source = Source.create(self.dsn, self.workload.tables, "torture")
        self.producer = ProducerProcess(
            self.source,
            self.kafka,
            self.registry,
            topic_partitions=3,
            idle_after_s=0.5,
        )
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
            catch_up = self.catch_up()
            self.recovery.poll()
            self.save_cycles(results)
        finally:
            self.recovery.stopping.set()
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

    def cycle(self, cycle: tc.Cycle) -> CycleResult:
        start = time.monotonic()
        result = CycleResult(cycle.number, [f.label() for f in cycle.faults], cycle.at_s)
        log(f"cycle {cycle.number}: {', '.join(result.faults)} at +{cycle.at_s:.1f}s")
        if cycle.schema_change and not any(f.kind is tc.Kind.REGISTRY_STOP for f in cycle.faults):
            result.schema_change = self.workload.add_column()
        time.sleep(max(0.0, start + cycle.at_s - time.monotonic()))
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
            "cycles": len(results),
            "seconds_per_cycle": self.o.seconds_per_cycle,
            "brokers": self.stack.brokers,
            "faults_by_kind": tc.faults_by_kind(plan[: len(results)]),
            "transactions": ends.transactions,
            "events": ends.events,
            "rows": self.rows(),
            "duplicates": ends.duplicates,
            "lost": verified["lost"],
            "diverged": verified["diverged"],
            "verify_equal": verified["equal"],
            "snapshots_checked": snapshots["checked"],
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


def parse(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="deploy/local/torture",
        description="Faults drawn from a seed strike the running pipeline cycle after cycle; "
        "then nothing may be lost, diverged or half-visible in the lake.",
    )
    p.add_argument("--cycles", type=int, required=True)
    p.add_argument("--seconds-per-cycle", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument(
        "--faults",
        default=",".join(tc.CHOICES),
        help=f"fault kinds to draw from, comma-separated (default all: {','.join(tc.CHOICES)})",
    )
    p.add_argument("--workers", type=int, default=2, help="load threads (default 2)")
    p.add_argument(
        "--pause-s", type=float, default=0.25, help="pause between a worker's transactions"
    )
    p.add_argument("--trigger", default="3 seconds", help="the consumer's trigger interval")
    p.add_argument("--recovery-timeout-s", type=float, default=600.0)
    p.add_argument(
        "--aim-timeout-s",
        type=float,
        default=90.0,
        help="a consumer kill waits this long for its moment (a MERGE, the progress write), "
        "then strikes anyway (reported as not aimed)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        help="lake, checkpoint, logs (default under WALBRIDGE_HOME/torture)",
    )
    p.add_argument("--keep", action="store_true", help="keep the slot and publication afterwards")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="run only the final checks on what the run in --work-dir left (same --seed, "
        "--cycles, --seconds-per-cycle): for a run that was interrupted",
    )
    a = p.parse_args(argv)
    if a.cycles < 1 or a.seconds_per_cycle <= 0:
        p.error("--cycles must be >= 1 and --seconds-per-cycle > 0")
    return Options(
        a.cycles, a.seconds_per_cycle, a.seed, a.report, tuple(a.faults.split(",")), a.workers,
        a.pause_s, a.trigger, a.recovery_timeout_s, a.aim_timeout_s, a.work_dir, a.keep,
        a.check_only,
    )  # fmt: skip


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
