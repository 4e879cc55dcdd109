"""The local stack's services as the torture run (tests/support/torture.py) handles them: kill
and restart through their pid files and `stack up <service>`, the consumer as a process group,
the supervisor that restarts what died (as Kubernetes would), and the consumer kill aimed at a
Delta write."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.producer_harness import ProducerProcess

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"


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
        self.run("crash", "postgres")


def broker_service(node_id: int) -> str:
    return "kafka" if node_id == 1 else f"kafka-{node_id}"


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
